#pragma once
// layer_norm(x, weight, bias, eps) = (x - mean) · rsqrt(var + eps) · weight + bias over the last dim
// (math in ops/common/norm.h). layer_norm_backward(grad, x, weight, eps, grad_residual) ->
// (grad_x, grad_weight, grad_bias); it also serves add_layer_norm (x is then h = x + residual).
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace fused_ops {

at::Tensor layer_norm_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          double eps);
at::Tensor layer_norm_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, double eps,
    const std::optional<at::Tensor>& grad_residual);
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight, double eps,
    const std::optional<at::Tensor>& grad_residual);

}  // namespace fused_ops
