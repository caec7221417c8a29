// The gated ops on the GPU: silu_mul and gelu_mul (the halves of one [..., 2d] tensor) and gated_mul
// (two tensors) build the same row problems (rows.h), so all of them run the kernels instantiated here.
#include "gated_mul.h"
#include "gelu_mul.h"
#include "silu_mul.h"

#include "cuda_rows.cuh"

namespace fused_ops {

void gated_mul_rows_cuda(const RowwiseProblem<2, 1>& problem, at::ScalarType dtype, c10::Device device,
                         GatedActivation activation) {
  if (activation == GatedActivation::Silu) return cuda::rowwise_cuda<SiluMulForward>(problem, dtype, device);
  const bool results_are_16_bit = c10::elementSize(dtype) == 2;
  with_kernel_gelu_approximation(for_16_bit_results(gelu_approximation_of(activation), results_are_16_bit),
                                 problem.rows, cuda::kFixedApproximationMaxRows, [&](auto kernel_approximation) {
    using Kernels = GeluMul<decltype(kernel_approximation)>;
    cuda::rowwise_cuda<Kernels::template Forward>(problem, dtype, device, kernel_approximation);
  });
}

void gated_mul_backward_rows_cuda(const RowwiseProblem<3, 2>& problem, at::ScalarType dtype, c10::Device device,
                                  GatedActivation activation) {
  if (activation == GatedActivation::Silu) return cuda::rowwise_cuda<SiluMulBackward>(problem, dtype, device);
  const bool results_are_16_bit = c10::elementSize(dtype) == 2;
  with_kernel_gelu_approximation(for_16_bit_results(gelu_approximation_of(activation), results_are_16_bit),
                                 problem.rows, cuda::kFixedApproximationMaxRows, [&](auto kernel_approximation) {
    using Kernels = GeluMul<decltype(kernel_approximation)>;
    cuda::rowwise_cuda<Kernels::template Backward>(problem, dtype, device, kernel_approximation);
  });
}

at::Tensor silu_mul_cuda(const at::Tensor& x) {
  return gated_forward(x, [&](const auto& problem) {
    gated_mul_rows_cuda(problem, x.scalar_type(), x.device(), GatedActivation::Silu);
  });
}

at::Tensor silu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& x) {
  return gated_backward(grad, x, [&](const auto& problem) {
    gated_mul_backward_rows_cuda(problem, x.scalar_type(), x.device(), GatedActivation::Silu);
  });
}

at::Tensor gelu_mul_cuda(const at::Tensor& x, GeluApproximation approximation) {
  return gated_forward(x, [&](const auto& problem) {
    gated_mul_rows_cuda(problem, x.scalar_type(), x.device(), gated_gelu(approximation));
  });
}

at::Tensor gelu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& x, GeluApproximation approximation) {
  return gated_backward(grad, x, [&](const auto& problem) {
    gated_mul_backward_rows_cuda(problem, x.scalar_type(), x.device(), gated_gelu(approximation));
  });
}

at::Tensor gated_mul_cuda(const at::Tensor& gate, const at::Tensor& up, GatedActivation activation) {
  return gated_pair_forward(gate, up, [&](const auto& problem) {
    gated_mul_rows_cuda(problem, gate.scalar_type(), gate.device(), activation);
  });
}

std::tuple<at::Tensor, at::Tensor> gated_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& gate,
                                                           const at::Tensor& up, GatedActivation activation) {
  return gated_pair_backward(grad, gate, up, [&](const auto& problem) {
    gated_mul_backward_rows_cuda(problem, gate.scalar_type(), gate.device(), activation);
  });
}

}  // namespace fused_ops
