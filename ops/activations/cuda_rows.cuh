#pragma once
// Rowwise CUDA loop (see rows.h; thresholds in launch_plan.h). Grid: x covers the columns of one row
// (one thread per 16-byte vector, one block per 256 vectors), y walks the rows, up to kMaxRowsPerThread
// at a time. Small grids (decode) give each thread 1-8 elements of one
// row, no loops (launch_small_grid). Fast path: every operand has contiguous, 16-byte-aligned rows;
// otherwise one element per thread with any strides.
// Column sums of output 0 (bias gradients): partial rows + column_sum_kernel for many rows, one
// launch for up to kMaxFewRows rows (decode).
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "../common/cuda_column_sum.cuh"
#include "../common/cuda_device.cuh"
#include "../common/cuda_launch.cuh"
#include "../common/dtype_dispatch.h"
#include "../common/vector.cuh"
#include "launch_plan.h"
#include "rows.h"

namespace fused_ops {
namespace cuda {

// Index: int64_t, or int where the launcher checked that every offset fits (decode kernels).
template <int kVectorBytes, typename scalar_t, int kInputs, int kOutputs, typename Index>
__device__ __forceinline__ void load_row_vectors(const RowwiseProblem<kInputs, kOutputs>& problem, Index row,
                                                 Index vector, Vec<scalar_t, kVectorBytes> (&in_vectors)[kInputs]) {
#pragma unroll
  for (int i = 0; i < kInputs; ++i) {
    in_vectors[i] = load_vec<kVectorBytes>(static_cast<const scalar_t*>(problem.inputs[i].data) +
                                               row * static_cast<Index>(problem.inputs[i].row_stride),
                                           vector);
  }
}

// Applies the op to one loaded vector of `row`, stores the outputs and, with kSumFirstOutput, adds
// output 0 (in opmath, before rounding) to `sums`.
template <bool kSumFirstOutput, int kVectorBytes, typename scalar_t, int kInputs, int kOutputs, typename Op,
          typename opmath_t, typename Index>
__device__ __forceinline__ void apply_row_vector(const RowwiseProblem<kInputs, kOutputs>& problem, const Op& op,
                                                 Index row, Index vector,
                                                 const Vec<scalar_t, kVectorBytes> (&in_vectors)[kInputs],
                                                 opmath_t (&sums)[Vec<scalar_t, kVectorBytes>::kSize]) {
  constexpr int kSize = Vec<scalar_t, kVectorBytes>::kSize;
  opmath_t in_values[kInputs][kSize];
#pragma unroll
  for (int i = 0; i < kInputs; ++i) unpack_vec(in_vectors[i], in_values[i]);
  opmath_t out_values[kOutputs][kSize];
#pragma unroll
  for (int j = 0; j < kSize; ++j) {
    opmath_t in[kInputs];
    opmath_t out[kOutputs];
#pragma unroll
    for (int i = 0; i < kInputs; ++i) in[i] = in_values[i][j];
    op(in, out);
    if constexpr (kSumFirstOutput) sums[j] += out[0];
#pragma unroll
    for (int o = 0; o < kOutputs; ++o) out_values[o][j] = out[o];
  }
#pragma unroll
  for (int o = 0; o < kOutputs; ++o) {
    store_vec<kVectorBytes>(
        static_cast<scalar_t*>(problem.outputs[o].data) + row * static_cast<Index>(problem.outputs[o].row_stride),
        vector, pack_vec<scalar_t, kVectorBytes>(out_values[o]));
  }
}

// Loads the vectors of rows first_row .. first_row + kRowsPerThread - 1 (those of the problem), then
// applies the op to each, so that every load of the group is in flight before the first is used.
template <bool kSumFirstOutput, int kRowsPerThread, int kVectorBytes, typename scalar_t, int kInputs,
          int kOutputs, typename Op, typename opmath_t, typename Index>
__device__ __forceinline__ void apply_row_group(const RowwiseProblem<kInputs, kOutputs>& problem, const Op& op,
                                                Index first_row, Index vector,
                                                opmath_t (&sums)[Vec<scalar_t, kVectorBytes>::kSize]) {
  const Index rows = static_cast<Index>(problem.rows);
  Vec<scalar_t, kVectorBytes> in_vectors[kRowsPerThread][kInputs];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    if (r > 0 && first_row + r >= rows) break;
    load_row_vectors<kVectorBytes>(problem, first_row + r, vector, in_vectors[r]);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    if (r > 0 && first_row + r >= rows) break;
    apply_row_vector<kSumFirstOutput, kVectorBytes>(problem, op, first_row + r, vector, in_vectors[r], sums);
  }
}

template <typename sum_t, int kSize, typename opmath_t>
__device__ __forceinline__ void store_column_sums(sum_t* destination, const opmath_t (&sums)[kSize]) {
  sum_t rounded[kSize];
#pragma unroll
  for (int j = 0; j < kSize; ++j) rounded[j] = static_cast<sum_t>(sums[j]);
  store_consecutive(destination, rounded);
}

// With a sum_t other than void, each thread also adds output 0 over the rows it visits and block
// row y writes its sums as row y of `column_sums` [gridDim.y, columns]: partial sums in opmath
// for launch_column_sums, or the final sums in scalar_t when gridDim.y is 1.
template <typename scalar_t, int kInputs, int kOutputs, int kRowsPerThread, typename sum_t, int kVectorBytes,
          typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_vectorized_kernel(RowwiseProblem<kInputs, kOutputs> problem, Op op, sum_t* column_sums) {
  begin_dependent_kernel();
  constexpr bool kSumFirstOutput = !std::is_void_v<sum_t>;
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = fused_ops::cuda::Vec<scalar_t, kVectorBytes>;
  const int64_t vectors_per_row = problem.columns / Vec::kSize;
  const int64_t row_step = int64_t(gridDim.y) * kRowsPerThread;
  for (int64_t vector = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; vector < vectors_per_row;
       vector += int64_t(gridDim.x) * blockDim.x) {
    opmath_t sums[Vec::kSize] = {};
    for (int64_t first_row = int64_t(blockIdx.y) * kRowsPerThread; first_row < problem.rows;
         first_row += row_step) {
      apply_row_group<kSumFirstOutput, kRowsPerThread, kVectorBytes, scalar_t>(problem, op, first_row, vector, sums);
    }
    if constexpr (kSumFirstOutput) {
      store_column_sums(column_sums + int64_t(blockIdx.y) * problem.columns + vector * Vec::kSize, sums);
    }
  }
}

// A decode launch's parameters: a RowwiseProblem of contiguous rows cut to what the decode kernel
// reads, with 32-bit strides and its first read (the vector count) first. For two inputs and one
// output it spans bytes 0x210-0x23b of the constant bank, where RowwiseProblem spans 0x210-0x25f and its
// first read sits at 0x258: every decode kernel starts sooner (docs/design.md).
template <int kInputs, int kOutputs>
struct DecodeProblem {
  int vectors_per_row;
  int rows;
  const void* inputs[kInputs];
  void* outputs[kOutputs];
  int input_row_strides[kInputs];
  int output_row_strides[kOutputs];
};

// The row helpers' view of a decode kernel's operands, in registers.
template <int kInputs, int kOutputs>
__device__ __forceinline__ RowwiseProblem<kInputs, kOutputs> rowwise_problem_of(
    const DecodeProblem<kInputs, kOutputs>& decode, int vector_size) {
  RowwiseProblem<kInputs, kOutputs> problem;
#pragma unroll
  for (int i = 0; i < kInputs; ++i) problem.inputs[i] = {decode.inputs[i], decode.input_row_strides[i], 1};
#pragma unroll
  for (int o = 0; o < kOutputs; ++o) problem.outputs[o] = {decode.outputs[o], decode.output_row_strides[o]};
  problem.rows = decode.rows;
  problem.columns = decode.vectors_per_row * vector_size;
  return problem;
}

// Decode grids: each thread takes one column vector of up to kRowsPerThread rows, with no loops and
// 32-bit offsets (launch_small_grid checks that they fit; with rows under 2^31 elements the grid
// covers every vector, and vector indices stay below 2^30 + 128). kExactGrid: the blocks cover the
// row's vectors exactly, so no bounds check: with one, every parameter read and blockIdx.y waits for
// the check's exit. Inductor's kernels skip it the same way for sizes their blocks divide.
template <typename scalar_t, int kInputs, int kOutputs, int kRowsPerThread, typename sum_t, int kVectorBytes,
          bool kExactGrid, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_decode_kernel(DecodeProblem<kInputs, kOutputs> decode, Op op, sum_t* column_sums) {
  begin_dependent_kernel();
  constexpr bool kSumFirstOutput = !std::is_void_v<sum_t>;
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = fused_ops::cuda::Vec<scalar_t, kVectorBytes>;
  const int vector = blockIdx.x * kDecodeThreadsPerBlock + threadIdx.x;
  if (!kExactGrid && vector >= decode.vectors_per_row) return;
  RowwiseProblem<kInputs, kOutputs> problem = rowwise_problem_of(decode, Vec::kSize);
  opmath_t sums[Vec::kSize] = {};
  apply_row_group<kSumFirstOutput, kRowsPerThread, kVectorBytes, scalar_t>(
      problem, op, static_cast<int>(blockIdx.y) * kRowsPerThread, vector, sums);
  if constexpr (kSumFirstOutput) store_column_sums(column_sums + vector * Vec::kSize, sums);  // one block row
}

// Column sums over few rows (decode) in one launch with every element in its own thread: a block
// is kFewRowsVectorsPerBlock column vectors x kFewRowsLanes row lanes, lane l takes rows l,
// l + kFewRowsLanes, ...; the lanes' sums meet in shared memory and are added in lane order
// (deterministic). One thread per column over all rows instead leaves each SM a few warps running
// hundreds of dependent instructions each, slower than two launches.
constexpr int kFewRowsVectorsPerBlock = kThreadsPerBlock / kFewRowsLanes;

// Each lane's sums of the block's vectors meet in shared memory; thread t then adds column t of the
// block over the lanes in lane order (deterministic) and writes it: consecutive threads, consecutive
// columns. kCheckColumns: the block's last vectors may lie past the row's `columns`.
template <bool kCheckColumns, typename scalar_t, typename opmath_t, int kSize, typename Index>
__device__ __forceinline__ void add_lane_sums(opmath_t (&lane_sums)[kFewRowsLanes][kFewRowsVectorsPerBlock][kSize],
                                              const opmath_t (&sums)[kSize], Index first_vector, Index columns,
                                              scalar_t* column_sums) {
#pragma unroll
  for (int j = 0; j < kSize; ++j) lane_sums[threadIdx.y][threadIdx.x][j] = sums[j];
  __syncthreads();
  const int thread = threadIdx.y * kFewRowsVectorsPerBlock + threadIdx.x;
  if (thread < kFewRowsVectorsPerBlock * kSize) {
    const int group_vector = thread / kSize;
    const int element = thread % kSize;
    const Index column = (first_vector + group_vector) * kSize + element;
    if (!kCheckColumns || column < columns) {
      opmath_t sum = 0;
#pragma unroll
      for (int lane = 0; lane < kFewRowsLanes; ++lane) sum += lane_sums[lane][group_vector][element];
      column_sums[column] = static_cast<scalar_t>(sum);
    }
  }
}

template <typename scalar_t, int kInputs, int kOutputs, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_few_rows_column_sums_kernel(RowwiseProblem<kInputs, kOutputs> problem, Op op, scalar_t* column_sums) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  __shared__ opmath_t lane_sums[kFewRowsLanes][kFewRowsVectorsPerBlock][Vec::kSize];
  const int64_t vectors_per_row = problem.columns / Vec::kSize;
  const int64_t vector_groups = (vectors_per_row + kFewRowsVectorsPerBlock - 1) / kFewRowsVectorsPerBlock;
  for (int64_t group = blockIdx.x; group < vector_groups; group += gridDim.x) {
    const int64_t vector = group * kFewRowsVectorsPerBlock + threadIdx.x;
    opmath_t sums[Vec::kSize] = {};
    if (vector < vectors_per_row) {
      for (int64_t row = threadIdx.y; row < problem.rows; row += kFewRowsLanes) {
        Vec in_vectors[kInputs];
        load_row_vectors<16>(problem, row, vector, in_vectors);
        apply_row_vector<true, 16>(problem, op, row, vector, in_vectors, sums);
      }
    }
    add_lane_sums<true>(lane_sums, sums, group * kFewRowsVectorsPerBlock, problem.columns, column_sums);
    __syncthreads();  // lane_sums is rewritten by the next group
  }
}

// The few-rows column sums on the decode kernel's terms, for up to kMaxFewRowsDecode rows whose vectors
// fill whole blocks and whose offsets fit in an int: the compact DecodeProblem, 32-bit indices, no
// loop over groups, no bounds check on the vector.

template <typename scalar_t, int kInputs, int kOutputs, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_few_rows_decode_column_sums_kernel(DecodeProblem<kInputs, kOutputs> decode, Op op, scalar_t* column_sums) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  __shared__ opmath_t lane_sums[kFewRowsLanes][kFewRowsVectorsPerBlock][Vec::kSize];
  RowwiseProblem<kInputs, kOutputs> problem = rowwise_problem_of(decode, Vec::kSize);
  const int vector = blockIdx.x * kFewRowsVectorsPerBlock + threadIdx.x;
  opmath_t sums[Vec::kSize] = {};
  // Unrolled for kMaxFewRows rows; launched for up to kMaxFewRowsDecode.
#pragma unroll
  for (int k = 0; k < kMaxFewRows / kFewRowsLanes; ++k) {
    const int row = threadIdx.y + k * kFewRowsLanes;
    if (row >= decode.rows) break;
    Vec in_vectors[kInputs];
    load_row_vectors<16>(problem, row, vector, in_vectors);
    apply_row_vector<true, 16>(problem, op, row, vector, in_vectors, sums);
  }
  add_lane_sums<false>(lane_sums, sums, blockIdx.x * kFewRowsVectorsPerBlock,
                       static_cast<unsigned int>(decode.vectors_per_row * Vec::kSize), column_sums);
}

template <typename scalar_t, int kInputs, int kOutputs, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    rowwise_strided_kernel(RowwiseProblem<kInputs, kOutputs> problem, Op op) {
  begin_dependent_kernel();
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

// Every operand offset of the problem fits in an int (rowwise_decode_kernel's index math).
template <int kInputs, int kOutputs>
bool offsets_fit_in_int(const RowwiseProblem<kInputs, kOutputs>& problem) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (problem.rows > kMax || problem.columns > kMax) return false;
  for (const RowOperand& operand : problem.inputs) {
    if ((problem.rows - 1) * operand.row_stride + problem.columns > kMax) return false;
  }
  for (const RowOutput& output : problem.outputs) {
    if ((problem.rows - 1) * output.row_stride + problem.columns > kMax) return false;
  }
  return true;
}

// The decode kernels' parameters for a problem whose offsets fit in an int (offsets_fit_in_int).
template <int kInputs, int kOutputs>
DecodeProblem<kInputs, kOutputs> decode_problem_of(const RowwiseProblem<kInputs, kOutputs>& problem,
                                                   int64_t vectors_per_row) {
  DecodeProblem<kInputs, kOutputs> decode;
  decode.vectors_per_row = static_cast<int>(vectors_per_row);
  decode.rows = static_cast<int>(problem.rows);
  for (int i = 0; i < kInputs; ++i) {
    decode.inputs[i] = problem.inputs[i].data;
    decode.input_row_strides[i] = static_cast<int>(problem.inputs[i].row_stride);
  }
  for (int o = 0; o < kOutputs; ++o) {
    decode.outputs[o] = problem.outputs[o].data;
    decode.output_row_strides[o] = static_cast<int>(problem.outputs[o].row_stride);
  }
  return decode;
}

// A small grid (decode) of vectorizable rows: kRowsPerThread rows of one column vector per thread;
// with a sum_t, rows <= kRowsPerThread and column_sums gets the final sums. rowwise_decode_kernel with
// decode_elements_per_thread elements in blocks of kDecodeThreadsPerBlock, where its offsets fit;
// the looping kernel with 16-byte vectors otherwise (rows of over 2^31 elements).
template <typename scalar_t, int kRowsPerThread, typename sum_t, int kInputs, int kOutputs, typename Op>
void launch_small_grid(const RowwiseProblem<kInputs, kOutputs>& problem, const Op& op, sum_t* column_sums,
                       cudaStream_t stream) {
  const int64_t row_groups = (problem.rows + kRowsPerThread - 1) / kRowsPerThread;
  if (row_groups > kMaxGridRows || !offsets_fit_in_int(problem)) {
    const dim3 grid(grid_size(problem.columns / Vec16<scalar_t>::kSize, kSmallGridThreadsPerBlock),
                    static_cast<unsigned int>(std::min(row_groups, kMaxGridRows)));
    launch_kernel(rowwise_vectorized_kernel<scalar_t, kInputs, kOutputs, kRowsPerThread, sum_t, 16, Op>, grid,
                  kSmallGridThreadsPerBlock, 0, stream, problem, op, column_sums);
    return;
  }
  const int elements = decode_elements_per_thread(problem.rows * problem.columns, Vec16<scalar_t>::kSize, sm_count());
  with_vector_bytes<scalar_t>(elements, [&](auto vector_bytes) {
    constexpr int kVectorBytes = decltype(vector_bytes)::value;
    const int64_t vectors_per_row = problem.columns / Vec<scalar_t, kVectorBytes>::kSize;
    const dim3 grid(grid_size(vectors_per_row, kDecodeThreadsPerBlock), static_cast<unsigned int>(row_groups));
    const DecodeProblem<kInputs, kOutputs> decode = decode_problem_of(problem, vectors_per_row);
    if (vectors_per_row % kDecodeThreadsPerBlock == 0) {
      launch_kernel(rowwise_decode_kernel<scalar_t, kInputs, kOutputs, kRowsPerThread, sum_t, kVectorBytes, true, Op>,
                    grid, kDecodeThreadsPerBlock, 0, stream, decode, op, column_sums);
    } else {
      launch_kernel(rowwise_decode_kernel<scalar_t, kInputs, kOutputs, kRowsPerThread, sum_t, kVectorBytes, false, Op>,
                    grid, kDecodeThreadsPerBlock, 0, stream, decode, op, column_sums);
    }
  });
}

template <int kInputs, int kOutputs>
bool rows_are_vectorizable(const RowwiseProblem<kInputs, kOutputs>& problem, int64_t element_size) {
  const int64_t vector_elements = 16 / element_size;
  if (problem.columns % vector_elements != 0) return false;
  for (const RowOperand& operand : problem.inputs) {
    if (operand.column_stride != 1 || !rows_aligned(operand.data, operand.row_stride, element_size)) {
      return false;
    }
  }
  for (const RowOutput& output : problem.outputs) {
    if (!rows_aligned(output.data, output.row_stride, element_size)) return false;
  }
  return true;
}

// Runs Op<opmath_t>{params...} over the problem on the current stream of `device`. With many rows, each
// thread takes `row_groups_per_thread` (at least 1) groups of kMaxRowsPerThread rows in turn, so its setup
// (row and column indices, operand addresses) is paid once for them: for issue-bound ops (the erf GELU).
template <template <typename> class Op, int kInputs, int kOutputs, typename... Params>
void rowwise_cuda_in_row_groups(const RowwiseProblem<kInputs, kOutputs>& problem, at::ScalarType dtype,
                                c10::Device device, int64_t row_groups_per_thread, Params... params) {
  if (problem.rows == 0 || problem.columns == 0) return;
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "rowwise_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{params...};
    if (rows_are_vectorizable(problem, sizeof(scalar_t))) {
      const unsigned int column_blocks = grid_size(problem.columns / Vec16<scalar_t>::kSize);
      const int64_t row_groups = (problem.rows + kMaxRowsPerThread - 1) / kMaxRowsPerThread;
      if (!uses_decode_grid(row_groups, column_blocks, sm_count())) {
        const int64_t grid_rows = (row_groups + row_groups_per_thread - 1) / row_groups_per_thread;
        const dim3 grid(column_blocks, static_cast<unsigned int>(std::min(grid_rows, kMaxGridRows)));
        launch_kernel(rowwise_vectorized_kernel<scalar_t, kInputs, kOutputs, kMaxRowsPerThread, void, 16, Op<opmath_t>>,
                      grid, kThreadsPerBlock, 0, stream, problem, op, nullptr);
      } else {
        launch_small_grid<scalar_t, 1>(problem, op, static_cast<void*>(nullptr), stream);
      }
    } else {
      const dim3 grid(grid_size(problem.columns), static_cast<unsigned int>(std::min(problem.rows, kMaxGridRows)));
      launch_kernel(rowwise_strided_kernel<scalar_t, kInputs, kOutputs, Op<opmath_t>>, grid, kThreadsPerBlock, 0,
                    stream, problem, op);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// One row group per thread, as the memory-bound ops take (bias_gelu_row_groups_per_thread).
template <template <typename> class Op, int kInputs, int kOutputs, typename... Params>
void rowwise_cuda(const RowwiseProblem<kInputs, kOutputs>& problem, at::ScalarType dtype, c10::Device device,
                  Params... params) {
  rowwise_cuda_in_row_groups<Op>(problem, dtype, device, 1, params...);
}

// rowwise_cuda, and column_sums[column] = Σ_row output 0 [row, column] (column_sums: [columns] of
// `dtype`). Fast path: summed in opmath before output 0 is rounded, in a fixed order.
template <template <typename> class Op, int kInputs, int kOutputs, typename... Params>
void rowwise_cuda_with_column_sums(const RowwiseProblem<kInputs, kOutputs>& problem, at::ScalarType dtype,
                                   c10::Device device, at::Tensor column_sums, Params... params) {
  if (problem.columns == 0) return;
  if (problem.rows == 0) {
    column_sums.zero_();
    return;
  }
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "rowwise_cuda_with_column_sums", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    if (!rows_are_vectorizable(problem, sizeof(scalar_t)) || !is_aligned(column_sums.const_data_ptr())) {
      // General path: the strided loop, then aten's (deterministic) sum of the rounded output.
      rowwise_cuda<Op>(problem, dtype, device, params...);
      const RowOutput& output = problem.outputs[0];
      const at::Tensor output_rows = at::from_blob(output.data, {problem.rows, problem.columns},
                                                   {output.row_stride, 1}, column_sums.options());
      at::sum_out(column_sums, output_rows, {0});
      return;
    }
    const Op<opmath_t> op{params...};
    const int64_t vectors_per_row = problem.columns / Vec16<scalar_t>::kSize;
    if (problem.rows <= kMaxRowsPerThread) {  // each thread holds every row: no lanes to add up
      launch_small_grid<scalar_t, kMaxRowsPerThread>(problem, op, column_sums.mutable_data_ptr<scalar_t>(), stream);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    if (problem.rows <= kMaxFewRows) {
      const dim3 block(kFewRowsVectorsPerBlock, kFewRowsLanes);
      if (problem.rows <= kMaxFewRowsDecode && vectors_per_row % kFewRowsVectorsPerBlock == 0 &&
          offsets_fit_in_int(problem)) {
        const DecodeProblem<kInputs, kOutputs> decode = decode_problem_of(problem, vectors_per_row);
        launch_kernel(rowwise_few_rows_decode_column_sums_kernel<scalar_t, kInputs, kOutputs, Op<opmath_t>>,
                      static_cast<unsigned int>(vectors_per_row / kFewRowsVectorsPerBlock), block, 0, stream, decode,
                      op, column_sums.mutable_data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        return;
      }
      launch_kernel(rowwise_few_rows_column_sums_kernel<scalar_t, kInputs, kOutputs, Op<opmath_t>>,
                    grid_size(vectors_per_row, kFewRowsVectorsPerBlock), block, 0, stream, problem, op,
                    column_sums.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    const unsigned int column_blocks = grid_size(vectors_per_row);
    const int64_t row_groups = (problem.rows + kMaxRowsPerThread - 1) / kMaxRowsPerThread;
    const int64_t row_blocks = std::max<int64_t>(
        1, std::min({row_groups, (kColumnSumBlocksPerSm * int64_t(sm_count()) + column_blocks - 1) / column_blocks, kMaxGridRows}));
    const dim3 grid(column_blocks, static_cast<unsigned int>(row_blocks));
    if (row_blocks == 1) {  // one block row (rows of millions of columns): it writes the sums itself
      launch_kernel(
          rowwise_vectorized_kernel<scalar_t, kInputs, kOutputs, kMaxRowsPerThread, scalar_t, 16, Op<opmath_t>>, grid,
          kThreadsPerBlock, 0, stream, problem, op, column_sums.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    const at::Tensor partials =
        at::empty({row_blocks, problem.columns}, column_sums.options().dtype(c10::CppTypeToScalarType<opmath_t>::value));
    opmath_t* partial_rows = partials.mutable_data_ptr<opmath_t>();
    launch_kernel(rowwise_vectorized_kernel<scalar_t, kInputs, kOutputs, kMaxRowsPerThread, opmath_t, 16, Op<opmath_t>>,
                  grid, kThreadsPerBlock, 0, stream, problem, op, partial_rows);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch_column_sums(partial_rows, 1, row_blocks, problem.columns, column_sums.mutable_data_ptr<scalar_t>(),
                       static_cast<scalar_t*>(nullptr), stream);
  });
}

}  // namespace cuda
}  // namespace fused_ops
