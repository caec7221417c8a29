#pragma once
// Rowwise elementwise ops over a [rows, columns] grid: each operand is addressed by a start
// pointer and (row stride, column stride) in elements, so one loop serves a bias broadcast
// over rows (row stride 0), the two halves of a gated input ([..., :d] and [..., d:]) and
// strided views. Outputs are contiguous rows. Functors take opmath values:
//   void operator()(const opmath_t (&in)[kInputs], opmath_t (&out)[kOutputs]) const
#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>
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

// Gated ops read a gate and an up operand, each [rows, d] given by (pointer, row stride, column
// stride): the halves of one [..., 2d] tensor (silu_mul, gelu_mul: the up operand starts d columns
// after the gate) or two tensors (gated_mul), so one problem shape and one set of kernels serve every
// layout. `run_rows` is the CPU or CUDA loop.

// The merged layout of SwiGLU/GeGLU MLPs: x = [..., 2d] holds the gate x[..., :d] and the up projection
// x[..., d:]. Forward reads both halves and writes [..., d].
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

// A gated_mul operand [..., d] as [rows, d] (a 0-d tensor as one row of one).
inline at::Tensor gated_operand_rows(const at::Tensor& tensor) {
  return tensor.dim() == 0 ? tensor.reshape({1, 1}) : as_rows(tensor);
}

// gated_mul: gate and up two tensors of one shape [..., d], any strides; the result [..., d] contiguous.
template <typename RunRows>
at::Tensor gated_pair_forward(const at::Tensor& gate, const at::Tensor& up, RunRows run_rows) {
  const at::Tensor gate_rows = gated_operand_rows(gate);
  at::Tensor out = empty_contiguous_like(gate);
  run_rows(RowwiseProblem<2, 1>{{row_operand(gate_rows), row_operand(gated_operand_rows(up))},
                                {row_output(out.view(gate_rows.sizes()))}, gate_rows.size(0), gate_rows.size(1)});
  return out;
}

template <typename RunRows>
std::tuple<at::Tensor, at::Tensor> gated_pair_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                       const at::Tensor& up, RunRows run_rows) {
  const at::Tensor gate_rows = gated_operand_rows(gate);
  at::Tensor grad_gate = empty_contiguous_like(gate);
  at::Tensor grad_up = empty_contiguous_like(up);
  run_rows(RowwiseProblem<3, 2>{
      {row_operand(gated_operand_rows(grad)), row_operand(gate_rows), row_operand(gated_operand_rows(up))},
      {row_output(grad_gate.view(gate_rows.sizes())), row_output(grad_up.view(gate_rows.sizes()))},
      gate_rows.size(0), gate_rows.size(1)});
  return {grad_gate, grad_up};
}

}  // namespace fused_ops
