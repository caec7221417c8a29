#include "checks_moe.h"

#include <cmath>

#include "checks.h"

namespace fused_ops {
namespace {

void check_index_vector(const char* op, const char* arg, const at::Tensor& tensor, at::ScalarType dtype,
                        const char* reference_arg, const at::Tensor& reference) {
  check_defined(op, arg, tensor);
  check_same_device(op, arg, tensor, reference_arg, reference);
  TORCH_CHECK(tensor.scalar_type() == dtype, "fused::", op, ": expected ", arg, " to be ", dtype, " (as moe_permute ",
              "returns it), but got ", tensor.scalar_type());
  TORCH_CHECK(tensor.dim() == 1, "fused::", op, ": expected ", arg, " to be 1-D, but got shape ", tensor.sym_sizes());
}

void check_routing_weights(const char* op, const at::Tensor& weights, const c10::SymInt& tokens,
                           const c10::SymInt& top_k, const at::Tensor& reference, const char* reference_arg) {
  check_floating(op, "routing_weights", weights);
  check_same_device(op, "routing_weights", weights, reference_arg, reference);
  TORCH_CHECK(weights.dim() == 2 && weights.sym_size(0) == tokens && weights.sym_size(1) == top_k, "fused::", op,
              ": expected routing_weights of shape [tokens = ", tokens, ", top_k = ", top_k, "], but got shape ",
              weights.sym_sizes());
}

void check_expert_bias(const char* op, const char* arg, const std::optional<at::Tensor>& bias,
                       const c10::SymInt& experts, const c10::SymInt& width, const at::Tensor& hidden) {
  if (!bias.has_value() || !bias->defined()) return;
  check_same_dtype(op, arg, *bias, "hidden_states", hidden);
  check_same_device(op, arg, *bias, "hidden_states", hidden);
  TORCH_CHECK(bias->dim() == 2 && bias->sym_size(0) == experts && bias->sym_size(1) == width, "fused::", op,
              ": expected ", arg, " of shape [experts = ", experts, ", ", width, "], but got shape ", bias->sym_sizes());
}

}  // namespace

void check_moe_permute_arguments(const at::Tensor& top_k_index, int64_t num_experts) {
  constexpr const char* op = "moe_permute";
  check_defined(op, "top_k_index", top_k_index);
  TORCH_CHECK(top_k_index.scalar_type() == at::kLong || top_k_index.scalar_type() == at::kInt, "fused::", op,
              ": expected top_k_index to be int64 or int32 (each token's experts), but got ",
              top_k_index.scalar_type());
  TORCH_CHECK(top_k_index.dim() == 2, "fused::", op, ": expected top_k_index of shape [tokens, top_k], but got shape ",
              top_k_index.sym_sizes());
  TORCH_CHECK(num_experts >= 1, "fused::", op, ": expected num_experts >= 1, but got ", num_experts);
}

MoeExpertOptions check_moe_expert_mlp_arguments(const char* op, const at::Tensor& hidden, const at::Tensor& order,
                                                const at::Tensor& offsets, const at::Tensor& routing_weights,
                                                const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                                const std::optional<at::Tensor>& gate_up_bias,
                                                const std::optional<at::Tensor>& down_bias,
                                                c10::string_view activation, bool transposed, bool interleaved,
                                                double alpha, double limit) {
  check_floating(op, "hidden_states", hidden);
  TORCH_CHECK(hidden.dim() == 2, "fused::", op, ": expected hidden_states of shape [tokens, hidden], but got shape ",
              hidden.sym_sizes());
  check_index_vector(op, "order", order, at::kLong, "hidden_states", hidden);
  check_index_vector(op, "offsets", offsets, at::kInt, "hidden_states", hidden);
  TORCH_CHECK(offsets.sym_size(0) >= 1, "fused::", op, ": expected offsets of at least one expert, but got none");
  TORCH_CHECK(routing_weights.defined() && routing_weights.dim() == 2, "fused::", op,
              ": expected routing_weights of shape [tokens, top_k], but got ",
              routing_weights.defined() ? routing_weights.sym_sizes() : c10::SymIntArrayRef());
  const c10::SymInt top_k = routing_weights.sym_size(1);
  check_routing_weights(op, routing_weights, hidden.sym_size(0), top_k, hidden, "hidden_states");
  TORCH_CHECK(order.sym_size(0) == hidden.sym_size(0) * top_k, "fused::", op, ": expected order of size tokens * top_k = ",
              hidden.sym_size(0) * top_k, ", but got ", order.sym_size(0));
  for (const auto& [arg, weight] : {std::pair<const char*, const at::Tensor&>{"gate_up_weight", gate_up_weight},
                                    std::pair<const char*, const at::Tensor&>{"down_weight", down_weight}}) {
    check_same_dtype(op, arg, weight, "hidden_states", hidden);
    check_same_device(op, arg, weight, "hidden_states", hidden);
    TORCH_CHECK(weight.dim() == 3 && weight.sym_size(0) == offsets.sym_size(0), "fused::", op, ": expected ", arg,
                " of shape [experts = offsets.size(0) = ", offsets.sym_size(0), ", ., .], but got shape ",
                weight.sym_sizes());
  }
  const c10::SymInt width = hidden.sym_size(1), experts = offsets.sym_size(0);
  // [E, 2I, H] and [E, H, I], or transposed [E, H, 2I] and [E, I, H].
  const c10::SymInt gate_up_width = gate_up_weight.sym_size(transposed ? 2 : 1);
  TORCH_CHECK(gate_up_weight.sym_size(transposed ? 1 : 2) == width && gate_up_width % 2 == 0, "fused::", op,
              ": expected gate_up_weight of shape ", transposed ? "[experts, hidden, 2 * intermediate]" :
              "[experts, 2 * intermediate, hidden]", " with hidden = ", width, ", but got shape ",
              gate_up_weight.sym_sizes());
  const c10::SymInt intermediate = gate_up_width / 2;
  const bool down_fits = transposed ? down_weight.sym_size(1) == intermediate && down_weight.sym_size(2) == width
                                    : down_weight.sym_size(1) == width && down_weight.sym_size(2) == intermediate;
  TORCH_CHECK(down_fits, "fused::", op, ": expected down_weight of shape [experts, ",
              transposed ? intermediate : width, ", ", transposed ? width : intermediate, "], but got shape ",
              down_weight.sym_sizes());
  check_expert_bias(op, "gate_up_bias", gate_up_bias, experts, gate_up_width, hidden);
  check_expert_bias(op, "down_bias", down_bias, experts, width, hidden);
  const bool clamped = activation == "swiglu_oai";
  TORCH_CHECK(clamped || activation == "silu" || activation == "gelu" || activation == "gelu_tanh", "fused::", op,
              ": expected activation 'silu', 'gelu', 'gelu_tanh' or 'swiglu_oai', but got '", activation, "'");
  TORCH_CHECK(!clamped || (std::isfinite(alpha) && std::isfinite(limit) && limit > 0), "fused::", op,
              ": expected a finite alpha and a finite limit > 0 for 'swiglu_oai', but got alpha ", alpha, ", limit ",
              limit);
  MoeExpertOptions options;
  options.top_k = top_k.guard_int(__FILE__, __LINE__);
  options.transposed = transposed;
  options.activation = activation;
  options.interleaved = interleaved;
  options.alpha = alpha;
  options.limit = limit;
  return options;
}

void check_moe_expert_mlp_grad(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& order) {
  constexpr const char* op = "moe_expert_mlp_backward";
  check_floating(op, "grad", grad);
  check_same_device(op, "grad", grad, "hidden_states", hidden);
  TORCH_CHECK(grad.dim() == 2 && grad.sym_size(0) == order.sym_size(0) && grad.sym_size(1) == hidden.sym_size(1),
              "fused::", op, ": expected grad of shape [order.size(0) = ", order.sym_size(0), ", hidden = ",
              hidden.sym_size(1), "], but got shape ", grad.sym_sizes());
}

void check_moe_kept_gate_up(const std::optional<at::Tensor>& gate_up, const at::Tensor& hidden, const at::Tensor& order,
                            const at::Tensor& gate_up_weight, bool transposed) {
  if (!gate_up.has_value() || !gate_up->defined()) return;
  constexpr const char* op = "moe_expert_mlp_backward";
  check_same_dtype(op, "gate_up", *gate_up, "hidden_states", hidden);
  check_same_device(op, "gate_up", *gate_up, "hidden_states", hidden);
  const c10::SymInt width = gate_up_weight.sym_size(transposed ? 2 : 1);
  TORCH_CHECK(gate_up->dim() == 2 && gate_up->sym_size(0) == order.sym_size(0) && gate_up->sym_size(1) == width,
              "fused::", op, ": expected gate_up (the forward's gate/up product) of shape [order.size(0) = ",
              order.sym_size(0), ", 2 * intermediate = ", width, "], but got shape ", gate_up->sym_sizes());
}

namespace {

// order, offsets, top_k and routing_weights of `pairs` rows, against `reference` (rows, or grad).
void check_pair_routing(const char* op, const c10::SymInt& pairs, const at::Tensor& order, const at::Tensor& offsets,
                        int64_t top_k, const std::optional<at::Tensor>& routing_weights, const at::Tensor& reference,
                        const char* reference_arg) {
  check_index_vector(op, "order", order, at::kLong, reference_arg, reference);
  check_index_vector(op, "offsets", offsets, at::kInt, reference_arg, reference);
  TORCH_CHECK(offsets.sym_size(0) >= 1, "fused::", op, ": expected offsets of at least one expert, but got none");
  TORCH_CHECK(order.sym_size(0) == pairs, "fused::", op, ": expected order of size ", pairs, " (one per pair), but got ",
              order.sym_size(0));
  TORCH_CHECK(top_k >= 1 && pairs % top_k == 0, "fused::", op, ": expected top_k >= 1 dividing the pairs (", pairs,
              "), but got ", top_k);
  if (routing_weights.has_value() && routing_weights->defined()) {
    check_routing_weights(op, *routing_weights, pairs / top_k, top_k, reference, reference_arg);
  }
}

}  // namespace

void check_moe_unpermute_arguments(const char* op, const at::Tensor& rows, const at::Tensor& order,
                                   const at::Tensor& offsets, int64_t top_k,
                                   const std::optional<at::Tensor>& routing_weights) {
  check_floating(op, "rows", rows);
  TORCH_CHECK(rows.dim() == 2, "fused::", op, ": expected rows of shape [pairs, hidden], but got shape ",
              rows.sym_sizes());
  check_pair_routing(op, rows.sym_size(0), order, offsets, top_k, routing_weights, rows, "rows");
}

void check_moe_unpermute_backward_arguments(const at::Tensor& grad, const std::optional<at::Tensor>& rows,
                                            const at::Tensor& order, const at::Tensor& offsets, int64_t top_k,
                                            const std::optional<at::Tensor>& routing_weights,
                                            std::array<bool, 2> output_mask) {
  constexpr const char* op = "moe_unpermute_backward";
  check_floating(op, "grad", grad);
  TORCH_CHECK(grad.dim() == 2, "fused::", op, ": expected grad of shape [tokens, hidden], but got shape ",
              grad.sym_sizes());
  TORCH_CHECK(top_k >= 1, "fused::", op, ": expected top_k >= 1, but got ", top_k);
  check_pair_routing(op, grad.sym_size(0) * top_k, order, offsets, top_k, routing_weights, grad, "grad");
  const bool rows_given = rows.has_value() && rows->defined();
  const bool weights_given = routing_weights.has_value() && routing_weights->defined();
  TORCH_CHECK(rows_given || !(output_mask[1] && weights_given), "fused::", op,
              ": expected rows (the forward's) for the routing weights' gradient, but got None");
  if (rows_given) {
    check_floating(op, "rows", *rows);
    check_same_device(op, "rows", *rows, "grad", grad);
    TORCH_CHECK(rows->dim() == 2 && rows->sym_size(0) == order.sym_size(0) && rows->sym_size(1) == grad.sym_size(1),
                "fused::", op, ": expected rows of shape [", order.sym_size(0), ", ", grad.sym_size(1),
                "], but got shape ", rows->sym_sizes());
  }
}

}  // namespace fused_ops
