// Shapes, dtypes and devices only, with SymInt sizes: FakeTensor, torch.compile with dynamic
// shapes and torch.export work from these kernels alone. Arguments are checked by the same
// entry points as the CPU and CUDA kernels.
#include <torch/library.h>

#include "../ops/common/bit_mask.h"
#include "entry_points.h"
#include "entry_points_attention.h"
#include "entry_points_moe.h"

namespace fused_ops {
namespace {

at::Tensor like_contiguous(const at::Tensor& tensor) {
  return at::empty_symint(tensor.sym_sizes(), tensor.options());
}

at::Tensor relu_add_meta(const at::Tensor& x, const at::Tensor&, double) { return like_contiguous(x); }
at::Tensor relu_add_backward_meta(const at::Tensor& grad, const at::Tensor&) { return like_contiguous(grad); }
std::tuple<at::Tensor, at::Tensor> relu_add_with_mask_meta(const at::Tensor& x, const at::Tensor&, double) {
  return {like_contiguous(x), at::empty_symint({bit_mask_bytes(x.sym_numel())}, x.options().dtype(at::kByte))};
}
at::Tensor relu_add_backward_masked_meta(const at::Tensor& grad, const at::Tensor&) { return like_contiguous(grad); }
at::Tensor bias_gelu_meta(const at::Tensor& x, const at::Tensor&, GeluApproximation) {
  return like_contiguous(x);
}
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_meta(const at::Tensor& grad, const at::Tensor&,
                                                           const at::Tensor& bias, GeluApproximation) {
  return {like_contiguous(grad), like_contiguous(bias)};
}
at::Tensor gated_meta(const at::Tensor& x) {
  std::vector<c10::SymInt> sizes = x.sym_sizes().vec();
  sizes.back() = sizes.back() / 2;
  return at::empty_symint(sizes, x.options());
}
at::Tensor gated_backward_meta(const at::Tensor&, const at::Tensor& x) { return like_contiguous(x); }
at::Tensor gelu_mul_meta(const at::Tensor& x, GeluApproximation) { return gated_meta(x); }
at::Tensor gelu_mul_backward_meta(const at::Tensor& grad, const at::Tensor& x, GeluApproximation) {
  return like_contiguous(x);
}
at::Tensor gated_mul_meta(const at::Tensor& gate, const at::Tensor&, GatedActivation) { return like_contiguous(gate); }
std::tuple<at::Tensor, at::Tensor> gated_mul_backward_meta(const at::Tensor&, const at::Tensor& gate,
                                                           const at::Tensor& up, GatedActivation) {
  return {like_contiguous(gate), like_contiguous(up)};
}

// The norm backward's grad_weight (and grad_bias): [H] of the weight's dtype, x's without a weight.
at::Tensor norm_parameter_gradient_meta(const at::Tensor& x, const OptionalTensor& weight) {
  return weight.has_value() && weight->defined() ? like_contiguous(*weight)
                                                 : at::empty_symint({x.sym_size(-1)}, x.options());
}
at::Tensor rms_norm_meta(const at::Tensor& x, const OptionalTensor&, double, double) { return like_contiguous(x); }
std::tuple<at::Tensor, at::Tensor> add_rms_norm_meta(const at::Tensor& x, const at::Tensor&, const OptionalTensor&,
                                                     double, double) {
  return {like_contiguous(x), like_contiguous(x)};
}
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_meta(const at::Tensor&, const at::Tensor& x,
                                                          const OptionalTensor& weight, double, const OptionalTensor&,
                                                          double) {
  return {like_contiguous(x), norm_parameter_gradient_meta(x, weight)};
}
at::Tensor layer_norm_meta(const at::Tensor& x, const OptionalTensor&, const OptionalTensor&, double, double) {
  return like_contiguous(x);
}
std::tuple<at::Tensor, at::Tensor> add_layer_norm_meta(const at::Tensor& x, const at::Tensor&, const OptionalTensor&,
                                                       const OptionalTensor&, double, double) {
  return {like_contiguous(x), like_contiguous(x)};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_meta(const at::Tensor&, const at::Tensor& x,
                                                                        const OptionalTensor& weight, double,
                                                                        const OptionalTensor&, double) {
  return {like_contiguous(x), norm_parameter_gradient_meta(x, weight), norm_parameter_gradient_meta(x, weight)};
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor&,
                                                         const at::Tensor&, int64_t, bool) {
  return {at::empty_like(q, at::MemoryFormat::Preserve), at::empty_like(k, at::MemoryFormat::Preserve)};
}

// linear_cross_entropy: the loss's shape and dtype, and each gradient asked for like its input (an
// empty tensor otherwise), as ops/cross_entropy/chunked.cpp returns them.
struct LinearCrossEntropyMeta {
  static at::Tensor loss(const at::Tensor& input, const at::Tensor& target, const CrossEntropyOptions& options) {
    const at::TensorOptions loss_options = input.options().dtype(cross_entropy_loss_dtype(input.scalar_type()));
    if (options.reduction == Reduction::None) return at::empty_symint(target.sym_sizes(), loss_options);
    return at::empty({}, loss_options);
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> gradients(const at::Tensor& input, const at::Tensor& weight,
                                                                  const std::optional<at::Tensor>& bias,
                                                                  std::array<bool, 3> mask) {
    const bool bias_gradient = mask[2] && bias.has_value() && bias->defined();
    return {mask[0] ? like_contiguous(input) : at::empty({0}, input.options()),
            mask[1] ? like_contiguous(weight) : at::empty({0}, weight.options()),
            bias_gradient ? like_contiguous(*bias) : at::empty({0}, input.options())};
  }
  static at::Tensor forward(const at::Tensor& input, const at::Tensor&, const at::Tensor& target,
                            const std::optional<at::Tensor>&, const CrossEntropyOptions& options) {
    return loss(input, target, options);
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_gradients(
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
      const std::optional<at::Tensor>& bias, const CrossEntropyOptions& options, std::array<bool, 3> mask) {
    auto [grad_input, grad_weight, grad_bias] = gradients(input, weight, bias, mask);
    return {loss(input, target, options), grad_input, grad_weight, grad_bias};
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor&, const at::Tensor& input,
                                                                 const at::Tensor& weight, const at::Tensor&,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 const CrossEntropyOptions&, std::array<bool, 3> mask) {
    return gradients(input, weight, bias, mask);
  }
};

// linear_log_probs: its outputs and the log-sum-exp of target's shape (the entropy [0] when not asked
// for), the kept logits [..., kept_classes], and each gradient asked for like its
// input, as ops/cross_entropy/log_probs_chunked.cpp returns them.
struct LinearLogProbsMeta {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>&,
      const LogProbsOptions& options, const c10::SymInt& kept_classes) {
    const at::TensorOptions output_options = input.options().dtype(cross_entropy_loss_dtype(input.scalar_type()));
    std::vector<c10::SymInt> kept_shape(input.sym_sizes().begin(), input.sym_sizes().end() - 1);
    kept_shape.emplace_back(kept_classes);
    const at::Tensor kept_logits = at::empty_symint(kept_shape, input.options());
    return {at::empty_symint(target.sym_sizes(), output_options),
            options.return_entropy ? at::empty_symint(target.sym_sizes(), output_options) : at::empty({0}, output_options),
            at::empty_symint(target.sym_sizes(), output_options), kept_logits};
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, const at::Tensor& input,
      const at::Tensor& weight, const at::Tensor&, const std::optional<at::Tensor>& bias, const LogProbsOptions&,
      std::array<bool, 3> mask, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&) {
    return LinearCrossEntropyMeta::gradients(input, weight, bias, mask);
  }
};


// The experts' ops: [pairs, H] rows in the promoted dtype of the hidden states and routing weights (the
// weighting's), [tokens, H] sums; the gradients not asked for are empty.
struct MoeMeta {
  static std::tuple<at::Tensor, at::Tensor> expert_mlp(const at::Tensor& hidden, const at::Tensor& order,
                                                        const at::Tensor&, const at::Tensor& routing_weights,
                                                        const at::Tensor& gate_up_weight, const at::Tensor&,
                                                        const OptionalTensor&, const OptionalTensor&,
                                                        const MoeExpertOptions& options, bool keep_gate_up) {
    const at::Tensor rows = at::empty_symint(
        {order.sym_size(0), hidden.sym_size(1)},
        hidden.options().dtype(at::promote_types(hidden.scalar_type(), routing_weights.scalar_type())));
    if (!keep_gate_up) return {rows, at::Tensor()};
    return {rows, at::empty_symint({order.sym_size(0), gate_up_weight.sym_size(options.transposed ? 2 : 1)},
                                   hidden.options())};
  }
  static SixTensors expert_mlp_backward(const at::Tensor&, const at::Tensor& hidden, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor& routing_weights,
                                        const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                        const OptionalTensor& gate_up_bias, const OptionalTensor& down_bias,
                                        const MoeExpertOptions&, std::array<bool, 6> mask, const OptionalTensor&) {
    auto gradient = [](bool wanted, const at::Tensor* like, const at::Tensor& fallback) {
      return wanted && like != nullptr ? like_contiguous(*like) : at::empty({0}, fallback.options());
    };
    const bool has_gate_up_bias = gate_up_bias.has_value() && gate_up_bias->defined();
    const bool has_down_bias = down_bias.has_value() && down_bias->defined();
    return {gradient(mask[0], &hidden, hidden), gradient(mask[1], &routing_weights, routing_weights),
            gradient(mask[2], &gate_up_weight, gate_up_weight), gradient(mask[3], &down_weight, down_weight),
            gradient(mask[4], has_gate_up_bias ? &*gate_up_bias : nullptr, gate_up_weight),
            gradient(mask[5], has_down_bias ? &*down_bias : nullptr, down_weight)};
  }
  static at::Tensor unpermute(const at::Tensor& rows, const at::Tensor&, const at::Tensor&, int64_t top_k,
                              const OptionalTensor&) {
    return at::empty_symint({rows.sym_size(0) / top_k, rows.sym_size(1)}, rows.options());
  }
  static std::tuple<at::Tensor, at::Tensor> unpermute_backward(const at::Tensor& grad, const at::Tensor& rows,
                                                               const at::Tensor& order, const at::Tensor&, int64_t,
                                                               const OptionalTensor& routing_weights,
                                                               std::array<bool, 2> mask) {
    const at::TensorOptions row_options = rows.defined() ? rows.options() : grad.options();
    at::Tensor grad_rows = mask[0] ? at::empty_symint({order.sym_size(0), grad.sym_size(1)}, row_options)
                                   : at::empty({0}, grad.options());
    const bool weights_given = routing_weights.has_value() && routing_weights->defined();
    at::Tensor grad_weights = mask[1] && weights_given ? like_contiguous(*routing_weights) : at::empty({0}, grad.options());
    return {grad_rows, grad_weights};
  }
};

}  // namespace
}  // namespace fused_ops

using namespace fused_ops;

TORCH_LIBRARY_IMPL(fused, Meta, m) {
  m.impl("relu_add", &relu_add_entry<relu_add_meta>);
  m.impl("relu_add_backward", &relu_add_backward_entry<relu_add_backward_meta>);
  m.impl("relu_add_with_mask", &relu_add_with_mask_entry<relu_add_with_mask_meta>);
  m.impl("relu_add_backward_masked", &relu_add_backward_masked_entry<relu_add_backward_masked_meta>);
  m.impl("bias_gelu", &bias_gelu_entry<bias_gelu_meta>);
  m.impl("bias_gelu_backward", &bias_gelu_backward_entry<bias_gelu_backward_meta>);
  m.impl("silu_mul", &silu_mul_entry<gated_meta>);
  m.impl("silu_mul_backward", &silu_mul_backward_entry<gated_backward_meta>);
  m.impl("gelu_mul", &gelu_mul_entry<gelu_mul_meta>);
  m.impl("gelu_mul_backward", &gelu_mul_backward_entry<gelu_mul_backward_meta>);
  m.impl("gated_mul", &gated_mul_entry<gated_mul_meta>);
  m.impl("gated_mul_backward", &gated_mul_backward_entry<gated_mul_backward_meta>);
  m.impl("rms_norm", &rms_norm_entry<rms_norm_meta>);
  m.impl("add_rms_norm", &add_rms_norm_entry<add_rms_norm_meta>);
  m.impl("rms_norm_backward", &rms_norm_backward_entry<rms_norm_backward_meta>);
  m.impl("layer_norm", &layer_norm_entry<layer_norm_meta>);
  m.impl("add_layer_norm", &add_layer_norm_entry<add_layer_norm_meta>);
  m.impl("layer_norm_backward", &layer_norm_backward_entry<layer_norm_backward_meta>);
  m.impl("rotary_embedding", &rotary_embedding_entry<rotary_embedding_meta>);
  m.impl("rotary_embedding_backward", &rotary_embedding_backward_entry<rotary_embedding_meta>);
  m.impl("linear_cross_entropy", &linear_cross_entropy_entry<LinearCrossEntropyMeta>);
  m.impl("linear_cross_entropy_with_gradients", &linear_cross_entropy_with_gradients_entry<LinearCrossEntropyMeta>);
  m.impl("linear_cross_entropy_backward", &linear_cross_entropy_backward_entry<LinearCrossEntropyMeta>);
  m.impl("linear_log_probs", &linear_log_probs_entry<LinearLogProbsMeta>);
  m.impl("linear_log_probs_with_log_sum_exp", &linear_log_probs_with_log_sum_exp_entry<LinearLogProbsMeta>);
  m.impl("linear_log_probs_backward", &linear_log_probs_backward_entry<LinearLogProbsMeta>);
  m.impl("moe_expert_mlp", &moe_expert_mlp_entry<MoeMeta>);
  m.impl("moe_expert_mlp_keeping_gate_up", &moe_expert_mlp_keeping_gate_up_entry<MoeMeta>);
  m.impl("moe_expert_mlp_backward", &moe_expert_mlp_backward_entry<MoeMeta>);
  m.impl("moe_unpermute", &moe_unpermute_entry<MoeMeta>);
  m.impl("moe_unpermute_backward", &moe_unpermute_backward_entry<MoeMeta>);
  m.impl("attention_with_sinks", &attention_with_sinks_entry<AttentionWithSinksMeta>);
  m.impl("attention_with_sinks_backward", &attention_with_sinks_backward_entry<AttentionWithSinksMeta>);
}
