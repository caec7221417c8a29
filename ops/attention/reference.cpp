// attention_with_sinks as ATen ops in opmath (float32, float64 for float64): the CPU kernel, the GPU's path for
// what the flash kernels do not take, and the tests' reference.
#include <ATen/OpMathType.h>

#include "attention.h"

namespace fused_ops {
namespace {

at::ScalarType opmath_of(const at::Tensor& tensor) {
  return tensor.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// [B, H, S, D] in opmath, key/value heads repeated for each of their query heads.
at::Tensor heads_first(const at::Tensor& tensor, int64_t query_heads, at::ScalarType opmath) {
  const at::Tensor heads = tensor.to(opmath).transpose(1, 2);
  const int64_t repeats = query_heads / tensor.size(2);
  return repeats == 1 ? heads : heads.repeat_interleave(repeats, 1);
}

// [B, Hkv, S, D] -> sums over each key/value head's query heads, as [B, S, Hkv, D].
at::Tensor sum_groups(const at::Tensor& gradient, int64_t key_heads) {
  const auto sizes = gradient.sizes();  // [B, Hq, S, D]
  return gradient.view({sizes[0], key_heads, sizes[1] / key_heads, sizes[2], sizes[3]}).sum(2).transpose(1, 2);
}

// Scaled scores [B, Hq, S, S] with the keys a query does not see at -inf.
at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, const AttentionWithSinksOptions& options) {
  const int64_t length = q.size(2);
  const at::Tensor rows = at::arange(length, q.options().dtype(at::kLong)).unsqueeze(1);
  const at::Tensor columns = at::arange(length, q.options().dtype(at::kLong)).unsqueeze(0);
  at::Tensor hidden = columns.gt(rows);
  if (options.window > 0) hidden = hidden.logical_or(columns.le(rows - options.window));
  return at::matmul(q, k.transpose(-2, -1)).mul_(options.scale).masked_fill_(hidden, -INFINITY);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_with_sinks_reference(const at::Tensor& query, const at::Tensor& key,
                                                                  const at::Tensor& value, const at::Tensor& sinks,
                                                                  const AttentionWithSinksOptions& options) {
  const at::ScalarType opmath = opmath_of(query);
  const int64_t heads = query.size(2);
  const at::Tensor q = heads_first(query, heads, opmath), k = heads_first(key, heads, opmath);
  const at::Tensor scores = masked_scores(q, k, options);
  const at::Tensor log_sum_exp = at::logsumexp(scores, -1);  // [B, Hq, S]
  const at::Tensor probabilities = at::exp(scores - log_sum_exp.unsqueeze(-1));
  const at::Tensor attended = at::matmul(probabilities, heads_first(value, heads, opmath)).transpose(1, 2);
  return {(attended * sink_factor(log_sum_exp, sinks)).to(query.scalar_type()).contiguous(), log_sum_exp};
}

AttentionGradients attention_with_sinks_backward_reference(const at::Tensor& grad_output, const at::Tensor& query,
                                                           const at::Tensor& key, const at::Tensor& value,
                                                           const at::Tensor& sinks, const at::Tensor& output,
                                                           const at::Tensor& log_sum_exp,
                                                           const AttentionWithSinksOptions& options) {
  const at::ScalarType opmath = opmath_of(query);
  const int64_t heads = query.size(2), key_heads = key.size(2);
  const at::Tensor lse = log_sum_exp.to(opmath);
  const at::Tensor factor = sink_factor(lse, sinks);  // [B, S, Hq, 1]
  const at::Tensor q = heads_first(query, heads, opmath), k = heads_first(key, heads, opmath);
  const at::Tensor v = heads_first(value, heads, opmath);
  const at::Tensor probabilities = at::exp(masked_scores(q, k, options) - lse.unsqueeze(-1));
  // Plain attention's backward at grad_output * s, the output standing in for the attention output.
  const at::Tensor scaled_grad = (grad_output.to(opmath) * factor).transpose(1, 2);  // [B, Hq, S, D]
  const at::Tensor out = output.to(opmath).transpose(1, 2);
  const at::Tensor row_dots = (scaled_grad * out).sum(-1, /*keepdim=*/true);
  const at::Tensor grad_scores = probabilities * (at::matmul(scaled_grad, v.transpose(-2, -1)) - row_dots);
  const at::Tensor grad_query = at::matmul(grad_scores, k).mul_(options.scale).transpose(1, 2);
  const at::Tensor grad_key = sum_groups(at::matmul(grad_scores.transpose(-2, -1), q).mul_(options.scale), key_heads);
  const at::Tensor grad_value = sum_groups(at::matmul(probabilities.transpose(-2, -1), scaled_grad), key_heads);
  return {grad_query.to(query.scalar_type()).contiguous(), grad_key.to(key.scalar_type()).contiguous(),
          grad_value.to(value.scalar_type()).contiguous(),
          sink_gradient(grad_output, output, factor, sinks)};
}

}  // namespace fused_ops
