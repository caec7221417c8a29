#include "gelu_mul.h"

#include "../common/cpu_rowwise.h"

namespace fused_ops {

at::Tensor gelu_mul_cpu(const at::Tensor& x, GeluApproximation approximation) {
  return gated_forward(x, [&](const auto& problem) {
    rowwise_cpu<GeluMul<GeluApproximation>::Forward>(problem, x.scalar_type(), approximation);
  });
}

at::Tensor gelu_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& x, GeluApproximation approximation) {
  return gated_backward(grad, x, [&](const auto& problem) {
    rowwise_cpu<GeluMul<GeluApproximation>::Backward>(problem, x.scalar_type(), approximation);
  });
}

}  // namespace fused_ops
