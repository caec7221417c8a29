#include "composites.h"

namespace fused_ops::composite {
namespace {

// The dtype the kernels compute in: float64 for float64, float32 otherwise.
at::ScalarType compute_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor widened(const at::Tensor& tensor, const at::Tensor& like) { return tensor.to(compute_dtype(like)); }

at::Tensor activated(const at::Tensor& gate, c10::string_view activation) {
  if (activation == "silu") return at::silu(gate);
  return at::gelu(gate, activation == "gelu_tanh" ? "tanh" : "none");
}

// The last dim's size, and the leading dims flattened: [rows, size].
at::Tensor as_rows(const at::Tensor& x) { return x.reshape({-1, x.size(-1)}); }

}  // namespace

at::Tensor relu_add(const at::Tensor& x, const at::Tensor& y, double bias) {
  return (at::relu(widened(x, x)) + widened(y, x) + bias).to(x.scalar_type());
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  return at::gelu(widened(x, x) + widened(bias, x), approximate).to(x.scalar_type());
}

at::Tensor gated_mul(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  return (activated(widened(gate, gate), activation) * widened(up, gate)).to(gate.scalar_type());
}

at::Tensor gated_mul_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                            const OptionalTensor& bias, c10::string_view activation) {
  return at::linear(gated_mul(gate, up, activation), weight, bias);
}

at::Tensor rms_norm(const at::Tensor& x, const OptionalTensor& weight, double eps, double offset) {
  const at::Tensor wide = widened(x, x);
  at::Tensor out = wide * at::rsqrt(wide.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (weight.has_value() && weight->defined()) out = out * (widened(*weight, x) + offset);
  return out.to(x.scalar_type());
}

at::Tensor layer_norm(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias, double eps,
                      double offset) {
  const at::Tensor wide = widened(x, x);
  const at::Tensor centred = wide - wide.mean(-1, /*keepdim=*/true);
  at::Tensor out = centred * at::rsqrt(centred.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (weight.has_value() && weight->defined()) out = out * (widened(*weight, x) + offset);
  if (bias.has_value() && bias->defined()) out = out + widened(*bias, x);
  return out.to(x.scalar_type());
}

at::Tensor residual_sum(const at::Tensor& x, const at::Tensor& residual) {
  return (widened(x, x) + widened(residual, x)).to(x.scalar_type());
}

TwoTensors rotary_embedding(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t unsqueeze_dim, bool interleaved) {
  const int64_t rotated = cos.size(-1);
  // Tables [S, R] are [1, S, R]; the heads' dim is inserted where the op's unsqueeze_dim says.
  const auto table = [&](const at::Tensor& t) {
    const at::Tensor batched = t.dim() == 2 ? t.unsqueeze(0) : t;
    return widened(batched, q).unsqueeze(unsqueeze_dim);
  };
  const at::Tensor c = table(cos), s = table(sin);
  const auto rotate = [&](const at::Tensor& x) {
    const at::Tensor head = widened(x.narrow(-1, 0, rotated), x);
    at::Tensor turned;
    if (interleaved) {  // pairs (2i, 2i + 1): (-x[2i + 1], x[2i])
      const at::Tensor pairs = head.unflatten(-1, {rotated / 2, 2});
      turned = at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
    } else {  // halves: (-x[R/2:], x[:R/2])
      turned = at::cat({-head.narrow(-1, rotated / 2, rotated / 2), head.narrow(-1, 0, rotated / 2)}, -1);
    }
    const at::Tensor out = (head * c + turned * s).to(x.scalar_type());
    if (rotated == x.size(-1)) return out;
    return at::cat({out, x.narrow(-1, rotated, x.size(-1) - rotated)}, -1);
  };
  return {rotate(q), rotate(k)};
}

at::Tensor linear_cross_entropy(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                const OptionalTensor& bias, int64_t ignore_index, double label_smoothing,
                                c10::string_view reduction, double softcap) {
  at::Tensor logits = at::linear(as_rows(input), weight, bias).to(compute_dtype(input));
  if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
  const at::Tensor rows = target.reshape({-1});
  const at::Tensor losses = at::cross_entropy_loss(logits, rows, std::nullopt, at::Reduction::None, ignore_index,
                                                   label_smoothing);
  if (reduction == "none") return losses.reshape(target.sizes());
  if (reduction == "sum") return losses.sum();
  // The mean over the rows not ignored; 0 where every row is ignored (the kernels' choice, not NaN).
  return losses.sum() / (rows != ignore_index).sum().clamp_min(1).to(losses.scalar_type());
}

TwoTensors linear_log_probs(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                            const OptionalTensor& bias, double temperature, int64_t ignore_index, bool return_entropy,
                            double logit_scale, double softcap) {
  at::Tensor logits = at::linear(as_rows(input), weight, bias).to(compute_dtype(input)) * logit_scale;
  if (softcap > 0) logits = at::tanh(logits / softcap) * softcap;
  logits = logits / temperature;
  const at::Tensor log_probs_all = at::log_softmax(logits, -1);
  const at::Tensor rows = target.reshape({-1});
  const at::Tensor kept = rows != ignore_index;
  const at::Tensor chosen = log_probs_all.gather(-1, rows.masked_fill(~kept, 0).unsqueeze(-1)).squeeze(-1);
  const at::Tensor log_probs = at::where(kept, chosen, at::zeros_like(chosen)).reshape(target.sizes());
  if (!return_entropy) return {log_probs, at::empty({0}, log_probs.options())};
  // A class of probability 0 adds 0 (eager's p * log p gives NaN there).
  const at::Tensor probs = log_probs_all.exp();
  const at::Tensor terms = at::where(probs > 0, probs * log_probs_all, at::zeros_like(probs));
  const at::Tensor entropy = -terms.sum(-1);
  return {log_probs, at::where(kept, entropy, at::zeros_like(entropy)).reshape(target.sizes())};
}

}  // namespace fused_ops::composite
