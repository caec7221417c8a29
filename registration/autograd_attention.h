#pragma once
// Autograd of attention_with_sinks: the node saves the inputs, the output and the log-sum-exp (no [S, S]
// scores); its backward op recomputes the probabilities from them. Under a torch.func transform or forward-mode
// AD the op runs its ATen reference, whose derivative and batching rules are ATen's.
#include "autograd_transforms.h"
#include "entry_points_attention.h"

namespace fused_ops {
namespace attention_autograd {

using TensorRef = const at::Tensor&;
using TwoTensors = std::tuple<at::Tensor, at::Tensor>;
using FourTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

inline const FusedOp<TwoTensors(TensorRef, TensorRef, TensorRef, TensorRef, double, int64_t)> attention_with_sinks_op{
    "fused::attention_with_sinks"};
inline const FusedOp<FourTensors(TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, double,
                                 int64_t)>
    attention_with_sinks_backward_op{"fused::attention_with_sinks_backward"};

class AttentionWithSinksFunction : public torch::autograd::Function<AttentionWithSinksFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& query, const at::Tensor& key,
                               const at::Tensor& value, const at::Tensor& sinks, double scale, int64_t window) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, log_sum_exp] = attention_with_sinks_op(query, key, value, sinks, scale, window);
    ctx->save_for_backward({query, key, value, sinks, output, log_sum_exp});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = window;
    ctx->mark_non_differentiable({log_sum_exp});
    return {output, log_sum_exp};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor grad = grad_outputs[0].defined() ? grad_outputs[0] : at::zeros_like(saved[4]);
    auto [grad_query, grad_key, grad_value, grad_sinks] =
        attention_with_sinks_backward_op(grad, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
                                         ctx->saved_data["scale"].toDouble(), ctx->saved_data["window"].toInt());
    return {grad_query, grad_key, grad_value, grad_sinks, at::Tensor(), at::Tensor()};
  }
};

inline TwoTensors attention_with_sinks_autograd(const at::Tensor& query, const at::Tensor& key,
                                                const at::Tensor& value, const at::Tensor& sinks, double scale,
                                                int64_t window) {
  auto outputs = AttentionWithSinksFunction::apply(query, key, value, sinks, scale, window);
  return {outputs[0], outputs[1]};
}

// The reference is a composition of ATen's differentiable ops.
inline TwoTensors attention_with_sinks_composite(const at::Tensor& query, const at::Tensor& key,
                                                 const at::Tensor& value, const at::Tensor& sinks, double scale,
                                                 int64_t window) {
  const auto options = check_attention_with_sinks("attention_with_sinks", query, key, value, sinks, scale, window);
  return attention_with_sinks_reference(query, key, value, sinks, options);
}

}  // namespace attention_autograd
}  // namespace fused_ops
