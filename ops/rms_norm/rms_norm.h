#pragma once
// rms_norm(x, weight, eps) = x · rsqrt(mean(x², -1) + eps) · weight (math in ops/common/norm.h).
// rms_norm_backward(grad, x, weight, eps, grad_residual) -> (grad_x, grad_weight); it also serves
// add_rms_norm, whose x here is h = x + residual and whose residual_out gradient is grad_residual.
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace fused_ops {

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                         const at::Tensor& weight, double eps,
                                                         const std::optional<at::Tensor>& grad_residual);
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                          const at::Tensor& weight, double eps,
                                                          const std::optional<at::Tensor>& grad_residual);

}  // namespace fused_ops
