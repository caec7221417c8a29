#pragma once
// Reference loops for the norms (see norm.h) on the CPU: rows in parallel, each row in two
// plain passes; weight and bias gradients summed per column over rows in order (deterministic).
// Sums run in float64 so a long row's statistics are as exact as the GPU's tree sums.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "norm.h"

namespace fused_ops {
namespace cpu {

template <typename acc_t>
struct RowStatistics {
  acc_t mean;
  acc_t rstd;
};

template <NormKind kKind, typename acc_t, typename Load>
RowStatistics<acc_t> row_statistics(int64_t columns, double eps, Load load) {
  double mean = 0;
  if (kKind == NormKind::Layer) {
    for (int64_t column = 0; column < columns; ++column) mean += load(column);
    mean /= columns;
  }
  double squares = 0;
  for (int64_t column = 0; column < columns; ++column) {
    const double centered = load(column) - mean;
    squares += centered * centered;
  }
  return {static_cast<acc_t>(mean), static_cast<acc_t>(1 / std::sqrt(squares / columns + eps))};
}

// The weight offset in the compute type (norm.h: w = offset + weight).
template <typename acc_t, typename Problem>
acc_t offset_of(const Problem& p) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return p.offset_double;
  } else {
    return p.offset_float;
  }
}

template <NormKind kKind>
void norm_forward_cpu(const NormForwardProblem& p, at::ScalarType dtype, at::ScalarType weight_dtype) {
  if (p.rows == 0 || p.columns == 0) return;
  FUSED_DISPATCH_MIXED_TYPES(dtype, weight_dtype, "norm_forward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto* weight = static_cast<const weight_t*>(p.weight);
    const auto* bias = static_cast<const weight_t*>(p.bias);
    const acc_t offset = offset_of<acc_t>(p);
    const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / p.columns);
    at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> h(p.columns);
      for (int64_t row = begin; row < end; ++row) {
        const auto* x = static_cast<const scalar_t*>(p.x) + row * p.x_row_stride;
        for (int64_t column = 0; column < p.columns; ++column) {
          if (p.residual) {
            const auto* residual = static_cast<const scalar_t*>(p.residual) + row * p.residual_row_stride;
            const scalar_t sum = static_cast<scalar_t>(static_cast<acc_t>(x[column]) + static_cast<acc_t>(residual[column]));
            static_cast<scalar_t*>(p.residual_out)[row * p.columns + column] = sum;
            h[column] = static_cast<acc_t>(sum);
          } else {
            h[column] = static_cast<acc_t>(x[column]);
          }
        }
        const auto stats = row_statistics<kKind, acc_t>(p.columns, p.eps, [&](int64_t c) { return h[c]; });
        auto* out = static_cast<scalar_t*>(p.out) + row * p.columns;
        for (int64_t column = 0; column < p.columns; ++column) {
          acc_t value = (h[column] - stats.mean) * stats.rstd * (offset + static_cast<acc_t>(weight[column]));
          if (bias) value += static_cast<acc_t>(bias[column]);
          out[column] = static_cast<scalar_t>(value);
        }
      }
    });
  });
}

template <NormKind kKind>
void norm_backward_cpu(const NormBackwardProblem& p, at::ScalarType dtype, at::ScalarType weight_dtype) {
  FUSED_DISPATCH_MIXED_TYPES(dtype, weight_dtype, "norm_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto* weight = static_cast<const weight_t*>(p.weight);
    const acc_t offset = offset_of<acc_t>(p);
    auto grad_at = [&](int64_t row, int64_t column) {
      return static_cast<acc_t>(static_cast<const scalar_t*>(p.grad)[row * p.grad_row_stride + column]);
    };
    auto x_at = [&](int64_t row, int64_t column) {
      return static_cast<acc_t>(static_cast<const scalar_t*>(p.x)[row * p.x_row_stride + column]);
    };
    std::vector<RowStatistics<acc_t>> stats(p.rows);
    const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, p.columns));
    at::parallel_for(0, p.rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        if (p.columns == 0) continue;
        stats[row] = row_statistics<kKind, acc_t>(p.columns, p.eps, [&](int64_t c) { return x_at(row, c); });
        const auto [mean, rstd] = stats[row];
        double sum_gw = 0, sum_gw_n = 0;
        for (int64_t column = 0; column < p.columns; ++column) {
          const acc_t gw = grad_at(row, column) * (offset + static_cast<acc_t>(weight[column]));
          sum_gw += gw;
          sum_gw_n += gw * (x_at(row, column) - mean) * rstd;
        }
        const acc_t mean_gw = kKind == NormKind::Layer ? static_cast<acc_t>(sum_gw / p.columns) : acc_t(0);
        const acc_t mean_gw_n = static_cast<acc_t>(sum_gw_n / p.columns);
        auto* grad_x = static_cast<scalar_t*>(p.grad_x) + row * p.columns;
        for (int64_t column = 0; column < p.columns; ++column) {
          const acc_t gw = grad_at(row, column) * (offset + static_cast<acc_t>(weight[column]));
          const acc_t n = (x_at(row, column) - mean) * rstd;
          acc_t value = rstd * (gw - mean_gw - n * mean_gw_n);
          if (p.grad_residual) {
            value += static_cast<acc_t>(
                static_cast<const scalar_t*>(p.grad_residual)[row * p.grad_residual_row_stride + column]);
          }
          grad_x[column] = static_cast<scalar_t>(value);
        }
      }
    });
    at::parallel_for(0, p.columns, 1, [&](int64_t begin, int64_t end) {
      for (int64_t column = begin; column < end; ++column) {
        double grad_weight = 0, grad_bias = 0;
        for (int64_t row = 0; row < p.rows; ++row) {
          const acc_t grad = grad_at(row, column);
          grad_weight += grad * (x_at(row, column) - stats[row].mean) * stats[row].rstd;
          grad_bias += grad;
        }
        static_cast<weight_t*>(p.grad_weight)[column] = static_cast<weight_t>(grad_weight);
        if (p.grad_bias) static_cast<weight_t*>(p.grad_bias)[column] = static_cast<weight_t>(grad_bias);
      }
    });
  });
}

}  // namespace cpu
}  // namespace fused_ops
