#pragma once
// Host-side views and outputs every family shares: an operand seen as [rows, last dim], and the one
// way an op allocates its result (a new contiguous tensor).
#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

namespace fused_ops {

inline at::Tensor empty_contiguous(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::empty(sizes, options.memory_format(at::MemoryFormat::Contiguous));
}

inline at::Tensor empty_contiguous_like(const at::Tensor& tensor) {
  return empty_contiguous(tensor.sizes(), tensor.options());
}

// `tensor` viewed as [rows, last dim] (a view when the leading dims collapse, else a copy).
inline at::Tensor as_rows(const at::Tensor& tensor) {
  const int64_t columns = tensor.size(-1);
  const int64_t rows = c10::multiply_integers(tensor.sizes().slice(0, tensor.dim() - 1));
  return tensor.reshape({rows, columns});
}

// `tensor` as [rows, last dim] with contiguous columns (a view when possible, else a copy).
inline at::Tensor as_unit_stride_rows(const at::Tensor& tensor) {
  const at::Tensor rows = as_rows(tensor);
  return rows.stride(1) == 1 || rows.size(1) <= 1 ? rows : rows.contiguous();
}

}  // namespace fused_ops
