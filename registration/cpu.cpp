#include <torch/library.h>

#include "../ops/activations/bias_gelu.h"
#include "../ops/activations/gated_mul.h"
#include "../ops/activations/gelu_mul.h"
#include "../ops/activations/silu_mul.h"
#include "../ops/cross_entropy/linear_cross_entropy.h"
#include "../ops/cross_entropy/linear_log_probs.h"
#include "../ops/elementwise/relu_add.h"
#include "../ops/norms/norm.h"
#include "../ops/rotary/rotary.h"
#include "entry_points.h"
#include "entry_points_attention.h"
#include "entry_points_moe.h"

using namespace fused_ops;

namespace {
// attention_with_sinks' kernels (ops/attention).
struct AttentionWithSinksCpu {
  static constexpr auto forward = &attention_with_sinks_reference;
  static constexpr auto backward = &attention_with_sinks_backward_reference;
};

constexpr MoeRowKernels kMoeRowKernels{&moe_gather_cpu, &moe_sum_pairs_cpu, &moe_zero_rows_past_end_cpu,
                                         &moe_routing_backward_cpu, &moe_add_expert_bias_cpu,
                                         &moe_expert_column_sums_cpu, &moe_expert_bias_dots_cpu, &clamped_gate_composite,
                                         &clamped_gate_backward_composite};
using Moe = MoeBackend<&kMoeRowKernels>;
}  // namespace

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  m.impl("relu_add", &relu_add_entry<relu_add_cpu>);
  m.impl("relu_add_backward", &relu_add_backward_entry<relu_add_backward_cpu>);
  m.impl("relu_add_with_mask", &relu_add_with_mask_entry<relu_add_with_mask_cpu>);
  m.impl("relu_add_backward_masked", &relu_add_backward_masked_entry<relu_add_backward_masked_cpu>);
  m.impl("bias_gelu", &bias_gelu_entry<bias_gelu_cpu>);
  m.impl("bias_gelu_backward", &bias_gelu_backward_entry<bias_gelu_backward_cpu>);
  m.impl("silu_mul", &silu_mul_entry<silu_mul_cpu>);
  m.impl("silu_mul_backward", &silu_mul_backward_entry<silu_mul_backward_cpu>);
  m.impl("gelu_mul", &gelu_mul_entry<gelu_mul_cpu>);
  m.impl("gelu_mul_backward", &gelu_mul_backward_entry<gelu_mul_backward_cpu>);
  m.impl("gated_mul", &gated_mul_entry<gated_mul_cpu>);
  m.impl("gated_mul_backward", &gated_mul_backward_entry<gated_mul_backward_cpu>);
  m.impl("rms_norm", &rms_norm_entry<rms_norm_cpu>);
  m.impl("add_rms_norm", &add_rms_norm_entry<add_rms_norm_cpu>);
  m.impl("rms_norm_backward", &rms_norm_backward_entry<rms_norm_backward_cpu>);
  m.impl("layer_norm", &layer_norm_entry<layer_norm_cpu>);
  m.impl("add_layer_norm", &add_layer_norm_entry<add_layer_norm_cpu>);
  m.impl("layer_norm_backward", &layer_norm_backward_entry<layer_norm_backward_cpu>);
  m.impl("rotary_embedding", &rotary_embedding_entry<rotary_embedding_cpu>);
  m.impl("rotary_embedding_backward", &rotary_embedding_backward_entry<rotary_embedding_backward_cpu>);
  using CrossEntropy = LinearCrossEntropyKernels<cross_entropy_cpu_backend>;
  m.impl("linear_cross_entropy", &linear_cross_entropy_entry<CrossEntropy>);
  m.impl("linear_cross_entropy_with_gradients", &linear_cross_entropy_with_gradients_entry<CrossEntropy>);
  m.impl("linear_cross_entropy_backward", &linear_cross_entropy_backward_entry<CrossEntropy>);
  using LogProbs = LinearLogProbsKernels<log_probs_cpu_backend>;
  m.impl("linear_log_probs", &linear_log_probs_entry<LogProbs>);
  m.impl("linear_log_probs_with_log_sum_exp", &linear_log_probs_with_log_sum_exp_entry<LogProbs>);
  m.impl("linear_log_probs_backward", &linear_log_probs_backward_entry<LogProbs>);
  m.impl("moe_expert_mlp", &moe_expert_mlp_entry<Moe>);
  m.impl("moe_expert_mlp_keeping_gate_up", &moe_expert_mlp_keeping_gate_up_entry<Moe>);
  m.impl("moe_expert_mlp_backward", &moe_expert_mlp_backward_entry<Moe>);
  m.impl("moe_unpermute", &moe_unpermute_entry<Moe>);
  m.impl("moe_unpermute_backward", &moe_unpermute_backward_entry<Moe>);
  m.impl("attention_with_sinks", &attention_with_sinks_entry<AttentionWithSinksCpu>);
  m.impl("attention_with_sinks_backward", &attention_with_sinks_backward_entry<AttentionWithSinksCpu>);
}
