#include "gelu_mul.h"

#include "cuda_rows.cuh"

namespace fused_ops {

at::Tensor gelu_mul_cuda(const at::Tensor& x, GeluApproximation approximation) {
  return gated_forward(x, [&](const auto& problem) {
    with_kernel_gelu_approximation(for_16_bit_results(approximation, x.element_size() == 2), problem.rows,
                                   cuda::kFixedApproximationMaxRows, [&](auto kernel_approximation) {
      using Kernels = GeluMul<decltype(kernel_approximation)>;
      cuda::rowwise_cuda<Kernels::template Forward>(problem, x.scalar_type(), x.device(), kernel_approximation);
    });
  });
}

at::Tensor gelu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& x, GeluApproximation approximation) {
  return gated_backward(grad, x, [&](const auto& problem) {
    with_kernel_gelu_approximation(for_16_bit_results(approximation, x.element_size() == 2), problem.rows,
                                   cuda::kFixedApproximationMaxRows, [&](auto kernel_approximation) {
      using Kernels = GeluMul<decltype(kernel_approximation)>;
      cuda::rowwise_cuda<Kernels::template Backward>(problem, x.scalar_type(), x.device(), kernel_approximation);
    });
  });
}

}  // namespace fused_ops
