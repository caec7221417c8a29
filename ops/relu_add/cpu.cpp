#include "relu_add.h"

#include "../common/cpu_elementwise.h"

namespace fused_ops {

at::Tensor relu_add_cpu(const at::Tensor& x, const at::Tensor& y, double bias) {
  return binary_elementwise_cpu<ReluAddForward>(x, y, bias);
}

at::Tensor relu_add_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  return binary_elementwise_cpu<ReluAddBackward>(grad, x);
}

}  // namespace fused_ops
