// silu_mul_linear and its backward from the registered silu_mul ops and ATen's products, for every
// backend. The checks (registration/checks.cpp) have run.
#include "silu_mul_linear.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "../common/tensors.h"

namespace fused_ops {
namespace {

at::Tensor silu_mul(const at::Tensor& x) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("fused::silu_mul", "").typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

at::Tensor silu_mul_backward(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::silu_mul_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, x);
}

}  // namespace

at::Tensor silu_mul_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  return at::linear(silu_mul(x), weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> silu_mul_linear_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                        const at::Tensor& weight,
                                                                        std::array<bool, 3> output_mask) {
  // The gradients not asked for are empty tensors (an op's outputs are always defined).
  at::Tensor grad_x = at::empty({0}, x.options()), grad_weight = at::empty({0}, weight.options());
  at::Tensor grad_bias = at::empty({0}, weight.options());
  if (output_mask[0]) grad_x = silu_mul_backward(at::matmul(grad, weight), x);
  const at::Tensor grad_rows = as_rows(grad);
  // The activation exists only from here to the weight gradient's product.
  if (output_mask[1]) grad_weight = grad_rows.t().mm(as_rows(silu_mul(x)));
  if (output_mask[2]) grad_bias = grad_rows.sum(0);
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace fused_ops
