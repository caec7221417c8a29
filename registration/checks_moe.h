#pragma once
// The argument checks of the experts' ops (ops/moe/moe.h): every error a caller can make, named.
#include <ATen/ATen.h>

#include <array>
#include <optional>

#include "../ops/moe/moe.h"

namespace fused_ops {

// top_k_index [T, top_k] of an integer dtype; num_experts >= 1.
void check_moe_permute_arguments(const at::Tensor& top_k_index, int64_t num_experts);
// hidden [T, H] floating; order [T * top_k] int64 and offsets [E] int32 on hidden's device; routing_weights
// [T, top_k] floating; gate_up_weight [E, 2I, H] ([E, H, 2I] transposed) and down_weight [E, H, I] ([E, I, H])
// of hidden's dtype; biases [E, 2I] and [E, H]. Returns the options parsed.
MoeExpertOptions check_moe_expert_mlp_arguments(const char* op, const at::Tensor& hidden, const at::Tensor& order,
                                                const at::Tensor& offsets, const at::Tensor& routing_weights,
                                                const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                                const std::optional<at::Tensor>& gate_up_bias,
                                                const std::optional<at::Tensor>& down_bias,
                                                c10::string_view activation, bool transposed, bool interleaved,
                                                double alpha, double limit);
// grad: [T * top_k, H] floating, on hidden's device.
void check_moe_expert_mlp_grad(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& order);
// gate_up (none, or the forward's kept gate/up product): [T * top_k, 2I] of hidden's dtype and device.
void check_moe_kept_gate_up(const std::optional<at::Tensor>& gate_up, const at::Tensor& hidden, const at::Tensor& order,
                            const at::Tensor& gate_up_weight, bool transposed);
// rows [S, H] floating; order [S] int64; offsets [E] int32; top_k >= 1 dividing S; routing_weights [S / top_k,
// top_k] floating.
void check_moe_unpermute_arguments(const char* op, const at::Tensor& rows, const at::Tensor& order,
                                   const at::Tensor& offsets, int64_t top_k,
                                   const std::optional<at::Tensor>& routing_weights);

// grad [S / top_k, H] floating; rows (the forward's, needed for the routing weights' gradient) [S, H].
void check_moe_unpermute_backward_arguments(const at::Tensor& grad, const std::optional<at::Tensor>& rows,
                                            const at::Tensor& order, const at::Tensor& offsets, int64_t top_k,
                                            const std::optional<at::Tensor>& routing_weights,
                                            std::array<bool, 2> output_mask);

}  // namespace fused_ops
