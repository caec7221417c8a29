#include "silu_mul.h"

#include "cuda_rows.cuh"

namespace fused_ops {

at::Tensor silu_mul_cuda(const at::Tensor& x) {
  return gated_forward(x, [&](const auto& problem) {
    cuda::rowwise_cuda<SiluMulForward>(problem, x.scalar_type(), x.device());
  });
}

at::Tensor silu_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& x) {
  return gated_backward(grad, x, [&](const auto& problem) {
    cuda::rowwise_cuda<SiluMulBackward>(problem, x.scalar_type(), x.device());
  });
}

}  // namespace fused_ops
