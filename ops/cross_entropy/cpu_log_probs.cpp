// CPU reference of linear_log_probs' rows: the maximum, the sum of exponentials, the entropy, then (in
// the backward) the gradient, each a plain loop over the row in opmath; rows in parallel.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "linear_cross_entropy.h"
#include "linear_log_probs.h"

namespace fused_ops {
namespace {

void log_probs_rows_cpu(const LogProbsRows& p, at::ScalarType dtype) {
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_log_probs_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const HeadLogit<opmath_t> head = head_logit<opmath_t>(p);
    opmath_t* log_probs = static_cast<opmath_t*>(p.log_probs);
    opmath_t* entropy = static_cast<opmath_t*>(p.entropy);
    const opmath_t* grad_log_probs = static_cast<const opmath_t*>(p.grad_log_probs);
    const opmath_t* grad_entropy = static_cast<const opmath_t*>(p.grad_entropy);
    const bool backward = grad_log_probs != nullptr || grad_entropy != nullptr;
    at::parallel_for(0, p.rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        scalar_t* logits = static_cast<scalar_t*>(p.logits) + row * p.row_stride;
        auto z = [&](int64_t j) { return head.of(static_cast<opmath_t>(logits[j])); };
        const int64_t target = p.target[row];
        if (target == p.ignore_index || target < 0 || target >= p.classes) {
          // Ignored: 0. Out of range: NaN (the chunk loop reports it).
          const opmath_t value = target == p.ignore_index ? opmath_t(0) : std::numeric_limits<opmath_t>::quiet_NaN();
          if (log_probs != nullptr) log_probs[row] = value;
          if (entropy != nullptr) entropy[row] = value;
          if (backward) std::fill(logits, logits + p.classes, static_cast<scalar_t>(value));
          continue;
        }
        opmath_t max = -std::numeric_limits<opmath_t>::infinity();
        for (int64_t j = 0; j < p.classes; ++j) max = std::max(max, z(j));
        opmath_t sum_exp = 0;
        for (int64_t j = 0; j < p.classes; ++j) sum_exp += std::exp(z(j) - max);
        const opmath_t log_sum_exp = max + std::log(sum_exp);
        const bool needs_entropy = entropy != nullptr || grad_entropy != nullptr;
        opmath_t row_entropy = 0;
        for (int64_t j = 0; needs_entropy && j < p.classes; ++j) {
          const opmath_t log_p = z(j) - log_sum_exp;
          const opmath_t probability = std::exp(log_p);
          if (probability != opmath_t(0)) row_entropy -= probability * log_p;
        }
        if (log_probs != nullptr) log_probs[row] = z(target) - log_sum_exp;
        if (entropy != nullptr) entropy[row] = row_entropy;
        if (!backward) continue;
        const opmath_t grad_log_prob = grad_log_probs == nullptr ? opmath_t(0) : grad_log_probs[row];
        const opmath_t grad_row_entropy = grad_entropy == nullptr ? opmath_t(0) : grad_entropy[row];
        for (int64_t j = 0; j < p.classes; ++j) {
          const opmath_t capped = head.capped(static_cast<opmath_t>(logits[j]));
          const opmath_t gradient = log_probs_logit_gradient(capped * head.inverse_temperature, j == target,
                                                             log_sum_exp, row_entropy, grad_log_prob, grad_row_entropy);
          logits[j] = static_cast<scalar_t>(gradient * head.slope(capped));
        }
      }
    });
  });
}

}  // namespace

LogProbsBackend log_probs_cpu_backend() {
  const CrossEntropyBackend device = cross_entropy_cpu_backend();
  return {log_probs_rows_cpu, device.available_bytes, device.check_targets, device.zero_row_padding};
}

}  // namespace fused_ops
