#pragma once
// Rowwise elementwise ops over a [rows, columns] grid: each operand is addressed by a start
// pointer and (row stride, column stride) in elements, so one loop serves a bias broadcast
// over rows (row stride 0), the two halves of a gated input ([..., :d] and [..., d:]) and
// strided views. Outputs are contiguous rows. Functors take opmath values:
//   void operator()(const opmath_t (&in)[kInputs], opmath_t (&out)[kOutputs]) const
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "../common/tensors.h"

namespace fused_ops {

struct RowOperand {
  const void* data;
  int64_t row_stride;
  int64_t column_stride;
};

struct RowOutput {
  void* data;
  int64_t row_stride;  // columns are contiguous
};

template <int kInputs, int kOutputs>
struct RowwiseProblem {
  RowOperand inputs[kInputs];
  RowOutput outputs[kOutputs];
  int64_t rows;
  int64_t columns;
};

// The operand for `tensor` viewed as [rows, columns] (its last dim is the column), starting at
// column `column_offset`. A 1-D tensor broadcast over rows gets row stride 0.
inline RowOperand row_operand(const at::Tensor& matrix, int64_t column_offset = 0) {
  const int64_t column_stride = matrix.stride(-1);
  const int64_t row_stride = matrix.dim() == 1 ? 0 : matrix.stride(0);
  return {static_cast<const char*>(matrix.const_data_ptr()) +
              column_offset * column_stride * matrix.element_size(),
          row_stride, column_stride};
}

inline RowOutput row_output(const at::Tensor& contiguous_matrix, int64_t column_offset = 0) {
  return {static_cast<char*>(contiguous_matrix.mutable_data_ptr()) +
              column_offset * contiguous_matrix.element_size(),
          contiguous_matrix.stride(0)};
}

// Gated layout of SwiGLU/GeGLU MLPs: x = [..., 2d] holds the gate x[..., :d] and the up
// projection x[..., d:]. Forward reads both halves and writes [..., d]; `run_rows` is the CPU or
// CUDA loop.
template <typename RunRows>
at::Tensor gated_forward(const at::Tensor& x, RunRows run_rows) {
  const at::Tensor x_rows = as_rows(x);
  const int64_t half = x_rows.size(1) / 2;
  std::vector<int64_t> out_sizes = x.sizes().vec();
  out_sizes.back() = half;
  at::Tensor out = empty_contiguous(out_sizes, x.options());
  run_rows(RowwiseProblem<2, 1>{{row_operand(x_rows, 0), row_operand(x_rows, half)},
                                {row_output(out.view({x_rows.size(0), half}))}, x_rows.size(0), half});
  return out;
}

// Backward reads grad [..., d] and both halves of x, writes both halves of grad_x [..., 2d].
template <typename RunRows>
at::Tensor gated_backward(const at::Tensor& grad, const at::Tensor& x, RunRows run_rows) {
  const at::Tensor x_rows = as_rows(x);
  const int64_t half = x_rows.size(1) / 2;
  at::Tensor grad_x = empty_contiguous_like(x);
  const at::Tensor grad_x_rows = grad_x.view(x_rows.sizes());
  run_rows(RowwiseProblem<3, 2>{
      {row_operand(as_rows(grad)), row_operand(x_rows, 0), row_operand(x_rows, half)},
      {row_output(grad_x_rows, 0), row_output(grad_x_rows, half)}, x_rows.size(0), half});
  return grad_x;
}

}  // namespace fused_ops
