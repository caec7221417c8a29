// CPU reference of linear_log_probs' kernels, each a plain loop in opmath, rows in parallel: the forward's
// rows (the maximum, the sum of exponentials, the entropy) and the backward's tiles of classes (each
// logit's gradient from its row's log-sum-exp and entropy).
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
    opmath_t* log_sum_exps = static_cast<opmath_t*>(p.log_sum_exp);
    at::parallel_for(0, p.rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* logits = static_cast<const scalar_t*>(p.logits) + row * p.row_stride;
        auto z = [&](int64_t j) { return head.of(static_cast<opmath_t>(logits[j])); };
        const int64_t target = p.target[row];
        if (target == p.ignore_index || target < 0 || target >= p.classes) {
          // Ignored: 0. Out of range: NaN (the chunk loop reports it).
          const opmath_t value = target == p.ignore_index ? opmath_t(0) : std::numeric_limits<opmath_t>::quiet_NaN();
          log_probs[row] = value;
          if (entropy != nullptr) entropy[row] = value;
          if (log_sum_exps != nullptr) log_sum_exps[row] = value;
          continue;
        }
        opmath_t max = -std::numeric_limits<opmath_t>::infinity();
        for (int64_t j = 0; j < p.classes; ++j) max = std::max(max, z(j));
        opmath_t sum_exp = 0;
        for (int64_t j = 0; j < p.classes; ++j) sum_exp += std::exp(z(j) - max);
        const opmath_t log_sum_exp = max + std::log(sum_exp);
        opmath_t row_entropy = 0;
        for (int64_t j = 0; entropy != nullptr && j < p.classes; ++j) {
          const opmath_t log_p = z(j) - log_sum_exp;
          const opmath_t probability = std::exp(log_p);
          if (probability != opmath_t(0)) row_entropy -= probability * log_p;
        }
        log_probs[row] = z(target) - log_sum_exp;
        if (entropy != nullptr) entropy[row] = row_entropy;
        if (log_sum_exps != nullptr) log_sum_exps[row] = log_sum_exp;
      }
    });
  });
}

void log_probs_gradient_cpu(const LogProbsGradientTile& p, int64_t classes_total, at::ScalarType dtype) {
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_log_probs_backward_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const HeadLogit<opmath_t> head = head_logit<opmath_t>(p);
    auto value = [](const void* values, int64_t row) {
      return values == nullptr ? opmath_t(0) : static_cast<const opmath_t*>(values)[row];
    };
    at::parallel_for(0, p.rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const scalar_t* logits = static_cast<const scalar_t*>(p.logits) + row * p.row_stride;
        scalar_t* grad_logits = static_cast<scalar_t*>(p.grad_logits) + row * p.grad_row_stride;
        const int64_t target = p.target[row];
        const opmath_t log_sum_exp = value(p.log_sum_exp, row), entropy = value(p.entropy, row);
        const opmath_t grad_log_prob = value(p.grad_log_probs, row), grad_entropy = value(p.grad_entropy, row);
        for (int64_t j = 0; j < p.classes; ++j) {
          grad_logits[j] = static_cast<scalar_t>(log_probs_raw_gradient(
              static_cast<opmath_t>(logits[j]), head, target, p.ignore_index, classes_total,
              p.first_class + j == target, log_sum_exp, entropy, grad_log_prob, grad_entropy));
        }
      }
    });
  });
}

}  // namespace

LogProbsBackend log_probs_cpu_backend() {
  const CrossEntropyBackend device = cross_entropy_cpu_backend();
  return {log_probs_rows_cpu, log_probs_gradient_cpu, device.available_bytes, device.check_targets,
          device.zero_row_padding};
}

}  // namespace fused_ops
