#pragma once
// Mixture-of-experts experts: a token t routed to top_k experts makes the pairs p = t * top_k + j (j < top_k),
// pair p going to expert top_k_index[t, j] with routing weight routing_weights[t, j].
//   moe_permute:      order [S] (the pairs sorted by expert, stable; pairs of no expert, ids outside
//                     [0, E), last) and offsets [E] int32 (each expert's end in that order, as torch's grouped
//                     products take them); end = offsets[E - 1] pairs belong to an expert.
//   moe_expert_mlp:   rows [S, H], row s for pair p = order[s] of token t = p / top_k and expert e:
//                     w_p * (act(x W_gate_e^T + b_gate_e) * (x W_up_e^T + b_up_e)) W_down_e^T + b_down_e) for
//                     x = hidden[t], gate_up_weight [E, 2I, H] ([gate; up], or [E, H, 2I] transposed) and
//                     down_weight [E, H, I] ([E, I, H] transposed); rows from end on are 0. Its autograd node
//                     saves the op's inputs only: the backward gathers x, recomputes the gate/up product and the
//                     activation, and takes each routing weight's gradient as dot(g W_down_e, activation) (no
//                     [S, H] output kept). With recompute=False it also keeps the gate/up product [S, 2I]
//                     (moe_expert_mlp_keeping_gate_up), which the backward then takes instead of that product.
//   moe_unpermute:    out [T, H], out[t] = sum over j in order of w_p * rows[position of p] (w = 1 without
//                     routing weights), pairs of no expert skipped; float32 sums, one rounding, no atomics.
#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <tuple>

namespace fused_ops {

// The backend's row kernels (ops/moe/cpu.cpp, ops/moe/cuda.cu).
struct MoeRowKernels {
  // out [S, H]: out[s] = source[order[s] / top_k] for s < end, else 0.
  at::Tensor (*gather)(const at::Tensor& source, const at::Tensor& order, const at::Tensor& offsets, int64_t top_k);
  // out [tokens, H] of rows' dtype: out[t] = sum_j weight(t * top_k + j) * rows[position[t * top_k + j]] over the
  // pairs with position < end; weights: [tokens * top_k] or undefined (1).
  at::Tensor (*sum_pairs)(const at::Tensor& rows, const at::Tensor& position, const at::Tensor& offsets,
                          const at::Tensor& weights, int64_t top_k, int64_t tokens);
  // rows [S, N] contiguous: the rows from end on set to 0, in place (no others touched).
  void (*zero_rows_past_end)(const at::Tensor& rows, const at::Tensor& offsets);
  // For h [S, I] (d loss / d (weighted activation)), the activation [S, I] and one routing weight a row
  // (opmath [S]): (h * weight in the activation's dtype, dot(h, activation) a row in opmath), one pass.
  std::tuple<at::Tensor, at::Tensor> (*routing_backward)(const at::Tensor& h, const at::Tensor& activation,
                                                         const at::Tensor& row_weights);
  // Biases per expert, for rows [S, N] contiguous in expert order (offsets) and bias [E, N]: rows[s] +=
  // scale[s] * bias[expert of s] in place for s < end (scale [S], or undefined: 1), one rounding.
  void (*add_expert_bias)(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets,
                          const at::Tensor& row_scale);
  // [E, N] in opmath: each expert's sum of scale[s] * values[s] over its rows, rows in order (no atomics).
  at::Tensor (*expert_column_sums)(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& row_scale);
  // [S] in opmath: dot(rows[s], bias[expert of s]) for s < end, 0 from end on.
  at::Tensor (*expert_bias_dots)(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets);
  // gpt-oss's clamped SwiGLU (MoeExpertOptions) on gate_up [S, 2I] -> [S, I] in opmath, one rounding, and its
  // gradient [S, 2I] in gate_up's layout.
  at::Tensor (*clamped_gate)(const at::Tensor& gate_up, bool interleaved, double alpha, double limit);
  at::Tensor (*clamped_gate_backward)(const at::Tensor& grad, const at::Tensor& gate_up, bool interleaved,
                                      double alpha, double limit);
};

at::Tensor moe_gather_cpu(const at::Tensor& source, const at::Tensor& order, const at::Tensor& offsets, int64_t top_k);
at::Tensor moe_sum_pairs_cpu(const at::Tensor& rows, const at::Tensor& position, const at::Tensor& offsets,
                             const at::Tensor& weights, int64_t top_k, int64_t tokens);
void moe_zero_rows_past_end_cpu(const at::Tensor& rows, const at::Tensor& offsets);
std::tuple<at::Tensor, at::Tensor> moe_routing_backward_cpu(const at::Tensor& h, const at::Tensor& activation,
                                                            const at::Tensor& row_weights);
at::Tensor moe_gather_cuda(const at::Tensor& source, const at::Tensor& order, const at::Tensor& offsets, int64_t top_k);
at::Tensor moe_sum_pairs_cuda(const at::Tensor& rows, const at::Tensor& position, const at::Tensor& offsets,
                              const at::Tensor& weights, int64_t top_k, int64_t tokens);
void moe_zero_rows_past_end_cuda(const at::Tensor& rows, const at::Tensor& offsets);
std::tuple<at::Tensor, at::Tensor> moe_routing_backward_cuda(const at::Tensor& h, const at::Tensor& activation,
                                                             const at::Tensor& row_weights);
void moe_add_expert_bias_cpu(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets,
                             const at::Tensor& row_scale);
at::Tensor moe_expert_column_sums_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& row_scale);
at::Tensor moe_expert_bias_dots_cpu(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets);
void moe_add_expert_bias_cuda(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets,
                              const at::Tensor& row_scale);
at::Tensor moe_expert_column_sums_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& row_scale);
at::Tensor moe_expert_bias_dots_cuda(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets);
// The clamped SwiGLU from ATen's ops (every backend's reference; the CPU's kernels) and the CUDA kernels.
at::Tensor clamped_gate_composite(const at::Tensor& gate_up, bool interleaved, double alpha, double limit);
at::Tensor clamped_gate_backward_composite(const at::Tensor& grad, const at::Tensor& gate_up, bool interleaved,
                                           double alpha, double limit);
at::Tensor moe_clamped_gate_cuda(const at::Tensor& gate_up, bool interleaved, double alpha, double limit);
at::Tensor moe_clamped_gate_backward_cuda(const at::Tensor& grad, const at::Tensor& gate_up, bool interleaved,
                                          double alpha, double limit);

struct MoeExpertOptions {
  int64_t top_k = 1;
  bool transposed = false;
  // 'silu', 'gelu', 'gelu_tanh': act(gate) * up; 'swiglu_oai' (gpt-oss): (clamp(up, -limit, limit) + 1) * g *
  // sigmoid(alpha * g) for g = clamp(gate, max=limit).
  c10::string_view activation = "silu";
  bool interleaved = false;  // gate and up as columns 2i and 2i + 1 of the gate/up product, not its halves
  double alpha = 1.702;
  double limit = 7.0;
};

// The gate on the gate/up product [S, 2I] -> [S, I], and its gradient [S, 2I] (ops/moe/gate.cpp).
at::Tensor experts_gate(const at::Tensor& gate_up, const MoeExpertOptions& options, const MoeRowKernels& kernels);
at::Tensor experts_gate_backward(const at::Tensor& grad, const at::Tensor& gate_up, const MoeExpertOptions& options,
                                 const MoeRowKernels& kernels);

// One implementation for every backend (ATen's sort and scans).
std::tuple<at::Tensor, at::Tensor> moe_permute(const at::Tensor& top_k_index, int64_t num_experts);

// position [S]: where each pair is in `order` (position[order[s]] = s).
at::Tensor moe_positions(const at::Tensor& order);

// The rows, and where keep_gate_up the gate/up product [S, 2I] (0 from end on) the backward can take instead of
// recomputing it (undefined otherwise).
std::tuple<at::Tensor, at::Tensor> moe_expert_mlp(const at::Tensor& hidden, const at::Tensor& order,
                                                  const at::Tensor& offsets, const at::Tensor& routing_weights,
                                                  const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                                  const std::optional<at::Tensor>& gate_up_bias,
                                                  const std::optional<at::Tensor>& down_bias,
                                                  const MoeExpertOptions& options, bool keep_gate_up,
                                                  const MoeRowKernels& kernels);

using SixTensors = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// output_mask: hidden, routing_weights, gate_up_weight, down_weight, gate_up_bias, down_bias. kept_gate_up: the
// forward's gate/up product (moe_expert_mlp with keep_gate_up), or none: recomputed.
SixTensors moe_expert_mlp_backward(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& order,
                                   const at::Tensor& offsets, const at::Tensor& routing_weights,
                                   const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                   const std::optional<at::Tensor>& gate_up_bias,
                                   const std::optional<at::Tensor>& down_bias, const MoeExpertOptions& options,
                                   std::array<bool, 6> output_mask, const std::optional<at::Tensor>& kept_gate_up,
                                   const MoeRowKernels& kernels);

at::Tensor moe_unpermute(const at::Tensor& rows, const at::Tensor& order, const at::Tensor& offsets,
                         const std::optional<at::Tensor>& routing_weights, int64_t top_k, const MoeRowKernels& kernels);

// output_mask: rows, routing_weights; rows (undefined: not needed) only for the routing weights' gradient.
std::tuple<at::Tensor, at::Tensor> moe_unpermute_backward(const at::Tensor& grad, const at::Tensor& rows,
                                                          const at::Tensor& order, const at::Tensor& offsets,
                                                          const std::optional<at::Tensor>& routing_weights,
                                                          int64_t top_k, std::array<bool, 2> output_mask,
                                                          const MoeRowKernels& kernels);

}  // namespace fused_ops
