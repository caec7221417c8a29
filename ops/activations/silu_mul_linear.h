#pragma once
// silu_mul_linear(x, weight, bias) = F.linear(silu_mul(x), weight, bias) for x [..., 2d], weight [n, d]:
// a SwiGLU MLP's activation and down projection as one autograd node that saves x (the gate/up
// projection's output, which the backward needs anyway) and not the activation. The backward
// recomputes silu_mul(x), a pass over x, instead of holding [..., d] from the forward to the backward
// (256 MB a layer at 16384 tokens and d = 8192 in bf16).
// Backward: grad_act = grad @ weight, grad_x = silu_mul_backward(grad_act, x),
// grad_weight = grad^T @ silu_mul(x), grad_bias = grad summed over the leading dims.
// One implementation for every backend: the fused silu_mul kernels and ATen's products, through the
// dispatcher (registration/composite.cpp).
#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <tuple>

namespace fused_ops {

at::Tensor silu_mul_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor, at::Tensor> silu_mul_linear_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                        const at::Tensor& weight,
                                                                        std::array<bool, 3> output_mask);

}  // namespace fused_ops
