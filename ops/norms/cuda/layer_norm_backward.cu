// CUDA entry point of layer_norm_backward (which add_layer_norm's backward calls too).
#include "../norm.h"
#include "dispatch.cuh"

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const OptionalWeight& weight, double eps,
    const std::optional<at::Tensor>& grad_residual, double offset) {
  return norm_backward(NormKind::Layer, grad, x, weight, grad_residual, eps, offset,
                       [&](const NormBackwardProblem& problem, at::ScalarType weight_dtype) {
                         cuda::norm_backward_cuda<NormKind::Layer>(problem, x.scalar_type(), weight_dtype, x.device());
                       });
}

}  // namespace fused_ops
