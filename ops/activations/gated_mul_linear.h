#pragma once
// gated_mul_linear(gate, up, weight, bias, activation) = F.linear(gated_mul(gate, up, activation), weight,
// bias) for gate and up [..., d], weight [n, d]: a gated MLP's activation and down projection as one
// autograd node that saves gate and up (the backward needs them anyway) and not the [..., d]
// activation, which the backward recomputes (silu_mul_linear.h gives the memory this saves).
// Backward: grad_act = grad @ weight, (grad_gate, grad_up) = gated_mul_backward(grad_act, gate, up),
// grad_weight = grad^T @ gated_mul(gate, up), grad_bias = grad summed over the leading dims.
// One implementation for every backend: the fused gated_mul kernels and ATen's products, through the
// dispatcher (registration/composite.cpp).
#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <tuple>

#include "gated_mul.h"

namespace fused_ops {

// gated_mul_backward from differentiable ATen ops: what a double backward records its graph through.
std::tuple<at::Tensor, at::Tensor> gated_mul_backward_composite(const at::Tensor& grad, const at::Tensor& gate,
                                                                const at::Tensor& up, GatedActivation activation);

at::Tensor gated_mul_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::string_view activation);
// output_mask: gate, up, weight, bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_mul_linear_backward(
    const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
    c10::string_view activation, std::array<bool, 4> output_mask);

}  // namespace fused_ops
