// CUDA kernels of the rotary family: one thread per rotated pair or passed-through element of a head
// vector, any strides, 64-bit offsets. (A vectorized path for contiguous heads is not written yet.)
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../common/cuda_launch.cuh"
#include "rotary.h"

namespace fused_ops {
namespace cuda {
namespace {

template <typename scalar_t, typename table_t>
__global__ void __launch_bounds__(kThreadsPerBlock) rotary_strided_kernel(RotaryProblem p) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t heads = p.sizes[1], sequence = p.sizes[2], head_dim = p.sizes[3];
  const int64_t half = p.rotary_dim / 2;
  const int64_t items_per_row = half + (head_dim - p.rotary_dim);
  const int64_t items = p.sizes[0] * heads * sequence * items_per_row;
  for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = item / items_per_row, j = item % items_per_row;
    const int64_t s = row % sequence, h = (row / sequence) % heads, b = row / (sequence * heads);
    auto offset = [&](const int64_t (&strides)[4], int64_t e) {
      return b * strides[0] + h * strides[1] + s * strides[2] + e * strides[3];
    };
    const scalar_t* x = static_cast<const scalar_t*>(p.x);
    scalar_t* out = static_cast<scalar_t*>(p.out);
    if (j < half) {
      const int64_t ia = p.interleaved ? 2 * j : j;
      const int64_t ib = p.interleaved ? 2 * j + 1 : j + half;
      const table_t* cos = static_cast<const table_t*>(p.cos);
      const table_t* sin = static_cast<const table_t*>(p.sin);
      opmath_t a = static_cast<opmath_t>(x[offset(p.x_strides, ia)]);
      opmath_t c = static_cast<opmath_t>(x[offset(p.x_strides, ib)]);
      rotate_pair(a, c, static_cast<opmath_t>(cos[offset(p.cos_strides, ia)]),
                  static_cast<opmath_t>(cos[offset(p.cos_strides, ib)]),
                  static_cast<opmath_t>(sin[offset(p.sin_strides, ia)]),
                  static_cast<opmath_t>(sin[offset(p.sin_strides, ib)]), p.transposed);
      out[offset(p.out_strides, ia)] = static_cast<scalar_t>(a);
      out[offset(p.out_strides, ib)] = static_cast<scalar_t>(c);
    } else {
      const int64_t e = p.rotary_dim + (j - half);
      out[offset(p.out_strides, e)] = x[offset(p.x_strides, e)];
    }
  }
}

void rotary_cuda(const RotaryProblem& p, at::ScalarType dtype, at::ScalarType table_dtype) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t items = p.sizes[0] * p.sizes[1] * p.sizes[2] * (p.rotary_dim / 2 + p.sizes[3] - p.rotary_dim);
  if (items == 0) return;
  FUSED_DISPATCH_MIXED_TYPES(dtype, table_dtype, "rotary_cuda", [&] {
    launch_kernel(rotary_strided_kernel<scalar_t, weight_t>, grid_size(items), kThreadsPerBlock, 0, stream, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace cuda

std::tuple<at::Tensor, at::Tensor> rotary_embedding_cuda(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos, const at::Tensor& sin,
                                                         int64_t unsqueeze_dim, bool interleaved) {
  const c10::cuda::CUDAGuard device_guard(q.device());
  return rotary_embedding_apply(q, k, cos, sin, unsqueeze_dim, interleaved, false, cuda::rotary_cuda);
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                  const at::Tensor& cos, const at::Tensor& sin,
                                                                  int64_t unsqueeze_dim, bool interleaved) {
  const c10::cuda::CUDAGuard device_guard(grad_q.device());
  return rotary_embedding_apply(grad_q, grad_k, cos, sin, unsqueeze_dim, interleaved, true, cuda::rotary_cuda);
}

}  // namespace fused_ops
