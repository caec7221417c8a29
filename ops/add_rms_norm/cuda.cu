#include "add_rms_norm.h"

#include "../common/cuda_norm.cuh"

namespace fused_ops {

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                     const at::Tensor& weight, double eps) {
  return norm_forward(x, &residual, weight, std::nullopt, eps, [&](const NormForwardProblem& problem) {
    cuda::norm_forward_cuda<NormKind::RMS>(problem, x.scalar_type(), weight.scalar_type(), x.device());
  });
}

}  // namespace fused_ops
