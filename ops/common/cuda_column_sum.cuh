#pragma once
// Deterministic column sums of per-block partial rows, shared by every kernel that reduces a
// gradient over rows (norm weight/bias, bias_gelu's bias): the kernel writes one partial row per
// block, then column_sum_kernel adds the partial rows in block order (fixed order, so the result
// is bit-identical run to run).
#include <c10/cuda/CUDAException.h>

#include <cstdint>

#include "cuda_launch.cuh"

namespace fused_ops {
namespace cuda {

constexpr int kColumnsPerBlock = 32;
constexpr int kRowGroups = 16;  // blockDim = (kColumnsPerBlock, kRowGroups)

// sums_y[column] = Σ_part partials[y][part, column] for blockIdx.y = y in {0, 1}: matrix y starts
// y * parts * columns into `partials` and goes to `first_sums` or `second_sums`.
template <typename acc_t, typename out_t>
__global__ void column_sum_kernel(const acc_t* partials, int64_t parts, int64_t columns, out_t* first_sums,
                                  out_t* second_sums) {
  begin_dependent_kernel();
  __shared__ acc_t shared[kRowGroups][kColumnsPerBlock];
  const int64_t column = int64_t(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  const acc_t* matrix = partials + blockIdx.y * parts * columns;
  acc_t sum = 0;
  if (column < columns) {
    for (int64_t part = threadIdx.y; part < parts; part += kRowGroups) sum += matrix[part * columns + column];
  }
  shared[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < columns) {
    for (int group = 1; group < kRowGroups; ++group) sum += shared[group][threadIdx.x];
    (blockIdx.y == 0 ? first_sums : second_sums)[column] = static_cast<out_t>(sum);
  }
}

inline unsigned int column_sum_blocks(int64_t columns) {
  return static_cast<unsigned int>((columns + kColumnsPerBlock - 1) / kColumnsPerBlock);
}

// Sums `matrices` (1 or 2) partial matrices of [parts, columns] into first_sums (and second_sums).
template <typename acc_t, typename out_t>
void launch_column_sums(const acc_t* partials, int matrices, int64_t parts, int64_t columns, out_t* first_sums,
                        out_t* second_sums, cudaStream_t stream, bool early = true) {
  launch_kernel_at(early, column_sum_kernel<acc_t, out_t>, dim3(column_sum_blocks(columns), matrices),
                dim3(kColumnsPerBlock, kRowGroups), 0, stream, partials, parts, columns, first_sums, second_sums);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace cuda
}  // namespace fused_ops
