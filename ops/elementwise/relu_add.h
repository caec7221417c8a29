#pragma once
// relu_add(x, y, bias) = relu(x) + y + bias, y broadcast to x's shape.
// Backward: grad_x = grad where relu passed x through (x > 0 or NaN), else 0;
//           grad_y = grad summed to y's shape (done with aten ops in registration/autograd.cpp).
// Autograd saves that rule as one bit per element of x (relu_add_with_mask), not x: the backward
// then reads grad and 1/8 byte per element (relu_add_backward_masked).
#include <ATen/ATen.h>

#include <tuple>

#include "../common/dtype_dispatch.h"

namespace fused_ops {

template <typename opmath_t>
struct ReluAddForward {
  opmath_t bias;
  FUSED_HOST_DEVICE opmath_t operator()(opmath_t x, opmath_t y) const {
    // `x != x` keeps NaN, as torch.relu does.
    const opmath_t relu_x = (x > opmath_t(0) || x != x) ? x : opmath_t(0);
    return relu_x + y + bias;
  }
};

// Same rule as eager's threshold_backward on relu's output: the gradient is zero where output <= 0,
// so NaN passes it.
template <typename opmath_t>
struct ReluPassesGradient {
  FUSED_HOST_DEVICE bool operator()(opmath_t x) const { return !(x <= opmath_t(0)); }
};

template <typename opmath_t>
struct ReluAddBackward {
  FUSED_HOST_DEVICE opmath_t operator()(opmath_t grad, opmath_t x) const {
    return ReluPassesGradient<opmath_t>{}(x) ? grad : opmath_t(0);
  }
};

at::Tensor relu_add_cpu(const at::Tensor& x, const at::Tensor& y, double bias);
at::Tensor relu_add_backward_cpu(const at::Tensor& grad, const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> relu_add_with_mask_cpu(const at::Tensor& x, const at::Tensor& y, double bias);
at::Tensor relu_add_backward_masked_cpu(const at::Tensor& grad, const at::Tensor& mask);
at::Tensor relu_add_cuda(const at::Tensor& x, const at::Tensor& y, double bias);
at::Tensor relu_add_backward_cuda(const at::Tensor& grad, const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> relu_add_with_mask_cuda(const at::Tensor& x, const at::Tensor& y, double bias);
at::Tensor relu_add_backward_masked_cuda(const at::Tensor& grad, const at::Tensor& mask);

}  // namespace fused_ops
