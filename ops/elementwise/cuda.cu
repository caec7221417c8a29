#include "relu_add.h"

#include "cuda_masked.cuh"

namespace fused_ops {

at::Tensor relu_add_cuda(const at::Tensor& x, const at::Tensor& y, double bias) {
  return cuda::binary_elementwise_cuda<ReluAddForward>(x, y, bias);
}

at::Tensor relu_add_backward_cuda(const at::Tensor& grad, const at::Tensor& x) {
  return cuda::binary_elementwise_cuda<ReluAddBackward>(grad, x);
}

std::tuple<at::Tensor, at::Tensor> relu_add_with_mask_cuda(const at::Tensor& x, const at::Tensor& y, double bias) {
  return cuda::binary_elementwise_with_mask_cuda<ReluAddForward, ReluPassesGradient>(x, y, bias);
}

at::Tensor relu_add_backward_masked_cuda(const at::Tensor& grad, const at::Tensor& mask) {
  return cuda::masked_gradient_cuda(grad, mask);
}

}  // namespace fused_ops
