#pragma once
// Weight (and bias) gradients summed by columns from grad, h and each row's stored mean and rstd: the
// backward of decode rows, of rows over clusters and of long rows, whose few blocks per row would
// otherwise each write a partial row. Every SM takes a slice of the columns.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>

#include <cstdint>

#include "../../common/cuda_column_sum.cuh"
#include "../../common/cuda_launch.cuh"
#include "../norm.h"

namespace fused_ops {
namespace cuda {

// A block takes 32 columns in kGroups row groups; each thread sums every kGroups-th row
// in order, then the groups are added in order.
template <typename scalar_t, typename weight_t, NormKind kKind, int kGroups>
__global__ void __launch_bounds__(kColumnsPerBlock * kGroups)
    weight_grad_kernel(NormBackwardProblem p, const at::opmath_type<scalar_t>* statistics) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[2][kGroups][kColumnsPerBlock];
  const int64_t column = int64_t(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  acc_t weight_sum = 0, bias_sum = 0;
  if (column < p.columns) {
    auto add_row = [&](int64_t row) {
      const acc_t grad = static_cast<acc_t>(static_cast<const scalar_t*>(p.grad)[row * p.grad_row_stride + column]);
      const acc_t x = static_cast<acc_t>(static_cast<const scalar_t*>(p.x)[row * p.x_row_stride + column]);
      weight_sum += grad * (x - statistics[2 * row]) * statistics[2 * row + 1];
      bias_sum += grad;
    };
    if constexpr (kGroups < kRowGroups) {  // several rows per thread: four loads in flight
#pragma unroll 4
      for (int64_t row = threadIdx.y; row < p.rows; row += kGroups) add_row(row);
    } else {
      for (int64_t row = threadIdx.y; row < p.rows; row += kGroups) add_row(row);
    }
  }
  shared[0][threadIdx.y][threadIdx.x] = weight_sum;
  shared[1][threadIdx.y][threadIdx.x] = bias_sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < p.columns) {
    for (int group = 1; group < kGroups; ++group) {
      weight_sum += shared[0][group][threadIdx.x];
      bias_sum += shared[1][group][threadIdx.x];
    }
    static_cast<weight_t*>(p.grad_weight)[column] = static_cast<weight_t>(weight_sum);
    if (kKind == NormKind::Layer) static_cast<weight_t*>(p.grad_bias)[column] = static_cast<weight_t>(bias_sum);
  }
}

// Launches weight_grad_kernel in `row_groups` (4, 8 or kRowGroups: the launch plan's choice).
template <typename scalar_t, typename weight_t, NormKind kKind>
void launch_weight_grad(const NormBackwardProblem& p, const at::Tensor& statistics, int row_groups,
                        cudaStream_t stream) {
  auto kernel = row_groups == 4   ? weight_grad_kernel<scalar_t, weight_t, kKind, 4>
                : row_groups == 8 ? weight_grad_kernel<scalar_t, weight_t, kKind, 8>
                                  : weight_grad_kernel<scalar_t, weight_t, kKind, kRowGroups>;
  launch_kernel(kernel, column_sum_blocks(p.columns), dim3(kColumnsPerBlock, row_groups), 0, stream, p,
                statistics.const_data_ptr<at::opmath_type<scalar_t>>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace fused_ops
