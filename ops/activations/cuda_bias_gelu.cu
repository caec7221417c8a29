#include "bias_gelu.h"

#include "cuda_rows.cuh"

namespace fused_ops {

at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias, GeluApproximation approximation) {
  return bias_gelu_forward(x, bias, [&](const auto& problem) {
    with_kernel_gelu_approximation(for_16_bit_results(approximation, x.element_size() == 2), problem.rows,
                                   cuda::kFixedApproximationMaxRows, [&](auto kernel_approximation) {
      using Kernels = BiasGelu<decltype(kernel_approximation)>;
      cuda::rowwise_cuda_in_row_groups<Kernels::template Forward>(
          problem, x.scalar_type(), x.device(), cuda::bias_gelu_row_groups_per_thread(kernel_approximation),
          kernel_approximation);
    });
  });
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                           const at::Tensor& bias, GeluApproximation approximation) {
  return bias_gelu_backward(grad, x, bias, [&](const auto& problem, const at::Tensor& grad_bias) {
    with_kernel_gelu_approximation(for_16_bit_results(approximation, x.element_size() == 2), problem.rows,
                                   cuda::kFixedApproximationMaxRows, [&](auto kernel_approximation) {
      using Kernels = BiasGelu<decltype(kernel_approximation)>;
      cuda::rowwise_cuda_with_column_sums<Kernels::template Backward>(problem, x.scalar_type(), x.device(),
                                                                      grad_bias, kernel_approximation);
    });
  });
}

}  // namespace fused_ops
