// C++ autograd for every op, registered at the `Autograd` key. Forwards re-dispatch below
// autograd; backwards call only registered ops (fused::*_backward, aten), so AOTAutograd can
// trace them and gradients work in a C++ process too.
#include <numeric>

#include "../ops/activations/gated_mul_linear.h"
#include "../ops/activations/silu_mul_linear.h"
#include "autograd.h"
#include "autograd_losses.h"
#include "autograd_attention.h"
#include "autograd_moe.h"
#include "autograd_norms.h"
#include "autograd_transforms.h"
#include "checks.h"

namespace fused_ops {
namespace {

using TwoTensors = std::tuple<at::Tensor, at::Tensor>;
using ThreeTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;
using TensorRef = const at::Tensor&;
using StringOption = c10::string_view;

const FusedOp<at::Tensor(TensorRef, TensorRef, double)> relu_add_op{"fused::relu_add"};
const FusedOp<at::Tensor(TensorRef, TensorRef)> relu_add_backward_op{"fused::relu_add_backward"};
const FusedOp<TwoTensors(TensorRef, TensorRef, double)> relu_add_with_mask_op{"fused::relu_add_with_mask"};
const FusedOp<at::Tensor(TensorRef, TensorRef)> relu_add_backward_masked_op{"fused::relu_add_backward_masked"};
const FusedOp<at::Tensor(TensorRef, TensorRef, StringOption)> bias_gelu_op{"fused::bias_gelu"};
const FusedOp<TwoTensors(TensorRef, TensorRef, TensorRef, StringOption)> bias_gelu_backward_op{"fused::bias_gelu_backward"};
const FusedOp<at::Tensor(TensorRef)> silu_mul_op{"fused::silu_mul"};
const FusedOp<at::Tensor(TensorRef, TensorRef)> silu_mul_backward_op{"fused::silu_mul_backward"};
using GradientMask = std::array<bool, 3>;
const FusedOp<at::Tensor(TensorRef, TensorRef, const OptionalTensor&)> silu_mul_linear_op{"fused::silu_mul_linear"};
const FusedOp<ThreeTensors(TensorRef, TensorRef, TensorRef, GradientMask)> silu_mul_linear_backward_op{
    "fused::silu_mul_linear_backward"};
const FusedOp<at::Tensor(TensorRef, StringOption)> gelu_mul_op{"fused::gelu_mul"};
const FusedOp<at::Tensor(TensorRef, TensorRef, StringOption)> gelu_mul_backward_op{"fused::gelu_mul_backward"};
const FusedOp<at::Tensor(TensorRef, TensorRef, StringOption)> gated_mul_op{"fused::gated_mul"};
const FusedOp<TwoTensors(TensorRef, TensorRef, TensorRef, StringOption)> gated_mul_backward_op{
    "fused::gated_mul_backward"};
using FourTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using GatedLinearMask = std::array<bool, 4>;
const FusedOp<at::Tensor(TensorRef, TensorRef, TensorRef, const OptionalTensor&, StringOption)> gated_mul_linear_op{
    "fused::gated_mul_linear"};
const FusedOp<FourTensors(TensorRef, TensorRef, TensorRef, TensorRef, StringOption, GatedLinearMask)>
    gated_mul_linear_backward_op{"fused::gated_mul_linear_backward"};
const FusedOp<TwoTensors(TensorRef, TensorRef, TensorRef, TensorRef, int64_t, bool)> rotary_embedding_op{
    "fused::rotary_embedding"};
const FusedOp<TwoTensors(TensorRef, TensorRef, TensorRef, TensorRef, int64_t, bool)> rotary_embedding_backward_op{
    "fused::rotary_embedding_backward"};
// The gradients of relu_add's x and y, from the mask its forward saved (when x needed a gradient)
// and y's sizes.
variable_list relu_add_input_gradients(AutogradContext* ctx, const at::Tensor& grad) {
  at::Tensor grad_x, grad_y;
  if (ctx->needs_input_grad(0)) grad_x = relu_add_backward_masked_op(grad, ctx->get_saved_variables()[0]);
  if (ctx->needs_input_grad(1)) grad_y = grad.sum_to_size_symint(ctx->saved_data["y_sizes"].toSymIntVector());
  return {grad_x, grad_y, at::Tensor()};
}

// Saves one bit per element of x (relu_add_with_mask) instead of x: the backward reads grad and the
// bits, 1/8 byte per element where x took 2-8 (docs/design.md).
class ReluAddFunction : public torch::autograd::Function<ReluAddFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y,
                            double bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->saved_data["y_sizes"] = c10::IValue(y.sym_sizes());
    if (!x.requires_grad()) return relu_add_op(x, y, bias);
    check_relu_add_arguments("relu_add", x, y);  // errors name the op called, not relu_add_with_mask
    auto [out, mask] = relu_add_with_mask_op(x, y, bias);
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
    auto [out, mask] = relu_add_with_mask_op(x, y, bias);
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
template <const auto& kBackward>
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

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                            c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = std::string(approximate);
    return bias_gelu_op(x, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_bias] =
        bias_gelu_backward_op(grad_outputs[0], saved[0], saved[1], ctx->saved_data["approximate"].toStringRef());
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
    return silu_mul_op(x);
  }
  static at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& x, AutogradContext*) {
    return silu_mul_backward_op(grad, x);
  }
};

class GeluMulFunction : public GatedFunction<GeluMulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x});
    ctx->saved_data["approximate"] = std::string(approximate);
    return gelu_mul_op(x, approximate);
  }
  static at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& x, AutogradContext* ctx) {
    return gelu_mul_backward_op(grad, x, ctx->saved_data["approximate"].toStringRef());
  }
};

// silu_mul_linear saves x and the weight, not the activation: the backward op recomputes it.
class SiluMulLinearFunction : public torch::autograd::Function<SiluMulLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const OptionalTensor& bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bias_needs_grad"] = requires_grad(bias);  // an absent bias has no input slot to ask
    return silu_mul_linear_op(x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const GradientMask mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                               ctx->saved_data["bias_needs_grad"].toBool()};
    auto [grad_x, grad_weight, grad_bias] = silu_mul_linear_backward_op(grad_outputs[0], saved[0], saved[1], mask);
    return {mask[0] ? grad_x : at::Tensor(), mask[1] ? grad_weight : at::Tensor(), mask[2] ? grad_bias : at::Tensor()};
  }
};

// gated_mul: the gradients of gate and up from the backward op.
class GatedMulFunction : public torch::autograd::Function<GatedMulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            c10::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({gate, up});
    ctx->saved_data["activation"] = std::string(activation);
    return gated_mul_op(gate, up, activation);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_gate, grad_up] =
        gated_mul_backward_op(grad_outputs[0], saved[0], saved[1], ctx->saved_data["activation"].toStringRef());
    return {ctx->needs_input_grad(0) ? grad_gate : at::Tensor(), ctx->needs_input_grad(1) ? grad_up : at::Tensor(),
            at::Tensor()};
  }
};

// gated_mul_linear saves gate, up and the weight, not the activation: the backward op recomputes it.
class GatedMulLinearFunction : public torch::autograd::Function<GatedMulLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& weight, const OptionalTensor& bias, c10::string_view activation) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({gate, up, weight});
    ctx->saved_data["bias_needs_grad"] = requires_grad(bias);  // an absent bias has no input slot to ask
    ctx->saved_data["activation"] = std::string(activation);
    return gated_mul_linear_op(gate, up, weight, bias, activation);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const GatedLinearMask mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2),
                                  ctx->saved_data["bias_needs_grad"].toBool()};
    auto [grad_gate, grad_up, grad_weight, grad_bias] = gated_mul_linear_backward_op(
        grad_outputs[0], saved[0], saved[1], saved[2], ctx->saved_data["activation"].toStringRef(), mask);
    return {mask[0] ? grad_gate : at::Tensor(), mask[1] ? grad_up : at::Tensor(),
            mask[2] ? grad_weight : at::Tensor(), mask[3] ? grad_bias : at::Tensor(), at::Tensor()};
  }
};

// Backward ops of the activations. Recording a graph through them (double backward) runs the same
// math as differentiable aten ops (gelu_backward has a derivative of its own);
// otherwise the fused kernel runs below autograd.
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_autograd(const at::Tensor& grad, const at::Tensor& x,
                                                               const at::Tensor& bias, c10::string_view approximate) {
  if (records_gradient(grad, x, bias) || under_a_transform(grad, x, bias)) {
    const at::Tensor grad_x = at::gelu_backward(grad, x + bias, approximate);
    std::vector<int64_t> leading(x.dim() - 1);
    std::iota(leading.begin(), leading.end(), 0);
    return {grad_x, leading.empty() ? grad_x.clone() : grad_x.sum(leading)};
  }
  return bias_gelu_backward_op.below_autograd(grad, x, bias, approximate);
}

at::Tensor silu_mul_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  if (records_gradient(grad, x) || under_a_transform(grad, x)) {
    const auto halves = x.chunk(2, -1);
    const at::Tensor sigmoid = at::sigmoid(halves[0]);  // aten's silu_backward has no derivative
    const at::Tensor silu_derivative = sigmoid * (1 + halves[0] * (1 - sigmoid));
    return at::cat({grad * halves[1] * silu_derivative, grad * halves[0] * sigmoid}, -1);
  }
  return silu_mul_backward_op.below_autograd(grad, x);
}

// Recording a graph (double backward): the same composition above autograd, of differentiable ops.
ThreeTensors silu_mul_linear_backward_autograd(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                               GradientMask output_mask) {
  if (records_gradient(grad, x, weight) || under_a_transform(grad, x, weight)) {
    check_silu_mul_linear_backward_arguments(grad, x, weight);
    return silu_mul_linear_backward(grad, x, weight, output_mask);
  }
  return silu_mul_linear_backward_op.below_autograd(grad, x, weight, output_mask);
}

at::Tensor gelu_mul_backward_autograd(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  if (records_gradient(grad, x) || under_a_transform(grad, x)) {
    const auto halves = x.chunk(2, -1);
    return at::cat({at::gelu_backward(grad * halves[1], halves[0], approximate),
                    grad * at::gelu(halves[0], approximate)}, -1);
  }
  return gelu_mul_backward_op.below_autograd(grad, x, approximate);
}

TwoTensors gated_mul_backward_autograd(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                       c10::string_view activation) {
  if (records_gradient(grad, gate, up) || under_a_transform(grad, gate, up)) {
    check_gated_mul_backward_arguments(grad, gate, up);
    return gated_mul_backward_composite(grad, gate, up, parse_gated_activation("gated_mul_backward", activation));
  }
  return gated_mul_backward_op.below_autograd(grad, gate, up, activation);
}

// Recording a graph (double backward): the same composition above autograd, of differentiable ops.
FourTensors gated_mul_linear_backward_autograd(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                               const at::Tensor& weight, c10::string_view activation,
                                               GatedLinearMask output_mask) {
  if (records_gradient(grad, gate, up, weight) || under_a_transform(grad, gate, up, weight)) {
    check_gated_mul_linear_backward_arguments(grad, gate, up, weight);
    parse_gated_activation("gated_mul_linear_backward", activation);
    return gated_mul_linear_backward(grad, gate, up, weight, activation, output_mask);
  }
  return gated_mul_linear_backward_op.below_autograd(grad, gate, up, weight, activation, output_mask);
}

// ---------------------------------------------------------------------------------------------
// RoPE. Both ops are linear in q and k (in grad_q and grad_k) and transposes of each other, so each
// one's gradient is the other; cos and sin come from a position table and get none.

template <const auto& kOp, const auto& kTranspose>
class RotaryFunction : public torch::autograd::Function<RotaryFunction<kOp, kTranspose>> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["unsqueeze_dim"] = unsqueeze_dim;
    ctx->saved_data["interleaved"] = interleaved;
    auto [q_out, k_out] = kOp(q, k, cos, sin, unsqueeze_dim, interleaved);
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    auto [grad_q, grad_k] = kTranspose(grad_outputs[0], grad_outputs[1], saved[0], saved[1],
                                       ctx->saved_data["unsqueeze_dim"].toInt(), ctx->saved_data["interleaved"].toBool());
    return {ctx->needs_input_grad(0) ? grad_q : at::Tensor(), ctx->needs_input_grad(1) ? grad_k : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// cos and sin requiring a gradient: an error, not a silently missing gradient.
void check_rotary_tables_need_no_gradient(const char* op, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(!at::GradMode::is_enabled() || !(cos.requires_grad() || sin.requires_grad()), "fused::", op,
              ": expected cos and sin not to require grad (the op gives them no gradient: they come from a "
              "position table); pass cos.detach() and sin.detach()");
}

template <const auto& kOp, const auto& kTranspose>
TwoTensors rotary_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t unsqueeze_dim, bool interleaved) {
  check_rotary_tables_need_no_gradient(&kOp == &rotary_embedding_op ? "rotary_embedding" : "rotary_embedding_backward",
                                       cos, sin);
  return AutogradKernel<RotaryFunction<kOp, kTranspose>, kOp>::call(q, k, cos, sin, unsqueeze_dim, interleaved);
}

// The gradient ops of the LM-head ops are not differentiable: an error where a graph would be needed.
template <const auto& kOp, typename Signature = typename std::decay_t<decltype(kOp)>::Signature>
struct NotDifferentiable;

template <const auto& kOp, typename Return, typename... Args>
struct NotDifferentiable<kOp, Return(Args...)> {
  static Return call(Args... args) {
    TORCH_CHECK(!records_gradient(args...), kOp.name(), ": not differentiable (its forward op has no double backward)");
    return kOp.below_autograd(args...);
  }
};

}  // namespace

}  // namespace fused_ops

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  using namespace fused_ops::lm_head_autograd;
  using namespace fused_ops::norm_autograd;
  using namespace fused_ops;
  m.impl("relu_add", &TransformAware<&AutogradKernel<ReluAddFunction, relu_add_op>::call, &transforms::relu_add>::call);
  m.impl("relu_add_backward", &AutogradKernel<ReluAddBackwardFunction<relu_add_backward_op>, relu_add_backward_op>::call);
  m.impl("relu_add_with_mask", &AutogradKernel<ReluAddWithMaskFunction, relu_add_with_mask_op>::call);
  m.impl("relu_add_backward_masked",
         &AutogradKernel<ReluAddBackwardFunction<relu_add_backward_masked_op>, relu_add_backward_masked_op>::call);
  m.impl("bias_gelu", &TransformAware<&AutogradKernel<BiasGeluFunction, bias_gelu_op>::call, &transforms::bias_gelu>::call);
  m.impl("bias_gelu_backward", &bias_gelu_backward_autograd);
  m.impl("silu_mul", &TransformAware<&AutogradKernel<SiluMulFunction, silu_mul_op>::call, &transforms::silu_mul>::call);
  m.impl("silu_mul_backward", &silu_mul_backward_autograd);
  m.impl("silu_mul_linear",
         &TransformAware<&AutogradKernel<SiluMulLinearFunction, silu_mul_linear_op>::call, &transforms::silu_mul_linear>::call);
  m.impl("silu_mul_linear_backward", &silu_mul_linear_backward_autograd);
  m.impl("gelu_mul", &TransformAware<&AutogradKernel<GeluMulFunction, gelu_mul_op>::call, &transforms::gelu_mul>::call);
  m.impl("gelu_mul_backward", &gelu_mul_backward_autograd);
  m.impl("gated_mul", &TransformAware<&AutogradKernel<GatedMulFunction, gated_mul_op>::call, &transforms::gated_mul>::call);
  m.impl("gated_mul_backward", &gated_mul_backward_autograd);
  m.impl("gated_mul_linear", &TransformAware<&AutogradKernel<GatedMulLinearFunction, gated_mul_linear_op>::call,
                                             &transforms::gated_mul_linear>::call);
  m.impl("gated_mul_linear_backward", &gated_mul_linear_backward_autograd);
  m.impl("rms_norm", &TransformAware<&AutogradKernel<RmsNormFunction, rms_norm_op>::call, &transforms::rms_norm>::call);
  m.impl("add_rms_norm",
         &TransformAware<&AutogradKernel<AddRmsNormFunction, add_rms_norm_op>::call, &transforms::add_rms_norm>::call);
  m.impl("rms_norm_backward", &rms_norm_backward_autograd);
  m.impl("layer_norm", &TransformAware<&AutogradKernel<LayerNormFunction, layer_norm_op>::call, &transforms::layer_norm>::call);
  m.impl("add_layer_norm", &TransformAware<&AutogradKernel<AddLayerNormFunction, add_layer_norm_op>::call,
                                           &transforms::add_layer_norm>::call);
  m.impl("layer_norm_backward", &layer_norm_backward_autograd);
  m.impl("rotary_embedding", &TransformAware<&rotary_autograd<rotary_embedding_op, rotary_embedding_backward_op>,
                                             &transforms::rotary_embedding>::call);
  m.impl("rotary_embedding_backward", &rotary_autograd<rotary_embedding_backward_op, rotary_embedding_op>);
  m.impl("linear_cross_entropy", &TransformAware<&AutogradKernel<LinearCrossEntropyFunction, linear_cross_entropy_op>::call,
                                                 &transforms::linear_cross_entropy>::call);
  m.impl("linear_cross_entropy_with_gradients",
         &NotDifferentiable<linear_cross_entropy_with_gradients_op>::call);
  m.impl("linear_cross_entropy_backward", &NotDifferentiable<linear_cross_entropy_backward_op>::call);
  m.impl("linear_log_probs", &TransformAware<&AutogradKernel<LinearLogProbsFunction, linear_log_probs_op>::call,
                                             &transforms::linear_log_probs>::call);
  m.impl("linear_log_probs_with_log_sum_exp", &NotDifferentiable<linear_log_probs_with_log_sum_exp_op>::call);
  m.impl("linear_log_probs_backward", &NotDifferentiable<linear_log_probs_backward_op>::call);
  using namespace fused_ops::moe_autograd;
  m.impl("moe_permute", &moe_permute_autograd);
  m.impl("moe_expert_mlp", &moe_expert_mlp_autograd);
  m.impl("moe_expert_mlp_keeping_gate_up", &NotDifferentiable<moe_expert_mlp_keeping_gate_up_op>::call);
  m.impl("moe_expert_mlp_backward", &NotDifferentiable<moe_expert_mlp_backward_op>::call);
  m.impl("moe_unpermute", &moe_unpermute_autograd);
  m.impl("moe_unpermute_backward", &NotDifferentiable<moe_unpermute_backward_op>::call);
  using namespace fused_ops::attention_autograd;
  m.impl("attention_with_sinks",
         &TransformAware<&attention_with_sinks_autograd, &attention_with_sinks_composite>::call);
  m.impl("attention_with_sinks_backward", &NotDifferentiable<attention_with_sinks_backward_op>::call);
}
