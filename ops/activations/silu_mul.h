#pragma once
// silu_mul(x) = silu(x[..., :d]) * x[..., d:] for x [..., 2d] (SwiGLU; vLLM's silu_and_mul).
// Backward: grad_gate = grad * up * silu'(gate), grad_up = grad * silu(gate).
#include <ATen/ATen.h>

#include "math.h"
#include "rows.h"

namespace fused_ops {

template <typename opmath_t>
struct SiluMulForward {  // in: gate, up
  FUSED_HOST_DEVICE void operator()(const opmath_t (&in)[2], opmath_t (&out)[1]) const {
    out[0] = silu(in[0]) * in[1];
  }
};

template <typename opmath_t>
struct SiluMulBackward {  // in: grad, gate, up; out: grad_gate, grad_up
  FUSED_HOST_DEVICE void operator()(const opmath_t (&in)[3], opmath_t (&out)[2]) const {
    out[0] = in[0] * in[2] * silu_derivative(in[1]);
    out[1] = in[0] * silu(in[1]);
  }
};

at::Tensor silu_mul_cpu(const at::Tensor& x);
at::Tensor silu_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& x);
at::Tensor silu_mul_cuda(const at::Tensor& x);
at::Tensor silu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& x);

}  // namespace fused_ops
