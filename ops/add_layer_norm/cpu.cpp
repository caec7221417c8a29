#include "add_layer_norm.h"

#include "../common/cpu_norm.h"

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                      double eps) {
  return norm_forward(x, &residual, weight, bias, eps, [&](const NormForwardProblem& problem) {
    cpu::norm_forward_cpu<NormKind::Layer>(problem, x.scalar_type(), weight.scalar_type());
  });
}

}  // namespace fused_ops
