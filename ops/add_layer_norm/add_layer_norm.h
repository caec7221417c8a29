#pragma once
// add_layer_norm(x, residual, weight, bias, eps) -> (out, residual_out): h = x + residual rounded
// to x's dtype, out = layer_norm(h, weight, bias, eps), residual_out = h (math in
// ops/common/norm.h). Its backward is layer_norm_backward(grad_out, h, weight, eps,
// grad_residual_out).
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                                      double eps);
std::tuple<at::Tensor, at::Tensor> add_layer_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                       const at::Tensor& weight,
                                                       const std::optional<at::Tensor>& bias, double eps);

}  // namespace fused_ops
