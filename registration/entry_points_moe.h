#pragma once
// The dispatcher-facing signatures of the experts' ops, shared by the CPU, CUDA and Meta registrations: check
// the arguments (checks_moe.h), then call the backend's implementation, `Backend` being MoeBackend<kernels>
// (the ops of ops/moe/experts.cpp around a backend's row kernels) or the Meta shapes.
#include <ATen/ATen.h>

#include "../ops/moe/moe.h"
#include "checks_moe.h"

namespace fused_ops {

template <const MoeRowKernels* kKernels>
struct MoeBackend {
  static std::tuple<at::Tensor, at::Tensor> expert_mlp(const at::Tensor& hidden, const at::Tensor& order,
                                                        const at::Tensor& offsets, const at::Tensor& routing_weights,
                                                        const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                                        const std::optional<at::Tensor>& gate_up_bias,
                                                        const std::optional<at::Tensor>& down_bias,
                                                        const MoeExpertOptions& options, bool keep_gate_up) {
    return moe_expert_mlp(hidden, order, offsets, routing_weights, gate_up_weight, down_weight, gate_up_bias,
                          down_bias, options, keep_gate_up, *kKernels);
  }
  static SixTensors expert_mlp_backward(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& order,
                                        const at::Tensor& offsets, const at::Tensor& routing_weights,
                                        const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                        const std::optional<at::Tensor>& gate_up_bias,
                                        const std::optional<at::Tensor>& down_bias, const MoeExpertOptions& options,
                                        std::array<bool, 6> output_mask, const std::optional<at::Tensor>& gate_up) {
    return moe_expert_mlp_backward(grad, hidden, order, offsets, routing_weights, gate_up_weight, down_weight,
                                   gate_up_bias, down_bias, options, output_mask, gate_up, *kKernels);
  }
  static at::Tensor unpermute(const at::Tensor& rows, const at::Tensor& order, const at::Tensor& offsets,
                              int64_t top_k, const std::optional<at::Tensor>& routing_weights) {
    return moe_unpermute(rows, order, offsets, routing_weights, top_k, *kKernels);
  }
  static std::tuple<at::Tensor, at::Tensor> unpermute_backward(const at::Tensor& grad, const at::Tensor& rows,
                                                               const at::Tensor& order, const at::Tensor& offsets,
                                                               int64_t top_k,
                                                               const std::optional<at::Tensor>& routing_weights,
                                                               std::array<bool, 2> output_mask) {
    return moe_unpermute_backward(grad, rows, order, offsets, routing_weights, top_k, output_mask, *kKernels);
  }
};

inline std::tuple<at::Tensor, at::Tensor> moe_permute_entry(const at::Tensor& top_k_index, int64_t num_experts) {
  check_moe_permute_arguments(top_k_index, num_experts);
  return moe_permute(top_k_index, num_experts);
}

// recompute only tells the autograd node what to keep: the values are the same.
template <typename Backend>
at::Tensor moe_expert_mlp_entry(const at::Tensor& hidden, const at::Tensor& order, const at::Tensor& offsets,
                                const at::Tensor& routing_weights, const at::Tensor& gate_up_weight,
                                const at::Tensor& down_weight, const std::optional<at::Tensor>& gate_up_bias,
                                const std::optional<at::Tensor>& down_bias, c10::string_view activation,
                                bool transposed, bool interleaved, double alpha, double limit, bool /*recompute*/) {
  const MoeExpertOptions options =
      check_moe_expert_mlp_arguments("moe_expert_mlp", hidden, order, offsets, routing_weights, gate_up_weight,
                                     down_weight, gate_up_bias, down_bias, activation, transposed, interleaved,
                                     alpha, limit);
  return std::get<0>(Backend::expert_mlp(hidden, order, offsets, routing_weights, gate_up_weight, down_weight,
                                         gate_up_bias, down_bias, options, /*keep_gate_up=*/false));
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> moe_expert_mlp_keeping_gate_up_entry(
    const at::Tensor& hidden, const at::Tensor& order, const at::Tensor& offsets, const at::Tensor& routing_weights,
    const at::Tensor& gate_up_weight, const at::Tensor& down_weight, const std::optional<at::Tensor>& gate_up_bias,
    const std::optional<at::Tensor>& down_bias, c10::string_view activation, bool transposed, bool interleaved,
    double alpha, double limit) {
  const MoeExpertOptions options =
      check_moe_expert_mlp_arguments("moe_expert_mlp_keeping_gate_up", hidden, order, offsets, routing_weights,
                                     gate_up_weight, down_weight, gate_up_bias, down_bias, activation, transposed,
                                     interleaved, alpha, limit);
  return Backend::expert_mlp(hidden, order, offsets, routing_weights, gate_up_weight, down_weight, gate_up_bias,
                             down_bias, options, /*keep_gate_up=*/true);
}

template <typename Backend>
SixTensors moe_expert_mlp_backward_entry(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& order,
                                         const at::Tensor& offsets, const at::Tensor& routing_weights,
                                         const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                         const std::optional<at::Tensor>& gate_up_bias,
                                         const std::optional<at::Tensor>& down_bias, c10::string_view activation,
                                         bool transposed, bool interleaved, double alpha, double limit,
                                         std::array<bool, 6> output_mask, const std::optional<at::Tensor>& gate_up) {
  const MoeExpertOptions options =
      check_moe_expert_mlp_arguments("moe_expert_mlp_backward", hidden, order, offsets, routing_weights,
                                     gate_up_weight, down_weight, gate_up_bias, down_bias, activation, transposed,
                                     interleaved, alpha, limit);
  check_moe_expert_mlp_grad(grad, hidden, order);
  check_moe_kept_gate_up(gate_up, hidden, order, gate_up_weight, transposed);
  return Backend::expert_mlp_backward(grad, hidden, order, offsets, routing_weights, gate_up_weight, down_weight,
                                      gate_up_bias, down_bias, options, output_mask, gate_up);
}

template <typename Backend>
at::Tensor moe_unpermute_entry(const at::Tensor& rows, const at::Tensor& order, const at::Tensor& offsets,
                               int64_t top_k, const std::optional<at::Tensor>& routing_weights) {
  check_moe_unpermute_arguments("moe_unpermute", rows, order, offsets, top_k, routing_weights);
  return Backend::unpermute(rows, order, offsets, top_k, routing_weights);
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> moe_unpermute_backward_entry(const at::Tensor& grad,
                                                                const std::optional<at::Tensor>& rows,
                                                                const at::Tensor& order, const at::Tensor& offsets,
                                                                int64_t top_k,
                                                                const std::optional<at::Tensor>& routing_weights,
                                                                std::array<bool, 2> output_mask) {
  check_moe_unpermute_backward_arguments(grad, rows, order, offsets, top_k, routing_weights, output_mask);
  return Backend::unpermute_backward(grad, rows.has_value() ? *rows : at::Tensor(), order, offsets, top_k, routing_weights,
                                     output_mask);
}

}  // namespace fused_ops
