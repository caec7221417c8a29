#pragma once
// Long-row path: each thread steps through the row's packs; rows are read more than once (from L2).
#include <ATen/OpMathType.h>

#include <cstdint>

#include "../../common/cuda_launch.cuh"
#include "../../common/vector.cuh"
#include "row_math.cuh"

namespace fused_ops {
namespace cuda {

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
__global__ void __launch_bounds__(kLongRowThreads) norm_forward_long_row_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ acc_t shared[32];
  const int64_t packs_per_row = p.columns / kWidth;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    // With a residual, h is written to residual_out in the first pass; later passes read it back
    // (each thread reads only what it wrote).
    const void* h = p.residual ? p.residual_out : p.x;
    const int64_t h_offset = p.residual ? row * p.columns : row * p.x_row_stride;
    acc_t sum[1] = {0};
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      XPack values = load_pack<scalar_t, kWidth>(p.x, row * p.x_row_stride, pack);
      if (p.residual) {
        const XPack residual = load_pack<scalar_t, kWidth>(p.residual, row * p.residual_row_stride, pack);
#pragma unroll
        for (int j = 0; j < kWidth; ++j) {
          values.values[j] =
              static_cast<scalar_t>(static_cast<acc_t>(values.values[j]) + static_cast<acc_t>(residual.values[j]));
        }
        store_pack<scalar_t, kWidth>(p.residual_out, row * p.columns, pack, values);
      }
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const acc_t value = static_cast<acc_t>(values.values[j]);
        sum[0] += kKind == NormKind::Layer ? value : value * value;
      }
    }
    block_sum(sum, shared);
    acc_t mean = 0;
    // Divides: multiplying by 1 / columns takes this kernel from 32 to 42 registers, one block of 1024
    // threads per SM instead of two.
    acc_t variance = sum[0] / p.columns;
    if constexpr (kKind == NormKind::Layer) {
      mean = sum[0] / p.columns;
      acc_t squares[1] = {0};
      for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
        const XPack values = load_pack<scalar_t, kWidth>(h, h_offset, pack);
#pragma unroll
        for (int j = 0; j < kWidth; ++j) {
          const acc_t centered = static_cast<acc_t>(values.values[j]) - mean;
          squares[0] += centered * centered;
        }
      }
      block_sum(squares, shared);
      variance = squares[0] / p.columns;
    }
    const acc_t rstd = reciprocal_sqrt(variance + static_cast<acc_t>(p.eps));
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      const XPack values = load_pack<scalar_t, kWidth>(h, h_offset, pack);
      const WPack weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
      WPack bias;
      if (p.bias) bias = load_pack<weight_t, kWidth>(p.bias, 0, pack);
      const XPack out = normalized_pack(p, values, mean, rstd, weight, bias);
      store_pack<scalar_t, kWidth>(p.out, row * p.columns, pack, out);
    }
  }
}

// grad_x per row; each row's mean and rstd go to `statistics` ([rows, 2]) for weight_grad_kernel.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
__global__ void __launch_bounds__(kLongRowThreads)
    norm_backward_long_row_kernel(NormBackwardProblem p, at::opmath_type<scalar_t>* statistics) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ acc_t shared[32 * 3];
  const int64_t packs_per_row = p.columns / kWidth;
  const acc_t inverse_columns = inverse_columns_of<acc_t>(p);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t x_offset = row * p.x_row_stride;
    const int64_t grad_offset = row * p.grad_row_stride;
    acc_t mean = 0;
    if constexpr (kKind == NormKind::Layer) {
      acc_t sum[1] = {0};
      for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
        const XPack x = load_pack<scalar_t, kWidth>(p.x, x_offset, pack);
#pragma unroll
        for (int j = 0; j < kWidth; ++j) sum[0] += static_cast<acc_t>(x.values[j]);
      }
      block_sum(sum, shared);
      mean = sum[0] * inverse_columns;
    }
    acc_t sums[3] = {0, 0, 0};
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      const XPack x = load_pack<scalar_t, kWidth>(p.x, x_offset, pack);
      const XPack grad = load_pack<scalar_t, kWidth>(p.grad, grad_offset, pack);
      const WPack weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        add_backward_terms(sums, static_cast<acc_t>(x.values[j]), static_cast<acc_t>(grad.values[j]),
                           offset_weight<acc_t>(p, weight.values[j]), mean);
      }
    }
    const BackwardRow<acc_t> row_statistics = backward_row<kKind>(mean, sums, inverse_columns, p.eps, shared);
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      const XPack x = load_pack<scalar_t, kWidth>(p.x, x_offset, pack);
      const XPack grad = load_pack<scalar_t, kWidth>(p.grad, grad_offset, pack);
      const WPack weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
      XPack grad_residual;
      if (p.grad_residual) {
        grad_residual = load_pack<scalar_t, kWidth>(p.grad_residual, row * p.grad_residual_row_stride, pack);
      }
      XPack grad_x;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const acc_t n = row_statistics.normalized(static_cast<acc_t>(x.values[j]));
        acc_t value =
            row_statistics.grad_h(static_cast<acc_t>(grad.values[j]), offset_weight<acc_t>(p, weight.values[j]), n);
        if (p.grad_residual) value += static_cast<acc_t>(grad_residual.values[j]);
        grad_x.values[j] = static_cast<scalar_t>(value);
      }
      store_pack<scalar_t, kWidth>(p.grad_x, row * p.columns, pack, grad_x);
    }
    if (threadIdx.x == 0) {
      statistics[2 * row] = mean;
      statistics[2 * row + 1] = row_statistics.rstd;
    }
  }
}

}  // namespace cuda
}  // namespace fused_ops
