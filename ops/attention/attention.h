#pragma once
// Causal attention with a learned sink logit per query head (gpt-oss): each query's softmax runs over its keys
// and one extra logit, sinks[h], whose value row is zero. With lse the log-sum-exp of the query's scaled scores,
//   output = softmax(scores) V * s,   s = sigmoid(lse - sinks[h]),
// and the gradients of q, k and v are plain attention's backward taken at grad_output * s with the output itself
// in the place of the attention output (its row sums absorb the lse term); d sinks[h] = -sum (1 - s) <dO, O>.
// window > 0: each query sees its `window` latest keys (itself included).
#include <ATen/ATen.h>

#include <tuple>

namespace fused_ops {

struct AttentionWithSinksOptions {
  double scale;
  int64_t window;  // 0: every earlier key
};

using AttentionGradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// query [B, S, Hq, D], key and value [B, S, Hkv, D] (Hq a multiple of Hkv), sinks [Hq]: output [B, S, Hq, D] of
// query's dtype and log_sum_exp [B, Hq, S] float32 (float64 for float64 inputs). ATen ops on any device.
std::tuple<at::Tensor, at::Tensor> attention_with_sinks_reference(const at::Tensor& query, const at::Tensor& key,
                                                                  const at::Tensor& value, const at::Tensor& sinks,
                                                                  const AttentionWithSinksOptions& options);
AttentionGradients attention_with_sinks_backward_reference(const at::Tensor& grad_output, const at::Tensor& query,
                                                           const at::Tensor& key, const at::Tensor& value,
                                                           const at::Tensor& sinks, const at::Tensor& output,
                                                           const at::Tensor& log_sum_exp,
                                                           const AttentionWithSinksOptions& options);

// The GPU: torch's flash kernels for half types with head sizes they take, the reference elsewhere.
std::tuple<at::Tensor, at::Tensor> attention_with_sinks_cuda(const at::Tensor& query, const at::Tensor& key,
                                                             const at::Tensor& value, const at::Tensor& sinks,
                                                             const AttentionWithSinksOptions& options);
AttentionGradients attention_with_sinks_backward_cuda(const at::Tensor& grad_output, const at::Tensor& query,
                                                      const at::Tensor& key, const at::Tensor& value,
                                                      const at::Tensor& sinks, const at::Tensor& output,
                                                      const at::Tensor& log_sum_exp,
                                                      const AttentionWithSinksOptions& options);

// The sink's factor s [B, S, Hq, 1] in opmath from log_sum_exp [B, Hq, S].
inline at::Tensor sink_factor(const at::Tensor& log_sum_exp, const at::Tensor& sinks) {
  return at::sigmoid(log_sum_exp - sinks.to(log_sum_exp.scalar_type()).view({1, -1, 1})).transpose(1, 2).unsqueeze(-1);
}

// d sinks [Hq] in sinks' dtype: -sum over batch and queries of (1 - s) <grad_output, output>.
inline at::Tensor sink_gradient(const at::Tensor& grad_output, const at::Tensor& output, const at::Tensor& factor,
                                const at::Tensor& sinks) {
  const at::ScalarType opmath = factor.scalar_type();
  const at::Tensor dots = (grad_output.to(opmath) * output.to(opmath)).sum(-1, /*keepdim=*/true);  // [B, S, Hq, 1]
  return ((factor - 1) * dots).sum({0, 1, 3}).to(sinks.scalar_type());
}

}  // namespace fused_ops
