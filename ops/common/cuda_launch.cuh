#pragma once
// Every kernel of the library launches through launch_kernel (or cluster_launch, norms/cuda/clusters.cuh) with
// programmatic dependent launch on sm_90 and newer: the GPU may start a kernel's blocks while the
// kernel before it in the stream is still finishing, which hides most of the gap between two short
// kernels (CUDA-graph replays of decode-sized calls). Correctness rests on one rule: every kernel
// calls begin_dependent_kernel() before its first global memory access. griddepcontrol.wait returns
// once the previous kernel has completed and its writes are visible, so nothing is read early and
// nothing the previous kernel still reads is overwritten; without the launch attribute (older GPUs,
// FUSED_OPS_PROGRAMMATIC_LAUNCH=0) both instructions do nothing.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <cuda_runtime.h>

#include "cuda_device.cuh"

namespace fused_ops {
namespace cuda {

constexpr int kThreadsPerBlock = 256;

// One block per kThreadsPerBlock work items, which streams faster than a persistent grid of SM-count
// blocks with a loop and launches small tensors sooner (docs/design.md). The kernels still loop, so a
// grid capped below CUDA's limit stays correct.
inline unsigned int grid_size(int64_t work_items, int threads_per_block = kThreadsPerBlock) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 30;
  const int64_t blocks = (work_items + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

__device__ __forceinline__ void begin_dependent_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // The next kernel may now be scheduled once every block of this one has started; it waits in its
  // own begin_dependent_kernel until this grid completes.
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// FUSED_OPS_PROGRAMMATIC_LAUNCH=0, read once per process, launches every kernel after the previous one.
// Code built for older GPUs only never waits, so it must not launch early on a newer one either.
inline bool programmatic_launch_enabled() {
  static const bool allowed = [] {
    const char* setting = std::getenv("FUSED_OPS_PROGRAMMATIC_LAUNCH");
    return setting == nullptr || std::strcmp(setting, "0") != 0;
  }();
  return allowed && runs_sm90_code();
}

// `attributes` has room for the caller's attributes plus the programmatic-launch one, appended here
// when `early` and the GPU has it.
template <typename... Parameters, typename... Arguments>
void launch_kernel_with(cudaLaunchConfig_t config, cudaLaunchAttribute* attributes, bool early,
                        void (*kernel)(Parameters...), Arguments&&... arguments) {
  if (early && programmatic_launch_enabled()) {
    cudaLaunchAttribute& programmatic = attributes[config.numAttrs];
    programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    programmatic.val.programmaticStreamSerializationAllowed = 1;
    config.numAttrs += 1;
  }
  config.attrs = attributes;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Arguments>(arguments)...));
}

// early = false: the kernel starts only after the previous one has finished (the norms' persistent
// backward and its column sums).
template <typename... Parameters, typename... Arguments>
void launch_kernel_at(bool early, void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Arguments&&... arguments) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[1];
  launch_kernel_with(config, attributes, early, kernel, std::forward<Arguments>(arguments)...);
}

template <typename... Parameters, typename... Arguments>
void launch_kernel(void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   Arguments&&... arguments) {
  launch_kernel_at(true, kernel, grid, block, shared_bytes, stream, std::forward<Arguments>(arguments)...);
}

}  // namespace cuda
}  // namespace fused_ops
