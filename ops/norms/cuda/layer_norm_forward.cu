// CUDA entry points of layer_norm and add_layer_norm (the forward kernels compile here, the backward's in
// layer_norm_backward.cu, so the two build in parallel).
#include "../norm.h"
#include "dispatch.cuh"

namespace fused_ops {

at::Tensor layer_norm_cuda(const at::Tensor& x, const OptionalWeight& weight, const std::optional<at::Tensor>& bias,
                           double eps, double offset) {
  return std::get<0>(norm_forward(x, nullptr, weight, bias, eps, offset,
                                  [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                                    cuda::norm_forward_cuda<NormKind::Layer>(problem, x.scalar_type(), weight_dtype,
                                                                             x.device());
                                  }));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                       const OptionalWeight& weight,
                                                       const std::optional<at::Tensor>& bias, double eps,
                                                       double offset) {
  return norm_forward(x, &residual, weight, bias, eps, offset,
                      [&](const NormForwardProblem& problem, at::ScalarType weight_dtype) {
                        cuda::norm_forward_cuda<NormKind::Layer>(problem, x.scalar_type(), weight_dtype, x.device());
                      });
}

}  // namespace fused_ops
