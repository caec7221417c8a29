#include "silu_mul.h"

#include "../common/cpu_rowwise.h"

namespace fused_ops {

at::Tensor silu_mul_cpu(const at::Tensor& x) {
  return gated_forward(x, [&](const auto& problem) { rowwise_cpu<SiluMulForward>(problem, x.scalar_type()); });
}

at::Tensor silu_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  return gated_backward(grad, x, [&](const auto& problem) {
    rowwise_cpu<SiluMulBackward>(problem, x.scalar_type());
  });
}

}  // namespace fused_ops
