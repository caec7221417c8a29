#pragma once
// Binary elementwise CUDA loops: out = op(a, b), `b` broadcast to `a`'s shape,
// out a new contiguous tensor of `a`'s shape.
//   fast path: a, b and out contiguous with 16-byte-aligned pointers -> 16-byte vector
//              loads/stores, both inputs loaded before use, one block per 256 vectors.
//   general path: any strides, offsets and alignment (broadcast dims have stride 0);
//              dims are coalesced first so the index math is usually one or two divisions.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../common/cuda_launch.cuh"
#include "../common/dtype_dispatch.h"
#include "../common/tensors.h"
#include "../common/vector.cuh"
#include "launch_plan.h"

namespace fused_ops {
namespace cuda {

// The default bit predicate of apply_binary_vector: no bits (the kernels that write no mask).
struct NoMaskBits {
  template <typename opmath_t>
  __device__ bool operator()(opmath_t) const { return false; }
};

// out = op(a, b) over the 16-byte vector at `index`; both loads are issued before either is used.
// Returns bit_op(a) of the vector's elements, element j in bit j (cuda_masked.cuh).
template <typename scalar_t, typename Op, typename BitOp = NoMaskBits>
__device__ __forceinline__ uint32_t apply_binary_vector(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                                                        const scalar_t* __restrict__ b, int64_t index, const Op& op,
                                                        const BitOp& bit_op = {}) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  const Vec a_vector = load_vec16(a, index);
  const Vec b_vector = load_vec16(b, index);
  opmath_t a_values[Vec::kSize], b_values[Vec::kSize], results[Vec::kSize];
  unpack_vec16(a_vector, a_values);
  unpack_vec16(b_vector, b_values);
  uint32_t bits = 0;
#pragma unroll
  for (int j = 0; j < Vec::kSize; ++j) {
    results[j] = op(a_values[j], b_values[j]);
    bits |= uint32_t(bit_op(a_values[j])) << j;
  }
  store_vec16(out, index, pack_vec16<scalar_t>(results));
  return bits;
}

template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_vectorized_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                             const scalar_t* __restrict__ b, int64_t numel, Op op) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  const int64_t num_vectors = numel / Vec::kSize;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t index = thread; index < num_vectors; index += thread_count) {
    apply_binary_vector(out, a, b, index, op);
  }
  // Fewer than one vector of elements is left at the end.
  const int64_t tail = num_vectors * Vec::kSize + thread;
  if (tail < numel) {
    out[tail] = static_cast<scalar_t>(
        op(static_cast<opmath_t>(a[tail]), static_cast<opmath_t>(b[tail])));
  }
}

// Dense sizes that whole blocks cover exactly, with 32-bit vector indices: one vector per thread (as
// binary_vectorized_kernel's grid gives), without its loop, tail and bounds check, so every parameter
// read issues at once instead of after the check (docs/design.md), as Inductor's kernels do for sizes
// their blocks divide.
template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_exact_grid_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                             const scalar_t* __restrict__ b, Op op) {
  begin_dependent_kernel();
  const int index = blockIdx.x * kThreadsPerBlock + threadIdx.x;
  apply_binary_vector(out, a, b, index, op);
}

struct BinaryStridedLayout {
  int dims;  // innermost dim last
  int64_t sizes[kMaxStridedDims];
  int64_t a_strides[kMaxStridedDims];
  int64_t b_strides[kMaxStridedDims];
};

// The offsets in `a` and `b` of element `linear` of the output (C order over layout.sizes).
__device__ __forceinline__ void strided_offsets(const BinaryStridedLayout& layout, int64_t linear, int64_t& a_offset,
                                                int64_t& b_offset) {
  int64_t remaining = linear;
  a_offset = 0;
  b_offset = 0;
#pragma unroll
  for (int d = kMaxStridedDims - 1; d >= 0; --d) {
    if (d < layout.dims) {
      const int64_t coordinate = remaining % layout.sizes[d];
      remaining /= layout.sizes[d];
      a_offset += coordinate * layout.a_strides[d];
      b_offset += coordinate * layout.b_strides[d];
    }
  }
}

template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_strided_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                          const scalar_t* __restrict__ b, int64_t numel,
                          BinaryStridedLayout layout, Op op) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t linear = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; linear < numel;
       linear += thread_count) {
    int64_t a_offset, b_offset;
    strided_offsets(layout, linear, a_offset, b_offset);
    out[linear] = static_cast<scalar_t>(
        op(static_cast<opmath_t>(a[a_offset]), static_cast<opmath_t>(b[b_offset])));
  }
}

// Lays `b` over `a`'s dims (missing leading dims and size-1 dims broadcast with stride 0),
// drops size-1 dims and merges neighbours that are contiguous with each other in both inputs.
// Returns false when more than kMaxStridedDims dims remain.
inline bool coalesce_binary_layout(const at::Tensor& a, const at::Tensor& b,
                                   BinaryStridedLayout& layout) {
  const at::IntArrayRef sizes = a.sizes(), a_strides = a.strides();
  const at::IntArrayRef b_sizes = b.sizes(), b_strides = b.strides();
  const size_t leading = sizes.size() - b_sizes.size();
  int dims = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    const int64_t b_stride = (d < leading || b_sizes[d - leading] == 1) ? 0 : b_strides[d - leading];
    if (dims > 0 && layout.a_strides[dims - 1] == a_strides[d] * sizes[d] &&
        layout.b_strides[dims - 1] == b_stride * sizes[d]) {
      layout.sizes[dims - 1] *= sizes[d];
      layout.a_strides[dims - 1] = a_strides[d];
      layout.b_strides[dims - 1] = b_stride;
      continue;
    }
    if (dims == kMaxStridedDims) return false;
    layout.sizes[dims] = sizes[d];
    layout.a_strides[dims] = a_strides[d];
    layout.b_strides[dims] = b_stride;
    ++dims;
  }
  layout.dims = dims;
  return true;
}

struct BinaryOperands {
  at::Tensor a, b;  // the inputs, or contiguous copies where they had more than kMaxStridedDims dims
  BinaryStridedLayout layout;
  BinaryPath path;
};

template <typename scalar_t>
BinaryOperands binary_operands_of(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  BinaryOperands operands{a, b, {}, BinaryPath::Strided};
  if (!coalesce_binary_layout(operands.a, operands.b, operands.layout)) {
    // Rare: more dims than the index math unrolls for; contiguous copies coalesce to one.
    operands.a = a.contiguous();
    operands.b = b.expand(a.sizes()).contiguous();
    coalesce_binary_layout(operands.a, operands.b, operands.layout);
  }
  const BinaryStridedLayout& layout = operands.layout;
  const bool dense = layout.dims <= 1 && (layout.dims == 0 || (layout.a_strides[0] == 1 && layout.b_strides[0] == 1));
  const bool aligned = is_aligned(operands.a.const_data_ptr()) && is_aligned(operands.b.const_data_ptr()) &&
                       is_aligned(out.const_data_ptr());
  operands.path = plan_binary_path(dense && aligned, out.numel(), Vec16<scalar_t>::kSize);
  return operands;
}

// Op<opmath_t> is a functor `opmath_t(opmath_t a, opmath_t b)` built from `params`.
template <template <typename> class Op, typename... Params>
at::Tensor binary_elementwise_cuda(const at::Tensor& a, const at::Tensor& b,
                                   Params... params) {
  const c10::cuda::CUDAGuard device_guard(a.device());
  at::Tensor out = empty_contiguous_like(a);
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  FUSED_DISPATCH_FLOATING_TYPES(a.scalar_type(), "binary_elementwise_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{static_cast<opmath_t>(params)...};
    const BinaryOperands operands = binary_operands_of<scalar_t>(a, b, out);
    const scalar_t* a_data = operands.a.const_data_ptr<scalar_t>();
    const scalar_t* b_data = operands.b.const_data_ptr<scalar_t>();
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    const int64_t num_vectors = numel / Vec16<scalar_t>::kSize;
    switch (operands.path) {
      case BinaryPath::ExactGrid:
        launch_kernel(binary_exact_grid_kernel<scalar_t, Op<opmath_t>>, num_vectors / kThreadsPerBlock,
                      kThreadsPerBlock, 0, stream, out_data, a_data, b_data, op);
        break;
      case BinaryPath::Vectorized:
        launch_kernel(binary_vectorized_kernel<scalar_t, Op<opmath_t>>, grid_size(num_vectors), kThreadsPerBlock,
                      0, stream, out_data, a_data, b_data, numel, op);
        break;
      case BinaryPath::Strided:
        launch_kernel(binary_strided_kernel<scalar_t, Op<opmath_t>>, grid_size(numel), kThreadsPerBlock, 0, stream,
                      out_data, a_data, b_data, numel, operands.layout, op);
        break;
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace cuda
}  // namespace fused_ops
