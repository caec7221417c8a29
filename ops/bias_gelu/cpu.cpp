#include "bias_gelu.h"

#include "../common/cpu_rowwise.h"

namespace fused_ops {

at::Tensor bias_gelu_cpu(const at::Tensor& x, const at::Tensor& bias, GeluApproximation approximation) {
  return bias_gelu_forward(x, bias, [&](const auto& problem) {
    rowwise_cpu<BiasGeluForward>(problem, x.scalar_type(), approximation);
  });
}

at::Tensor bias_gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias,
                                  GeluApproximation approximation) {
  return bias_gelu_backward(grad, x, bias, [&](const auto& problem) {
    rowwise_cpu<BiasGeluBackward>(problem, x.scalar_type(), approximation);
  });
}

}  // namespace fused_ops
