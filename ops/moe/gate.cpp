// The experts' gate on the gate/up product of every pair, and its gradient: act(gate) * up through the fused
// silu_mul / gelu_mul ops ([gate; up] halves) or gated_mul (gate and up interleaved, column 2i and 2i + 1), and
// gpt-oss's clamped SwiGLU through the backend's kernels (ATen's ops in float32 here, the reference).
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

at::Tensor clamped_gate_composite(const at::Tensor& gate_up, bool interleaved, double alpha, double limit) {
  auto [gate, up] = gate_and_up(gate_up, interleaved);
  // (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit)
  const at::Tensor g = gate.to(at::toOpMathType(gate.scalar_type())).clamp_max(limit);
  const at::Tensor u = up.to(at::toOpMathType(up.scalar_type())).clamp(-limit, limit);
  return ((u + 1) * g * at::sigmoid(g * alpha)).to(gate_up.scalar_type());
}

at::Tensor clamped_gate_backward_composite(const at::Tensor& grad, const at::Tensor& gate_up, bool interleaved,
                                           double alpha, double limit) {
  auto [gate, up] = gate_and_up(gate_up, interleaved);
  // Where a clamp holds its input at the limit, that input gets no gradient (clamp's own rule: inside the
  // bounds, the bounds included, it passes).
  const at::ScalarType opmath = at::toOpMathType(gate.scalar_type());
  const at::Tensor gate_value = gate.to(opmath), up_value = up.to(opmath), gradient = grad.to(opmath);
  const at::Tensor g = gate_value.clamp_max(limit);
  const at::Tensor u = up_value.clamp(-limit, limit);
  const at::Tensor sigmoid = at::sigmoid(g * alpha);
  const at::Tensor glu = g * sigmoid;
  const at::Tensor grad_g = gradient * (u + 1) * (sigmoid + alpha * glu * (1 - sigmoid));
  const at::Tensor grad_gate = grad_g * gate_value.le(limit);
  const at::Tensor grad_up = gradient * glu * up_value.ge(-limit).logical_and(up_value.le(limit));
  return joined(grad_gate, grad_up, interleaved).to(gate_up.scalar_type());
}

at::Tensor experts_gate(const at::Tensor& gate_up, const MoeExpertOptions& options, const MoeRowKernels& kernels) {
  if (options.activation == "swiglu_oai") {
    return kernels.clamped_gate(gate_up, options.interleaved, options.alpha, options.limit);
  }
  auto [gate, up] = gate_and_up(gate_up, options.interleaved);
  if (options.interleaved) return registered::gated_mul(gate, up, options.activation);
  if (options.activation == "silu") return registered::silu_mul(gate_up);
  return registered::gelu_mul(gate_up, gelu_approximation(options.activation));
}

at::Tensor experts_gate_backward(const at::Tensor& grad, const at::Tensor& gate_up, const MoeExpertOptions& options,
                                 const MoeRowKernels& kernels) {
  if (options.activation == "swiglu_oai") {
    return kernels.clamped_gate_backward(grad, gate_up, options.interleaved, options.alpha, options.limit);
  }
  if (options.interleaved) {
    auto [gate, up] = gate_and_up(gate_up, true);
    auto [grad_gate, grad_up] = registered::gated_mul_backward(grad, gate, up, options.activation);
    return joined(grad_gate, grad_up, true);
  }
  if (options.activation == "silu") return registered::silu_mul_backward(grad, gate_up);
  return registered::gelu_mul_backward(grad, gate_up, gelu_approximation(options.activation));
}

}  // namespace fused_ops
