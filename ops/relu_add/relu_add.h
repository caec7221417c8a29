#pragma once
// relu_add(x, y, bias) = relu(x) + y + bias, y broadcast to x's shape.
// Backward: grad_x = grad where relu passed x through (x > 0 or NaN), else 0;
//           grad_y = grad summed to y's shape (done with aten ops in registration/autograd.cpp).
#include <ATen/ATen.h>

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

template <typename opmath_t>
struct ReluAddBackward {
  // Same rule as eager's threshold_backward on relu's output: zero where output <= 0.
  FUSED_HOST_DEVICE opmath_t operator()(opmath_t grad, opmath_t x) const {
    return x <= opmath_t(0) ? opmath_t(0) : grad;
  }
};

at::Tensor relu_add_cpu(const at::Tensor& x, const at::Tensor& y, double bias);
at::Tensor relu_add_backward_cpu(const at::Tensor& grad, const at::Tensor& x);
at::Tensor relu_add_cuda(const at::Tensor& x, const at::Tensor& y, double bias);
at::Tensor relu_add_backward_cuda(const at::Tensor& grad, const at::Tensor& x);

}  // namespace fused_ops
