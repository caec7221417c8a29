#include "cuda_targets.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <atomic>

#include <cuda_runtime.h>

// The TORCH_CUDA_ARCH_LIST of the build (CMakeLists.txt).
#ifndef FUSED_OPS_CUDA_ARCH_LIST
#define FUSED_OPS_CUDA_ARCH_LIST "unknown targets"
#endif

namespace fused_ops {
namespace cuda {
namespace {

// Built for the same targets as every kernel of the library: whether the GPU has code for it answers for all.
__global__ void kernel_image_probe_kernel() {}

}  // namespace

void check_kernels_run_on(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> runs_on[kMaxDevices] = {};
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && runs_on[device].load(std::memory_order_relaxed)) return;
  const c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  cudaFuncAttributes attributes;
  const cudaError_t status = cudaFuncGetAttributes(&attributes, kernel_image_probe_kernel);
  if (status == cudaSuccess) {
    if (cached) runs_on[device].store(true, std::memory_order_relaxed);
    return;
  }
  (void)cudaGetLastError();  // the failed query is answered here, not by the next launch check
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  cudaDeviceProp properties;
  C10_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  TORCH_CHECK(false, "fused_ops: the CUDA kernels, built for ", FUSED_OPS_CUDA_ARCH_LIST, ", do not run on ",
              properties.name, " (cuda:", device, ", compute capability ", major, ".", minor,
              "): ", cudaGetErrorString(status), "; rebuild fused_ops for it: TORCH_CUDA_ARCH_LIST=", major, ".",
              minor, " scripts/setup.sh, or TORCH_CUDA_ARCH_LIST=", major, ".", minor,
              " pip install --no-build-isolation . in its source folder");
}

}  // namespace cuda
}  // namespace fused_ops
