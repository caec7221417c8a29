#pragma once
// Binary elementwise CUDA loop shared by ops: out = op(a, b), `b` broadcast to `a`'s shape,
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

#include "dtype_dispatch.h"

namespace fused_ops {
namespace cuda {

constexpr int kThreadsPerBlock = 256;
constexpr int kMaxStridedDims = 8;

template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / sizeof(T);
  T values[kSize];
};

template <typename T>
__device__ __forceinline__ Vec16<T> load_vec16(const T* base, int64_t vector_index) {
  return reinterpret_cast<const Vec16<T>*>(base)[vector_index];
}

template <typename T>
__device__ __forceinline__ void store_vec16(T* base, int64_t vector_index, const Vec16<T>& value) {
  reinterpret_cast<Vec16<T>*>(base)[vector_index] = value;
}

inline bool is_aligned16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// One block per kThreadsPerBlock work items: measured on an H200 (docs/benchmarks.md), this
// streams 6% faster than a persistent grid of SM-count blocks with a loop, and launches small
// tensors faster. The kernels still loop, so a grid capped below CUDA's limit stays correct.
inline unsigned int grid_size(int64_t work_items) {
  constexpr int64_t kMaxBlocks = int64_t(1) << 30;
  const int64_t blocks = (work_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(blocks, kMaxBlocks)));
}

template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_vectorized_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                             const scalar_t* __restrict__ b, int64_t numel, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vec16<scalar_t>;
  const int64_t num_vectors = numel / Vec::kSize;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t index = thread; index < num_vectors; index += thread_count) {
    // Both loads are issued before either is used.
    const Vec a_vector = load_vec16(a, index);
    const Vec b_vector = load_vec16(b, index);
    Vec result;
#pragma unroll
    for (int j = 0; j < Vec::kSize; ++j) {
      result.values[j] = static_cast<scalar_t>(
          op(static_cast<opmath_t>(a_vector.values[j]), static_cast<opmath_t>(b_vector.values[j])));
    }
    store_vec16(out, index, result);
  }
  // Fewer than one vector of elements is left at the end.
  const int64_t tail = num_vectors * Vec::kSize + thread;
  if (tail < numel) {
    out[tail] = static_cast<scalar_t>(
        op(static_cast<opmath_t>(a[tail]), static_cast<opmath_t>(b[tail])));
  }
}

struct BinaryStridedLayout {
  int dims;  // innermost dim last
  int64_t sizes[kMaxStridedDims];
  int64_t a_strides[kMaxStridedDims];
  int64_t b_strides[kMaxStridedDims];
};

template <typename scalar_t, typename Op>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_strided_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ a,
                          const scalar_t* __restrict__ b, int64_t numel,
                          BinaryStridedLayout layout, Op op) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t linear = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; linear < numel;
       linear += thread_count) {
    int64_t remaining = linear;
    int64_t a_offset = 0;
    int64_t b_offset = 0;
#pragma unroll
    for (int d = kMaxStridedDims - 1; d >= 0; --d) {
      if (d < layout.dims) {
        const int64_t coordinate = remaining % layout.sizes[d];
        remaining /= layout.sizes[d];
        a_offset += coordinate * layout.a_strides[d];
        b_offset += coordinate * layout.b_strides[d];
      }
    }
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

// Op<opmath_t> is a functor `opmath_t(opmath_t a, opmath_t b)` built from `params`.
template <template <typename> class Op, typename... Params>
at::Tensor binary_elementwise_cuda(const at::Tensor& a, const at::Tensor& b,
                                   Params... params) {
  const c10::cuda::CUDAGuard device_guard(a.device());
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  at::Tensor a_view = a;
  at::Tensor b_view = b;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  FUSED_DISPATCH_FLOATING_TYPES(a.scalar_type(), "binary_elementwise_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{static_cast<opmath_t>(params)...};
    BinaryStridedLayout layout;
    if (!coalesce_binary_layout(a_view, b_view, layout)) {
      // Rare: more dims than the index math unrolls for; contiguous copies coalesce to one.
      a_view = a_view.contiguous();
      b_view = b_view.expand(a.sizes()).contiguous();
      coalesce_binary_layout(a_view, b_view, layout);
    }
    const scalar_t* a_data = a_view.const_data_ptr<scalar_t>();
    const scalar_t* b_data = b_view.const_data_ptr<scalar_t>();
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    const bool dense = layout.dims <= 1 && (layout.dims == 0 ||
                                            (layout.a_strides[0] == 1 && layout.b_strides[0] == 1));
    if (dense && is_aligned16(a_data) && is_aligned16(b_data) && is_aligned16(out_data)) {
      const int64_t num_vectors = numel / Vec16<scalar_t>::kSize;
      binary_vectorized_kernel<scalar_t><<<grid_size(num_vectors), kThreadsPerBlock, 0, stream>>>(
          out_data, a_data, b_data, numel, op);
    } else {
      binary_strided_kernel<scalar_t><<<grid_size(numel), kThreadsPerBlock, 0, stream>>>(
          out_data, a_data, b_data, numel, layout, op);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace cuda
}  // namespace fused_ops
