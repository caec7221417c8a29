#pragma once
// The norm family: normalisation over the last dim, optionally after a residual add (rms_norm,
// add_rms_norm, layer_norm, add_layer_norm):
//   h   = x + residual, rounded to x's dtype as eager stores it (h = x without a residual)
//   RMS:   out = h · rstd · w,                   rstd = 1 / sqrt(mean(h²) + eps)
//   Layer: out = (h - mean) · rstd · w + bias,   rstd = 1 / sqrt(var(h) + eps)
//   w = offset + weight (Gemma's RMSNorm 1 + weight, Nemotron's LayerNorm1P), summed in the compute
//   type; no weight (weight=None, offset 0) is a unit weight of x's dtype made by the op.
// Statistics in float32 (float64 for float64); weight and bias may be float32 while x is 16-bit
// (mixed precision); out has x's dtype, one rounding of the float32 product. The backward recomputes
// the statistics from h, which it reads anyway, so forwards save only h:
//   n = (h - mean) · rstd (RMS: mean = 0),  gw = grad · w
//   grad_h      = rstd · (gw - mean(gw) - n · mean(gw · n)) + grad_residual   (RMS: no mean(gw))
//   grad_weight = Σ_rows grad · n,   grad_bias = Σ_rows grad   (fixed summation order)
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "../common/dtype_dispatch.h"
#include "../common/tensors.h"

namespace fused_ops {

enum class NormKind { RMS, Layer };

struct NormForwardProblem {
  const void* x;
  int64_t x_row_stride;  // columns are contiguous in every operand
  const void* residual;  // null: no residual add
  int64_t residual_row_stride;
  const void* weight;  // [columns]
  const void* bias;    // [columns] or null
  void* out;           // contiguous rows
  void* residual_out;  // contiguous rows; null without a residual
  int64_t rows;
  int64_t columns;
  double eps;
  // 1 / columns in both precisions: the CUDA statistics multiply by it, a kernel-parameter operand,
  // instead of dividing.
  float inverse_columns_float;
  double inverse_columns_double;
  // Added to each weight value in the compute type (float32, float64 for float64): 0 for a plain norm.
  float offset_float;
  double offset_double;
};

struct NormBackwardProblem {
  const void* grad;
  int64_t grad_row_stride;
  const void* x;  // h of the forward
  int64_t x_row_stride;
  const void* weight;
  const void* grad_residual;  // null: none
  int64_t grad_residual_row_stride;
  void* grad_x;       // contiguous rows
  void* grad_weight;  // [columns], weight's dtype
  void* grad_bias;    // [columns], weight's dtype; null for RMS
  int64_t rows;
  int64_t columns;
  double eps;
  // 1 / columns in both precisions: the CUDA statistics multiply by it, a kernel-parameter operand,
  // instead of dividing.
  float inverse_columns_float;
  double inverse_columns_double;
  // Added to each weight value in the compute type (float32, float64 for float64): 0 for a plain norm.
  float offset_float;
  double offset_double;
};

// The weight the kernels read: weight, or for none a unit weight of x's dtype [H] (docs/design.md).
inline at::Tensor weight_or_unit(const std::optional<at::Tensor>& weight, const at::Tensor& x) {
  if (weight.has_value() && weight->defined()) return weight->contiguous();
  return at::ones({x.size(-1)}, x.options());
}

// Allocates out (and residual_out) and hands the [rows, H] problem and the weight's dtype to `run`
// (CPU or CUDA loop).
template <typename Run>
std::tuple<at::Tensor, at::Tensor> norm_forward(const at::Tensor& x, const at::Tensor* residual,
                                                const std::optional<at::Tensor>& weight,
                                                const std::optional<at::Tensor>& bias, double eps, double offset,
                                                Run run) {
  const at::Tensor x_rows = as_unit_stride_rows(x);
  const at::Tensor residual_rows = residual ? as_unit_stride_rows(*residual) : at::Tensor();
  const at::Tensor weight_contiguous = weight_or_unit(weight, x);
  const at::Tensor bias_contiguous = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = empty_contiguous_like(x);
  at::Tensor residual_out = residual ? empty_contiguous_like(x) : at::Tensor();
  NormForwardProblem problem{x_rows.const_data_ptr(),
                             x_rows.stride(0),
                             residual ? residual_rows.const_data_ptr() : nullptr,
                             residual ? residual_rows.stride(0) : 0,
                             weight_contiguous.const_data_ptr(),
                             bias_contiguous.defined() ? bias_contiguous.const_data_ptr() : nullptr,
                             out.mutable_data_ptr(),
                             residual ? residual_out.mutable_data_ptr() : nullptr,
                             x_rows.size(0),
                             x_rows.size(1),
                             eps,
                             1.0f / static_cast<float>(x_rows.size(1)),
                             1.0 / static_cast<double>(x_rows.size(1)),
                             static_cast<float>(offset),
                             offset};
  run(problem, weight_contiguous.scalar_type());
  return {out, residual_out};
}

// grad_x, grad_weight and (Layer) grad_bias, [H] of the weight's dtype (x's without a weight: the
// gradient a unit weight gets); `run` is the CPU or CUDA loop.
template <typename Run>
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_backward(NormKind kind, const at::Tensor& grad,
                                                             const at::Tensor& x,
                                                             const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& grad_residual,
                                                             double eps, double offset, Run run) {
  const at::Tensor grad_rows = as_unit_stride_rows(grad);
  const at::Tensor x_rows = as_unit_stride_rows(x);
  const bool has_grad_residual = grad_residual.has_value() && grad_residual->defined();
  const at::Tensor grad_residual_rows = has_grad_residual ? as_unit_stride_rows(*grad_residual) : at::Tensor();
  const at::Tensor weight_contiguous = weight_or_unit(weight, x);
  at::Tensor grad_x = empty_contiguous_like(x);
  at::Tensor grad_weight = empty_contiguous({weight_contiguous.size(0)}, weight_contiguous.options());
  at::Tensor grad_bias = kind == NormKind::Layer
                             ? empty_contiguous({weight_contiguous.size(0)}, weight_contiguous.options())
                             : at::Tensor();
  NormBackwardProblem problem{grad_rows.const_data_ptr(),
                              grad_rows.stride(0),
                              x_rows.const_data_ptr(),
                              x_rows.stride(0),
                              weight_contiguous.const_data_ptr(),
                              has_grad_residual ? grad_residual_rows.const_data_ptr() : nullptr,
                              has_grad_residual ? grad_residual_rows.stride(0) : 0,
                              grad_x.mutable_data_ptr(),
                              grad_weight.mutable_data_ptr(),
                              grad_bias.defined() ? grad_bias.mutable_data_ptr() : nullptr,
                              x_rows.size(0),
                              x_rows.size(1),
                              eps,
                              1.0f / static_cast<float>(x_rows.size(1)),
                              1.0 / static_cast<double>(x_rows.size(1)),
                              static_cast<float>(offset),
                              offset};
  run(problem, weight_contiguous.scalar_type());
  return {grad_x, grad_weight, grad_bias};
}

// The ops, per backend (cpu.cpp, cuda/*_forward.cu, cuda/*_backward.cu). The add variants return
// (out, residual_out = h); their backward is the plain norm's, with x = h and grad_residual the
// gradient of residual_out.
using OptionalWeight = std::optional<at::Tensor>;
at::Tensor rms_norm_cpu(const at::Tensor& x, const OptionalWeight& weight, double eps, double offset);
at::Tensor rms_norm_cuda(const at::Tensor& x, const OptionalWeight& weight, double eps, double offset);
std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const OptionalWeight& weight, double eps, double offset);
std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                     const OptionalWeight& weight, double eps, double offset);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                         const OptionalWeight& weight, double eps,
                                                         const std::optional<at::Tensor>& grad_residual, double offset);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                          const OptionalWeight& weight, double eps,
                                                          const std::optional<at::Tensor>& grad_residual,
                                                          double offset);
at::Tensor layer_norm_cpu(const at::Tensor& x, const OptionalWeight& weight, const std::optional<at::Tensor>& bias,
                          double eps, double offset);
at::Tensor layer_norm_cuda(const at::Tensor& x, const OptionalWeight& weight, const std::optional<at::Tensor>& bias,
                           double eps, double offset);
std::tuple<at::Tensor, at::Tensor> add_layer_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                      const OptionalWeight& weight,
                                                      const std::optional<at::Tensor>& bias, double eps, double offset);
std::tuple<at::Tensor, at::Tensor> add_layer_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                       const OptionalWeight& weight,
                                                       const std::optional<at::Tensor>& bias, double eps,
                                                       double offset);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const OptionalWeight& weight, double eps,
    const std::optional<at::Tensor>& grad_residual, double offset);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const OptionalWeight& weight, double eps,
    const std::optional<at::Tensor>& grad_residual, double offset);

}  // namespace fused_ops
