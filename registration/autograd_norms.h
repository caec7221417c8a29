#pragma once
// The autograd Functions of the norm ops (rms_norm, add_rms_norm, layer_norm, add_layer_norm) and of
// their backward ops (double backward), with the handles of the ops they call; registration/autograd.cpp
// registers them at the Autograd key with the others. Forwards save h (x, or residual_out of the add
// variants) and the weight; the backward ops recompute the statistics from h.
#include <numeric>
#include <tuple>
#include <vector>

#include "../ops/norms/norm.h"
#include "autograd.h"
#include "checks.h"

namespace fused_ops {
namespace norm_autograd {

using TwoTensors = std::tuple<at::Tensor, at::Tensor>;
using ThreeTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;
using TensorRef = const at::Tensor&;

inline const FusedOp<at::Tensor(TensorRef, const OptionalTensor&, double, double)> rms_norm_op{"fused::rms_norm"};
inline const FusedOp<TwoTensors(TensorRef, TensorRef, const OptionalTensor&, double, double)> add_rms_norm_op{
    "fused::add_rms_norm"};
inline const FusedOp<TwoTensors(TensorRef, TensorRef, const OptionalTensor&, double, const OptionalTensor&, double)>
    rms_norm_backward_op{"fused::rms_norm_backward"};
inline const FusedOp<at::Tensor(TensorRef, const OptionalTensor&, const OptionalTensor&, double, double)>
    layer_norm_op{"fused::layer_norm"};
inline const FusedOp<TwoTensors(TensorRef, TensorRef, const OptionalTensor&, const OptionalTensor&, double, double)>
    add_layer_norm_op{"fused::add_layer_norm"};
inline const FusedOp<ThreeTensors(TensorRef, TensorRef, const OptionalTensor&, double, const OptionalTensor&, double)>
    layer_norm_backward_op{"fused::layer_norm_backward"};

inline OptionalTensor defined_or_none(const at::Tensor& tensor) {
  return tensor.defined() ? OptionalTensor(tensor) : std::nullopt;
}

inline bool is_given(const OptionalTensor& tensor) { return tensor.has_value() && tensor->defined(); }

// Saves h, the weight (undefined for None) and the options every norm's backward needs.
inline void save_norm_inputs(AutogradContext* ctx, const at::Tensor& h, const OptionalTensor& weight,
                             const OptionalTensor& bias, double eps, double offset) {
  ctx->save_for_backward({h, is_given(weight) ? *weight : at::Tensor()});
  ctx->saved_data["eps"] = eps;
  ctx->saved_data["offset"] = offset;
  ctx->saved_data["has_bias"] = is_given(bias);
}

// Gradients of h (= x), weight and (Layer) bias given the gradients of out and of h itself (the
// residual_out of the add variants; undefined when unused). The weight's gradient is undefined for a
// weight given as None (the backward op's is the unit weight's, which autograd drops), and so is the
// bias's for a bias given as None. Returns {grad_h, grad_weight, grad_bias}.
template <NormKind kKind>
variable_list norm_gradients(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& grad_h_output) {
  if (!grad_out.defined()) return {grad_h_output, at::Tensor(), at::Tensor()};
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& h = saved[0];
  const OptionalTensor weight = defined_or_none(saved[1]);
  const double eps = ctx->saved_data["eps"].toDouble();
  const double offset = ctx->saved_data["offset"].toDouble();
  at::Tensor grad_h, grad_weight, grad_bias;
  if constexpr (kKind == NormKind::RMS) {
    std::tie(grad_h, grad_weight) = rms_norm_backward_op(grad_out, h, weight, eps, defined_or_none(grad_h_output), offset);
  } else {
    std::tie(grad_h, grad_weight, grad_bias) =
        layer_norm_backward_op(grad_out, h, weight, eps, defined_or_none(grad_h_output), offset);
  }
  return {grad_h, weight.has_value() ? grad_weight : at::Tensor(),
          ctx->saved_data["has_bias"].toBool() ? grad_bias : at::Tensor()};
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptionalTensor& weight, double eps,
                            double offset) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    save_norm_inputs(ctx, x, weight, std::nullopt, eps, offset);
    return rms_norm_op(x, weight, eps, offset);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto grads = norm_gradients<NormKind::RMS>(ctx, grad_outputs[0], at::Tensor());
    return {grads[0], grads[1], at::Tensor(), at::Tensor()};
  }
};

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptionalTensor& weight,
                            const OptionalTensor& bias, double eps, double offset) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    save_norm_inputs(ctx, x, weight, bias, eps, offset);
    return layer_norm_op(x, weight, bias, eps, offset);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto grads = norm_gradients<NormKind::Layer>(ctx, grad_outputs[0], at::Tensor());
    return {grads[0], grads[1], grads[2], at::Tensor(), at::Tensor()};
  }
};

// add_rms_norm and add_layer_norm: out and residual_out = h; the gradient of h (from out, plus
// whatever reached residual_out) is the gradient of both x and residual.
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const OptionalTensor& weight, double eps, double offset) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, h] = add_rms_norm_op(x, residual, weight, eps, offset);
    save_norm_inputs(ctx, h, weight, std::nullopt, eps, offset);
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined, not zeros
    return {out, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto grads = norm_gradients<NormKind::RMS>(ctx, grad_outputs[0], grad_outputs[1]);
    return {grads[0], grads[0], grads[1], at::Tensor(), at::Tensor()};
  }
};

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const OptionalTensor& weight, const OptionalTensor& bias, double eps, double offset) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, h] = add_layer_norm_op(x, residual, weight, bias, eps, offset);
    save_norm_inputs(ctx, h, weight, bias, eps, offset);
    ctx->set_materialize_grads(false);
    return {out, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto grads = norm_gradients<NormKind::Layer>(ctx, grad_outputs[0], grad_outputs[1]);
    return {grads[0], grads[0], grads[1], grads[2], at::Tensor(), at::Tensor()};
  }
};

// The norm backward ops through differentiable aten math (double backward), statistics in
// float32 (float64 for float64) like the kernels, w = offset + weight (1 without a weight).
// Returns {grad_x, grad_weight, grad_bias}, the parameter gradients of the weight's dtype (x's without).
inline ThreeTensors norm_backward_composite(NormKind kind, const at::Tensor& grad, const at::Tensor& x,
                                            const OptionalTensor& weight, double eps,
                                            const OptionalTensor& grad_residual, double offset) {
  const auto compute_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor h = x.to(compute_type);
  const at::Tensor g = grad.to(compute_type);
  const at::Tensor centered = kind == NormKind::Layer ? h - h.mean(-1, true) : h;
  const at::Tensor rstd = at::rsqrt(centered.pow(2).mean(-1, true) + eps);
  const at::Tensor n = centered * rstd;
  const at::Tensor gw = is_given(weight) ? g * (weight->to(compute_type) + offset) : g;
  at::Tensor grad_x = gw - n * (gw * n).mean(-1, true);
  if (kind == NormKind::Layer) grad_x = grad_x - gw.mean(-1, true);
  grad_x = rstd * grad_x;
  if (is_given(grad_residual)) grad_x = grad_x + grad_residual->to(compute_type);
  std::vector<int64_t> leading(x.dim() - 1);
  std::iota(leading.begin(), leading.end(), 0);
  const auto parameter_type = is_given(weight) ? weight->scalar_type() : x.scalar_type();
  auto sum_rows = [&](const at::Tensor& t) { return (leading.empty() ? t : t.sum(leading)).to(parameter_type); };
  return {grad_x.to(x.scalar_type()), sum_rows(g * n), sum_rows(g)};
}

inline TwoTensors rms_norm_backward_autograd(const at::Tensor& grad, const at::Tensor& x, const OptionalTensor& weight,
                                             double eps, const OptionalTensor& grad_residual, double offset) {
  if (records_gradient(grad, x, weight, grad_residual) || under_a_transform(grad, x, weight, grad_residual)) {
    check_norm_backward_arguments("rms_norm_backward", grad, x, weight, grad_residual, eps, offset);
    auto [grad_x, grad_weight, grad_bias] =
        norm_backward_composite(NormKind::RMS, grad, x, weight, eps, grad_residual, offset);
    return {grad_x, grad_weight};
  }
  return rms_norm_backward_op.below_autograd(grad, x, weight, eps, grad_residual, offset);
}

inline ThreeTensors layer_norm_backward_autograd(const at::Tensor& grad, const at::Tensor& x,
                                                 const OptionalTensor& weight, double eps,
                                                 const OptionalTensor& grad_residual, double offset) {
  if (records_gradient(grad, x, weight, grad_residual) || under_a_transform(grad, x, weight, grad_residual)) {
    check_norm_backward_arguments("layer_norm_backward", grad, x, weight, grad_residual, eps, offset);
    return norm_backward_composite(NormKind::Layer, grad, x, weight, eps, grad_residual, offset);
  }
  return layer_norm_backward_op.below_autograd(grad, x, weight, eps, grad_residual, offset);
}

}  // namespace norm_autograd
}  // namespace fused_ops
