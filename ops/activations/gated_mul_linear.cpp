// gated_mul_linear and its backward from the registered gated_mul ops and ATen's products, for every
// backend, and gated_mul's backward from differentiable ATen ops. The checks (registration/checks.cpp) have run.
#include "gated_mul_linear.h"

#include "../common/tensors.h"
#include "registered_ops.h"

namespace fused_ops {

using registered::gated_mul;
using registered::gated_mul_backward;

std::tuple<at::Tensor, at::Tensor> gated_mul_backward_composite(const at::Tensor& grad, const at::Tensor& gate,
                                                                const at::Tensor& up, GatedActivation activation) {
  if (activation == GatedActivation::Silu) {
    const at::Tensor sigmoid = at::sigmoid(gate);  // aten's silu_backward has no derivative
    const at::Tensor silu_derivative = sigmoid * (1 + gate * (1 - sigmoid));
    return {grad * up * silu_derivative, grad * gate * sigmoid};
  }
  const c10::string_view approximate = activation == GatedActivation::Gelu ? "none" : "tanh";
  return {at::gelu_backward(grad * up, gate, approximate), grad * at::gelu(gate, approximate)};
}

at::Tensor gated_mul_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::string_view activation) {
  return at::linear(gated_mul(gate, up, activation), weight, bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_mul_linear_backward(
    const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
    c10::string_view activation, std::array<bool, 4> output_mask) {
  // The gradients not asked for are empty tensors (an op's outputs are always defined).
  at::Tensor grad_gate = at::empty({0}, gate.options()), grad_up = at::empty({0}, up.options());
  at::Tensor grad_weight = at::empty({0}, weight.options()), grad_bias = at::empty({0}, weight.options());
  if (output_mask[0] || output_mask[1]) {
    auto [gate_gradient, up_gradient] = gated_mul_backward(at::matmul(grad, weight), gate, up, activation);
    if (output_mask[0]) grad_gate = gate_gradient;
    if (output_mask[1]) grad_up = up_gradient;
  }
  const at::Tensor grad_rows = as_rows(grad);
  // The activation exists only from here to the weight gradient's product.
  if (output_mask[2]) grad_weight = grad_rows.t().mm(as_rows(gated_mul(gate, up, activation)));
  if (output_mask[3]) grad_bias = grad_rows.sum(0);
  return {grad_gate, grad_up, grad_weight, grad_bias};
}

}  // namespace fused_ops
