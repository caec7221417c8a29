// C++ autograd for every op, registered at the `Autograd` key. Forwards re-dispatch below
// autograd; backwards call only registered ops (fused::*_backward, aten), so AOTAutograd can
// trace them and gradients work in a C++ process too.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <numeric>
#include <optional>
#include <tuple>

#include "../ops/common/norm.h"

namespace fused_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

at::Tensor call_relu_add(const at::Tensor& x, const at::Tensor& y, double bias) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("fused::relu_add");
  return op.call(x, y, bias);
}

at::Tensor call_relu_add_backward(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("fused::relu_add_backward");
  return op.call(grad, x);
}

std::tuple<at::Tensor, at::Tensor> call_relu_add_with_mask(const at::Tensor& x, const at::Tensor& y, double bias) {
  static const auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double)>(
      "fused::relu_add_with_mask");
  return op.call(x, y, bias);
}

at::Tensor call_relu_add_backward_masked(const at::Tensor& grad, const at::Tensor& mask) {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("fused::relu_add_backward_masked");
  return op.call(grad, mask);
}

at::Tensor call_bias_gelu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>("fused::bias_gelu");
  return op.call(x, bias, approximate);
}

at::Tensor call_silu_mul(const at::Tensor& x) {
  static const auto op = find_op<at::Tensor(const at::Tensor&)>("fused::silu_mul");
  return op.call(x);
}

at::Tensor call_gelu_mul(const at::Tensor& x, c10::string_view approximate) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, c10::string_view)>("fused::gelu_mul");
  return op.call(x, approximate);
}

// The gradients of relu_add's x and y, from the mask its forward saved (when x needed a gradient)
// and y's sizes.
variable_list relu_add_input_gradients(AutogradContext* ctx, const at::Tensor& grad) {
  at::Tensor grad_x, grad_y;
  if (ctx->needs_input_grad(0)) grad_x = call_relu_add_backward_masked(grad, ctx->get_saved_variables()[0]);
  if (ctx->needs_input_grad(1)) grad_y = grad.sum_to_size_symint(ctx->saved_data["y_sizes"].toSymIntVector());
  return {grad_x, grad_y, at::Tensor()};
}

// Saves one bit per element of x (relu_add_with_mask) instead of x: the backward reads grad and the
// bits, 1/8 byte per element where x took 2-8 (docs/design_notes.md).
class ReluAddFunction : public torch::autograd::Function<ReluAddFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y,
                            double bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->saved_data["y_sizes"] = c10::IValue(y.sym_sizes());
    if (!x.requires_grad()) return call_relu_add(x, y, bias);
    auto [out, mask] = call_relu_add_with_mask(x, y, bias);
    ctx->save_for_backward({mask});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return relu_add_input_gradients(ctx, grad_outputs[0]);
  }
};

// relu_add_with_mask called directly with inputs that need gradients: out as relu_add's, the mask
// not differentiable.
class ReluAddWithMaskFunction : public torch::autograd::Function<ReluAddWithMaskFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y, double bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->saved_data["y_sizes"] = c10::IValue(y.sym_sizes());
    auto [out, mask] = call_relu_add_with_mask(x, y, bias);
    ctx->save_for_backward({mask});
    ctx->mark_non_differentiable({mask});
    return {out, mask};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return relu_add_input_gradients(ctx, grad_outputs[0]);
  }
};

// Both relu_add backward ops are linear in `grad` and piecewise constant in their second input (x,
// or the mask made from it), so each is its own gradient w.r.t. grad and has none w.r.t. the other.
template <at::Tensor (*kBackward)(const at::Tensor&, const at::Tensor&)>
class ReluAddBackwardFunction : public torch::autograd::Function<ReluAddBackwardFunction<kBackward>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& x_or_mask) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x_or_mask});
    return kBackward(grad, x_or_mask);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    at::Tensor grad_grad;
    if (ctx->needs_input_grad(0)) grad_grad = kBackward(grad_outputs[0], ctx->get_saved_variables()[0]);
    return {grad_grad, at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> call_bias_gelu_backward(const at::Tensor& grad, const at::Tensor& x,
                                                           const at::Tensor& bias, c10::string_view approximate) {
  static const auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                    const at::Tensor&, c10::string_view)>(
      "fused::bias_gelu_backward");
  return op.call(grad, x, bias, approximate);
}

at::Tensor call_silu_mul_backward(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("fused::silu_mul_backward");
  return op.call(grad, x);
}

at::Tensor call_gelu_mul_backward(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>(
      "fused::gelu_mul_backward");
  return op.call(grad, x, approximate);
}

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                            c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call_bias_gelu(x, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_bias] =
        call_bias_gelu_backward(grad_outputs[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
    return {ctx->needs_input_grad(0) ? grad_x : at::Tensor(), ctx->needs_input_grad(1) ? grad_bias : at::Tensor(),
            at::Tensor()};
  }
};

// silu_mul and gelu_mul: the gradient of x [..., 2d] from the backward op.
template <typename Derived>
class GatedFunction : public torch::autograd::Function<Derived> {
 public:
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {Derived::backward_op(grad_outputs[0], x, ctx), at::Tensor()};
  }
};

class SiluMulFunction : public GatedFunction<SiluMulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x});
    return call_silu_mul(x);
  }
  static at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& x, AutogradContext*) {
    return call_silu_mul_backward(grad, x);
  }
};

class GeluMulFunction : public GatedFunction<GeluMulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call_gelu_mul(x, approximate);
  }
  static at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& x, AutogradContext* ctx) {
    return call_gelu_mul_backward(grad, x, ctx->saved_data["approximate"].toStringRef());
  }
};

inline bool requires_grad(const at::Tensor& tensor) { return tensor.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() && tensor->defined() && tensor->requires_grad();
}

// Whether a call must record a graph node; otherwise the forward runs without one (the eager
// inference path stays as short as the op itself).
template <typename... Tensors>
bool records_gradient(const Tensors&... tensors) {
  return at::GradMode::is_enabled() && (requires_grad(tensors) || ...);
}

at::Tensor relu_add_autograd(const at::Tensor& x, const at::Tensor& y, double bias) {
  if (!records_gradient(x, y)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_relu_add(x, y, bias);
  }
  return ReluAddFunction::apply(x, y, bias);
}

at::Tensor relu_add_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  if (!records_gradient(grad, x)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_relu_add_backward(grad, x);
  }
  return ReluAddBackwardFunction<call_relu_add_backward>::apply(grad, x);
}

std::tuple<at::Tensor, at::Tensor> relu_add_with_mask_autograd(const at::Tensor& x, const at::Tensor& y, double bias) {
  if (!records_gradient(x, y)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_relu_add_with_mask(x, y, bias);
  }
  const variable_list outputs = ReluAddWithMaskFunction::apply(x, y, bias);
  return {outputs[0], outputs[1]};
}

at::Tensor relu_add_backward_masked_autograd(const at::Tensor& grad, const at::Tensor& mask) {
  if (!records_gradient(grad)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_relu_add_backward_masked(grad, mask);
  }
  return ReluAddBackwardFunction<call_relu_add_backward_masked>::apply(grad, mask);
}


at::Tensor bias_gelu_autograd(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  if (!records_gradient(x, bias)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_bias_gelu(x, bias, approximate);
  }
  return BiasGeluFunction::apply(x, bias, approximate);
}

at::Tensor silu_mul_autograd(const at::Tensor& x) {
  if (!records_gradient(x)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_silu_mul(x);
  }
  return SiluMulFunction::apply(x);
}

at::Tensor gelu_mul_autograd(const at::Tensor& x, c10::string_view approximate) {
  if (!records_gradient(x)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_gelu_mul(x, approximate);
  }
  return GeluMulFunction::apply(x, approximate);
}

// Backward ops of the activations. Recording a graph through them (double backward) runs the same
// math as differentiable aten ops (gelu_backward has a derivative of its own);
// otherwise the fused kernel runs below autograd.
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_autograd(const at::Tensor& grad, const at::Tensor& x,
                                                               const at::Tensor& bias, c10::string_view approximate) {
  if (records_gradient(grad, x, bias)) {
    const at::Tensor grad_x = at::gelu_backward(grad, x + bias, approximate);
    std::vector<int64_t> leading(x.dim() - 1);
    std::iota(leading.begin(), leading.end(), 0);
    return {grad_x, leading.empty() ? grad_x.clone() : grad_x.sum(leading)};
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_bias_gelu_backward(grad, x, bias, approximate);
}

at::Tensor silu_mul_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  if (records_gradient(grad, x)) {
    const auto halves = x.chunk(2, -1);
    const at::Tensor sigmoid = at::sigmoid(halves[0]);  // aten's silu_backward has no derivative
    const at::Tensor silu_derivative = sigmoid * (1 + halves[0] * (1 - sigmoid));
    return at::cat({grad * halves[1] * silu_derivative, grad * halves[0] * sigmoid}, -1);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_silu_mul_backward(grad, x);
}

at::Tensor gelu_mul_backward_autograd(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  if (records_gradient(grad, x)) {
    const auto halves = x.chunk(2, -1);
    return at::cat({at::gelu_backward(grad * halves[1], halves[0], approximate),
                    grad * at::gelu(halves[0], approximate)}, -1);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_gelu_mul_backward(grad, x, approximate);
}

// ---------------------------------------------------------------------------------------------
// Norms. Forwards save h (x, or residual_out of the add variants) and weight; the backward ops
// recompute the statistics from h.

using TwoTensors = std::tuple<at::Tensor, at::Tensor>;
using ThreeTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;

at::Tensor call_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("fused::rms_norm");
  return op.call(x, weight, eps);
}

TwoTensors call_add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps) {
  static const auto op =
      find_op<TwoTensors(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>("fused::add_rms_norm");
  return op.call(x, residual, weight, eps);
}

TwoTensors call_rms_norm_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, double eps,
                                  const OptionalTensor& grad_residual) {
  static const auto op = find_op<TwoTensors(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                            const OptionalTensor&)>("fused::rms_norm_backward");
  return op.call(grad, x, weight, eps, grad_residual);
}

at::Tensor call_layer_norm(const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias, double eps) {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const OptionalTensor&, double)>("fused::layer_norm");
  return op.call(x, weight, bias, eps);
}

TwoTensors call_add_layer_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                               const OptionalTensor& bias, double eps) {
  static const auto op = find_op<TwoTensors(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            const OptionalTensor&, double)>("fused::add_layer_norm");
  return op.call(x, residual, weight, bias, eps);
}

ThreeTensors call_layer_norm_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                      double eps, const OptionalTensor& grad_residual) {
  static const auto op = find_op<ThreeTensors(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                                              const OptionalTensor&)>("fused::layer_norm_backward");
  return op.call(grad, x, weight, eps, grad_residual);
}

OptionalTensor defined_or_none(const at::Tensor& tensor) {
  return tensor.defined() ? OptionalTensor(tensor) : std::nullopt;
}

// Gradients of h (= x) and weight (and bias) given the gradients of out and of h itself (the
// residual_out of the add variants; undefined when unused). Returns {grad_h, grad_weight, grad_bias}.
template <NormKind kKind>
variable_list norm_gradients(const at::Tensor& grad_out, const at::Tensor& grad_h_output, const at::Tensor& h,
                             const at::Tensor& weight, double eps) {
  if (!grad_out.defined()) return {grad_h_output, at::Tensor(), at::Tensor()};
  if constexpr (kKind == NormKind::RMS) {
    auto [grad_h, grad_weight] = call_rms_norm_backward(grad_out, h, weight, eps, defined_or_none(grad_h_output));
    return {grad_h, grad_weight, at::Tensor()};
  } else {
    auto [grad_h, grad_weight, grad_bias] =
        call_layer_norm_backward(grad_out, h, weight, eps, defined_or_none(grad_h_output));
    return {grad_h, grad_weight, grad_bias};
  }
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, weight});
    ctx->saved_data["eps"] = eps;
    return call_rms_norm(x, weight, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto grads = norm_gradients<NormKind::RMS>(grad_outputs[0], at::Tensor(), saved[0], saved[1],
                                               ctx->saved_data["eps"].toDouble());
    return {grads[0], grads[1], at::Tensor()};
  }
};

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const OptionalTensor& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, weight});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    return call_layer_norm(x, weight, bias, eps);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto grads = norm_gradients<NormKind::Layer>(grad_outputs[0], at::Tensor(), saved[0], saved[1],
                                                 ctx->saved_data["eps"].toDouble());
    return {grads[0], grads[1], ctx->saved_data["has_bias"].toBool() ? grads[2] : at::Tensor(), at::Tensor()};
  }
};

// add_rms_norm and add_layer_norm: out and residual_out = h; the gradient of h (from out, plus
// whatever reached residual_out) is the gradient of both x and residual.
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const at::Tensor& weight, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, h] = call_add_rms_norm(x, residual, weight, eps);
    ctx->save_for_backward({h, weight});
    ctx->saved_data["eps"] = eps;
    ctx->set_materialize_grads(false);  // an unused output's gradient stays undefined, not zeros
    return {out, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto grads = norm_gradients<NormKind::RMS>(grad_outputs[0], grad_outputs[1], saved[0], saved[1],
                                               ctx->saved_data["eps"].toDouble());
    return {grads[0], grads[0], grads[1], at::Tensor()};
  }
};

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const at::Tensor& weight, const OptionalTensor& bias, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, h] = call_add_layer_norm(x, residual, weight, bias, eps);
    ctx->save_for_backward({h, weight});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->set_materialize_grads(false);
    return {out, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto grads = norm_gradients<NormKind::Layer>(grad_outputs[0], grad_outputs[1], saved[0], saved[1],
                                                 ctx->saved_data["eps"].toDouble());
    return {grads[0], grads[0], grads[1], ctx->saved_data["has_bias"].toBool() ? grads[2] : at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor rms_norm_autograd(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (!records_gradient(x, weight)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_rms_norm(x, weight, eps);
  }
  return RmsNormFunction::apply(x, weight, eps);
}

TwoTensors add_rms_norm_autograd(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                 double eps) {
  if (!records_gradient(x, residual, weight)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_add_rms_norm(x, residual, weight, eps);
  }
  auto outputs = AddRmsNormFunction::apply(x, residual, weight, eps);
  return {outputs[0], outputs[1]};
}

at::Tensor layer_norm_autograd(const at::Tensor& x, const at::Tensor& weight, const OptionalTensor& bias,
                               double eps) {
  if (!records_gradient(x, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_layer_norm(x, weight, bias, eps);
  }
  return LayerNormFunction::apply(x, weight, bias, eps);
}

TwoTensors add_layer_norm_autograd(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                   const OptionalTensor& bias, double eps) {
  if (!records_gradient(x, residual, weight, bias)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_add_layer_norm(x, residual, weight, bias, eps);
  }
  auto outputs = AddLayerNormFunction::apply(x, residual, weight, bias, eps);
  return {outputs[0], outputs[1]};
}

// The norm backward ops through differentiable aten math (double backward), statistics in
// float32 (float64 for float64) like the kernels. Returns {grad_x, grad_weight, grad_bias}.
ThreeTensors norm_backward_composite(NormKind kind, const at::Tensor& grad, const at::Tensor& x,
                                     const at::Tensor& weight, double eps, const OptionalTensor& grad_residual) {
  const auto compute_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor h = x.to(compute_type);
  const at::Tensor g = grad.to(compute_type);
  const at::Tensor centered = kind == NormKind::Layer ? h - h.mean(-1, true) : h;
  const at::Tensor rstd = at::rsqrt(centered.pow(2).mean(-1, true) + eps);
  const at::Tensor n = centered * rstd;
  const at::Tensor gw = g * weight.to(compute_type);
  at::Tensor grad_x = gw - n * (gw * n).mean(-1, true);
  if (kind == NormKind::Layer) grad_x = grad_x - gw.mean(-1, true);
  grad_x = rstd * grad_x;
  if (grad_residual.has_value() && grad_residual->defined()) grad_x = grad_x + grad_residual->to(compute_type);
  std::vector<int64_t> leading(x.dim() - 1);
  std::iota(leading.begin(), leading.end(), 0);
  auto sum_rows = [&](const at::Tensor& t) { return (leading.empty() ? t : t.sum(leading)).to(weight.scalar_type()); };
  return {grad_x.to(x.scalar_type()), sum_rows(g * n), sum_rows(g)};
}

TwoTensors rms_norm_backward_autograd(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                      double eps, const OptionalTensor& grad_residual) {
  if (records_gradient(grad, x, weight, grad_residual)) {
    auto [grad_x, grad_weight, grad_bias] = norm_backward_composite(NormKind::RMS, grad, x, weight, eps, grad_residual);
    return {grad_x, grad_weight};
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_rms_norm_backward(grad, x, weight, eps, grad_residual);
}

ThreeTensors layer_norm_backward_autograd(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                          double eps, const OptionalTensor& grad_residual) {
  if (records_gradient(grad, x, weight, grad_residual)) {
    return norm_backward_composite(NormKind::Layer, grad, x, weight, eps, grad_residual);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_layer_norm_backward(grad, x, weight, eps, grad_residual);
}

}  // namespace
}  // namespace fused_ops

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("relu_add", &fused_ops::relu_add_autograd);
  m.impl("relu_add_backward", &fused_ops::relu_add_backward_autograd);
  m.impl("relu_add_with_mask", &fused_ops::relu_add_with_mask_autograd);
  m.impl("relu_add_backward_masked", &fused_ops::relu_add_backward_masked_autograd);
  m.impl("bias_gelu", &fused_ops::bias_gelu_autograd);
  m.impl("bias_gelu_backward", &fused_ops::bias_gelu_backward_autograd);
  m.impl("silu_mul", &fused_ops::silu_mul_autograd);
  m.impl("silu_mul_backward", &fused_ops::silu_mul_backward_autograd);
  m.impl("gelu_mul", &fused_ops::gelu_mul_autograd);
  m.impl("gelu_mul_backward", &fused_ops::gelu_mul_backward_autograd);
  m.impl("rms_norm", &fused_ops::rms_norm_autograd);
  m.impl("add_rms_norm", &fused_ops::add_rms_norm_autograd);
  m.impl("rms_norm_backward", &fused_ops::rms_norm_backward_autograd);
  m.impl("layer_norm", &fused_ops::layer_norm_autograd);
  m.impl("add_layer_norm", &fused_ops::add_layer_norm_autograd);
  m.impl("layer_norm_backward", &fused_ops::layer_norm_backward_autograd);
}
