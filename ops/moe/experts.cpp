// The experts' ops for every backend: ATen's sort and products (torch's grouped products on CUDA) around the
// backend's row kernels (MoeRowKernels) and the experts' gate (gate.cpp). The checks
// (registration/checks_moe.cpp) have run.
#include <ATen/OpMathType.h>
#include <torch/version.h>

#include "moe.h"

namespace fused_ops {
namespace {

bool given(const std::optional<at::Tensor>& tensor) { return tensor.has_value() && tensor->defined(); }

// Whether torch's grouped product (cuBLAS / CUTLASS on the GPU) takes these operands: bfloat16 on CUDA with
// 16-byte aligned rows; elsewhere one product per expert.
bool takes_grouped_mm(const at::Tensor& a, const at::Tensor& b) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
  const auto aligned = [](const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0 && t.size(-1) % 8 == 0 && t.size(-2) % 8 == 0;
  };
  return a.is_cuda() && a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 && aligned(a) &&
         aligned(b);
#else
  return false;
#endif
}

// Calls body(expert, start, count) for each expert with rows, its rows [start, start + count) by offsets (read
// on the host: the path without torch's grouped products).
template <typename Body>
void for_each_expert(const at::Tensor& offsets, Body body) {
  const at::Tensor ends = offsets.to(at::kCPU, at::kLong);
  const int64_t* end = ends.const_data_ptr<int64_t>();
  for (int64_t expert = 0, start = 0; expert < ends.numel(); start = end[expert], ++expert) {
    if (end[expert] > start) body(expert, start, end[expert] - start);
  }
}

// rows [S, K] times each row's expert matrix: W_e^T of weight [E, N, K] (out_by_in) or W_e of [E, K, N]. Rows
// from the last offset on are left as they come (zeros here, unwritten by the grouped product).
at::Tensor grouped_product(const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& offsets,
                           bool out_by_in) {
  const at::Tensor matrices = out_by_in ? weight.transpose(-2, -1) : weight;  // [E, K, N]
  const at::Tensor operand = rows.contiguous();
  if (takes_grouped_mm(operand, matrices)) return at::_grouped_mm(operand, matrices, offsets);
  at::Tensor out = at::zeros({operand.size(0), matrices.size(2)}, operand.options());
  for_each_expert(offsets, [&](int64_t expert, int64_t start, int64_t count) {
    at::Tensor slice = out.narrow(0, start, count);
    at::mm_out(slice, operand.narrow(0, start, count), matrices.select(0, expert));
  });
  return out;
}

// [E, N, K]: a_e^T @ b_e over each expert's rows of a [S, N] and b [S, K] (a weight's gradient); 0 for an
// expert without rows.
at::Tensor grouped_outer_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offsets) {
  const at::Tensor left = a.contiguous(), right = b.contiguous();
  if (takes_grouped_mm(left, right)) return at::_grouped_mm(left.t(), right, offsets);
  at::Tensor out = at::zeros({offsets.numel(), left.size(1), right.size(1)}, left.options());
  for_each_expert(offsets, [&](int64_t expert, int64_t start, int64_t count) {
    at::Tensor slice = out.select(0, expert);
    at::mm_out(slice, left.narrow(0, start, count).t(), right.narrow(0, start, count));
  });
  return out;
}

// Values of the pairs in order's order [S] put back in pair order, as routing_weights' shape and dtype.
at::Tensor in_pair_order(const at::Tensor& values, const at::Tensor& order, const at::Tensor& routing_weights) {
  return at::zeros({order.numel()}, values.options()).scatter_(0, order, values).view(routing_weights.sizes())
      .to(routing_weights.scalar_type());
}

// One pair's routing weight per row [S].
at::Tensor row_weights(const at::Tensor& routing_weights, const at::Tensor& order) {
  return routing_weights.reshape({-1}).index_select(0, order);
}

struct PairValues {
  at::Tensor x, gate_up, activation;
};

// The gathered rows and the gate/up product of every pair (its bias added).
PairValues gate_up_of_pairs(const at::Tensor& hidden, const at::Tensor& order, const at::Tensor& offsets,
                            const at::Tensor& gate_up_weight, const std::optional<at::Tensor>& gate_up_bias,
                            const MoeExpertOptions& options, const MoeRowKernels& kernels) {
  PairValues result;
  result.x = kernels.gather(hidden, order, offsets, options.top_k);
  result.gate_up = grouped_product(result.x, gate_up_weight, offsets, !options.transposed);
  if (given(gate_up_bias)) kernels.add_expert_bias(result.gate_up, *gate_up_bias, offsets, at::Tensor());
  return result;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_permute(const at::Tensor& top_k_index, int64_t num_experts) {
  const at::Tensor ids = top_k_index.reshape({-1}).to(at::kLong);
  const at::Tensor keys = at::where(ids.ge(0).logical_and(ids.lt(num_experts)), ids, num_experts);
  auto [sorted, order] = at::sort(keys, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor experts = at::arange(num_experts, sorted.options());
  return {order, at::searchsorted(sorted, experts, /*out_int32=*/true, /*right=*/true)};
}

at::Tensor moe_positions(const at::Tensor& order) {
  return at::empty_like(order).scatter_(0, order, at::arange(order.numel(), order.options()));
}

std::tuple<at::Tensor, at::Tensor> moe_expert_mlp(const at::Tensor& hidden, const at::Tensor& order,
                                                  const at::Tensor& offsets, const at::Tensor& routing_weights,
                                                  const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                                  const std::optional<at::Tensor>& gate_up_bias,
                                                  const std::optional<at::Tensor>& down_bias,
                                                  const MoeExpertOptions& options, bool keep_gate_up,
                                                  const MoeRowKernels& kernels) {
  PairValues parts = gate_up_of_pairs(hidden, order, offsets, gate_up_weight, gate_up_bias, options, kernels);
  parts.x = at::Tensor();
  // The grouped product leaves the rows of no expert unwritten: a kept product holds zeros there.
  if (keep_gate_up) kernels.zero_rows_past_end(parts.gate_up, offsets);
  parts.activation = experts_gate(parts.gate_up, options, kernels);
  if (!keep_gate_up) parts.gate_up = at::Tensor();
  // The routing weight scales the activation before the (linear) down product: one pass over [S, I] rather
  // than over [S, H].
  const at::Tensor weights = row_weights(routing_weights, order).unsqueeze(1);
  parts.activation.mul_(weights);
  at::Tensor down = grouped_product(parts.activation, down_weight, offsets, !options.transposed);
  if (given(down_bias)) kernels.add_expert_bias(down, *down_bias, offsets, weights);
  kernels.zero_rows_past_end(down, offsets);  // pairs of no expert give 0
  return {down.to(at::promote_types(hidden.scalar_type(), routing_weights.scalar_type())), parts.gate_up};
}

SixTensors moe_expert_mlp_backward(const at::Tensor& grad, const at::Tensor& hidden, const at::Tensor& order,
                                   const at::Tensor& offsets, const at::Tensor& routing_weights,
                                   const at::Tensor& gate_up_weight, const at::Tensor& down_weight,
                                   const std::optional<at::Tensor>& gate_up_bias,
                                   const std::optional<at::Tensor>& down_bias, const MoeExpertOptions& options,
                                   std::array<bool, 6> output_mask, const std::optional<at::Tensor>& kept_gate_up,
                                   const MoeRowKernels& kernels) {
  const int64_t rows = order.numel();
  PairValues parts;
  if (given(kept_gate_up)) {  // the forward's product: the rows are gathered only for gate_up_weight's gradient
    parts.gate_up = *kept_gate_up;
    if (output_mask[2]) parts.x = kernels.gather(hidden, order, offsets, options.top_k);
  } else {
    parts = gate_up_of_pairs(hidden, order, offsets, gate_up_weight, gate_up_bias, options, kernels);
  }
  parts.activation = experts_gate(parts.gate_up, options, kernels);
  const at::Tensor weights = row_weights(routing_weights, order);  // [S]
  // Rows from the last offset on are never read below (the products and sums stop there), whatever they hold.
  const at::Tensor g = grad.to(down_weight.scalar_type());
  auto empty = [](const at::Tensor& like) { return at::empty({0}, like.options()); };
  at::Tensor grad_hidden = empty(hidden), grad_routing = empty(routing_weights);
  at::Tensor grad_gate_up_weight = empty(gate_up_weight), grad_down_weight = empty(down_weight);
  at::Tensor grad_gate_up_bias = empty(gate_up_weight), grad_down_bias = empty(down_weight);
  if (output_mask[3]) {
    const at::Tensor weighted_activation =
        (parts.activation * weights.unsqueeze(1)).to(parts.activation.scalar_type());
    grad_down_weight = options.transposed ? grouped_outer_product(weighted_activation, g, offsets)
                                          : grouped_outer_product(g, weighted_activation, offsets);
  }
  if (output_mask[5] && given(down_bias)) {
    grad_down_bias = kernels.expert_column_sums(g, offsets, weights).to(down_bias->scalar_type());
  }
  const bool input_side = output_mask[0] || output_mask[2] || output_mask[4];
  if (!output_mask[1] && !input_side) {
    return {grad_hidden, grad_routing, grad_gate_up_weight, grad_down_weight, grad_gate_up_bias, grad_down_bias};
  }
  // d loss / d (weighted activation) = g W_down_e; the activation's gradient is that times the weight, and the
  // weight's is its dot with the activation (+ dot(g, b_down_e)).
  auto [grad_activation, dots] =
      kernels.routing_backward(grouped_product(g, down_weight, offsets, options.transposed), parts.activation, weights);
  parts.activation = at::Tensor();
  if (output_mask[1]) {
    if (given(down_bias)) dots += kernels.expert_bias_dots(g, *down_bias, offsets);
    dots.masked_fill_(at::arange(rows, offsets.options().dtype(at::kLong)).ge(offsets.select(0, -1)), 0);
    grad_routing = in_pair_order(dots, order, routing_weights);
  }
  if (!input_side) {
    return {grad_hidden, grad_routing, grad_gate_up_weight, grad_down_weight, grad_gate_up_bias, grad_down_bias};
  }
  at::Tensor grad_gate_up = experts_gate_backward(grad_activation, parts.gate_up, options, kernels);
  grad_activation = at::Tensor();
  parts.gate_up = at::Tensor();
  if (output_mask[2]) {
    grad_gate_up_weight = options.transposed ? grouped_outer_product(parts.x, grad_gate_up, offsets)
                                             : grouped_outer_product(grad_gate_up, parts.x, offsets);
  }
  parts.x = at::Tensor();
  if (output_mask[4] && given(gate_up_bias)) {
    grad_gate_up_bias = kernels.expert_column_sums(grad_gate_up, offsets, at::Tensor()).to(gate_up_bias->scalar_type());
  }
  if (output_mask[0]) {
    const at::Tensor grad_x = grouped_product(grad_gate_up, gate_up_weight, offsets, options.transposed);
    grad_gate_up = at::Tensor();
    grad_hidden = kernels.sum_pairs(grad_x, moe_positions(order), offsets, at::Tensor(), options.top_k,
                                    hidden.size(0)).to(hidden.scalar_type());
  }
  return {grad_hidden, grad_routing, grad_gate_up_weight, grad_down_weight, grad_gate_up_bias, grad_down_bias};
}

at::Tensor moe_unpermute(const at::Tensor& rows, const at::Tensor& order, const at::Tensor& offsets,
                         const std::optional<at::Tensor>& routing_weights, int64_t top_k, const MoeRowKernels& kernels) {
  const at::Tensor weights = given(routing_weights) ? routing_weights->reshape({-1}) : at::Tensor();
  return kernels.sum_pairs(rows, moe_positions(order), offsets, weights, top_k, order.numel() / top_k);
}

std::tuple<at::Tensor, at::Tensor> moe_unpermute_backward(const at::Tensor& grad, const at::Tensor& rows,
                                                          const at::Tensor& order, const at::Tensor& offsets,
                                                          const std::optional<at::Tensor>& routing_weights,
                                                          int64_t top_k, std::array<bool, 2> output_mask,
                                                          const MoeRowKernels& kernels) {
  const at::Tensor gathered = kernels.gather(grad, order, offsets, top_k);  // grad of each pair's token, 0 past end
  at::Tensor grad_rows = at::empty({0}, grad.options());
  at::Tensor grad_routing = at::empty({0}, grad.options());
  const at::ScalarType opmath = at::toOpMathType(grad.scalar_type());
  if (output_mask[0]) {
    const at::ScalarType dtype = rows.defined() ? rows.scalar_type() : grad.scalar_type();
    grad_rows = given(routing_weights)
                    ? (gathered.to(opmath) * row_weights(*routing_weights, order).to(opmath).unsqueeze(1)).to(dtype)
                    : gathered.to(dtype);
  }
  if (output_mask[1] && given(routing_weights)) {
    const at::Tensor dots = (gathered.to(opmath) * rows.to(opmath)).sum(1);
    grad_routing = in_pair_order(dots, order, *routing_weights);
  }
  return {grad_rows, grad_routing};
}

}  // namespace fused_ops
