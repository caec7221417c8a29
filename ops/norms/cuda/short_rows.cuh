#pragma once
// The short-row path (launch_plan.h): rows of at most kShortRowMaxPacks 16-byte packs, such as the
// per-head norms of queries and keys (128 or 256 columns). A group of kThreadsPerRow lanes of one warp
// takes a row, one pack per lane, and reduces it with shuffles, so a block of kShortRowBlockThreads
// works on kShortRowBlockThreads / kThreadsPerRow rows at once instead of one row per block of mostly
// idle threads. Forward: one block per group of rows. Backward: a persistent grid whose lanes add
// grad·n (and grad) of their pack over their rows; each block adds its groups' sums in a fixed order
// into one partial row for column_sum_kernel (bit-identical run to run), or with one block writes the
// gradients itself.
#include <ATen/OpMathType.h>

#include <cstdint>

#include "../../common/cuda_launch.cuh"
#include "../../common/vector.cuh"
#include "row_math.cuh"

namespace fused_ops {
namespace cuda {

// Sum over the kThreadsPerRow lanes of this thread's group; every lane of the warp must call it.
template <int kThreadsPerRow, typename acc_t>
__device__ __forceinline__ acc_t row_group_sum(acc_t value) {
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// The row's mean from each lane's pack (idle lanes hold zeros); 0 for RMSNorm, which does not center.
template <NormKind kKind, int kThreadsPerRow, typename acc_t, typename T, int kBytes>
__device__ __forceinline__ acc_t short_row_mean(const Vec<T, kBytes>& pack, acc_t inverse_columns) {
  if constexpr (kKind == NormKind::RMS) {
    return acc_t(0);
  } else {
    acc_t sum = 0;
#pragma unroll
    for (int j = 0; j < Vec<T, kBytes>::kSize; ++j) sum += static_cast<acc_t>(pack.values[j]);
    return row_group_sum<kThreadsPerRow>(sum) * inverse_columns;
  }
}

// One lane's place: its pack of the row, and whether that pack exists (rows of fewer packs than
// kThreadsPerRow leave the group's last lanes idle).
template <int kThreadsPerRow>
struct ShortRowLane {
  static constexpr int kRowsPerBlock = kShortRowBlockThreads / kThreadsPerRow;
  int64_t pack;
  int row_in_block;
  __device__ ShortRowLane() : pack(threadIdx.x % kThreadsPerRow), row_in_block(threadIdx.x / kThreadsPerRow) {}
  __device__ __forceinline__ bool holds(int64_t packs_per_row) const { return pack < packs_per_row; }
};

// Four blocks per SM (32 registers): each lane has one pack in flight, so the forward needs every thread.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kThreadsPerRow>
__global__ void __launch_bounds__(kShortRowBlockThreads, 4) norm_forward_short_rows_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  const ShortRowLane<kThreadsPerRow> lane;
  const int64_t packs_per_row = p.columns / kWidth;
  const bool holds_pack = lane.holds(packs_per_row);
  const acc_t inverse_columns = inverse_columns_of<acc_t>(p);
  WPack weight{}, bias{};
  if (holds_pack) {
    weight = load_pack<weight_t, kWidth>(p.weight, 0, lane.pack);
    if (p.bias) bias = load_pack<weight_t, kWidth>(p.bias, 0, lane.pack);
  }
  // The loop's bounds are the block's, so every lane of a warp reaches each shuffle.
  for (int64_t first = int64_t(blockIdx.x) * lane.kRowsPerBlock; first < p.rows;
       first += int64_t(gridDim.x) * lane.kRowsPerBlock) {
    const int64_t row = first + lane.row_in_block;
    const bool live = holds_pack && row < p.rows;
    XPack h{};
    if (live) {
      h = load_pack<scalar_t, kWidth>(p.x, row * p.x_row_stride, lane.pack);
      if (p.residual) {
        add_residual_pack<true>(h, load_pack<scalar_t, kWidth>(p.residual, row * p.residual_row_stride, lane.pack));
        store_pack<scalar_t, kWidth>(p.residual_out, row * p.columns, lane.pack, h);
      }
    }
    const acc_t mean = short_row_mean<kKind, kThreadsPerRow>(h, inverse_columns);
    acc_t squares = 0;
    if (live) {
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const acc_t centered = static_cast<acc_t>(h.values[j]) - mean;
        squares += centered * centered;
      }
    }
    squares = row_group_sum<kThreadsPerRow>(squares);
    const acc_t variance = kKind == NormKind::RMS ? squares / p.columns : squares * inverse_columns;
    const acc_t rstd = reciprocal_sqrt(variance + static_cast<acc_t>(p.eps));
    if (!live) continue;
    const XPack out = normalized_pack(p, h, mean, rstd, weight, bias);
    store_pack<scalar_t, kWidth>(p.out, row * p.columns, lane.pack, out);
  }
}

// Two blocks per SM (64 registers: x, grad and each lane's column sums), the persistent grid's size.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kThreadsPerRow>
__global__ void __launch_bounds__(kShortRowBlockThreads, 2)
    norm_backward_short_rows_kernel(NormBackwardProblem p, at::opmath_type<scalar_t>* weight_partials,
                                    at::opmath_type<scalar_t>* bias_partials) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  constexpr int kGroupColumns = kThreadsPerRow * kWidth;
  __shared__ acc_t column_sums[kShortRowBlockThreads * kWidth];
  const ShortRowLane<kThreadsPerRow> lane;
  const int64_t packs_per_row = p.columns / kWidth;
  const bool holds_pack = lane.holds(packs_per_row);
  const acc_t inverse_columns = inverse_columns_of<acc_t>(p);
  WPack weight{};
  if (holds_pack) weight = load_pack<weight_t, kWidth>(p.weight, 0, lane.pack);
  acc_t weight_sum[kWidth] = {};
  acc_t bias_sum[kWidth] = {};
  for (int64_t first = int64_t(blockIdx.x) * lane.kRowsPerBlock; first < p.rows;
       first += int64_t(gridDim.x) * lane.kRowsPerBlock) {
    const int64_t row = first + lane.row_in_block;
    const bool live = holds_pack && row < p.rows;
    XPack x{}, grad{}, grad_residual{};
    if (live) {
      x = load_pack<scalar_t, kWidth>(p.x, row * p.x_row_stride, lane.pack);
      grad = load_pack<scalar_t, kWidth>(p.grad, row * p.grad_row_stride, lane.pack);
      if (p.grad_residual) {
        grad_residual = load_pack<scalar_t, kWidth>(p.grad_residual, row * p.grad_residual_row_stride, lane.pack);
      }
    }
    const acc_t mean = short_row_mean<kKind, kThreadsPerRow>(x, inverse_columns);
    // Σ (h - mean)², Σ gw·(h - mean), Σ gw, as the other paths.
    acc_t sums[3] = {0, 0, 0};
    if (live) {
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        add_backward_terms(sums, static_cast<acc_t>(x.values[j]), static_cast<acc_t>(grad.values[j]),
                           offset_weight<acc_t>(p, weight.values[j]), mean);
      }
    }
#pragma unroll
    for (int i = 0; i < 3; ++i) sums[i] = row_group_sum<kThreadsPerRow>(sums[i]);
    const BackwardRow<acc_t> statistics = backward_row_of_sums<kKind>(mean, sums, inverse_columns, p.eps);
    if (!live) continue;
    XPack grad_x;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const acc_t g = static_cast<acc_t>(grad.values[j]);
      const acc_t n = statistics.normalized(static_cast<acc_t>(x.values[j]));
      acc_t value = statistics.grad_h(g, offset_weight<acc_t>(p, weight.values[j]), n);
      if (p.grad_residual) value += static_cast<acc_t>(grad_residual.values[j]);
      grad_x.values[j] = static_cast<scalar_t>(value);
      weight_sum[j] += g * n;
      if constexpr (kKind == NormKind::Layer) bias_sum[j] += g;
    }
    store_pack<scalar_t, kWidth>(p.grad_x, row * p.columns, lane.pack, grad_x);
  }
  // The block's column sums: thread t's sums sit at t * kWidth, so group g's column c is at
  // g * kGroupColumns + c; column c adds the groups in order.
  auto write_sums = [&](const acc_t(&lane_sums)[kWidth], acc_t* partials, void* gradient) {
    __syncthreads();  // the previous pass's readers are done with column_sums
#pragma unroll
    for (int j = 0; j < kWidth; ++j) column_sums[threadIdx.x * kWidth + j] = lane_sums[j];
    __syncthreads();
    for (int64_t column = threadIdx.x; column < p.columns; column += blockDim.x) {
      acc_t total = 0;
      for (int group = 0; group < lane.kRowsPerBlock; ++group) total += column_sums[group * kGroupColumns + column];
      if (gridDim.x == 1) {
        static_cast<weight_t*>(gradient)[column] = static_cast<weight_t>(total);
      } else {
        partials[int64_t(blockIdx.x) * p.columns + column] = total;
      }
    }
  };
  write_sums(weight_sum, weight_partials, p.grad_weight);
  if constexpr (kKind == NormKind::Layer) write_sums(bias_sum, bias_partials, p.grad_bias);
}

}  // namespace cuda
}  // namespace fused_ops
