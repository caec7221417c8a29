// CUDA entry points of layer_norm, add_layer_norm and layer_norm_backward.
#include "../norm.h"
#include "dispatch.cuh"

namespace fused_ops {

at::Tensor layer_norm_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          double eps) {
  return std::get<0>(norm_forward(x, nullptr, weight, bias, eps, [&](const NormForwardProblem& problem) {
    cuda::norm_forward_cuda<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type(), x.device());
  }));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                      double eps) {
  return norm_forward(x, &residual, weight, bias, eps, [&](const NormForwardProblem& problem) {
    cuda::norm_forward_cuda<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type(), x.device());
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, double eps,
    const std::optional<at::Tensor>& grad_residual) {
  return norm_backward(NormKind::Layer, grad, x, weight, grad_residual, eps, [&](const NormBackwardProblem& problem) {
    cuda::norm_backward_cuda<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type(), x.device());
  });
}

}  // namespace fused_ops
