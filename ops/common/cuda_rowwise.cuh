#pragma once
// Rowwise CUDA loop (see rowwise.h). Grid: x covers the columns of one row (one thread per
// 16-byte vector, one block per 256 vectors, as measured fastest in docs/benchmarks.md), y walks
// the rows. Fast path: every operand has contiguous, 16-byte-aligned rows; otherwise one
// element per thread with any strides.
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "cuda_elementwise.cuh"
#include "rowwise.h"

namespace fused_ops {
namespace cuda {

constexpr int64_t kMaxGridRows = 65535;

template <typename scalar_t, int kInputs, int kOutputs, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_vectorized_kernel(RowwiseProblem<kInputs, kOutputs> problem, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  const int64_t vectors_per_row = problem.columns / Vec::kSize;
  for (int64_t vector = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; vector < vectors_per_row;
       vector += int64_t(gridDim.x) * blockDim.x) {
    for (int64_t row = blockIdx.y; row < problem.rows; row += gridDim.y) {
      Vec in_vectors[kInputs];
#pragma unroll
      for (int i = 0; i < kInputs; ++i) {
        in_vectors[i] = load_vec16(
            static_cast<const scalar_t*>(problem.inputs[i].data) + row * problem.inputs[i].row_stride, vector);
      }
      Vec out_vectors[kOutputs];
#pragma unroll
      for (int j = 0; j < Vec::kSize; ++j) {
        opmath_t in[kInputs];
        opmath_t out[kOutputs];
#pragma unroll
        for (int i = 0; i < kInputs; ++i) in[i] = static_cast<opmath_t>(in_vectors[i].values[j]);
        op(in, out);
#pragma unroll
        for (int o = 0; o < kOutputs; ++o) out_vectors[o].values[j] = static_cast<scalar_t>(out[o]);
      }
#pragma unroll
      for (int o = 0; o < kOutputs; ++o) {
        store_vec16(static_cast<scalar_t*>(problem.outputs[o].data) + row * problem.outputs[o].row_stride,
                    vector, out_vectors[o]);
      }
    }
  }
}

template <typename scalar_t, int kInputs, int kOutputs, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_strided_kernel(RowwiseProblem<kInputs, kOutputs> problem, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  for (int64_t column = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; column < problem.columns;
       column += int64_t(gridDim.x) * blockDim.x) {
    for (int64_t row = blockIdx.y; row < problem.rows; row += gridDim.y) {
      opmath_t in[kInputs];
      opmath_t out[kOutputs];
#pragma unroll
      for (int i = 0; i < kInputs; ++i) {
        const RowOperand& operand = problem.inputs[i];
        in[i] = static_cast<opmath_t>(static_cast<const scalar_t*>(operand.data)[
            row * operand.row_stride + column * operand.column_stride]);
      }
      op(in, out);
#pragma unroll
      for (int o = 0; o < kOutputs; ++o) {
        static_cast<scalar_t*>(problem.outputs[o].data)[row * problem.outputs[o].row_stride + column] =
            static_cast<scalar_t>(out[o]);
      }
    }
  }
}

template <int kInputs, int kOutputs>
bool rows_are_vectorizable(const RowwiseProblem<kInputs, kOutputs>& problem, int64_t element_size) {
  const int64_t vector_elements = 16 / element_size;
  if (problem.columns % vector_elements != 0) return false;
  for (const RowOperand& operand : problem.inputs) {
    if (operand.column_stride != 1 || !is_aligned16(operand.data) ||
        (operand.row_stride * element_size) % 16 != 0) {
      return false;
    }
  }
  for (const RowOutput& output : problem.outputs) {
    if (!is_aligned16(output.data) || (output.row_stride * element_size) % 16 != 0) return false;
  }
  return true;
}

// Runs Op<opmath_t>{params...} over the problem on the current stream of `device`.
template <template <typename> class Op, int kInputs, int kOutputs, typename... Params>
void rowwise_cuda(const RowwiseProblem<kInputs, kOutputs>& problem, at::ScalarType dtype,
                  c10::Device device, Params... params) {
  if (problem.rows == 0 || problem.columns == 0) return;
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "rowwise_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{params...};
    const unsigned int grid_rows = static_cast<unsigned int>(std::min(problem.rows, kMaxGridRows));
    if (rows_are_vectorizable(problem, sizeof(scalar_t))) {
      const dim3 grid(grid_size(problem.columns / Vec16<scalar_t>::kSize), grid_rows);
      rowwise_vectorized_kernel<scalar_t><<<grid, kThreadsPerBlock, 0, stream>>>(problem, op);
    } else {
      const dim3 grid(grid_size(problem.columns), grid_rows);
      rowwise_strided_kernel<scalar_t><<<grid, kThreadsPerBlock, 0, stream>>>(problem, op);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace cuda
}  // namespace fused_ops
