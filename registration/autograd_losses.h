#pragma once
// The autograd Functions of the LM-head ops (linear_cross_entropy, linear_log_probs) and the handles of
// the ops they call; registration/autograd.cpp registers them at the Autograd key with the others.
#include <string>
#include <tuple>
#include <vector>

#include "autograd.h"
#include "checks.h"

namespace fused_ops {
namespace lm_head_autograd {

using ThreeTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using TwoTensors = std::tuple<at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;
using TensorRef = const at::Tensor&;
using StringOption = c10::string_view;
using GradientMask = std::array<bool, 3>;

inline const FusedOp<at::Tensor(TensorRef, TensorRef, TensorRef, const OptionalTensor&, int64_t, double, StringOption, double)>
    linear_cross_entropy_op{"fused::linear_cross_entropy"};
inline const FusedOp<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    TensorRef, TensorRef, TensorRef, const OptionalTensor&, int64_t, double, StringOption, double, GradientMask)>
    linear_cross_entropy_with_gradients_op{"fused::linear_cross_entropy_with_gradients"};
inline const FusedOp<ThreeTensors(TensorRef, TensorRef, TensorRef, TensorRef, const OptionalTensor&, int64_t, double,
                           StringOption, double, GradientMask)>
    linear_cross_entropy_backward_op{"fused::linear_cross_entropy_backward"};
inline const FusedOp<TwoTensors(TensorRef, TensorRef, TensorRef, const OptionalTensor&, double, int64_t, bool, double,
                                 double)>
    linear_log_probs_op{"fused::linear_log_probs"};
inline const FusedOp<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    TensorRef, TensorRef, TensorRef, const OptionalTensor&, double, int64_t, bool, double, double, c10::SymInt)>
    linear_log_probs_with_log_sum_exp_op{"fused::linear_log_probs_with_log_sum_exp"};
inline const FusedOp<ThreeTensors(const OptionalTensor&, const OptionalTensor&, TensorRef, TensorRef, TensorRef,
                           const OptionalTensor&, double, int64_t, GradientMask, double, double, const OptionalTensor&,
                           const OptionalTensor&, const OptionalTensor&)>
    linear_log_probs_backward_op{"fused::linear_log_probs_backward"};


// linear_cross_entropy. With the mean or the sum, the forward computes the gradients for
// grad_output = 1 along with the loss (the logits are in hand then) and the backward scales them in
// place: no [N, V] tensor at any time and no second pass over the products. With 'none' each row's
// grad_output is known only in the backward, which recomputes the logits chunk by chunk; so does a
// second backward through the same graph.
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& target, const OptionalTensor& bias, int64_t ignore_index,
                            double label_smoothing, StringOption reduction, double softcap) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    // Errors name the op called, not linear_cross_entropy_with_gradients.
    check_linear_cross_entropy_arguments("linear_cross_entropy", input, weight, target, bias, ignore_index,
                                         label_smoothing, reduction, softcap);
    const GradientMask mask = {input.requires_grad(), weight.requires_grad(), requires_grad(bias)};
    ctx->saved_data["options"] = c10::IValue(std::make_tuple(ignore_index, label_smoothing, std::string(reduction), softcap));
    ctx->saved_data["mask"] = c10::IValue(std::vector<bool>(mask.begin(), mask.end()));
    ctx->save_for_backward({input, weight, target, bias.has_value() ? *bias : at::Tensor()});
    if (reduction == "none") {
      return linear_cross_entropy_op(input, weight, target, bias, ignore_index, label_smoothing, reduction, softcap);
    }
    auto [loss, grad_input, grad_weight, grad_bias] = linear_cross_entropy_with_gradients_op(
        input, weight, target, bias, ignore_index, label_smoothing, reduction, softcap, mask);
    ctx->saved_data["gradients"] = c10::IValue(std::vector<at::Tensor>{grad_input, grad_weight, grad_bias});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(!at::GradMode::is_enabled(), "fused::linear_cross_entropy: double backward (create_graph=True) is "
                "not supported: the op's gradients are not differentiable");
    const auto options = ctx->saved_data["options"].to<std::tuple<int64_t, double, std::string, double>>();
    const auto& [ignore_index, label_smoothing, reduction, softcap] = options;
    const c10::List<bool> mask_list = ctx->saved_data["mask"].toBoolList();
    const GradientMask mask = {mask_list[0], mask_list[1], mask_list[2]};
    at::Tensor grad_input, grad_weight, grad_bias;
    auto computed = ctx->saved_data.find("gradients");
    if (computed != ctx->saved_data.end()) {
      // The forward's gradients, scaled in place and handed over: no second copy of the weight's.
      const std::vector<at::Tensor> gradients = computed->second.toTensorVector();
      ctx->saved_data.erase(computed);
      std::vector<at::Tensor> scaled;
      for (int i = 0; i < 3; ++i) {
        if (mask[i]) scaled.push_back(gradients[i]);
      }
      // One vectorized pass over all of them with the scale read on the device. The foreach kernel
      // takes a scale of the gradients' own dtype only (any other goes element by element at a third of
      // the bandwidth); rounding grad_output to it adds at most one rounding of that dtype, none for the
      // usual 1 or a power of two.
      if (!scaled.empty()) {
        const at::Tensor scale = grad_outputs[0].to(scaled.front().scalar_type());
        // A tensor subclass (DTensor) scales each gradient by itself: torch 2.11's DTensor foreach
        // multiply leaves Partial tensors (the weight's and bias's gradients of sharded rows) unscaled.
        if (scale.key_set().has(c10::DispatchKey::Python)) {
          for (at::Tensor& gradient : scaled) gradient.mul_(scale);
        } else {
          at::_foreach_mul_(scaled, scale);
        }
      }
      grad_input = mask[0] ? gradients[0] : at::Tensor();
      grad_weight = mask[1] ? gradients[1] : at::Tensor();
      grad_bias = mask[2] ? gradients[2] : at::Tensor();
    } else {
      // 'none', or a later backward through the same graph (retain_graph=True): recomputed.
      const variable_list saved = ctx->get_saved_variables();
      const OptionalTensor bias = saved[3].defined() ? OptionalTensor(saved[3]) : std::nullopt;
      std::tie(grad_input, grad_weight, grad_bias) = linear_cross_entropy_backward_op(
          grad_outputs[0], saved[0], saved[1], saved[2], bias, ignore_index, label_smoothing, reduction, softcap, mask);
    }
    return {mask[0] ? grad_input : at::Tensor(), mask[1] ? grad_weight : at::Tensor(), at::Tensor(),
            mask[2] ? grad_bias : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// linear_log_probs. The per-row weights of both outputs (advantages, ratios, KL terms) are known only in
// the backward, which recomputes the logits chunk by chunk of classes from the rows' log-sum-exp (and
// entropy) the forward saves, all but those of the first classes, which the forward keeps where a
// gradient will be asked for (never under no_grad). An output whose gradient is absent (unused in the loss, or the entropy not
// asked for) costs nothing in the backward's kernel.
class LinearLogProbsFunction : public torch::autograd::Function<LinearLogProbsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                               const at::Tensor& target, const OptionalTensor& bias, double temperature,
                               int64_t ignore_index, bool return_entropy, double logit_scale, double softcap) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const GradientMask mask = {input.requires_grad(), weight.requires_grad(), requires_grad(bias)};
    ctx->saved_data["options"] = c10::IValue(std::make_tuple(temperature, ignore_index, return_entropy));
    ctx->saved_data["head"] = c10::IValue(std::make_tuple(logit_scale, softcap));
    ctx->saved_data["mask"] = c10::IValue(std::vector<bool>(mask.begin(), mask.end()));
    ctx->set_materialize_grads(false);
    // The autograd kernel runs this only where a gradient is recorded (AutogradKernel, autograd.h).
    const c10::SymInt kept_classes = mask[0] || mask[1] ? log_probs_kept_classes(input, weight) : c10::SymInt(0);
    auto [log_probs, entropy, log_sum_exp, kept_logits] = linear_log_probs_with_log_sum_exp_op(
        input, weight, target, bias, temperature, ignore_index, return_entropy, logit_scale, softcap, kept_classes);
    ctx->save_for_backward({input, weight, target, bias.has_value() ? *bias : at::Tensor(), log_sum_exp,
                            return_entropy ? entropy : at::Tensor(), kept_logits});
    if (!return_entropy) ctx->mark_non_differentiable({entropy});
    return {log_probs, entropy};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    TORCH_CHECK(!at::GradMode::is_enabled(), "fused::linear_log_probs: double backward (create_graph=True) is "
                "not supported: the op's gradients are not differentiable");
    const auto [temperature, ignore_index, return_entropy] =
        ctx->saved_data["options"].to<std::tuple<double, int64_t, bool>>();
    const auto [logit_scale, softcap] = ctx->saved_data["head"].to<std::tuple<double, double>>();
    const c10::List<bool> mask_list = ctx->saved_data["mask"].toBoolList();
    const GradientMask mask = {mask_list[0], mask_list[1], mask_list[2]};
    const OptionalTensor grad_log_probs = grad_outputs[0].defined() ? OptionalTensor(grad_outputs[0]) : std::nullopt;
    const OptionalTensor grad_entropy =
        return_entropy && grad_outputs[1].defined() ? OptionalTensor(grad_outputs[1]) : std::nullopt;
    const variable_list saved = ctx->get_saved_variables();
    const OptionalTensor bias = saved[3].defined() ? OptionalTensor(saved[3]) : std::nullopt;
    auto [grad_input, grad_weight, grad_bias] = linear_log_probs_backward_op(
        grad_log_probs, grad_entropy, saved[0], saved[1], saved[2], bias, temperature, ignore_index, mask, logit_scale,
        softcap, saved[4], saved[5].defined() ? OptionalTensor(saved[5]) : std::nullopt, saved[6]);
    return {mask[0] ? grad_input : at::Tensor(), mask[1] ? grad_weight : at::Tensor(), at::Tensor(),
            mask[2] ? grad_bias : at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace lm_head_autograd
}  // namespace fused_ops
