#pragma once
// Binary elementwise loops that also write one bit per element, a predicate of `a` (relu_add's
// forward: where relu passed x through), and the loop that reads those bits back for a backward:
// out = bit ? grad : 0. A backward that keeps the bits instead of `a` reads 1/8 byte per element
// instead of 2-4.
//
// Bit layout, whichever kernel writes or reads it: bit e % 8 of byte e / 8 belongs to element e
// of `a` in C order; the last byte's unused high bits are 0. So a forward on the vector path and a
// backward on the strided path (say, an expanded grad) agree.
#include <tuple>

#include "../common/bit_mask.h"
#include "cuda_binary.cuh"

namespace fused_ops {
namespace cuda {

constexpr unsigned kFullWarp = 0xffffffffu;

// Each lane holds kBitsPerLane bits for the elements first_element .. first_element + kBitsPerLane - 1
// (first_element a multiple of kBitsPerLane, consecutive across lanes); the lanes that start a byte
// gather it from their neighbours and store it, up to the byte that holds element numel - 1. Every
// lane of the warp must call this together (it shuffles).
template <int kBitsPerLane>
__device__ __forceinline__ void store_warp_bits(uint8_t* __restrict__ mask, int64_t first_element, uint32_t bits,
                                                int64_t numel) {
  static_assert(kBitsPerLane == 1 || kBitsPerLane == 2 || kBitsPerLane == 4 || kBitsPerLane == 8,
                "bits per lane divide a byte");
  const int lane = threadIdx.x % 32;
  if constexpr (kBitsPerLane == 1) {
    // 32 consecutive elements: one ballot, four lanes store its bytes.
    const uint32_t word = __ballot_sync(kFullWarp, bits);
    const int64_t warp_first_element = first_element - lane;
    if (lane < 4 && warp_first_element + 8 * lane < numel) {
      mask[warp_first_element / 8 + lane] = static_cast<uint8_t>(word >> (8 * lane));
    }
  } else {
    constexpr int kLanesPerByte = 8 / kBitsPerLane;
    uint32_t byte = bits << ((lane % kLanesPerByte) * kBitsPerLane);
#pragma unroll
    for (int step = 1; step < kLanesPerByte; step *= 2) byte |= __shfl_xor_sync(kFullWarp, byte, step);
    if (lane % kLanesPerByte == 0 && first_element < numel) mask[first_element / 8] = static_cast<uint8_t>(byte);
  }
}

// The kCount bits of elements first_element .. first_element + kCount - 1 (first_element a multiple
// of kCount, kCount at most 8), element first_element in bit 0.
template <int kCount>
__device__ __forceinline__ uint32_t load_bits(const uint8_t* __restrict__ mask, int64_t first_element) {
  return (uint32_t(mask[first_element / 8]) >> (first_element % 8)) & ((1u << kCount) - 1);
}

// out = op(a, b) and the bits of bit_op(a); the whole-block grid of binary_exact_grid_kernel.
template <typename scalar_t, typename Op, typename BitOp>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_exact_grid_with_mask_kernel(scalar_t* __restrict__ out, uint8_t* __restrict__ mask,
                                       const scalar_t* __restrict__ a, const scalar_t* __restrict__ b, int64_t numel,
                                       Op op, BitOp bit_op) {
  begin_dependent_kernel();
  constexpr int kSize = Vec16<scalar_t>::kSize;
  const int index = blockIdx.x * kThreadsPerBlock + threadIdx.x;
  const uint32_t bits = apply_binary_vector(out, a, b, index, op, bit_op);
  store_warp_bits<kSize>(mask, int64_t(index) * kSize, bits, numel);
}

// Dense and aligned, any size: vector slots, the last possibly partial, in a loop whose condition is
// the warp's first slot, so that every lane of a warp reaches store_warp_bits together.
template <typename scalar_t, typename Op, typename BitOp>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_vectorized_with_mask_kernel(scalar_t* __restrict__ out, uint8_t* __restrict__ mask,
                                       const scalar_t* __restrict__ a, const scalar_t* __restrict__ b, int64_t numel,
                                       Op op, BitOp bit_op) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr int kSize = Vec16<scalar_t>::kSize;
  const int64_t num_vectors = numel / kSize;
  const int64_t num_slots = (numel + kSize - 1) / kSize;
  const int lane = threadIdx.x % 32;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t index = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; index - lane < num_slots;
       index += thread_count) {
    uint32_t bits = 0;
    if (index < num_vectors) {
      bits = apply_binary_vector(out, a, b, index, op, bit_op);
    } else if (index < num_slots) {
      // Fewer than one vector of elements is left at the end.
      for (int j = 0; j < kSize && index * kSize + j < numel; ++j) {
        const int64_t element = index * kSize + j;
        const opmath_t a_value = static_cast<opmath_t>(a[element]);
        out[element] = static_cast<scalar_t>(op(a_value, static_cast<opmath_t>(b[element])));
        bits |= uint32_t(bit_op(a_value)) << j;
      }
    }
    store_warp_bits<kSize>(mask, index * kSize, bits, numel);
  }
}

template <typename scalar_t, typename Op, typename BitOp>
__global__ void __launch_bounds__(kThreadsPerBlock)
    binary_strided_with_mask_kernel(scalar_t* __restrict__ out, uint8_t* __restrict__ mask,
                                    const scalar_t* __restrict__ a, const scalar_t* __restrict__ b, int64_t numel,
                                    BinaryStridedLayout layout, Op op, BitOp bit_op) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % 32;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t linear = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; linear - lane < numel;
       linear += thread_count) {
    uint32_t bit = 0;
    if (linear < numel) {
      int64_t a_offset, b_offset;
      strided_offsets(layout, linear, a_offset, b_offset);
      const opmath_t a_value = static_cast<opmath_t>(a[a_offset]);
      out[linear] = static_cast<scalar_t>(op(a_value, static_cast<opmath_t>(b[b_offset])));
      bit = bit_op(a_value);
    }
    store_warp_bits<1>(mask, linear, bit, numel);
  }
}

// out = bit ? grad : 0 over the 16-byte vector at `index`: a selection, exact in scalar_t.
template <typename scalar_t>
__device__ __forceinline__ void apply_masked_vector(scalar_t* __restrict__ out, const scalar_t* __restrict__ grad,
                                                    const uint8_t* __restrict__ mask, int64_t index) {
  using Vec = Vec16<scalar_t>;
  const Vec grad_vector = load_vec16(grad, index);
  const uint32_t bits = load_bits<Vec::kSize>(mask, index * Vec::kSize);
  Vec result;
#pragma unroll
  for (int j = 0; j < Vec::kSize; ++j) result.values[j] = (bits >> j) & 1u ? grad_vector.values[j] : scalar_t(0);
  store_vec16(out, index, result);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    masked_exact_grid_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ grad,
                             const uint8_t* __restrict__ mask) {
  begin_dependent_kernel();
  apply_masked_vector(out, grad, mask, blockIdx.x * kThreadsPerBlock + threadIdx.x);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    masked_vectorized_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ grad,
                             const uint8_t* __restrict__ mask, int64_t numel) {
  begin_dependent_kernel();
  const int64_t num_vectors = numel / Vec16<scalar_t>::kSize;
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t index = thread; index < num_vectors; index += thread_count) apply_masked_vector(out, grad, mask, index);
  const int64_t tail = num_vectors * Vec16<scalar_t>::kSize + thread;
  if (tail < numel) out[tail] = load_bits<1>(mask, tail) ? grad[tail] : scalar_t(0);
}

template <typename scalar_t>
__global__ void __launch_bounds__(kThreadsPerBlock)
    masked_strided_kernel(scalar_t* __restrict__ out, const scalar_t* __restrict__ grad,
                          const uint8_t* __restrict__ mask, int64_t numel, BinaryStridedLayout layout) {
  begin_dependent_kernel();
  const int64_t thread_count = int64_t(gridDim.x) * blockDim.x;
  for (int64_t linear = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; linear < numel; linear += thread_count) {
    int64_t grad_offset, unused_offset;
    strided_offsets(layout, linear, grad_offset, unused_offset);
    out[linear] = load_bits<1>(mask, linear) ? grad[grad_offset] : scalar_t(0);
  }
}

// (op(a, b), bits of bit_op(a)): Op<opmath_t> as for binary_elementwise_cuda, BitOp<opmath_t> a
// functor `bool(opmath_t a)`. The bits are a uint8 tensor of bit_mask_bytes(a.numel()) bytes.
template <template <typename> class Op, template <typename> class BitOp, typename... Params>
std::tuple<at::Tensor, at::Tensor> binary_elementwise_with_mask_cuda(const at::Tensor& a, const at::Tensor& b,
                                                                     Params... params) {
  const c10::cuda::CUDAGuard device_guard(a.device());
  at::Tensor out = empty_contiguous_like(a);
  const int64_t numel = out.numel();
  at::Tensor mask = at::empty({bit_mask_bytes(numel)}, a.options().dtype(at::kByte));
  if (numel == 0) return {out, mask};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  FUSED_DISPATCH_FLOATING_TYPES(a.scalar_type(), "binary_elementwise_with_mask_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{static_cast<opmath_t>(params)...};
    const BitOp<opmath_t> bit_op{};
    const BinaryOperands operands = binary_operands_of<scalar_t>(a, b, out);
    const scalar_t* a_data = operands.a.const_data_ptr<scalar_t>();
    const scalar_t* b_data = operands.b.const_data_ptr<scalar_t>();
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    uint8_t* mask_data = mask.mutable_data_ptr<uint8_t>();
    constexpr int kSize = Vec16<scalar_t>::kSize;
    switch (operands.path) {
      case BinaryPath::ExactGrid:
        launch_kernel(binary_exact_grid_with_mask_kernel<scalar_t, Op<opmath_t>, BitOp<opmath_t>>,
                      numel / kSize / kThreadsPerBlock, kThreadsPerBlock, 0, stream, out_data, mask_data, a_data,
                      b_data, numel, op, bit_op);
        break;
      case BinaryPath::Vectorized:
        launch_kernel(binary_vectorized_with_mask_kernel<scalar_t, Op<opmath_t>, BitOp<opmath_t>>,
                      grid_size((numel + kSize - 1) / kSize), kThreadsPerBlock, 0, stream, out_data, mask_data, a_data,
                      b_data, numel, op, bit_op);
        break;
      case BinaryPath::Strided:
        launch_kernel(binary_strided_with_mask_kernel<scalar_t, Op<opmath_t>, BitOp<opmath_t>>, grid_size(numel),
                      kThreadsPerBlock, 0, stream, out_data, mask_data, a_data, b_data, numel, operands.layout, op,
                      bit_op);
        break;
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, mask};
}

// bit ? grad : 0 per element of grad (any strides), the bits as binary_elementwise_with_mask_cuda
// wrote them for a tensor of grad's shape.
inline at::Tensor masked_gradient_cuda(const at::Tensor& grad, const at::Tensor& mask) {
  const c10::cuda::CUDAGuard device_guard(grad.device());
  at::Tensor out = empty_contiguous_like(grad);
  const int64_t numel = out.numel();
  if (numel == 0) return out;
  const at::Tensor mask_contiguous = mask.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  FUSED_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "masked_gradient_cuda", [&] {
    // grad as both operands: the same path rules and layout, b's half unused.
    const BinaryOperands operands = binary_operands_of<scalar_t>(grad, grad, out);
    const scalar_t* grad_data = operands.a.const_data_ptr<scalar_t>();
    const uint8_t* mask_data = mask_contiguous.const_data_ptr<uint8_t>();
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    const int64_t num_vectors = numel / Vec16<scalar_t>::kSize;
    switch (operands.path) {
      case BinaryPath::ExactGrid:
        launch_kernel(masked_exact_grid_kernel<scalar_t>, num_vectors / kThreadsPerBlock, kThreadsPerBlock, 0, stream,
                      out_data, grad_data, mask_data);
        break;
      case BinaryPath::Vectorized:
        launch_kernel(masked_vectorized_kernel<scalar_t>, grid_size(num_vectors), kThreadsPerBlock, 0, stream,
                      out_data, grad_data, mask_data, numel);
        break;
      case BinaryPath::Strided:
        launch_kernel(masked_strided_kernel<scalar_t>, grid_size(numel), kThreadsPerBlock, 0, stream, out_data,
                      grad_data, mask_data, numel, operands.layout);
        break;
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace cuda
}  // namespace fused_ops
