#include "relu_add.h"

#include "cpu_loops.h"

namespace fused_ops {

at::Tensor relu_add_cpu(const at::Tensor& x, const at::Tensor& y, double bias) {
  return binary_elementwise_cpu<ReluAddForward>(x, y, bias);
}

at::Tensor relu_add_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  return binary_elementwise_cpu<ReluAddBackward>(grad, x);
}

std::tuple<at::Tensor, at::Tensor> relu_add_with_mask_cpu(const at::Tensor& x, const at::Tensor& y, double bias) {
  return {binary_elementwise_cpu<ReluAddForward>(x, y, bias), bit_mask_cpu<ReluPassesGradient>(x)};
}

at::Tensor relu_add_backward_masked_cpu(const at::Tensor& grad, const at::Tensor& mask) {
  return masked_gradient_cpu(grad, mask);
}

}  // namespace fused_ops
