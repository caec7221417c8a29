#pragma once
// The forward ops under a torch.func transform (grad, vjp, jvp, vmap) or forward-mode AD: a C++ autograd
// node cannot take part in those, so each op's Autograd kernel runs its checks and then its composition of
// ATen's differentiable ops (ops/transforms/composites.h), whose derivative and batching rules are ATen's.
#include "../ops/transforms/composites.h"
#include "autograd.h"
#include "checks.h"

namespace fused_ops {

// kKernel's call, or kComposite's under a transform; both take the op's arguments.
template <auto kKernel, auto kComposite>
struct TransformAware;

template <typename Return, typename... Args, Return (*kKernel)(Args...), Return (*kComposite)(Args...)>
struct TransformAware<kKernel, kComposite> {
  static Return call(Args... args) { return under_a_transform(args...) ? kComposite(args...) : kKernel(args...); }
};

namespace transforms {

using OptionalTensor = std::optional<at::Tensor>;
using TwoTensors = std::tuple<at::Tensor, at::Tensor>;

// The halves of a gated op's input [..., 2d]: (gate, up).
inline TwoTensors halves(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return {x.narrow(-1, 0, half), x.narrow(-1, half, half)};
}

inline at::Tensor relu_add(const at::Tensor& x, const at::Tensor& y, double bias) {
  check_relu_add_arguments("relu_add", x, y);
  return composite::relu_add(x, y, bias);
}

inline at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  check_bias_gelu_arguments("bias_gelu", x, bias);
  parse_gelu_approximation("bias_gelu", approximate);
  return composite::bias_gelu(x, bias, approximate);
}

inline at::Tensor silu_mul(const at::Tensor& x) {
  check_gated_arguments("silu_mul", x);
  auto [gate, up] = halves(x);
  return composite::gated_mul(gate, up, "silu");
}

inline at::Tensor gelu_mul(const at::Tensor& x, c10::string_view approximate) {
  check_gated_arguments("gelu_mul", x);
  parse_gelu_approximation("gelu_mul", approximate);
  auto [gate, up] = halves(x);
  return composite::gated_mul(gate, up, approximate == "tanh" ? "gelu_tanh" : "gelu");
}

inline at::Tensor silu_mul_linear(const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias) {
  check_silu_mul_linear_arguments("silu_mul_linear", x, weight, bias);
  auto [gate, up] = halves(x);
  return composite::gated_mul_linear(gate, up, weight, bias, "silu");
}

inline at::Tensor gated_mul(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  check_gated_mul_arguments("gated_mul", gate, up);
  parse_gated_activation("gated_mul", activation);
  return composite::gated_mul(gate, up, activation);
}

inline at::Tensor gated_mul_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                                   const OptionalTensor& bias, c10::string_view activation) {
  check_gated_mul_linear_arguments("gated_mul_linear", gate, up, weight, bias);
  parse_gated_activation("gated_mul_linear", activation);
  return composite::gated_mul_linear(gate, up, weight, bias, activation);
}

inline at::Tensor rms_norm(const at::Tensor& x, const OptionalTensor& weight, double eps, double offset) {
  check_norm_arguments("rms_norm", x, nullptr, weight, std::nullopt, eps, offset);
  return composite::rms_norm(x, weight, eps, offset);
}

inline TwoTensors add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const OptionalTensor& weight,
                               double eps, double offset) {
  check_norm_arguments("add_rms_norm", x, &residual, weight, std::nullopt, eps, offset);
  const at::Tensor sum = composite::residual_sum(x, residual);
  return {composite::rms_norm(sum, weight, eps, offset), sum};
}

inline at::Tensor layer_norm(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias, double eps,
                             double offset) {
  check_norm_arguments("layer_norm", x, nullptr, weight, bias, eps, offset);
  return composite::layer_norm(x, weight, bias, eps, offset);
}

inline TwoTensors add_layer_norm(const at::Tensor& x, const at::Tensor& residual, const OptionalTensor& weight,
                                 const OptionalTensor& bias, double eps, double offset) {
  check_norm_arguments("add_layer_norm", x, &residual, weight, bias, eps, offset);
  const at::Tensor sum = composite::residual_sum(x, residual);
  return {composite::layer_norm(sum, weight, bias, eps, offset), sum};
}

inline TwoTensors rotary_embedding(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                   const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved) {
  check_rotary_arguments("rotary_embedding", q, k, cos, sin, unsqueeze_dim);
  return composite::rotary_embedding(q, k, cos, sin, unsqueeze_dim < 0 ? unsqueeze_dim + 4 : unsqueeze_dim,
                                     interleaved);
}

inline at::Tensor linear_cross_entropy(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                       const OptionalTensor& bias, int64_t ignore_index, double label_smoothing,
                                       c10::string_view reduction, double softcap) {
  check_linear_cross_entropy_arguments("linear_cross_entropy", input, weight, target, bias, ignore_index,
                                       label_smoothing, reduction, softcap);
  return composite::linear_cross_entropy(input, weight, target, bias, ignore_index, label_smoothing, reduction,
                                         softcap);
}

inline TwoTensors linear_log_probs(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                   const OptionalTensor& bias, double temperature, int64_t ignore_index,
                                   bool return_entropy, double logit_scale, double softcap) {
  check_linear_log_probs_arguments("linear_log_probs", input, weight, target, bias, temperature, ignore_index,
                                   return_entropy, logit_scale, softcap);
  return composite::linear_log_probs(input, weight, target, bias, temperature, ignore_index, return_entropy,
                                     logit_scale, softcap);
}

}  // namespace transforms
}  // namespace fused_ops
