// CPU reference kernels of the norm family (loops in cpu_loops.h).
#include "cpu_loops.h"
#include "norm.h"

namespace fused_ops {

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return std::get<0>(norm_forward(x, nullptr, weight, std::nullopt, eps, [&](const NormForwardProblem& problem) {
    cpu::norm_forward_cpu<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type());
  }));
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  return norm_forward(x, &residual, weight, std::nullopt, eps, [&](const NormForwardProblem& problem) {
    cpu::norm_forward_cpu<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type());
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                         const at::Tensor& weight, double eps,
                                                         const std::optional<at::Tensor>& grad_residual) {
  auto [grad_x, grad_weight, grad_bias] =
      norm_backward(NormKind::RMS, grad, x, weight, grad_residual, eps, [&](const NormBackwardProblem& problem) {
        cpu::norm_backward_cpu<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type());
      });
  return {grad_x, grad_weight};
}

at::Tensor layer_norm_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          double eps) {
  return std::get<0>(norm_forward(x, nullptr, weight, bias, eps, [&](const NormForwardProblem& problem) {
    cpu::norm_forward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type());
  }));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                      double eps) {
  return norm_forward(x, &residual, weight, bias, eps, [&](const NormForwardProblem& problem) {
    cpu::norm_forward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type());
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, double eps,
    const std::optional<at::Tensor>& grad_residual) {
  return norm_backward(NormKind::Layer, grad, x, weight, grad_residual, eps, [&](const NormBackwardProblem& problem) {
    cpu::norm_backward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type());
  });
}

}  // namespace fused_ops
