#pragma once
// Asynchronous copies from global to shared memory (cp.async, sm_80 and later): a copy occupies no
// registers while in flight, so a thread can have many rows' loads outstanding. Copies committed
// together form a group; groups complete in order, and wait_async_copies<N> returns once at most N of
// this thread's groups are pending. Other threads see the copied bytes after a barrier.

namespace fused_ops {
namespace cuda {

// The 32-bit shared-window address of a pointer to shared memory, as PTX's shared-space operands take.
__device__ __forceinline__ unsigned int shared_address(const void* pointer) {
  return static_cast<unsigned int>(__cvta_generic_to_shared(pointer));
}

// Copies kBytes (4, 8 or 16, both addresses aligned to it); 16-byte copies bypass L1.
template <int kBytes>
__device__ __forceinline__ void copy_async(void* shared_destination, const void* global_source) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async moves 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared_destination)),
                 "l"(global_source)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(shared_address(shared_destination)),
                 "l"(global_source), "n"(kBytes)
                 : "memory");
  }
#else
  struct alignas(kBytes) Word {
    unsigned char bytes[kBytes];
  };
  *static_cast<Word*>(shared_destination) = *static_cast<const Word*>(global_source);
#endif
}

__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace cuda
}  // namespace fused_ops
