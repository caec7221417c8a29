#include "gelu_mul.h"

#include "../common/cuda_rowwise.cuh"

namespace fused_ops {

at::Tensor gelu_mul_cuda(const at::Tensor& x, GeluApproximation approximation) {
  const GeluApproximation kernel_approximation = for_16_bit_results(approximation, x.element_size() == 2);
  return gated_forward(x, [&](const auto& problem) {
    cuda::rowwise_cuda<GeluMulForward>(problem, x.scalar_type(), x.device(), kernel_approximation);
  });
}

at::Tensor gelu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& x, GeluApproximation approximation) {
  const GeluApproximation kernel_approximation = for_16_bit_results(approximation, x.element_size() == 2);
  return gated_backward(grad, x, [&](const auto& problem) {
    cuda::rowwise_cuda<GeluMulBackward>(problem, x.scalar_type(), x.device(), kernel_approximation);
  });
}

}  // namespace fused_ops
