#include <torch/library.h>

#include "../ops/relu_add/relu_add.h"
#include "checks.h"

namespace fused_ops {
namespace {

at::Tensor relu_add(const at::Tensor& x, const at::Tensor& y, double bias) {
  check_relu_add_arguments(x, y);
  return relu_add_cuda(x, y, bias);
}

at::Tensor relu_add_backward(const at::Tensor& grad, const at::Tensor& x) {
  check_relu_add_backward_arguments(grad, x);
  return relu_add_backward_cuda(grad, x);
}

}  // namespace
}  // namespace fused_ops

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("relu_add", &fused_ops::relu_add);
  m.impl("relu_add_backward", &fused_ops::relu_add_backward);
}
