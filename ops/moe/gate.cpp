// The experts' gate on the gate/up product of every pair, and its gradient: act(gate) * up through the fused
// silu_mul / gelu_mul ops ([gate; up] halves) or gated_mul (gate and up interleaved, column 2i and 2i + 1), and
// gpt-oss's clamped SwiGLU from ATen's ops in float32.
#include <ATen/OpMathType.h>

#include "../activations/registered_ops.h"
#include "moe.h"

namespace fused_ops {
namespace {

c10::string_view gelu_approximation(c10::string_view activation) { return activation == "gelu" ? "none" : "tanh"; }

// The gate and up columns of gate_up [S, 2I].
std::pair<at::Tensor, at::Tensor> gate_and_up(const at::Tensor& gate_up, bool interleaved) {
  const int64_t width = gate_up.size(1) / 2;
  if (interleaved) return {gate_up.slice(1, 0, 2 * width, 2), gate_up.slice(1, 1, 2 * width, 2)};
  return {gate_up.narrow(1, 0, width), gate_up.narrow(1, width, width)};
}

// [gate gradient, up gradient] back into gate_up's column layout.
at::Tensor joined(const at::Tensor& grad_gate, const at::Tensor& grad_up, bool interleaved) {
  return interleaved ? at::stack({grad_gate, grad_up}, 2).flatten(1) : at::cat({grad_gate, grad_up}, 1);
}

}  // namespace

at::Tensor experts_gate(const at::Tensor& gate_up, const MoeExpertOptions& options) {
  auto [gate, up] = gate_and_up(gate_up, options.interleaved);
  if (options.activation == "swiglu_oai") {
    // (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit)
    const at::Tensor g = gate.to(at::toOpMathType(gate.scalar_type())).clamp_max(options.limit);
    const at::Tensor u = up.to(at::toOpMathType(up.scalar_type())).clamp(-options.limit, options.limit);
    return ((u + 1) * g * at::sigmoid(g * options.alpha)).to(gate_up.scalar_type());
  }
  if (options.interleaved) return registered::gated_mul(gate, up, options.activation);
  if (options.activation == "silu") return registered::silu_mul(gate_up);
  return registered::gelu_mul(gate_up, gelu_approximation(options.activation));
}

at::Tensor experts_gate_backward(const at::Tensor& grad, const at::Tensor& gate_up, const MoeExpertOptions& options) {
  auto [gate, up] = gate_and_up(gate_up, options.interleaved);
  if (options.activation == "swiglu_oai") {
    // Where a clamp holds its input at the limit, that input gets no gradient (clamp's own rule: inside the
    // bounds, the bounds included, it passes).
    const at::ScalarType opmath = at::toOpMathType(gate.scalar_type());
    const at::Tensor gate_value = gate.to(opmath), up_value = up.to(opmath), gradient = grad.to(opmath);
    const at::Tensor g = gate_value.clamp_max(options.limit);
    const at::Tensor u = up_value.clamp(-options.limit, options.limit);
    const at::Tensor sigmoid = at::sigmoid(g * options.alpha);
    const at::Tensor glu = g * sigmoid;
    const at::Tensor grad_g = gradient * (u + 1) * (sigmoid + options.alpha * glu * (1 - sigmoid));
    const at::Tensor grad_gate = grad_g * gate_value.le(options.limit);
    const at::Tensor grad_up = gradient * glu * up_value.ge(-options.limit).logical_and(up_value.le(options.limit));
    return joined(grad_gate, grad_up, options.interleaved).to(gate_up.scalar_type());
  }
  if (options.interleaved) {
    auto [grad_gate, grad_up] = registered::gated_mul_backward(grad, gate, up, options.activation);
    return joined(grad_gate, grad_up, true);
  }
  if (options.activation == "silu") return registered::silu_mul_backward(grad, gate_up);
  return registered::gelu_mul_backward(grad, gate_up, gelu_approximation(options.activation));
}

}  // namespace fused_ops
