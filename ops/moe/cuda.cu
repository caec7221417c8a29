// CUDA kernels of the experts' rows: one block per output row, each thread moving 16-byte vectors of it
// (element by element where the rows are not 16-byte aligned). The end of the paired rows is read from
// offsets on the device: no host synchronisation.
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "../common/cuda_device.cuh"
#include "../common/cuda_launch.cuh"
#include "../common/dtype_dispatch.h"
#include "../common/tensors.h"
#include "../common/vector.cuh"
#include "moe.h"

namespace fused_ops {
namespace cuda {
namespace {

constexpr int kMoeRowThreads = 128;

__device__ __forceinline__ int64_t paired_rows(const int* offsets, int64_t experts) {
  return experts == 0 ? 0 : static_cast<int64_t>(offsets[experts - 1]);
}

// out[s] = source[order[s] / top_k] for s < end, else 0; vectors of kBytes.
template <typename scalar_t, int kBytes>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_gather_kernel(const scalar_t* __restrict__ source,  // [T, width]
                      const int64_t* __restrict__ order,    // [S]
                      const int* __restrict__ offsets,      // [E]
                      int64_t experts, int64_t top_k, int64_t width,
                      scalar_t* __restrict__ out) {          // [S, width]
  begin_dependent_kernel();
  using Vector = Vec<scalar_t, kBytes>;
  const int64_t row = blockIdx.x;
  const int64_t vectors = width / Vector::kSize;
  Vector* to = reinterpret_cast<Vector*>(out + row * width);
  if (row >= paired_rows(offsets, experts)) {
    Vector zero;
#pragma unroll
    for (int i = 0; i < Vector::kSize; ++i) zero.values[i] = scalar_t(0);
    for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) to[v] = zero;
    return;
  }
  const Vector* from = reinterpret_cast<const Vector*>(source + (order[row] / top_k) * width);
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) to[v] = from[v];
}

// out[t] = sum_j weight(p) * rows[position[p]] for p = t * top_k + j with position[p] < end, in float32 (the
// opmath type), j in order; vectors of kBytes.
template <typename scalar_t, int kBytes>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_sum_pairs_kernel(const scalar_t* __restrict__ rows,                              // [S, width]
                         const int64_t* __restrict__ position,                           // [T * top_k]
                         const int* __restrict__ offsets,                                // [E]
                         const at::opmath_type<scalar_t>* __restrict__ weights,  // [T * top_k] or null
                         int64_t experts, int64_t top_k, int64_t width,
                         scalar_t* __restrict__ out) {                                   // [T, width]
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  using Vector = Vec<scalar_t, kBytes>;
  constexpr int kSize = Vector::kSize;
  const int64_t token = blockIdx.x;
  const int64_t end = paired_rows(offsets, experts);
  const int64_t vectors = width / kSize;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    opmath_t sum[kSize];
#pragma unroll
    for (int i = 0; i < kSize; ++i) sum[i] = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t pair = token * top_k + j;
      const int64_t at_row = position[pair];
      if (at_row >= end) continue;
      const opmath_t factor = weights == nullptr ? opmath_t(1) : weights[pair];
      const Vector value = reinterpret_cast<const Vector*>(rows + at_row * width)[v];
#pragma unroll
      for (int i = 0; i < kSize; ++i) sum[i] += factor * static_cast<opmath_t>(value.values[i]);
    }
    Vector result;
#pragma unroll
    for (int i = 0; i < kSize; ++i) result.values[i] = static_cast<scalar_t>(sum[i]);
    reinterpret_cast<Vector*>(out + token * width)[v] = result;
  }
}

// Rows from end on set to 0: a grid-stride loop over those rows only (blocks find none where no pair lacks an
// expert).
template <typename scalar_t>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_zero_rows_past_end_kernel(scalar_t* __restrict__ rows,        // [S, width]
                                  const int* __restrict__ offsets,  // [E]
                                  int64_t experts, int64_t count, int64_t width) {
  begin_dependent_kernel();
  for (int64_t row = paired_rows(offsets, experts) + blockIdx.x; row < count; row += gridDim.x) {
    for (int64_t c = threadIdx.x; c < width; c += blockDim.x) rows[row * width + c] = scalar_t(0);
  }
}

constexpr int kWarpsPerBlock = 8;

// One warp a row: grad_activation = h * weight (rounded once) and dot(h, activation) in opmath.
template <typename scalar_t, int kBytes>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    moe_routing_backward_kernel(const scalar_t* __restrict__ h,                          // [S, width]
                                const scalar_t* __restrict__ activation,                 // [S, width]
                                const at::opmath_type<scalar_t>* __restrict__ weights,  // [S]
                                int64_t count, int64_t width,
                                scalar_t* __restrict__ grad_activation,                  // [S, width]
                                at::opmath_type<scalar_t>* __restrict__ dots) {          // [S]
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  using Vector = Vec<scalar_t, kBytes>;
  constexpr int kSize = Vector::kSize;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= count) return;
  const opmath_t weight = weights[row];
  const Vector* h_row = reinterpret_cast<const Vector*>(h + row * width);
  const Vector* a_row = reinterpret_cast<const Vector*>(activation + row * width);
  Vector* out_row = reinterpret_cast<Vector*>(grad_activation + row * width);
  opmath_t sum = 0;
  for (int64_t v = lane; v < width / kSize; v += 32) {
    const Vector g = h_row[v], a = a_row[v];
    Vector out;
#pragma unroll
    for (int i = 0; i < kSize; ++i) {
      const opmath_t value = static_cast<opmath_t>(g.values[i]);
      sum += value * static_cast<opmath_t>(a.values[i]);
      out.values[i] = static_cast<scalar_t>(value * weight);
    }
    out_row[v] = out;
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) dots[row] = sum;
}

// The expert of row `row` < end: the first e with offsets[e] > row (offsets are the experts' ends).
__device__ __forceinline__ int64_t expert_of_row(const int* offsets, int64_t experts, int64_t row) {
  int64_t low = 0, high = experts - 1;
  while (low < high) {
    const int64_t middle = (low + high) / 2;
    if (offsets[middle] > row) high = middle; else low = middle + 1;
  }
  return low;
}

// One block a row: rows[s] += scale[s] * bias[expert of s] for s < end, in opmath.
template <typename scalar_t>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_add_expert_bias_kernel(scalar_t* __restrict__ rows,                              // [S, width]
                               const scalar_t* __restrict__ bias,                        // [E, width]
                               const int* __restrict__ offsets,                          // [E]
                               const at::opmath_type<scalar_t>* __restrict__ row_scale,  // [S] or null
                               int64_t experts, int64_t width) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t row = blockIdx.x;
  if (row >= paired_rows(offsets, experts)) return;
  const scalar_t* expert_bias = bias + expert_of_row(offsets, experts, row) * width;
  const opmath_t factor = row_scale == nullptr ? opmath_t(1) : row_scale[row];
  scalar_t* values = rows + row * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    values[c] = static_cast<scalar_t>(static_cast<opmath_t>(values[c]) + factor * static_cast<opmath_t>(expert_bias[c]));
  }
}

// Block (expert, column tile): each thread sums one column over the expert's rows in order.
template <typename scalar_t>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_expert_column_sums_kernel(const scalar_t* __restrict__ values,                       // [S, width]
                                  const int* __restrict__ offsets,                           // [E]
                                  const at::opmath_type<scalar_t>* __restrict__ row_scale,  // [S] or null
                                  int64_t width,
                                  at::opmath_type<scalar_t>* __restrict__ sums) {            // [E, width]
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t expert = blockIdx.x;
  const int64_t column = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (column >= width) return;
  const int64_t start = expert == 0 ? 0 : offsets[expert - 1], end = offsets[expert];
  opmath_t sum = 0;
  for (int64_t row = start; row < end; ++row) {
    const opmath_t factor = row_scale == nullptr ? opmath_t(1) : row_scale[row];
    sum += factor * static_cast<opmath_t>(values[row * width + column]);
  }
  sums[expert * width + column] = sum;
}

// One warp a row: dot(rows[s], bias[expert of s]) in opmath, 0 from end on.
template <typename scalar_t>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    moe_expert_bias_dots_kernel(const scalar_t* __restrict__ rows,  // [S, width]
                                const scalar_t* __restrict__ bias,  // [E, width]
                                const int* __restrict__ offsets,    // [E]
                                int64_t experts, int64_t count, int64_t width,
                                at::opmath_type<scalar_t>* __restrict__ dots) {  // [S]
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= count) return;
  opmath_t sum = 0;
  if (row < paired_rows(offsets, experts)) {
    const scalar_t* expert_bias = bias + expert_of_row(offsets, experts, row) * width;
    for (int64_t c = lane; c < width; c += 32) {
      sum += static_cast<opmath_t>(rows[row * width + c]) * static_cast<opmath_t>(expert_bias[c]);
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) dots[row] = sum;
}

// gpt-oss's clamped SwiGLU of one (gate, up) pair in opmath, as gate.cpp's composite computes it: the clamps
// are comparisons, so NaN passes through them as it does through ATen's clamp.
template <typename opmath_t>
struct ClampedSwiglu {
  opmath_t alpha, limit;
  __device__ __forceinline__ opmath_t clamped_gate(opmath_t gate) const { return gate > limit ? limit : gate; }
  __device__ __forceinline__ opmath_t clamped_up(opmath_t up) const {
    return up < -limit ? -limit : (up > limit ? limit : up);
  }
  __device__ __forceinline__ opmath_t sigmoid(opmath_t g) const {
    return opmath_t(1) / (opmath_t(1) + exp(-(g * alpha)));
  }
};

// Column i's gate and up of a gate/up row: columns 2i and 2i + 1 (interleaved) or i and width + i.
struct GateUpColumns {
  int64_t stride, up_start;
  __host__ __device__ GateUpColumns(bool interleaved, int64_t width)
      : stride(interleaved ? 2 : 1), up_start(interleaved ? 1 : width) {}
  __device__ __forceinline__ int64_t gate(int64_t i) const { return i * stride; }
  __device__ __forceinline__ int64_t up(int64_t i) const { return up_start + i * stride; }
};

// One block a row: out[row, i] = (clamp(up) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit).
template <typename scalar_t>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_clamped_gate_kernel(const scalar_t* __restrict__ gate_up,  // [S, 2 * width]
                            int64_t width, GateUpColumns columns, ClampedSwiglu<at::opmath_type<scalar_t>> gate,
                            scalar_t* __restrict__ out) {         // [S, width]
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const scalar_t* source = gate_up + int64_t(blockIdx.x) * 2 * width;
  scalar_t* target = out + int64_t(blockIdx.x) * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const opmath_t g = gate.clamped_gate(static_cast<opmath_t>(source[columns.gate(i)]));
    const opmath_t u = gate.clamped_up(static_cast<opmath_t>(source[columns.up(i)]));
    target[i] = static_cast<scalar_t>((u + opmath_t(1)) * g * gate.sigmoid(g));
  }
}

// Its gradient into gate_up's layout: a clamp holding its input at the limit passes it no gradient.
template <typename scalar_t>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_clamped_gate_backward_kernel(const scalar_t* __restrict__ grad,     // [S, width]
                                     const scalar_t* __restrict__ gate_up,  // [S, 2 * width]
                                     int64_t width, GateUpColumns columns,
                                     ClampedSwiglu<at::opmath_type<scalar_t>> gate,
                                     scalar_t* __restrict__ grad_gate_up) {  // [S, 2 * width]
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t row = blockIdx.x;
  const scalar_t* source = gate_up + row * 2 * width;
  const scalar_t* gradient_row = grad + row * width;
  scalar_t* target = grad_gate_up + row * 2 * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    const opmath_t gate_value = static_cast<opmath_t>(source[columns.gate(i)]);
    const opmath_t up_value = static_cast<opmath_t>(source[columns.up(i)]);
    const opmath_t gradient = static_cast<opmath_t>(gradient_row[i]);
    const opmath_t g = gate.clamped_gate(gate_value), u = gate.clamped_up(up_value);
    const opmath_t sigmoid = gate.sigmoid(g);
    const opmath_t glu = g * sigmoid;
    const opmath_t grad_g = gradient * (u + opmath_t(1)) * (sigmoid + gate.alpha * glu * (opmath_t(1) - sigmoid));
    const bool up_inside = up_value >= -gate.limit && up_value <= gate.limit;
    target[columns.gate(i)] = static_cast<scalar_t>(grad_g * opmath_t(gate_value <= gate.limit));
    target[columns.up(i)] = static_cast<scalar_t>(gradient * glu * opmath_t(up_inside));
  }
}

// 16-byte vectors where every row starts 16-byte aligned, else one element at a time.
template <typename scalar_t, typename Launch>
void with_row_vectors(const void* a, const void* b, int64_t width, const Launch& launch) {
  if (is_aligned(a) && is_aligned(b) && (width * int64_t(sizeof(scalar_t))) % 16 == 0) {
    launch(std::integral_constant<int, 16>{});
  } else {
    launch(std::integral_constant<int, int(sizeof(scalar_t))>{});
  }
}

}  // namespace
}  // namespace cuda

at::Tensor moe_gather_cuda(const at::Tensor& source, const at::Tensor& order, const at::Tensor& offsets, int64_t top_k) {
  const c10::cuda::CUDAGuard guard(source.device());
  const at::Tensor rows = source.contiguous();
  const at::Tensor pairs = order.contiguous();
  const at::Tensor ends = offsets.contiguous();
  const int64_t count = pairs.numel(), width = rows.size(1);
  at::Tensor out = empty_contiguous({count, width}, rows.options());
  if (count == 0 || width == 0) return out;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "moe_gather_cuda", [&] {
    cuda::with_row_vectors<scalar_t>(rows.const_data_ptr(), out.data_ptr(), width, [&](auto bytes) {
      cuda::launch_kernel(cuda::moe_gather_kernel<scalar_t, decltype(bytes)::value>,
                          static_cast<unsigned int>(count), cuda::kMoeRowThreads, 0, stream,
                          rows.const_data_ptr<scalar_t>(), pairs.const_data_ptr<int64_t>(),
                          ends.const_data_ptr<int>(), ends.numel(), top_k, width, out.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

void moe_zero_rows_past_end_cuda(const at::Tensor& rows, const at::Tensor& offsets) {
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t count = rows.size(0), width = rows.size(1);
  if (count == 0 || width == 0) return;
  const at::Tensor ends = offsets.contiguous();
  const unsigned int blocks = static_cast<unsigned int>(std::min<int64_t>(count, 4 * cuda::sm_count()));
  FUSED_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "moe_zero_rows_past_end_cuda", [&] {
    cuda::launch_kernel(cuda::moe_zero_rows_past_end_kernel<scalar_t>, blocks, cuda::kMoeRowThreads, 0,
                        at::cuda::getCurrentCUDAStream(), rows.data_ptr<scalar_t>(), ends.const_data_ptr<int>(),
                        ends.numel(), count, width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> moe_routing_backward_cuda(const at::Tensor& h, const at::Tensor& activation,
                                                             const at::Tensor& row_weights) {
  const c10::cuda::CUDAGuard guard(h.device());
  const at::Tensor gradient = h.contiguous(), values = activation.contiguous();
  const int64_t count = gradient.size(0), width = gradient.size(1);
  at::Tensor grad_activation = empty_contiguous({count, width}, values.options());
  const at::ScalarType opmath_type = at::toOpMathType(values.scalar_type());
  at::Tensor dots = at::empty({count}, values.options().dtype(opmath_type));
  if (count == 0) return {grad_activation, dots};
  const at::Tensor weights = row_weights.to(opmath_type).contiguous();
  const unsigned int blocks = static_cast<unsigned int>((count + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock);
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_routing_backward_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    cuda::with_row_vectors<scalar_t>(gradient.const_data_ptr(), values.const_data_ptr(), width, [&](auto bytes) {
      cuda::launch_kernel(cuda::moe_routing_backward_kernel<scalar_t, decltype(bytes)::value>, blocks,
                          cuda::kWarpsPerBlock * 32, 0, at::cuda::getCurrentCUDAStream(),
                          gradient.const_data_ptr<scalar_t>(), values.const_data_ptr<scalar_t>(),
                          weights.const_data_ptr<opmath_t>(), count, width, grad_activation.data_ptr<scalar_t>(),
                          dots.data_ptr<opmath_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {grad_activation, dots};
}

at::Tensor moe_sum_pairs_cuda(const at::Tensor& rows, const at::Tensor& position, const at::Tensor& offsets,
                              const at::Tensor& weights, int64_t top_k, int64_t tokens) {
  const c10::cuda::CUDAGuard guard(rows.device());
  const at::Tensor values = rows.contiguous();
  const at::Tensor where = position.contiguous();
  const at::Tensor ends = offsets.contiguous();
  const int64_t width = values.size(1);
  at::Tensor out = empty_contiguous({tokens, width}, values.options());
  if (tokens == 0 || width == 0) return out;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_sum_pairs_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const at::Tensor scale = weights.defined() ? weights.to(c10::CppTypeToScalarType<opmath_t>::value).contiguous()
                                               : at::Tensor();
    const opmath_t* weight = scale.defined() ? scale.const_data_ptr<opmath_t>() : nullptr;
    cuda::with_row_vectors<scalar_t>(values.const_data_ptr(), out.data_ptr(), width, [&](auto bytes) {
      cuda::launch_kernel(cuda::moe_sum_pairs_kernel<scalar_t, decltype(bytes)::value>,
                          static_cast<unsigned int>(tokens), cuda::kMoeRowThreads, 0, stream,
                          values.const_data_ptr<scalar_t>(), where.const_data_ptr<int64_t>(),
                          ends.const_data_ptr<int>(), weight, ends.numel(), top_k, width, out.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

at::Tensor moe_clamped_gate_cuda(const at::Tensor& gate_up, bool interleaved, double alpha, double limit) {
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const at::Tensor values = gate_up.contiguous();
  const int64_t rows = values.size(0), width = values.size(1) / 2;
  at::Tensor out = empty_contiguous({rows, width}, values.options());
  if (rows == 0 || width == 0) return out;
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_clamped_gate_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    cuda::launch_kernel(cuda::moe_clamped_gate_kernel<scalar_t>, static_cast<unsigned int>(rows), cuda::kMoeRowThreads,
                        0, at::cuda::getCurrentCUDAStream(), values.const_data_ptr<scalar_t>(), width,
                        cuda::GateUpColumns(interleaved, width),
                        cuda::ClampedSwiglu<opmath_t>{static_cast<opmath_t>(alpha), static_cast<opmath_t>(limit)},
                        out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor moe_clamped_gate_backward_cuda(const at::Tensor& grad, const at::Tensor& gate_up, bool interleaved,
                                          double alpha, double limit) {
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const at::Tensor values = gate_up.contiguous();
  const at::Tensor gradient = grad.to(values.scalar_type()).contiguous();
  const int64_t rows = values.size(0), width = values.size(1) / 2;
  at::Tensor grad_gate_up = empty_contiguous({rows, 2 * width}, values.options());
  if (rows == 0 || width == 0) return grad_gate_up;
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_clamped_gate_backward_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    cuda::launch_kernel(cuda::moe_clamped_gate_backward_kernel<scalar_t>, static_cast<unsigned int>(rows),
                        cuda::kMoeRowThreads, 0, at::cuda::getCurrentCUDAStream(), gradient.const_data_ptr<scalar_t>(),
                        values.const_data_ptr<scalar_t>(), width, cuda::GateUpColumns(interleaved, width),
                        cuda::ClampedSwiglu<opmath_t>{static_cast<opmath_t>(alpha), static_cast<opmath_t>(limit)},
                        grad_gate_up.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_gate_up;
}

void moe_add_expert_bias_cuda(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets,
                              const at::Tensor& row_scale) {
  TORCH_INTERNAL_ASSERT(rows.is_contiguous(), "moe_add_expert_bias_cuda: rows must be contiguous");
  const c10::cuda::CUDAGuard guard(rows.device());
  const at::Tensor biases = bias.to(rows.scalar_type()).contiguous();
  const at::Tensor ends = offsets.contiguous();
  const int64_t count = rows.size(0), width = rows.size(1);
  if (count == 0 || width == 0 || ends.numel() == 0) return;
  FUSED_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "moe_add_expert_bias_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const at::Tensor scale = row_values_as(row_scale, c10::CppTypeToScalarType<opmath_t>::value);
    cuda::launch_kernel(cuda::moe_add_expert_bias_kernel<scalar_t>, static_cast<unsigned int>(count),
                        cuda::kMoeRowThreads, 0, at::cuda::getCurrentCUDAStream(), rows.data_ptr<scalar_t>(),
                        biases.const_data_ptr<scalar_t>(), ends.const_data_ptr<int>(),
                        scale.defined() ? scale.const_data_ptr<opmath_t>() : nullptr, ends.numel(), width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

at::Tensor moe_expert_column_sums_cuda(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& row_scale) {
  const c10::cuda::CUDAGuard guard(values.device());
  const at::Tensor rows = values.contiguous();
  const at::Tensor ends = offsets.contiguous();
  const int64_t width = rows.size(1), experts = ends.numel();
  const at::ScalarType opmath_type = at::toOpMathType(rows.scalar_type());
  at::Tensor sums = at::empty({experts, width}, rows.options().dtype(opmath_type));
  if (experts == 0 || width == 0) return sums;
  const dim3 grid(static_cast<unsigned int>(experts),
                  static_cast<unsigned int>((width + cuda::kMoeRowThreads - 1) / cuda::kMoeRowThreads));
  FUSED_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "moe_expert_column_sums_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const at::Tensor scale = row_values_as(row_scale, opmath_type);
    cuda::launch_kernel(cuda::moe_expert_column_sums_kernel<scalar_t>, grid, cuda::kMoeRowThreads, 0,
                        at::cuda::getCurrentCUDAStream(), rows.const_data_ptr<scalar_t>(), ends.const_data_ptr<int>(),
                        scale.defined() ? scale.const_data_ptr<opmath_t>() : nullptr, width, sums.data_ptr<opmath_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return sums;
}

at::Tensor moe_expert_bias_dots_cuda(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets) {
  const c10::cuda::CUDAGuard guard(rows.device());
  const at::Tensor values = rows.contiguous();
  const at::Tensor biases = bias.to(values.scalar_type()).contiguous();
  const at::Tensor ends = offsets.contiguous();
  const int64_t count = values.size(0), width = values.size(1);
  at::Tensor dots = at::zeros({count}, values.options().dtype(at::toOpMathType(values.scalar_type())));
  if (count == 0 || ends.numel() == 0) return dots;
  const unsigned int blocks = static_cast<unsigned int>((count + cuda::kWarpsPerBlock - 1) / cuda::kWarpsPerBlock);
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_expert_bias_dots_cuda", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    cuda::launch_kernel(cuda::moe_expert_bias_dots_kernel<scalar_t>, blocks, cuda::kWarpsPerBlock * 32, 0,
                        at::cuda::getCurrentCUDAStream(), values.const_data_ptr<scalar_t>(),
                        biases.const_data_ptr<scalar_t>(), ends.const_data_ptr<int>(), ends.numel(), count, width,
                        dots.data_ptr<opmath_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return dots;
}

}  // namespace fused_ops
