#include "layer_norm.h"

#include "../common/cpu_norm.h"

namespace fused_ops {

at::Tensor layer_norm_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          double eps) {
  return std::get<0>(norm_forward(x, nullptr, weight, bias, eps, [&](const NormForwardProblem& problem) {
    cpu::norm_forward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type());
  }));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, double eps,
    const std::optional<at::Tensor>& grad_residual) {
  return norm_backward(NormKind::Layer, grad, x, weight, grad_residual, eps, [&](const NormBackwardProblem& problem) {
    cpu::norm_backward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type());
  });
}

}  // namespace fused_ops
