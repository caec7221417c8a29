#pragma once
// Binary elementwise CUDA loop shared by ops: out = op(a, b), `b` broadcast to `a`'s shape,
// out a new contiguous tensor of `a`'s shape.
//   fast path: a, b and out contiguous with 16-byte-aligned pointers -> 16-byte vector
//              loads/stores, both inputs loaded before use, one block per 256 vectors.
//   general path: any strides, offsets and alignment (broadcast dims have stride 0);
//              dims are coalesced first so the index math is usually one or two divisions.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_launch.cuh"
#include "dtype_dispatch.h"

namespace fused_ops {
namespace cuda {

constexpr int kThreadsPerBlock = 256;
constexpr int kMaxStridedDims = 8;

// kBytes of T in one load or store: 16 (one LDG.128) streams best; decode grids take fewer bytes per
// thread so that a small tensor spreads over more threads (cuda_rowwise.cuh).
template <typename T, int kBytes>
struct alignas(kBytes) Vec {
  static_assert(kBytes >= int(sizeof(T)) && kBytes % int(sizeof(T)) == 0, "a vector holds whole elements");
  static constexpr int kSize = kBytes / sizeof(T);
  T values[kSize];
};

template <typename T>
using Vec16 = Vec<T, 16>;

template <int kBytes = 16, typename T>
__device__ __forceinline__ Vec<T, kBytes> load_vec(const T* base, int64_t vector_index) {
  return reinterpret_cast<const Vec<T, kBytes>*>(base)[vector_index];
}

template <int kBytes, typename T>
__device__ __forceinline__ void store_vec(T* base, int64_t vector_index, const Vec<T, kBytes>& value) {
  reinterpret_cast<Vec<T, kBytes>*>(base)[vector_index] = value;
}

template <typename T>
__device__ __forceinline__ Vec16<T> load_vec16(const T* base, int64_t vector_index) {
  return load_vec<16>(base, vector_index);
}

template <typename T>
__device__ __forceinline__ void store_vec16(T* base, int64_t vector_index, const Vec16<T>& value) {
  store_vec<16>(base, vector_index, value);
}

// Stores kCount consecutive values at `destination` (16-byte aligned when they fill whole 16-byte
// vectors) with vector stores: a warp then writes whole sectors, where element-by-element stores
// from threads 16-32 bytes apart touch 32 sectors per instruction (the norm backward's per-column
// sums took microseconds per block that way).
template <typename T, int kCount>
__device__ __forceinline__ void store_consecutive(T* destination, const T (&values)[kCount]) {
  constexpr int kPerVector = Vec16<T>::kSize;
  if constexpr (kCount % kPerVector != 0) {
#pragma unroll
    for (int j = 0; j < kCount; ++j) destination[j] = values[j];
  } else {
#pragma unroll
    for (int v = 0; v < kCount / kPerVector; ++v) {
      Vec16<T> vector;
#pragma unroll
      for (int j = 0; j < kPerVector; ++j) vector.values[j] = values[v * kPerVector + j];
      store_vec16(destination, v, vector);
    }
  }
}

// A vector's elements in opmath, and back. 16-bit floats go two at a time: bf16 -> float is one
// shift or mask per element on the 32-bit word (c10's per-element path extracts each half first),
// and float -> bf16/half one cvt per pair (cvt.rn.{bf16x2,f16x2}.f32), both round-to-nearest-even.
template <typename T, int kBytes, typename opmath_t>
__device__ __forceinline__ void unpack_vec(const Vec<T, kBytes>& vector, opmath_t (&values)[Vec<T, kBytes>::kSize]) {
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) {
      values[2 * k] = __uint_as_float(words[k] << 16);
      values[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  } else if constexpr (std::is_same_v<T, c10::Half> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    const __half2* pairs = reinterpret_cast<const __half2*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) {
      const float2 pair = __half22float2(pairs[k]);
      values[2 * k] = pair.x;
      values[2 * k + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < Vec<T, kBytes>::kSize; ++j) values[j] = static_cast<opmath_t>(vector.values[j]);
  }
}

template <typename T, int kBytes, typename opmath_t>
__device__ __forceinline__ Vec<T, kBytes> pack_vec(const opmath_t (&values)[Vec<T, kBytes>::kSize]) {
  Vec<T, kBytes> vector;
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) pairs[k] = __floats2bfloat162_rn(values[2 * k], values[2 * k + 1]);
  } else if constexpr (std::is_same_v<T, c10::Half> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    __half2* pairs = reinterpret_cast<__half2*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) pairs[k] = __floats2half2_rn(values[2 * k], values[2 * k + 1]);
  } else {
#pragma unroll
    for (int j = 0; j < Vec<T, kBytes>::kSize; ++j) vector.values[j] = static_cast<T>(values[j]);
  }
  return vector;
}

template <typename T, typename opmath_t>
__device__ __forceinline__ void unpack_vec16(const Vec16<T>& vector, opmath_t (&values)[Vec16<T>::kSize]) {
  unpack_vec(vector, values);
}

template <typename T, typename opmath_t>
__device__ __forceinline__ Vec16<T> pack_vec16(const opmath_t (&values)[Vec16<T>::kSize]) {
  return pack_vec<T, 16>(values);
}

// Calls function(std::integral_constant<int, bytes>) with the bytes of a vector of `elements`
// scalar_t (a power of two), at most 16.
template <typename scalar_t, typename Function>
void with_vector_bytes(int elements, const Function& function) {
  const int64_t bytes = std::max<int64_t>(sizeof(scalar_t), std::min<int64_t>(16, elements * int64_t(sizeof(scalar_t))));
  if constexpr (sizeof(scalar_t) <= 2) {
    if (bytes <= 2) return function(std::integral_constant<int, 2>{});
  }
  if constexpr (sizeof(scalar_t) <= 4) {
    if (bytes <= 4) return function(std::integral_constant<int, 4>{});
  }
  if constexpr (sizeof(scalar_t) <= 8) {
    if (bytes <= 8) return function(std::integral_constant<int, 8>{});
  }
  function(std::integral_constant<int, 16>{});
}

inline bool is_aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// One block per kThreadsPerBlock work items: measured on an H200 (docs/benchmarks.md), this
// streams 6% faster than a persistent grid of SM-count blocks with a loop, and launches small
// tensors faster. The kernels still loop, so a grid capped below CUDA's limit stays correct.
inline unsigned int grid_size(int64_t work_items, int threads_per_block = kThreadsPerBlock) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 30;
  const int64_t blocks = (work_items + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

// The default bit predicate of apply_binary_vector: no bits (the kernels that write no mask).
struct NoMaskBits {
  template <typename opmath_t>
  __device__ bool operator()(opmath_t) const { return false; }
};

// out = op(a, b) over the 16-byte vector at `index`; both loads are issued before either is used.
// Returns bit_op(a) of the vector's elements, element j in bit j (cuda_masked_elementwise.cuh).
template <typename scalar_t, typename Op, typename BitOp = NoMaskBits>
__device__ __forceinline__ uint32_t apply_binary_vector(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                                                        const scalar_t* __restrict__ b, int64_t index, const Op& op,
                                                        const BitOp& bit_op = {}) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  const Vec a_vector = load_vec16(a, index);
  const Vec b_vector = load_vec16(b, index);
  opmath_t a_values[Vec::kSize], b_values[Vec::kSize], results[Vec::kSize];
  unpack_vec16(a_vector, a_values);
  unpack_vec16(b_vector, b_values);
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < Vec::kSize; ++j) {
    results[j] = op(a_values[j], b_values[j]);
    bits |= uint32_t(bit_op(a_values[j])) << j;
  }
  store_vec16(out, index, pack_vec16<scalar_t>(results));
  return bits;
}

template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_vectorized_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                             const scalar_t* __restrict__ b, int64_t numel, Op op) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  const int64_t num_vectors = numel / Vec::kSize;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t index = thread; index < num_vectors; index += thread_count) {
    apply_binary_vector(out, a, b, index, op);
  }
  // Fewer than one vector of elements is left at the end.
  const int64_t tail = num_vectors * Vec::kSize + thread;
  if (tail < numel) {
    out[tail] = static_cast<scalar_t>(
        op(static_cast<opmath_t>(a[tail]), static_cast<opmath_t>(b[tail])));
  }
}

// Dense sizes that whole blocks cover exactly, with 32-bit vector indices: one vector per thread (as
// binary_vectorized_kernel's grid gives), without its loop, tail and bounds check. These let every
// parameter read issue at once instead of after the check; 0.06-0.17 µs off each relu_add kernel
// at 4096-262144 elements (H200, docs/benchmarks.md Change 19), as Inductor's kernels for sizes
// their blocks divide.
template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_exact_grid_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                             const scalar_t* __restrict__ b, Op op) {
  begin_dependent_kernel();
  const int index = blockIdx.x * kThreadsPerBlock + threadIdx.x;
  apply_binary_vector(out, a, b, index, op);
}

struct BinaryStridedLayout {
  int dims;  // innermost dim last
  int64_t sizes[kMaxStridedDims];
  int64_t a_strides[kMaxStridedDims];
  int64_t b_strides[kMaxStridedDims];
};

// The offsets in `a` and `b` of element `linear` of the output (C order over layout.sizes).
__device__ __forceinline__ void strided_offsets(const BinaryStridedLayout& layout, int64_t linear, int64_t& a_offset,
                                                int64_t& b_offset) {
  int64_t remaining = linear;
  a_offset = 0;
  b_offset = 0;
#pragma unroll
  for (int d = kMaxStridedDims - 1; d >= 0; --d) {
    if (d < layout.dims) {
      const int64_t coordinate = remaining % layout.sizes[d];
      remaining /= layout.sizes[d];
      a_offset += coordinate * layout.a_strides[d];
      b_offset += coordinate * layout.b_strides[d];
    }
  }
}

template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_strided_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                          const scalar_t* __restrict__ b, int64_t numel,
                          BinaryStridedLayout layout, Op op) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t linear = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; linear < numel;
       linear += thread_count) {
    int64_t a_offset, b_offset;
    strided_offsets(layout, linear, a_offset, b_offset);
    out[linear] = static_cast<scalar_t>(
        op(static_cast<opmath_t>(a[a_offset]), static_cast<opmath_t>(b[b_offset])));
  }
}

// Lays `b` over `a`'s dims (missing leading dims and size-1 dims broadcast with stride 0),
// drops size-1 dims and merges neighbours that are contiguous with each other in both inputs.
// Returns false when more than kMaxStridedDims dims remain.
inline bool coalesce_binary_layout(const at::Tensor& a, const at::Tensor& b,
                                   BinaryStridedLayout& layout) {
  const at::IntArrayRef sizes = a.sizes(), a_strides = a.strides();
  const at::IntArrayRef b_sizes = b.sizes(), b_strides = b.strides();
  const size_t leading = sizes.size() - b_sizes.size();
  int dims = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    const int64_t b_stride = (d < leading || b_sizes[d - leading] == 1) ? 0 : b_strides[d - leading];
    if (dims > 0 && layout.a_strides[dims - 1] == a_strides[d] * sizes[d] &&
        layout.b_strides[dims - 1] == b_stride * sizes[d]) {
      layout.sizes[dims - 1] *= sizes[d];
      layout.a_strides[dims - 1] = a_strides[d];
      layout.b_strides[dims - 1] = b_stride;
      continue;
    }
    if (dims == kMaxStridedDims) return false;
    layout.sizes[dims] = sizes[d];
    layout.a_strides[dims] = a_strides[d];
    layout.b_strides[dims] = b_stride;
    ++dims;
  }
  layout.dims = dims;
  return true;
}

// The kernel that a binary op's operands take.
enum class BinaryPath {
  ExactGrid,   // dense, aligned, and whole blocks of 16-byte vectors cover every element
  Vectorized,  // dense and aligned
  Strided,     // anything else
};

struct BinaryOperands {
  at::Tensor a, b;  // the inputs, or contiguous copies where they had more than kMaxStridedDims dims
  BinaryStridedLayout layout;
  BinaryPath path;
};

template <typename scalar_t>
BinaryOperands binary_operands_of(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  BinaryOperands operands{a, b, {}, BinaryPath::Strided};
  if (!coalesce_binary_layout(operands.a, operands.b, operands.layout)) {
    // Rare: more dims than the index math unrolls for; contiguous copies coalesce to one.
    operands.a = a.contiguous();
    operands.b = b.expand(a.sizes()).contiguous();
    coalesce_binary_layout(operands.a, operands.b, operands.layout);
  }
  const BinaryStridedLayout& layout = operands.layout;
  const bool dense = layout.dims <= 1 && (layout.dims == 0 || (layout.a_strides[0] == 1 && layout.b_strides[0] == 1));
  if (dense && is_aligned16(operands.a.const_data_ptr()) && is_aligned16(operands.b.const_data_ptr()) &&
      is_aligned16(out.const_data_ptr())) {
    const int64_t numel = out.numel();
    const int64_t num_vectors = numel / Vec16<scalar_t>::kSize;
    const bool whole_blocks = numel % (Vec16<scalar_t>::kSize * kThreadsPerBlock) == 0 &&
                              num_vectors <= std::numeric_limits<int>::max();
    operands.path = whole_blocks ? BinaryPath::ExactGrid : BinaryPath::Vectorized;
  }
  return operands;
}

// Op<opmath_t> is a functor `opmath_t(opmath_t a, opmath_t b)` built from `params`.
template <template <typename> class Op, typename... Params>
at::Tensor binary_elementwise_cuda(const at::Tensor& a, const at::Tensor& b,
                                   Params... params) {
  const c10::cuda::CUDAGuard device_guard(a.device());
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  FUSED_DISPATCH_FLOATING_TYPES(a.scalar_type(), "binary_elementwise_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{static_cast<opmath_t>(params)...};
    const BinaryOperands operands = binary_operands_of<scalar_t>(a, b, out);
    const scalar_t* a_data = operands.a.const_data_ptr<scalar_t>();
    const scalar_t* b_data = operands.b.const_data_ptr<scalar_t>();
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    const int64_t num_vectors = numel / Vec16<scalar_t>::kSize;
    switch (operands.path) {
      case BinaryPath::ExactGrid:
        launch_kernel(binary_exact_grid_kernel<scalar_t, Op<opmath_t>>, num_vectors / kThreadsPerBlock,
                      kThreadsPerBlock, 0, stream, out_data, a_data, b_data, op);
        break;
      case BinaryPath::Vectorized:
        launch_kernel(binary_vectorized_kernel<scalar_t, Op<opmath_t>>, grid_size(num_vectors), kThreadsPerBlock,
                      0, stream, out_data, a_data, b_data, numel, op);
        break;
      case BinaryPath::Strided:
        launch_kernel(binary_strided_kernel<scalar_t, Op<opmath_t>>, grid_size(numel), kThreadsPerBlock, 0, stream,
                      out_data, a_data, b_data, numel, operands.layout, op);
        break;
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace cuda
}  // namespace fused_ops
