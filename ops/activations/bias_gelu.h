#pragma once
// bias_gelu(x, bias, approximate) = gelu(x + bias), bias [H] broadcast over x [..., H].
// Backward: grad_h = grad * gelu'(x + bias); grad_x = grad_h, grad_bias = grad_h summed over the
// leading dims, in the same pass on the GPU (deterministic: fixed-order partial sums).
#include <ATen/ATen.h>

#include "math.h"
#include "../common/tensors.h"
#include "rows.h"

namespace fused_ops {

// Approximation: GeluApproximation or FixedGeluApproximation<...> (math.h).
template <typename Approximation>
struct BiasGelu {
  template <typename opmath_t>
  struct Forward {  // in: x, bias
    Approximation approximation;
    FUSED_HOST_DEVICE void operator()(const opmath_t (&in)[2], opmath_t (&out)[1]) const {
      out[0] = gelu(in[0] + in[1], GeluApproximation(approximation));
    }
  };

  template <typename opmath_t>
  struct Backward {  // in: grad, x, bias
    Approximation approximation;
    FUSED_HOST_DEVICE void operator()(const opmath_t (&in)[3], opmath_t (&out)[1]) const {
      out[0] = in[0] * gelu_derivative(in[1] + in[2], GeluApproximation(approximation));
    }
  };
};

// Allocate the result and hand the [rows, H] problem to `run_rows` (the CPU or the CUDA loop).
template <typename RunRows>
at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, RunRows run_rows) {
  const at::Tensor x_rows = as_rows(x);
  at::Tensor out = empty_contiguous_like(x);
  run_rows(RowwiseProblem<2, 1>{{row_operand(x_rows), row_operand(bias)},
                                {row_output(out.view(x_rows.sizes()))}, x_rows.size(0), x_rows.size(1)});
  return out;
}

// `run_rows(problem, grad_bias)` fills grad_h and grad_bias.
template <typename RunRows>
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad, const at::Tensor& x,
                                                      const at::Tensor& bias, RunRows run_rows) {
  const at::Tensor x_rows = as_rows(x);
  at::Tensor grad_h = empty_contiguous_like(x);
  at::Tensor grad_bias = empty_contiguous_like(bias);
  run_rows(RowwiseProblem<3, 1>{{row_operand(as_rows(grad)), row_operand(x_rows), row_operand(bias)},
                                {row_output(grad_h.view(x_rows.sizes()))}, x_rows.size(0), x_rows.size(1)},
           grad_bias);
  return {grad_h, grad_bias};
}

at::Tensor bias_gelu_cpu(const at::Tensor& x, const at::Tensor& bias, GeluApproximation approximation);
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                          const at::Tensor& bias, GeluApproximation approximation);
at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias, GeluApproximation approximation);
std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                           const at::Tensor& bias, GeluApproximation approximation);

}  // namespace fused_ops
