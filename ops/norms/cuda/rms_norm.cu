// CUDA entry points of rms_norm, add_rms_norm and rms_norm_backward.
#include "../norm.h"
#include "dispatch.cuh"

namespace fused_ops {

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return std::get<0>(norm_forward(x, nullptr, weight, std::nullopt, eps, [&](const NormForwardProblem& problem) {
    cuda::norm_forward_cuda<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type(), x.device());
  }));
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  return norm_forward(x, &residual, weight, std::nullopt, eps, [&](const NormForwardProblem& problem) {
    cuda::norm_forward_cuda<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type(), x.device());
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                         const at::Tensor& weight, double eps,
                                                         const std::optional<at::Tensor>& grad_residual) {
  auto [grad_x, grad_weight, grad_bias] =
      norm_backward(NormKind::RMS, grad, x, weight, grad_residual, eps, [&](const NormBackwardProblem& problem) {
        cuda::norm_backward_cuda<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type(), x.device());
      });
  return {grad_x, grad_weight};
}

}  // namespace fused_ops
