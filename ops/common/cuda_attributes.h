#pragma once
// Attributes of a GPU, for host code in C++ and CUDA sources alike.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

namespace fused_ops {
namespace cuda {

inline int sm_count(int device = c10::cuda::current_device()) {
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

inline int compute_capability_major(int device = c10::cuda::current_device()) {
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

inline int compute_capability_minor(int device = c10::cuda::current_device()) {
  int minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return minor;
}

// Shared memory one block may use (static plus dynamic, after opting in) on `device`.
inline int max_shared_bytes_per_block(int device = c10::cuda::current_device()) {
  int bytes = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}

}  // namespace cuda
}  // namespace fused_ops
