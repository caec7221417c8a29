// CPU reference of the cross-entropy rows: max, then the sum of exponentials, then the gradient, each
// a plain loop over the row in opmath; rows in parallel.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "linear_cross_entropy.h"

namespace fused_ops {
namespace {

void cross_entropy_rows_cpu(const CrossEntropyRows& p, at::ScalarType dtype) {
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_cross_entropy_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const opmath_t softcap = static_cast<opmath_t>(p.softcap);
    const opmath_t smoothing = static_cast<opmath_t>(p.label_smoothing);
    const opmath_t classes = static_cast<opmath_t>(p.classes);
    opmath_t* loss = static_cast<opmath_t*>(p.loss);
    const opmath_t* grad_scale = static_cast<const opmath_t*>(p.grad_scale);
    at::parallel_for(0, p.rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        scalar_t* z = static_cast<scalar_t*>(p.logits) + row * p.row_stride;
        const int64_t target = p.target[row];
        const opmath_t scale = grad_scale == nullptr ? opmath_t(0) : grad_scale[row * p.grad_scale_stride];
        if (target == p.ignore_index || target < 0 || target >= p.classes) {
          const opmath_t value = target == p.ignore_index ? opmath_t(0) : std::numeric_limits<opmath_t>::quiet_NaN();
          loss[row] = value;
          if (grad_scale != nullptr) std::fill(z, z + p.classes, static_cast<scalar_t>(value));
          continue;
        }
        opmath_t max = -std::numeric_limits<opmath_t>::infinity(), sum_z = 0;
        for (int64_t j = 0; j < p.classes; ++j) {
          const opmath_t capped = soft_capped(static_cast<opmath_t>(z[j]), softcap);
          max = std::max(max, capped);
          sum_z += capped;
        }
        opmath_t sum_exp = 0;
        for (int64_t j = 0; j < p.classes; ++j) sum_exp += std::exp(soft_capped(static_cast<opmath_t>(z[j]), softcap) - max);
        const opmath_t log_sum_exp = max + std::log(sum_exp);
        const opmath_t z_target = soft_capped(static_cast<opmath_t>(z[target]), softcap);
        loss[row] = log_sum_exp - (1 - smoothing) * z_target - smoothing * sum_z / classes;
        if (grad_scale == nullptr) continue;
        for (int64_t j = 0; j < p.classes; ++j) {
          const opmath_t capped = soft_capped(static_cast<opmath_t>(z[j]), softcap);
          opmath_t gradient = std::exp(capped - log_sum_exp) - smoothing / classes - (j == target ? 1 - smoothing : 0);
          z[j] = static_cast<scalar_t>(gradient * soft_cap_slope(capped, softcap) * scale);
        }
      }
    });
  });
}

}  // namespace

CrossEntropyBackend cross_entropy_cpu_backend() {
  // A chunk of at most an eighth of 4 GB: the CPU path is the reference, not a memory-bound server.
  return {cross_entropy_rows_cpu, int64_t(4) << 30, true, /*zero_row_padding=*/true};
}

}  // namespace fused_ops
