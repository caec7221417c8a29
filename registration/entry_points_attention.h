#pragma once
// The dispatcher-facing signatures of attention_with_sinks for the CPU, CUDA and Meta registrations: the checks,
// then the backend's kernels (`Backend` has forward and backward, ops/attention/attention.h).
#include <ATen/ATen.h>

#include <cmath>

#include "../ops/attention/attention.h"

namespace fused_ops {

// Every error a caller can cause, named by op and argument.
inline AttentionWithSinksOptions check_attention_with_sinks(const char* op, const at::Tensor& query,
                                                            const at::Tensor& key, const at::Tensor& value,
                                                            const at::Tensor& sinks, double scale, int64_t window) {
  TORCH_CHECK(query.dim() == 4, "fused::", op, ": expected query of 4 dimensions [batch, sequence, heads, head size], ",
              "but got ", query.dim());
  TORCH_CHECK(key.dim() == 4 && value.dim() == 4, "fused::", op, ": expected key and value of 4 dimensions ",
              "[batch, sequence, key heads, head size], but got ", key.dim(), " and ", value.dim());
  TORCH_CHECK(key.sym_sizes() == value.sym_sizes(), "fused::", op, ": expected value of key's shape ", key.sym_sizes(),
              ", but got ", value.sym_sizes());
  TORCH_SYM_CHECK(key.sym_size(0).sym_eq(query.sym_size(0)).sym_and(key.sym_size(1).sym_eq(query.sym_size(1)))
                      .sym_and(key.sym_size(3).sym_eq(query.sym_size(3))),
                  "fused::", op, ": expected key of query's batch, sequence and head size, but got query ",
                  query.sym_sizes(), " and key ", key.sym_sizes());
  TORCH_SYM_CHECK(key.sym_size(2).sym_gt(0).sym_and((query.sym_size(2) % key.sym_size(2)).sym_eq(0)), "fused::", op,
                  ": expected query's heads to be a multiple of key's, but got ", query.sym_size(2), " and ",
                  key.sym_size(2));
  TORCH_CHECK(sinks.dim() == 1, "fused::", op, ": expected sinks of one dimension [heads], but got ", sinks.dim());
  TORCH_SYM_CHECK(sinks.sym_size(0).sym_eq(query.sym_size(2)), "fused::", op, ": expected one sink per query head (",
                  query.sym_size(2), "), but got ", sinks.sym_size(0));
  TORCH_CHECK(at::isFloatingType(query.scalar_type()) && key.scalar_type() == query.scalar_type() &&
                  value.scalar_type() == query.scalar_type(),
              "fused::", op, ": expected query, key and value of one floating dtype, but got ", query.scalar_type(),
              ", ", key.scalar_type(), " and ", value.scalar_type());
  TORCH_CHECK(at::isFloatingType(sinks.scalar_type()), "fused::", op, ": expected floating sinks, but got ",
              sinks.scalar_type());
  TORCH_CHECK(key.device() == query.device() && value.device() == query.device() && sinks.device() == query.device(),
              "fused::", op, ": expected query, key, value and sinks on one device, but got ", query.device(), ", ",
              key.device(), ", ", value.device(), " and ", sinks.device());
  TORCH_CHECK(std::isfinite(scale) && scale > 0, "fused::", op, ": expected scale > 0 and finite, but got ", scale);
  TORCH_CHECK(window >= 0, "fused::", op, ": expected window >= 0 (0: every earlier key), but got ", window);
  return {scale, window};
}

template <typename Backend>
std::tuple<at::Tensor, at::Tensor> attention_with_sinks_entry(const at::Tensor& query, const at::Tensor& key,
                                                              const at::Tensor& value, const at::Tensor& sinks,
                                                              double scale, int64_t window) {
  const auto options = check_attention_with_sinks("attention_with_sinks", query, key, value, sinks, scale, window);
  return Backend::forward(query, key, value, sinks, options);
}

template <typename Backend>
AttentionGradients attention_with_sinks_backward_entry(const at::Tensor& grad_output, const at::Tensor& query,
                                                       const at::Tensor& key, const at::Tensor& value,
                                                       const at::Tensor& sinks, const at::Tensor& output,
                                                       const at::Tensor& log_sum_exp, double scale, int64_t window) {
  constexpr const char* op = "attention_with_sinks_backward";
  const auto options = check_attention_with_sinks(op, query, key, value, sinks, scale, window);
  TORCH_CHECK(grad_output.sym_sizes() == query.sym_sizes() && output.sym_sizes() == query.sym_sizes(), "fused::", op,
              ": expected grad_output and output of query's shape ", query.sym_sizes(), ", but got ",
              grad_output.sym_sizes(), " and ", output.sym_sizes());
  TORCH_CHECK(log_sum_exp.dim() == 3, "fused::", op, ": expected log_sum_exp [batch, heads, sequence], but got ",
              log_sum_exp.sym_sizes());
  return Backend::backward(grad_output, query, key, value, sinks, output, log_sum_exp, options);
}

// Shapes only: log_sum_exp [B, Hq, S] in float32 (float64 for float64).
struct AttentionWithSinksMeta {
  static std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& query, const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, const AttentionWithSinksOptions&) {
    const at::ScalarType lse_dtype = query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    return {at::empty_symint(query.sym_sizes(), query.options()),
            at::empty_symint({query.sym_size(0), query.sym_size(2), query.sym_size(1)},
                             query.options().dtype(lse_dtype))};
  }
  static AttentionGradients backward(const at::Tensor&, const at::Tensor& query, const at::Tensor& key,
                                     const at::Tensor& value, const at::Tensor& sinks, const at::Tensor&,
                                     const at::Tensor&, const AttentionWithSinksOptions&) {
    return {at::empty_symint(query.sym_sizes(), query.options()), at::empty_symint(key.sym_sizes(), key.options()),
            at::empty_symint(value.sym_sizes(), value.options()), at::empty_symint(sinks.sym_sizes(), sinks.options())};
  }
};

}  // namespace fused_ops
