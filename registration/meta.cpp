// Shapes, dtypes and devices only, with SymInt sizes: FakeTensor, torch.compile with dynamic
// shapes and torch.export work from these kernels alone.
#include <torch/library.h>

#include "checks.h"

namespace fused_ops {
namespace {

at::Tensor relu_add(const at::Tensor& x, const at::Tensor& y, double /*bias*/) {
  check_relu_add_arguments(x, y);
  return at::empty_symint(x.sym_sizes(), x.options());
}

at::Tensor relu_add_backward(const at::Tensor& grad, const at::Tensor& x) {
  check_relu_add_backward_arguments(grad, x);
  return at::empty_symint(grad.sym_sizes(), grad.options());
}

}  // namespace
}  // namespace fused_ops

TORCH_LIBRARY_IMPL(fused, Meta, m) {
  m.impl("relu_add", &fused_ops::relu_add);
  m.impl("relu_add_backward", &fused_ops::relu_add_backward);
}
