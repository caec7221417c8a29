#pragma once
// Facts about the current GPU that launch configurations depend on.
#include <atomic>

#include "cuda_attributes.h"

namespace fused_ops {
namespace cuda {

// Compiled like every kernel of the library; its PTX version is that of the code the GPU runs.
template <int = 0>
__global__ void sm90_code_probe_kernel() {}

// Whether the current GPU runs this library's code as compiled for sm_90 or newer: compute capability
// 9.0+ and not a build for older GPUs only, JIT-compiled from their PTX. Such code has the cluster
// kernels' bodies and the griddepcontrol instructions (cuda_launch.cuh). Every CUDA source is built
// for the same architectures, so one probe answers for all kernels; cached per device.
inline bool runs_sm90_code() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known_by_device[kMaxDevices] = {};  // 0 unknown, 1 yes, -1 no
  const int device = c10::cuda::current_device();
  auto probe = [device] {
    if (compute_capability_major(device) < 9) return false;
    cudaFuncAttributes attributes;
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, sm90_code_probe_kernel<>));
    return attributes.ptxVersion >= 90;
  };
  if (device >= kMaxDevices) return probe();
  int known = known_by_device[device].load(std::memory_order_relaxed);
  if (known == 0) {
    known = probe() ? 1 : -1;
    known_by_device[device].store(known, std::memory_order_relaxed);
  }
  return known > 0;
}

}  // namespace cuda
}  // namespace fused_ops
