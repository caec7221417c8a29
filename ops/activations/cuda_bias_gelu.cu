#include "bias_gelu.h"

#include "cuda_rows.cuh"

namespace fused_ops {

at::Tensor bias_gelu_cuda(const at::Tensor& x, const at::Tensor& bias, GeluApproximation approximation) {
  return bias_gelu_forward(x, bias, [&](const auto& problem) {
    with_kernel_gelu_approximation(for_16_bit_results(approximation, x.element_size() == 2), problem.rows,
                                   [&](auto kernel_approximation) {
      using Kernels = BiasGelu<decltype(kernel_approximation)>;
      // The erf forward with 16-bit results is issue-bound: two row groups per thread. H200 16384x8192
      // kernels, one process: bf16 137.3 -> 130.9 us, float16 136.5 -> 129.4; float32 (252.7 -> 254.9),
      // tanh and the gated ops did not gain (docs/benchmarks.md Change 14).
      const int64_t row_groups_per_thread = kernel_approximation == GeluApproximation::NoneRoundedTo16Bits ? 2 : 1;
      cuda::rowwise_cuda_in_row_groups<Kernels::template Forward>(problem, x.scalar_type(), x.device(),
                                                                  row_groups_per_thread, kernel_approximation);
    });
  });
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                           const at::Tensor& bias, GeluApproximation approximation) {
  return bias_gelu_backward(grad, x, bias, [&](const auto& problem, const at::Tensor& grad_bias) {
    with_kernel_gelu_approximation(for_16_bit_results(approximation, x.element_size() == 2), problem.rows,
                                   [&](auto kernel_approximation) {
      using Kernels = BiasGelu<decltype(kernel_approximation)>;
      cuda::rowwise_cuda_with_column_sums<Kernels::template Backward>(problem, x.scalar_type(), x.device(),
                                                                      grad_bias, kernel_approximation);
    });
  });
}

}  // namespace fused_ops
