#pragma once
// Autograd of the experts' ops. moe_expert_mlp's node saves its inputs only (the hidden states, the routing and
// the weights): its backward op gathers the rows and recomputes the gate/up product and the activation; with
// recompute=False it also saves the gate/up product (moe_expert_mlp_keeping_gate_up's), which the backward takes.
// moe_unpermute's saves the routing, and its rows only where the routing weights take a gradient.
#include "autograd.h"
#include "checks.h"
#include "checks_moe.h"

namespace fused_ops {
namespace moe_autograd {

using SixTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using TwoTensors = std::tuple<at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;
using TensorRef = const at::Tensor&;

inline const FusedOp<TwoTensors(TensorRef, int64_t)> moe_permute_op{"fused::moe_permute"};
inline const FusedOp<at::Tensor(TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, const OptionalTensor&,
                                const OptionalTensor&, c10::string_view, bool, bool, double, double, bool)>
    moe_expert_mlp_op{"fused::moe_expert_mlp"};
inline const FusedOp<TwoTensors(TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, const OptionalTensor&,
                                const OptionalTensor&, c10::string_view, bool, bool, double, double)>
    moe_expert_mlp_keeping_gate_up_op{"fused::moe_expert_mlp_keeping_gate_up"};
inline const FusedOp<SixTensors(TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef, TensorRef,
                                const OptionalTensor&, const OptionalTensor&, c10::string_view, bool, bool, double,
                                double, std::array<bool, 6>, const OptionalTensor&)>
    moe_expert_mlp_backward_op{"fused::moe_expert_mlp_backward"};
inline const FusedOp<at::Tensor(TensorRef, TensorRef, TensorRef, int64_t, const OptionalTensor&)> moe_unpermute_op{
    "fused::moe_unpermute"};
inline const FusedOp<TwoTensors(TensorRef, const OptionalTensor&, TensorRef, TensorRef, int64_t, const OptionalTensor&,
                                std::array<bool, 2>)>
    moe_unpermute_backward_op{"fused::moe_unpermute_backward"};

inline OptionalTensor optional_of(const at::Tensor& tensor) {
  return tensor.defined() ? OptionalTensor(tensor) : std::nullopt;
}

class MoeExpertMlpFunction : public torch::autograd::Function<MoeExpertMlpFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& order,
                            const at::Tensor& offsets, const at::Tensor& routing_weights,
                            const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                            const OptionalTensor& gate_up_bias, const OptionalTensor& down_bias,
                            c10::string_view activation, bool transposed, bool interleaved, double alpha,
                            double limit, bool recompute) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor rows, gate_up;
    if (recompute) {
      rows = moe_expert_mlp_op(hidden, order, offsets, routing_weights, gate_up_weight, down_weight, gate_up_bias,
                               down_bias, activation, transposed, interleaved, alpha, limit, recompute);
    } else {
      std::tie(rows, gate_up) =
          moe_expert_mlp_keeping_gate_up_op(hidden, order, offsets, routing_weights, gate_up_weight, down_weight,
                                            gate_up_bias, down_bias, activation, transposed, interleaved, alpha, limit);
    }
    ctx->save_for_backward({hidden, order, offsets, routing_weights, gate_up_weight, down_weight,
                            gate_up_bias.value_or(at::Tensor()), down_bias.value_or(at::Tensor()), gate_up});
    // An absent bias has no input slot to ask.
    ctx->saved_data["gate_up_bias_needs_grad"] = requires_grad(gate_up_bias);
    ctx->saved_data["down_bias_needs_grad"] = requires_grad(down_bias);
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["transposed"] = transposed;
    ctx->saved_data["interleaved"] = interleaved;
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["limit"] = limit;
    return rows;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const std::array<bool, 6> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(3), ctx->needs_input_grad(4),
                                      ctx->needs_input_grad(5), ctx->saved_data["gate_up_bias_needs_grad"].toBool(),
                                      ctx->saved_data["down_bias_needs_grad"].toBool()};
    auto [grad_hidden, grad_routing, grad_gate_up, grad_down, grad_gate_up_bias, grad_down_bias] =
        moe_expert_mlp_backward_op(grad_outputs[0], saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
                                   optional_of(saved[6]), optional_of(saved[7]),
                                   ctx->saved_data["activation"].toStringRef(), ctx->saved_data["transposed"].toBool(),
                                   ctx->saved_data["interleaved"].toBool(), ctx->saved_data["alpha"].toDouble(),
                                   ctx->saved_data["limit"].toDouble(), mask, optional_of(saved[8]));
    auto kept = [](bool wanted, const at::Tensor& gradient) { return wanted ? gradient : at::Tensor(); };
    return {kept(mask[0], grad_hidden), at::Tensor(), at::Tensor(), kept(mask[1], grad_routing),
            kept(mask[2], grad_gate_up), kept(mask[3], grad_down), kept(mask[4], grad_gate_up_bias),
            kept(mask[5], grad_down_bias), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

class MoeUnpermuteFunction : public torch::autograd::Function<MoeUnpermuteFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& order,
                            const at::Tensor& offsets, int64_t top_k, const OptionalTensor& routing_weights) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const bool weights_need_grad = requires_grad(routing_weights);
    ctx->save_for_backward({weights_need_grad ? rows : at::Tensor(), order, offsets,
                            routing_weights.value_or(at::Tensor())});
    ctx->saved_data["weights_need_grad"] = weights_need_grad;
    ctx->saved_data["top_k"] = top_k;
    ctx->saved_data["rows_dtype"] = rows.scalar_type();
    return moe_unpermute_op(rows, order, offsets, top_k, routing_weights);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const std::array<bool, 2> mask = {ctx->needs_input_grad(0), ctx->saved_data["weights_need_grad"].toBool()};
    auto [grad_rows, grad_weights] =
        moe_unpermute_backward_op(grad_outputs[0], optional_of(saved[0]), saved[1], saved[2],
                                  ctx->saved_data["top_k"].toInt(), optional_of(saved[3]), mask);
    return {mask[0] ? grad_rows.to(ctx->saved_data["rows_dtype"].toScalarType()) : at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), mask[1] ? grad_weights : at::Tensor()};
  }
};

// torch.func transforms and forward-mode AD: an error naming the op (no rule of either kind exists for it).
template <typename... Arguments>
void check_no_transform(const char* op, const Arguments&... arguments) {
  TORCH_CHECK(!under_a_transform(arguments...), op,
              ": torch.func transforms (grad, vjp, jvp, vmap) and forward-mode AD are not supported by the experts' "
              "ops; transformers' own experts implementations compute the same there (a model patched by "
              "fused_ops.fuse() runs them under a transform by itself)");
}

// Integer results of integer indices: nothing to differentiate.
inline TwoTensors moe_permute_autograd(const at::Tensor& top_k_index, int64_t num_experts) {
  return moe_permute_op.below_autograd(top_k_index, num_experts);
}

inline at::Tensor moe_expert_mlp_autograd(const at::Tensor& hidden, const at::Tensor& order, const at::Tensor& offsets,
                                          const at::Tensor& routing_weights, const at::Tensor& gate_up_weight,
                                          const at::Tensor& down_weight, const OptionalTensor& gate_up_bias,
                                          const OptionalTensor& down_bias, c10::string_view activation,
                                          bool transposed, bool interleaved, double alpha, double limit,
                                          bool recompute) {
  check_no_transform("fused::moe_expert_mlp", hidden, routing_weights, gate_up_weight, down_weight, gate_up_bias,
                     down_bias);
  // An error names the op called, not moe_expert_mlp_keeping_gate_up, which the node runs for recompute=False.
  if (!recompute) {
    check_moe_expert_mlp_arguments("moe_expert_mlp", hidden, order, offsets, routing_weights, gate_up_weight,
                                   down_weight, gate_up_bias, down_bias, activation, transposed, interleaved, alpha,
                                   limit);
  }
  return AutogradKernel<MoeExpertMlpFunction, moe_expert_mlp_op>::call(
      hidden, order, offsets, routing_weights, gate_up_weight, down_weight, gate_up_bias, down_bias, activation,
      transposed, interleaved, alpha, limit, recompute);
}

inline at::Tensor moe_unpermute_autograd(const at::Tensor& rows, const at::Tensor& order, const at::Tensor& offsets,
                                         int64_t top_k, const OptionalTensor& routing_weights) {
  check_no_transform("fused::moe_unpermute", rows, routing_weights);
  return AutogradKernel<MoeUnpermuteFunction, moe_unpermute_op>::call(rows, order, offsets, top_k, routing_weights);
}

}  // namespace moe_autograd
}  // namespace fused_ops
