#include "checks.h"

#include <cmath>

#include <cstring>

#include "../ops/common/bit_mask.h"

namespace fused_ops {

void check_defined(const char* op, const char* arg, const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined(), "fused::", op, ": expected ", arg,
              " to be a tensor, but got None (an undefined tensor)");
}

void check_floating(const char* op, const char* arg, const at::Tensor& tensor) {
  check_defined(op, arg, tensor);
  const auto dtype = tensor.scalar_type();
  TORCH_CHECK(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf ||
                  dtype == at::kBFloat16,
              "fused::", op, ": expected ", arg,
              " to be float64, float32, float16 or bfloat16, but got ", dtype);
}

void check_same_dtype(const char* op, const char* arg, const at::Tensor& tensor,
                      const char* reference_arg, const at::Tensor& reference) {
  check_defined(op, arg, tensor);
  check_defined(op, reference_arg, reference);
  TORCH_CHECK(tensor.scalar_type() == reference.scalar_type(), "fused::", op, ": expected ", arg,
              " to have the same dtype as ", reference_arg, " (", reference.scalar_type(),
              "), but got ", tensor.scalar_type());
}

void check_same_device(const char* op, const char* arg, const at::Tensor& tensor,
                       const char* reference_arg, const at::Tensor& reference) {
  check_defined(op, arg, tensor);
  check_defined(op, reference_arg, reference);
  TORCH_CHECK(tensor.device() == reference.device(), "fused::", op, ": expected ", arg,
              " to be on the same device as ", reference_arg, " (", reference.device(),
              "), but got ", tensor.device());
}

void check_broadcasts_to(const char* op, const char* arg, const at::Tensor& tensor,
                         const char* target_arg, const at::Tensor& target) {
  check_defined(op, arg, tensor);
  check_defined(op, target_arg, target);
  const c10::SymIntArrayRef sizes = tensor.sym_sizes();
  const c10::SymIntArrayRef target_sizes = target.sym_sizes();
  bool broadcasts = sizes.size() <= target_sizes.size();
  for (size_t i = 1; broadcasts && i <= sizes.size(); ++i) {
    const c10::SymInt& size = sizes[sizes.size() - i];
    broadcasts = size == 1 || size == target_sizes[target_sizes.size() - i];
  }
  TORCH_CHECK(broadcasts, "fused::", op, ": expected ", arg, " of shape ", sizes,
              " to broadcast to the shape of ", target_arg, " ", target_sizes,
              " (the result keeps ", target_arg, "'s shape)");
}

void check_same_shape(const char* op, const char* arg, const at::Tensor& tensor,
                      const char* reference_arg, const at::Tensor& reference) {
  check_defined(op, arg, tensor);
  check_defined(op, reference_arg, reference);
  TORCH_CHECK(tensor.sym_sizes() == reference.sym_sizes(), "fused::", op, ": expected ", arg,
              " to have the shape of ", reference_arg, " ", reference.sym_sizes(), ", but got ",
              tensor.sym_sizes());
}

namespace {

// An optional bias of a product with `weight` ([out, in], as nn.Linear stores it): 1-D of weight.size(0)
// (`size_name` says it as the op's documentation does), of `input`'s dtype and device.
void check_linear_bias(const char* op, const std::optional<at::Tensor>& bias, const at::Tensor& weight,
                       const char* size_name, const char* input_name, const at::Tensor& input) {
  if (!bias.has_value() || !bias->defined()) return;
  check_same_dtype(op, "bias", *bias, input_name, input);
  check_same_device(op, "bias", *bias, input_name, input);
  TORCH_CHECK(bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0), "fused::", op, ": expected bias to be 1-D of size ",
              size_name, " = ", weight.sym_size(0), ", but got shape ", bias->sym_sizes());
}

}  // namespace

void check_relu_add_arguments(const char* op, const at::Tensor& x, const at::Tensor& y) {
  check_floating(op, "x", x);
  check_same_dtype(op, "y", y, "x", x);
  check_same_device(op, "y", y, "x", x);
  check_broadcasts_to(op, "y", y, "x", x);
}

void check_relu_add_backward_arguments(const at::Tensor& grad, const at::Tensor& x) {
  check_floating("relu_add_backward", "grad", grad);
  check_same_dtype("relu_add_backward", "x", x, "grad", grad);
  check_same_device("relu_add_backward", "x", x, "grad", grad);
  check_same_shape("relu_add_backward", "x", x, "grad", grad);
}

void check_relu_add_backward_masked_arguments(const at::Tensor& grad, const at::Tensor& mask) {
  constexpr const char* op = "relu_add_backward_masked";
  check_floating(op, "grad", grad);
  check_same_device(op, "mask", mask, "grad", grad);
  TORCH_CHECK(mask.scalar_type() == at::kByte, "fused::", op,
              ": expected mask to be uint8 (the mask relu_add_with_mask returns), but got ", mask.scalar_type());
  const c10::SymInt mask_bytes = bit_mask_bytes(grad.sym_numel());
  TORCH_CHECK(mask.dim() == 1 && mask.sym_size(0) == mask_bytes, "fused::", op,
              ": expected mask to be 1-D of (grad.numel() + 7) / 8 = ", mask_bytes,
              " bytes (one bit per element of grad), but got shape ", mask.sym_sizes());
}

GeluApproximation parse_gelu_approximation(const char* op, c10::string_view approximate) {
  if (approximate == "none") return GeluApproximation::None;
  TORCH_CHECK(approximate == "tanh", "fused::", op, ": expected approximate to be 'none' or 'tanh', but got '",
              std::string(approximate), "'");
  return GeluApproximation::Tanh;
}

void check_bias_gelu_arguments(const char* op, const at::Tensor& x, const at::Tensor& bias) {
  check_floating(op, "x", x);
  check_same_dtype(op, "bias", bias, "x", x);
  check_same_device(op, "bias", bias, "x", x);
  TORCH_CHECK(x.dim() >= 1, "fused::", op, ": expected x to have at least one dim, but got a 0-d tensor");
  TORCH_CHECK(bias.dim() == 1 && bias.sym_size(0) == x.sym_size(-1), "fused::", op,
              ": expected bias to be 1-D of size x.size(-1) = ", x.sym_size(-1), ", but got shape ",
              bias.sym_sizes());
}

void check_bias_gelu_backward_arguments(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias) {
  check_bias_gelu_arguments("bias_gelu_backward", x, bias);
  check_same_dtype("bias_gelu_backward", "grad", grad, "x", x);
  check_same_device("bias_gelu_backward", "grad", grad, "x", x);
  check_same_shape("bias_gelu_backward", "grad", grad, "x", x);
}

void check_gated_arguments(const char* op, const at::Tensor& x) {
  check_floating(op, "x", x);
  TORCH_CHECK(x.dim() >= 1, "fused::", op, ": expected x of shape [..., 2d], but got a 0-d tensor");
  TORCH_CHECK(x.sym_size(-1) % 2 == 0, "fused::", op,
              ": expected the last dim of x to be even (x is [..., 2d]: gate, then up), but got shape ",
              x.sym_sizes());
}

void check_gated_backward_arguments(const char* op, const at::Tensor& grad, const at::Tensor& x) {
  check_gated_arguments(op, x);
  check_same_dtype(op, "grad", grad, "x", x);
  check_same_device(op, "grad", grad, "x", x);
  std::vector<c10::SymInt> expected = x.sym_sizes().vec();
  expected.back() = expected.back() / 2;
  TORCH_CHECK(grad.sym_sizes() == c10::SymIntArrayRef(expected), "fused::", op,
              ": expected grad of shape ", c10::SymIntArrayRef(expected), ", but got ", grad.sym_sizes());
}

void check_silu_mul_linear_arguments(const char* op, const at::Tensor& x, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias) {
  check_gated_arguments(op, x);
  check_same_dtype(op, "weight", weight, "x", x);
  check_same_device(op, "weight", weight, "x", x);
  TORCH_CHECK(weight.dim() == 2 && weight.sym_size(1) * 2 == x.sym_size(-1), "fused::", op,
              ": expected weight of shape [n, x.size(-1) / 2 = ", x.sym_size(-1) / 2, "] (as nn.Linear stores it), "
              "but got shape ", weight.sym_sizes());
  check_linear_bias(op, bias, weight, "weight.size(0)", "x", x);
}

void check_silu_mul_linear_backward_arguments(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight) {
  constexpr const char* op = "silu_mul_linear_backward";
  check_silu_mul_linear_arguments(op, x, weight, std::nullopt);
  check_same_dtype(op, "grad", grad, "x", x);
  check_same_device(op, "grad", grad, "x", x);
  std::vector<c10::SymInt> expected = x.sym_sizes().vec();
  expected.back() = weight.sym_size(0);
  TORCH_CHECK(grad.sym_sizes() == c10::SymIntArrayRef(expected), "fused::", op, ": expected grad of shape ",
              c10::SymIntArrayRef(expected), " (x's leading dims, weight.size(0)), but got ", grad.sym_sizes());
}

GatedActivation parse_gated_activation(const char* op, c10::string_view activation) {
  if (activation == "silu") return GatedActivation::Silu;
  if (activation == "gelu") return GatedActivation::Gelu;
  TORCH_CHECK(activation == "gelu_tanh", "fused::", op,
              ": expected activation to be 'silu', 'gelu' or 'gelu_tanh', but got '", std::string(activation), "'");
  return GatedActivation::GeluTanh;
}

void check_gated_mul_arguments(const char* op, const at::Tensor& gate, const at::Tensor& up) {
  check_floating(op, "gate", gate);
  check_same_dtype(op, "up", up, "gate", gate);
  check_same_device(op, "up", up, "gate", gate);
  check_same_shape(op, "up", up, "gate", gate);
}

void check_gated_mul_backward_arguments(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up) {
  constexpr const char* op = "gated_mul_backward";
  check_gated_mul_arguments(op, gate, up);
  check_same_dtype(op, "grad", grad, "gate", gate);
  check_same_device(op, "grad", grad, "gate", gate);
  check_same_shape(op, "grad", grad, "gate", gate);
}

void check_gated_mul_linear_arguments(const char* op, const at::Tensor& gate, const at::Tensor& up,
                                      const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_gated_mul_arguments(op, gate, up);
  TORCH_CHECK(gate.dim() >= 1, "fused::", op, ": expected gate of shape [..., d], but got a 0-d tensor");
  check_same_dtype(op, "weight", weight, "gate", gate);
  check_same_device(op, "weight", weight, "gate", gate);
  TORCH_CHECK(weight.dim() == 2 && weight.sym_size(1) == gate.sym_size(-1), "fused::", op,
              ": expected weight of shape [n, gate.size(-1) = ", gate.sym_size(-1), "] (as nn.Linear stores it), "
              "but got shape ", weight.sym_sizes());
  check_linear_bias(op, bias, weight, "weight.size(0)", "gate", gate);
}

void check_gated_mul_linear_backward_arguments(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                               const at::Tensor& weight) {
  constexpr const char* op = "gated_mul_linear_backward";
  check_gated_mul_linear_arguments(op, gate, up, weight, std::nullopt);
  check_same_dtype(op, "grad", grad, "gate", gate);
  check_same_device(op, "grad", grad, "gate", gate);
  std::vector<c10::SymInt> expected = gate.sym_sizes().vec();
  expected.back() = weight.sym_size(0);
  TORCH_CHECK(grad.sym_sizes() == c10::SymIntArrayRef(expected), "fused::", op, ": expected grad of shape ",
              c10::SymIntArrayRef(expected), " (gate's leading dims, weight.size(0)), but got ", grad.sym_sizes());
}

namespace {

void check_norm_parameter(const char* op, const char* arg, const at::Tensor& parameter, const at::Tensor& x) {
  check_same_device(op, arg, parameter, "x", x);
  const bool mixed = parameter.scalar_type() == at::kFloat &&
                     (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16);
  TORCH_CHECK(parameter.scalar_type() == x.scalar_type() || mixed, "fused::", op, ": expected ", arg,
              " to have x's dtype (", x.scalar_type(), ") or float32 for float16/bfloat16 x, but got ",
              parameter.scalar_type());
  TORCH_CHECK(parameter.dim() == 1 && parameter.sym_size(0) == x.sym_size(-1), "fused::", op, ": expected ", arg,
              " to be 1-D of size x.size(-1) = ", x.sym_size(-1), ", but got shape ", parameter.sym_sizes());
}

}  // namespace

void check_norm_arguments(const char* op, const at::Tensor& x, const at::Tensor* residual,
                          const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                          double offset) {
  check_floating(op, "x", x);
  TORCH_CHECK(x.dim() >= 1, "fused::", op, ": expected x to have at least one dim (normalised over the last), "
              "but got a 0-d tensor");
  if (residual) {
    check_same_dtype(op, "residual", *residual, "x", x);
    check_same_device(op, "residual", *residual, "x", x);
    check_same_shape(op, "residual", *residual, "x", x);
  }
  const bool has_weight = weight.has_value() && weight->defined();
  if (has_weight) check_norm_parameter(op, "weight", *weight, x);
  TORCH_CHECK(has_weight || offset == 0.0, "fused::", op, ": expected offset 0.0 when weight is None (offset is ",
              "added to the weight), but got offset ", offset);
  if (bias.has_value() && bias->defined()) {
    check_norm_parameter(op, "bias", *bias, x);
    if (has_weight) check_same_dtype(op, "bias", *bias, "weight", *weight);
    TORCH_CHECK(has_weight || bias->scalar_type() == x.scalar_type(), "fused::", op, ": expected bias to have x's ",
                "dtype (", x.scalar_type(), ") when weight is None (the unit weight the op uses has x's dtype), ",
                "but got ", bias->scalar_type());
  }
  TORCH_CHECK(eps >= 0, "fused::", op, ": expected eps >= 0, but got ", eps);
}

void check_norm_backward_arguments(const char* op, const at::Tensor& grad, const at::Tensor& x,
                                   const std::optional<at::Tensor>& weight,
                                   const std::optional<at::Tensor>& grad_residual, double eps, double offset) {
  check_norm_arguments(op, x, nullptr, weight, std::nullopt, eps, offset);
  check_same_dtype(op, "grad", grad, "x", x);
  check_same_device(op, "grad", grad, "x", x);
  check_same_shape(op, "grad", grad, "x", x);
  if (grad_residual.has_value() && grad_residual->defined()) {
    check_same_dtype(op, "grad_residual", *grad_residual, "x", x);
    check_same_device(op, "grad_residual", *grad_residual, "x", x);
    check_same_shape(op, "grad_residual", *grad_residual, "x", x);
  }
}

void check_rotary_arguments(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t unsqueeze_dim) {
  // The backward op checks grad_q and grad_k in q's and k's places (no string built on the call path).
  const bool backward = std::strstr(op, "backward") != nullptr;
  const char* q_name = backward ? "grad_q" : "q";
  const char* k_name = backward ? "grad_k" : "k";
  check_floating(op, q_name, q);
  check_same_dtype(op, k_name, k, q_name, q);
  check_same_device(op, k_name, k, q_name, q);
  check_same_device(op, "cos", cos, q_name, q);
  check_same_device(op, "sin", sin, q_name, q);
  TORCH_CHECK(unsqueeze_dim == 1 || unsqueeze_dim == 2 || unsqueeze_dim == -3 || unsqueeze_dim == -2, "fused::", op,
              ": expected unsqueeze_dim to be 1 (", q_name, " [B, H, S, D]) or 2 (", q_name, " [B, S, H, D]), but got ",
              unsqueeze_dim);
  const int64_t heads = unsqueeze_dim < 0 ? unsqueeze_dim + 4 : unsqueeze_dim;
  const int64_t sequence = heads == 1 ? 2 : 1;
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "fused::", op, ": expected ", q_name, " and ", k_name,
              " to be 4-D (", heads == 1 ? "[B, H, S, D]" : "[B, S, H, D]", "), but got shapes ", q.sym_sizes(),
              " and ", k.sym_sizes());
  bool alike = true;
  for (int64_t d = 0; d < 4; ++d) alike = alike && (d == heads || q.sym_size(d) == k.sym_size(d));
  TORCH_CHECK(alike, "fused::", op, ": expected ", k_name, " of shape ", k.sym_sizes(), " to match ", q_name, " ",
              q.sym_sizes(), " in every dim but the heads (dim ", heads, ")");
  const bool sixteen_bit = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  TORCH_CHECK(cos.scalar_type() == q.scalar_type() || (sixteen_bit && cos.scalar_type() == at::kFloat), "fused::", op,
              ": expected cos to have ", q_name, "'s dtype (", q.scalar_type(), ") or, for a 16-bit ", q_name,
              ", float32, but got ", cos.scalar_type());
  check_same_dtype(op, "sin", sin, "cos", cos);
  check_same_shape(op, "sin", sin, "cos", cos);
  TORCH_CHECK(cos.dim() == 2 || cos.dim() == 3, "fused::", op, ": expected cos to be [B or 1, S, R] or [S, R], but got shape ",
              cos.sym_sizes());
  const c10::SymInt rotary_dim = cos.sym_size(-1);
  TORCH_CHECK(rotary_dim % 2 == 0 && rotary_dim <= q.sym_size(3), "fused::", op,
              ": expected the rotated dims R = cos.size(-1) to be even and at most the head dim ", q.sym_size(3),
              ", but got ", rotary_dim);
  TORCH_CHECK(cos.sym_size(-2) == q.sym_size(sequence), "fused::", op, ": expected cos of shape ", cos.sym_sizes(),
              " to have ", q_name, "'s sequence length ", q.sym_size(sequence), " in dim -2");
  TORCH_CHECK(cos.dim() == 2 || cos.sym_size(0) == 1 || cos.sym_size(0) == q.sym_size(0), "fused::", op,
              ": expected cos of shape ", cos.sym_sizes(), " to have ", q_name, "'s batch ", q.sym_size(0),
              " or 1 in dim 0");
}

namespace {

// What linear_cross_entropy and linear_log_probs take alike: input [..., H] floating, weight [V, H] and
// bias [V] of input's dtype, target int64 of input's leading shape, one device.
void check_linear_head_arguments(const char* op, const at::Tensor& input, const at::Tensor& weight,
                                 const at::Tensor& target, const std::optional<at::Tensor>& bias) {
  check_floating(op, "input", input);
  check_same_dtype(op, "weight", weight, "input", input);
  check_same_device(op, "weight", weight, "input", input);
  check_same_device(op, "target", target, "input", input);
  TORCH_CHECK(input.dim() >= 1, "fused::", op, ": expected input [..., H] to have at least one dim, but got a 0-d tensor");
  TORCH_CHECK(weight.dim() == 2 && weight.sym_size(1) == input.sym_size(-1) && weight.sym_size(0) >= 1, "fused::", op,
              ": expected weight [V, H] with V >= 1 and H = input.size(-1) = ", input.sym_size(-1), ", but got shape ",
              weight.sym_sizes());
  TORCH_CHECK(target.scalar_type() == at::kLong, "fused::", op, ": expected target to be int64 class indices, but got ",
              target.scalar_type());
  TORCH_CHECK(target.sym_sizes() == input.sym_sizes().slice(0, input.dim() - 1), "fused::", op,
              ": expected target of input's leading shape ", input.sym_sizes().slice(0, input.dim() - 1),
              ", but got ", target.sym_sizes());
  check_linear_bias(op, bias, weight, "V = weight.size(0)", "input", input);
}

}  // namespace

CrossEntropyOptions check_linear_cross_entropy_arguments(const char* op, const at::Tensor& input,
                                                         const at::Tensor& weight, const at::Tensor& target,
                                                         const std::optional<at::Tensor>& bias, int64_t ignore_index,
                                                         double label_smoothing, c10::string_view reduction,
                                                         double softcap) {
  check_linear_head_arguments(op, input, weight, target, bias);
  TORCH_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "fused::", op,
              ": expected label_smoothing in [0, 1], but got ", label_smoothing);
  TORCH_CHECK(softcap >= 0.0 && std::isfinite(softcap), "fused::", op,
              ": expected softcap >= 0 (0: no cap), but got ", softcap);
  CrossEntropyOptions options;
  options.ignore_index = ignore_index;
  options.label_smoothing = label_smoothing;
  options.softcap = softcap;
  if (reduction == "mean") {
    options.reduction = Reduction::Mean;
  } else if (reduction == "sum") {
    options.reduction = Reduction::Sum;
  } else {
    TORCH_CHECK(reduction == "none", "fused::", op, ": expected reduction to be 'mean', 'sum' or 'none', but got '",
                std::string(reduction), "'");
    options.reduction = Reduction::None;
  }
  return options;
}

void check_linear_cross_entropy_grad_loss(const at::Tensor& grad_loss, const at::Tensor& input,
                                          const at::Tensor& target, const CrossEntropyOptions& options) {
  const char* op = "linear_cross_entropy_backward";
  check_floating(op, "grad_loss", grad_loss);
  check_same_device(op, "grad_loss", grad_loss, "input", input);
  const bool per_row = options.reduction == Reduction::None;
  TORCH_CHECK(per_row ? grad_loss.sym_sizes() == target.sym_sizes() : grad_loss.dim() == 0, "fused::", op,
              ": expected grad_loss of the loss's shape ", per_row ? target.sym_sizes() : c10::SymIntArrayRef(),
              ", but got ", grad_loss.sym_sizes());
}

LogProbsOptions check_linear_log_probs_arguments(const char* op, const at::Tensor& input, const at::Tensor& weight,
                                                 const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                                 double temperature, int64_t ignore_index, bool return_entropy,
                                                 double logit_scale, double softcap) {
  check_linear_head_arguments(op, input, weight, target, bias);
  TORCH_CHECK(temperature > 0.0 && std::isfinite(temperature), "fused::", op,
              ": expected temperature > 0 and finite, but got ", temperature);
  TORCH_CHECK(logit_scale != 0.0 && std::isfinite(logit_scale), "fused::", op,
              ": expected logit_scale finite and not 0, but got ", logit_scale);
  TORCH_CHECK(softcap >= 0.0 && std::isfinite(softcap), "fused::", op,
              ": expected softcap >= 0 (0: no cap) and finite, but got ", softcap);
  LogProbsOptions options;
  options.temperature = temperature;
  options.ignore_index = ignore_index;
  options.return_entropy = return_entropy;
  options.logit_scale = logit_scale;
  options.softcap = softcap;
  return options;
}

void check_linear_log_probs_gradients(const std::optional<at::Tensor>& grad_log_probs,
                                      const std::optional<at::Tensor>& grad_entropy,
                                      const std::optional<at::Tensor>& log_sum_exp,
                                      const std::optional<at::Tensor>& entropy,
                                      const std::optional<at::Tensor>& kept_logits, const at::Tensor& input,
                                      const at::Tensor& weight, const at::Tensor& target) {
  const char* op = "linear_log_probs_backward";
  for (const auto& [name, gradient] : {std::make_pair("grad_log_probs", &grad_log_probs),
                                       std::make_pair("grad_entropy", &grad_entropy),
                                       std::make_pair("log_sum_exp", &log_sum_exp),
                                       std::make_pair("entropy", &entropy)}) {
    if (!gradient->has_value() || !(*gradient)->defined()) continue;
    const at::Tensor& tensor = **gradient;
    check_floating(op, name, tensor);
    check_same_device(op, name, tensor, "input", input);
    check_same_shape(op, name, tensor, "target", target);
  }
  if (!kept_logits.has_value() || !kept_logits->defined() || kept_logits->sym_numel() == 0) return;
  const at::Tensor& kept = *kept_logits;
  check_same_dtype(op, "kept_logits", kept, "input", input);
  check_same_device(op, "kept_logits", kept, "input", input);
  const bool leading_dims_match = kept.dim() == input.dim() && kept.sym_sizes().slice(0, input.dim() - 1).equals(
                                                                    input.sym_sizes().slice(0, input.dim() - 1));
  TORCH_CHECK(leading_dims_match && kept.sym_size(-1) <= weight.sym_size(0), "fused::", op,
              ": expected kept_logits (the forward's) of input's leading dims and at most weight.size(0) (",
              weight.sym_size(0), ") classes, got kept_logits of shape ", kept.sym_sizes(), " for input of shape ",
              input.sym_sizes());
}

void check_kept_classes(const char* op, const c10::SymInt& kept_classes, const at::Tensor& weight) {
  TORCH_SYM_CHECK(kept_classes.sym_ge(0).sym_and(kept_classes.sym_le(weight.sym_size(0))), "fused::", op,
                  ": expected kept_classes from 0 to weight.size(0) (", weight.sym_size(0), "), but got ", kept_classes);
}

}  // namespace fused_ops
