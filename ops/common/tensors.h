#pragma once
// Host-side views and outputs every family shares: an operand seen as [rows, last dim], and the one
// way an op allocates its result (a new contiguous tensor).
#include <ATen/ATen.h>

namespace fused_ops {

inline at::Tensor empty_contiguous(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty(sizes, options.memory_format(at::MemoryFormat::Contiguous));
}

inline at::Tensor empty_contiguous_like(const at::Tensor& tensor) {
  return empty_contiguous(tensor.sizes(), tensor.options());
}

// `tensor` viewed as [rows, last dim] (a view when the leading dims collapse, else a copy; a 1-D tensor
// as one row). Symbolic sizes pass through, so composite ops may use it under torch.compile too.
inline at::Tensor as_rows(const at::Tensor& tensor) {
  return tensor.dim() == 1 ? tensor.unsqueeze(0) : tensor.flatten(0, -2);
}

// `tensor` as [rows, last dim] with contiguous columns (a view when possible, else a copy).
inline at::Tensor as_unit_stride_rows(const at::Tensor& tensor) {
  const at::Tensor rows = as_rows(tensor);
  return rows.stride(1) == 1 || rows.size(1) <= 1 ? rows : rows.contiguous();
}

// One value a row as a contiguous [rows] tensor of `dtype`, or undefined where none is given.
inline at::Tensor row_values_as(const at::Tensor& values, at::ScalarType dtype) {
  return values.defined() ? values.to(dtype).reshape({-1}).contiguous() : at::Tensor();
}

}  // namespace fused_ops
