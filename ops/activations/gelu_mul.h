#pragma once
// gelu_mul(x, approximate) = gelu(x[..., :d], approximate) * x[..., d:] for x [..., 2d] (GeGLU).
// Backward: grad_gate = grad * up * gelu'(gate), grad_up = grad * gelu(gate).
#include <ATen/ATen.h>

#include "math.h"
#include "rows.h"

namespace fused_ops {

// Approximation: GeluApproximation or FixedGeluApproximation<...> (math.h).
template <typename Approximation>
struct GeluMul {
  template <typename opmath_t>
  struct Forward {  // in: gate, up
    Approximation approximation;
    FUSED_HOST_DEVICE void operator()(const opmath_t (&in)[2], opmath_t (&out)[1]) const {
      out[0] = gelu(in[0], GeluApproximation(approximation)) * in[1];
    }
  };

  template <typename opmath_t>
  struct Backward {  // in: grad, gate, up; out: grad_gate, grad_up
    Approximation approximation;
    FUSED_HOST_DEVICE void operator()(const opmath_t (&in)[3], opmath_t (&out)[2]) const {
      out[0] = in[0] * in[2] * gelu_derivative(in[1], GeluApproximation(approximation));
      out[1] = in[0] * gelu(in[1], GeluApproximation(approximation));
    }
  };
};

at::Tensor gelu_mul_cpu(const at::Tensor& x, GeluApproximation approximation);
at::Tensor gelu_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& x, GeluApproximation approximation);
at::Tensor gelu_mul_cuda(const at::Tensor& x, GeluApproximation approximation);
at::Tensor gelu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& x, GeluApproximation approximation);

}  // namespace fused_ops
