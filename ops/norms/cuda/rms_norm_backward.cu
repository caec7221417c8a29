// CUDA entry point of rms_norm_backward (which add_rms_norm's backward calls too).
#include "../norm.h"
#include "dispatch.cuh"

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                          const OptionalWeight& weight, double eps,
                                                          const std::optional<at::Tensor>& grad_residual,
                                                          double offset) {
  auto [grad_x, grad_weight, grad_bias] =
      norm_backward(NormKind::RMS, grad, x, weight, grad_residual, eps, offset,
                    [&](const NormBackwardProblem& problem, at::ScalarType weight_dtype) {
                      cuda::norm_backward_cuda<NormKind::RMS>(problem, x.scalar_type(), weight_dtype, x.device());
                    });
  return {grad_x, grad_weight};
}

}  // namespace fused_ops
