#include "add_layer_norm.h"

#include "../common/cuda_norm.cuh"

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                      double eps) {
  return norm_forward(x, &residual, weight, bias, eps, [&](const NormForwardProblem& problem) {
    cuda::norm_forward_cuda<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type(), x.device());
  });
}

}  // namespace fused_ops
