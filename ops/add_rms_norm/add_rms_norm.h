#pragma once
// add_rms_norm(x, residual, weight, eps) -> (out, residual_out): h = x + residual rounded to x's
// dtype, out = rms_norm(h, weight, eps), residual_out = h (math in ops/common/norm.h). Its
// backward is rms_norm_backward(grad_out, h, weight, eps, grad_residual_out): the gradient of h
// is the gradient of x and of residual.
#include <ATen/ATen.h>

#include <tuple>

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps);

}  // namespace fused_ops
