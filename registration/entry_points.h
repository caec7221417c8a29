#pragma once
// The dispatcher-facing signature of every op, shared by the CPU, CUDA and Meta registrations:
// check the arguments (registration/checks.h), turn string options into enums, then call the
// backend's kernel. Each dispatch key's file instantiates these with its kernels.
#include <ATen/ATen.h>

#include "../ops/activations/gated_mul_linear.h"
#include "../ops/activations/silu_mul_linear.h"
#include "checks.h"

namespace fused_ops {

template <auto kernel>
at::Tensor relu_add_entry(const at::Tensor& x, const at::Tensor& y, double bias) {
  check_relu_add_arguments("relu_add", x, y);
  return kernel(x, y, bias);
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> relu_add_with_mask_entry(const at::Tensor& x, const at::Tensor& y, double bias) {
  check_relu_add_arguments("relu_add_with_mask", x, y);
  return kernel(x, y, bias);
}

template <auto kernel>
at::Tensor relu_add_backward_entry(const at::Tensor& grad, const at::Tensor& x) {
  check_relu_add_backward_arguments(grad, x);
  return kernel(grad, x);
}

template <auto kernel>
at::Tensor relu_add_backward_masked_entry(const at::Tensor& grad, const at::Tensor& mask) {
  check_relu_add_backward_masked_arguments(grad, mask);
  return kernel(grad, mask);
}

template <auto kernel>
at::Tensor bias_gelu_entry(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  check_bias_gelu_arguments("bias_gelu", x, bias);
  return kernel(x, bias, parse_gelu_approximation("bias_gelu", approximate));
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_entry(const at::Tensor& grad, const at::Tensor& x,
                                                            const at::Tensor& bias, c10::string_view approximate) {
  check_bias_gelu_backward_arguments(grad, x, bias);
  return kernel(grad, x, bias, parse_gelu_approximation("bias_gelu_backward", approximate));
}

template <auto kernel>
at::Tensor silu_mul_entry(const at::Tensor& x) {
  check_gated_arguments("silu_mul", x);
  return kernel(x);
}

template <auto kernel>
at::Tensor silu_mul_backward_entry(const at::Tensor& grad, const at::Tensor& x) {
  check_gated_backward_arguments("silu_mul_backward", grad, x);
  return kernel(grad, x);
}

template <auto kernel>
at::Tensor gelu_mul_entry(const at::Tensor& x, c10::string_view approximate) {
  check_gated_arguments("gelu_mul", x);
  return kernel(x, parse_gelu_approximation("gelu_mul", approximate));
}

template <auto kernel>
at::Tensor gelu_mul_backward_entry(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  check_gated_backward_arguments("gelu_mul_backward", grad, x);
  return kernel(grad, x, parse_gelu_approximation("gelu_mul_backward", approximate));
}

template <auto kernel>
at::Tensor gated_mul_entry(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  check_gated_mul_arguments("gated_mul", gate, up);
  return kernel(gate, up, parse_gated_activation("gated_mul", activation));
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> gated_mul_backward_entry(const at::Tensor& grad, const at::Tensor& gate,
                                                            const at::Tensor& up, c10::string_view activation) {
  check_gated_mul_backward_arguments(grad, gate, up);
  return kernel(grad, gate, up, parse_gated_activation("gated_mul_backward", activation));
}

using OptionalTensor = std::optional<at::Tensor>;

template <auto kernel>
at::Tensor rms_norm_entry(const at::Tensor& x, const OptionalTensor& weight, double eps, double offset) {
  check_norm_arguments("rms_norm", x, nullptr, weight, std::nullopt, eps, offset);
  return kernel(x, weight, eps, offset);
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> add_rms_norm_entry(const at::Tensor& x, const at::Tensor& residual,
                                                      const OptionalTensor& weight, double eps, double offset) {
  check_norm_arguments("add_rms_norm", x, &residual, weight, std::nullopt, eps, offset);
  return kernel(x, residual, weight, eps, offset);
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_entry(const at::Tensor& grad, const at::Tensor& x,
                                                           const OptionalTensor& weight, double eps,
                                                           const OptionalTensor& grad_residual, double offset) {
  check_norm_backward_arguments("rms_norm_backward", grad, x, weight, grad_residual, eps, offset);
  return kernel(grad, x, weight, eps, grad_residual, offset);
}

template <auto kernel>
at::Tensor layer_norm_entry(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias, double eps,
                            double offset) {
  check_norm_arguments("layer_norm", x, nullptr, weight, bias, eps, offset);
  return kernel(x, weight, bias, eps, offset);
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> add_layer_norm_entry(const at::Tensor& x, const at::Tensor& residual,
                                                        const OptionalTensor& weight, const OptionalTensor& bias,
                                                        double eps, double offset) {
  check_norm_arguments("add_layer_norm", x, &residual, weight, bias, eps, offset);
  return kernel(x, residual, weight, bias, eps, offset);
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_entry(const at::Tensor& grad, const at::Tensor& x,
                                                                         const OptionalTensor& weight, double eps,
                                                                         const OptionalTensor& grad_residual,
                                                                         double offset) {
  check_norm_backward_arguments("layer_norm_backward", grad, x, weight, grad_residual, eps, offset);
  return kernel(grad, x, weight, eps, grad_residual, offset);
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> rotary_embedding_entry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                          const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved) {
  check_rotary_arguments("rotary_embedding", q, k, cos, sin, unsqueeze_dim);
  return kernel(q, k, cos, sin, unsqueeze_dim, interleaved);
}

template <auto kernel>
std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_entry(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                   const at::Tensor& cos, const at::Tensor& sin,
                                                                   int64_t unsqueeze_dim, bool interleaved) {
  check_rotary_arguments("rotary_embedding_backward", grad_q, grad_k, cos, sin, unsqueeze_dim);
  return kernel(grad_q, grad_k, cos, sin, unsqueeze_dim, interleaved);
}

// linear_cross_entropy's kernels take the options parsed: `Kernels` is LinearCrossEntropyKernels<backend>
// (ops/cross_entropy/linear_cross_entropy.h) or the Meta kernels.
template <typename Kernels>
at::Tensor linear_cross_entropy_entry(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                      const std::optional<at::Tensor>& bias, int64_t ignore_index,
                                      double label_smoothing, c10::string_view reduction, double softcap) {
  const CrossEntropyOptions options = check_linear_cross_entropy_arguments(
      "linear_cross_entropy", input, weight, target, bias, ignore_index, label_smoothing, reduction, softcap);
  return Kernels::forward(input, weight, target, bias, options);
}

template <typename Kernels>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_with_gradients_entry(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    int64_t ignore_index, double label_smoothing, c10::string_view reduction, double softcap,
    std::array<bool, 3> output_mask) {
  const CrossEntropyOptions options =
      check_linear_cross_entropy_arguments("linear_cross_entropy_with_gradients", input, weight, target, bias,
                                           ignore_index, label_smoothing, reduction, softcap);
  return Kernels::with_gradients(input, weight, target, bias, options, output_mask);
}

template <typename Kernels>
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_backward_entry(
    const at::Tensor& grad_loss, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
    const std::optional<at::Tensor>& bias, int64_t ignore_index, double label_smoothing, c10::string_view reduction,
    double softcap, std::array<bool, 3> output_mask) {
  const CrossEntropyOptions options =
      check_linear_cross_entropy_arguments("linear_cross_entropy_backward", input, weight, target, bias, ignore_index,
                                           label_smoothing, reduction, softcap);
  check_linear_cross_entropy_grad_loss(grad_loss, input, target, options);
  return Kernels::backward(grad_loss, input, weight, target, bias, options, output_mask);
}

// linear_log_probs' kernels take the options checked: `Kernels` is LinearLogProbsKernels<backend>
// (ops/cross_entropy/linear_log_probs.h) or the Meta kernels.
template <typename Kernels>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linear_log_probs_with_log_sum_exp_entry(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    double temperature, int64_t ignore_index, bool return_entropy, double logit_scale, double softcap,
    c10::SymInt kept_classes) {
  const LogProbsOptions options = check_linear_log_probs_arguments("linear_log_probs_with_log_sum_exp", input, weight,
                                                                   target, bias, temperature, ignore_index,
                                                                   return_entropy, logit_scale, softcap);
  check_kept_classes("linear_log_probs_with_log_sum_exp", kept_classes, weight);
  return Kernels::forward(input, weight, target, bias, options, kept_classes);
}

template <typename Kernels>
std::tuple<at::Tensor, at::Tensor> linear_log_probs_entry(const at::Tensor& input, const at::Tensor& weight,
                                                          const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                                          double temperature, int64_t ignore_index, bool return_entropy,
                                                          double logit_scale, double softcap) {
  const LogProbsOptions options = check_linear_log_probs_arguments(
      "linear_log_probs", input, weight, target, bias, temperature, ignore_index, return_entropy, logit_scale, softcap);
  auto [log_probs, entropy, log_sum_exp, kept_logits] = Kernels::forward(input, weight, target, bias, options, false);
  return {log_probs, entropy};
}

template <typename Kernels>
std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_log_probs_backward_entry(
    const std::optional<at::Tensor>& grad_log_probs, const std::optional<at::Tensor>& grad_entropy,
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    double temperature, int64_t ignore_index, std::array<bool, 3> output_mask, double logit_scale, double softcap,
    const std::optional<at::Tensor>& log_sum_exp, const std::optional<at::Tensor>& entropy,
    const std::optional<at::Tensor>& kept_logits) {
  const LogProbsOptions options = check_linear_log_probs_arguments("linear_log_probs_backward", input, weight, target,
                                                                   bias, temperature, ignore_index, false, logit_scale,
                                                                   softcap);
  check_linear_log_probs_gradients(grad_log_probs, grad_entropy, log_sum_exp, entropy, kept_logits, input, weight,
                                   target);
  return Kernels::backward(grad_log_probs, grad_entropy, input, weight, target, bias, options, output_mask, log_sum_exp,
                           entropy, kept_logits);
}

// silu_mul_linear has one implementation for every backend (the composite registration).
inline at::Tensor silu_mul_linear_entry(const at::Tensor& x, const at::Tensor& weight,
                                        const std::optional<at::Tensor>& bias) {
  check_silu_mul_linear_arguments("silu_mul_linear", x, weight, bias);
  return silu_mul_linear(x, weight, bias);
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor> silu_mul_linear_backward_entry(const at::Tensor& grad,
                                                                                     const at::Tensor& x,
                                                                                     const at::Tensor& weight,
                                                                                     std::array<bool, 3> output_mask) {
  check_silu_mul_linear_backward_arguments(grad, x, weight);
  return silu_mul_linear_backward(grad, x, weight, output_mask);
}

// gated_mul_linear likewise; the activation is parsed here so that every backend rejects a bad one alike.
inline at::Tensor gated_mul_linear_entry(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                                         const std::optional<at::Tensor>& bias, c10::string_view activation) {
  check_gated_mul_linear_arguments("gated_mul_linear", gate, up, weight, bias);
  parse_gated_activation("gated_mul_linear", activation);
  return gated_mul_linear(gate, up, weight, bias, activation);
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_mul_linear_backward_entry(
    const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
    c10::string_view activation, std::array<bool, 4> output_mask) {
  check_gated_mul_linear_backward_arguments(grad, gate, up, weight);
  parse_gated_activation("gated_mul_linear_backward", activation);
  return gated_mul_linear_backward(grad, gate, up, weight, activation, output_mask);
}

}  // namespace fused_ops
