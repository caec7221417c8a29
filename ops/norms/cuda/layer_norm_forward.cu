// CUDA entry points of layer_norm and add_layer_norm (the forward kernels compile here, the backward's in
// layer_norm_backward.cu, so the two build in parallel).
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

}  // namespace fused_ops
