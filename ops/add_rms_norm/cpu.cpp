#include "add_rms_norm.h"

#include "../common/cpu_norm.h"

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  return norm_forward(x, &residual, weight, std::nullopt, eps, [&](const NormForwardProblem& problem) {
    cpu::norm_forward_cpu<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type());
  });
}

}  // namespace fused_ops
