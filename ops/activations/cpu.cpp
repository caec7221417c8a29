// CPU reference kernels of the activation family: the row loop of cpu_rows.h over each op's functor.
#include "bias_gelu.h"
#include "cpu_rows.h"
#include "gated_mul.h"
#include "gelu_mul.h"
#include "silu_mul.h"

namespace fused_ops {

at::Tensor bias_gelu_cpu(const at::Tensor& x, const at::Tensor& bias, GeluApproximation approximation) {
  return bias_gelu_forward(x, bias, [&](const auto& problem) {
    rowwise_cpu<BiasGelu<GeluApproximation>::Forward>(problem, x.scalar_type(), approximation);
  });
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                          const at::Tensor& bias, GeluApproximation approximation) {
  return bias_gelu_backward(grad, x, bias, [&](const auto& problem, at::Tensor& grad_bias) {
    rowwise_cpu<BiasGelu<GeluApproximation>::Backward>(problem, x.scalar_type(), approximation);
    if (problem.rows == 0) {
      grad_bias.zero_();
      return;
    }
    // Summed over rows in float64 (from grad_h as stored; the GPU sums before rounding).
    const at::Tensor grad_h = at::from_blob(problem.outputs[0].data, {problem.rows, problem.columns},
                                            {problem.outputs[0].row_stride, 1}, grad_bias.options());
    grad_bias.copy_(grad_h.sum(0, /*keepdim=*/false, at::kDouble));
  });
}

void gated_mul_rows_cpu(const RowwiseProblem<2, 1>& problem, at::ScalarType dtype, GatedActivation activation) {
  if (activation == GatedActivation::Silu) return rowwise_cpu<SiluMulForward>(problem, dtype);
  rowwise_cpu<GeluMul<GeluApproximation>::Forward>(problem, dtype, gelu_approximation_of(activation));
}

void gated_mul_backward_rows_cpu(const RowwiseProblem<3, 2>& problem, at::ScalarType dtype,
                                 GatedActivation activation) {
  if (activation == GatedActivation::Silu) return rowwise_cpu<SiluMulBackward>(problem, dtype);
  rowwise_cpu<GeluMul<GeluApproximation>::Backward>(problem, dtype, gelu_approximation_of(activation));
}

at::Tensor silu_mul_cpu(const at::Tensor& x) {
  return gated_forward(x, [&](const auto& problem) {
    gated_mul_rows_cpu(problem, x.scalar_type(), GatedActivation::Silu);
  });
}

at::Tensor silu_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  return gated_backward(grad, x, [&](const auto& problem) {
    gated_mul_backward_rows_cpu(problem, x.scalar_type(), GatedActivation::Silu);
  });
}

at::Tensor gelu_mul_cpu(const at::Tensor& x, GeluApproximation approximation) {
  return gated_forward(x, [&](const auto& problem) {
    gated_mul_rows_cpu(problem, x.scalar_type(), gated_gelu(approximation));
  });
}

at::Tensor gelu_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& x, GeluApproximation approximation) {
  return gated_backward(grad, x, [&](const auto& problem) {
    gated_mul_backward_rows_cpu(problem, x.scalar_type(), gated_gelu(approximation));
  });
}

at::Tensor gated_mul_cpu(const at::Tensor& gate, const at::Tensor& up, GatedActivation activation) {
  return gated_pair_forward(gate, up, [&](const auto& problem) {
    gated_mul_rows_cpu(problem, gate.scalar_type(), activation);
  });
}

std::tuple<at::Tensor, at::Tensor> gated_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& gate,
                                                          const at::Tensor& up, GatedActivation activation) {
  return gated_pair_backward(grad, gate, up, [&](const auto& problem) {
    gated_mul_backward_rows_cpu(problem, gate.scalar_type(), activation);
  });
}

}  // namespace fused_ops
