// CUDA entry points of rms_norm and add_rms_norm (the forward kernels compile here, the backward's in
// rms_norm_backward.cu, so the two build in parallel).
#include "../norm.h"
#include "dispatch.cuh"

namespace fused_ops {

at::Tensor rms_norm_cuda(const at::Tensor& x, const OptionalWeight& weight, double eps, double offset) {
  return std::get<0>(norm_forward(x, nullptr, weight, std::nullopt, eps, offset,
                                  [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                                    cuda::norm_forward_cuda<NormKind::RMS>(problem, x.scalar_type(), weight_dtype,
                                                                           x.device());
                                  }));
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                     const OptionalWeight& weight, double eps, double offset) {
  return norm_forward(x, &residual, weight, std::nullopt, eps, offset,
                      [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                        cuda::norm_forward_cuda<NormKind::RMS>(problem, x.scalar_type(), weight_dtype, x.device());
                      });
}

}  // namespace fused_ops
