// CPU reference kernels of the norm family (loops in cpu_loops.h).
#include "cpu_loops.h"
#include "norm.h"

namespace fused_ops {

at::Tensor rms_norm_cpu(const at::Tensor& x, const OptionalWeight& weight, double eps, double offset) {
  return std::get<0>(norm_forward(x, nullptr, weight, std::nullopt, eps, offset,
                                  [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                                    cpu::norm_forward_cpu<NormKind::RMS>(problem, x.scalar_type(), weight_dtype);
                                  }));
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const OptionalWeight& weight, double eps, double offset) {
  return norm_forward(x, &residual, weight, std::nullopt, eps, offset,
                      [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                        cpu::norm_forward_cpu<NormKind::RMS>(problem, x.scalar_type(), weight_dtype);
                      });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                         const OptionalWeight& weight, double eps,
                                                         const std::optional<at::Tensor>& grad_residual,
                                                         double offset) {
  auto [grad_x, grad_weight, grad_bias] =
      norm_backward(NormKind::RMS, grad, x, weight, grad_residual, eps, offset,
                    [&](const NormBackwardProblem& problem, at::ScalarType weight_dtype) {
                      cpu::norm_backward_cpu<NormKind::RMS>(problem, x.scalar_type(), weight_dtype);
                    });
  return {grad_x, grad_weight};
}

at::Tensor layer_norm_cpu(const at::Tensor& x, const OptionalWeight& weight, const std::optional<at::Tensor>& bias,
                          double eps, double offset) {
  return std::get<0>(norm_forward(x, nullptr, weight, bias, eps, offset,
                                  [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                                    cpu::norm_forward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight_dtype);
                                  }));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                      const OptionalWeight& weight,
                                                      const std::optional<at::Tensor>& bias, double eps,
                                                      double offset) {
  return norm_forward(x, &residual, weight, bias, eps, offset,
                      [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                        cpu::norm_forward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight_dtype);
                      });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const OptionalWeight& weight, double eps,
    const std::optional<at::Tensor>& grad_residual, double offset) {
  return norm_backward(NormKind::Layer, grad, x, weight, grad_residual, eps, offset,
                       [&](const NormBackwardProblem& problem, at::ScalarType weight_dtype) {
                         cpu::norm_backward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight_dtype);
                       });
}

}  // namespace fused_ops
