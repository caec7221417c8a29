// CUDA kernel of the cross-entropy rows: one block per row of logits. A first pass keeps each thread's
// running maximum and sum of exponentials (online softmax) and the sum of z, merged across the block;
// a second pass writes the gradient over the logits. 16-byte vectors where the chunk buffer's rows
// allow them (launch_plan.h pads the rows so they always do), element by element for the rest.
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <limits>
#include <map>
#include <mutex>

#include "../common/cuda_block_merge.cuh"
#include "../common/cuda_launch.cuh"
#include "../common/vector.cuh"
#include "launch_plan.h"
#include "linear_cross_entropy.h"

namespace fused_ops {
namespace cuda {
namespace {

constexpr int kRowThreads = 512;

// A running (maximum, sum of exp(z - maximum), sum of z).
template <typename opmath_t>
struct SoftmaxState {
  opmath_t max = -std::numeric_limits<opmath_t>::infinity();
  opmath_t sum_exp = 0;
  opmath_t sum_z = 0;

  __device__ __forceinline__ void add(opmath_t z) {
    if (z > max) {
      sum_exp = sum_exp * exp(max - z) + opmath_t(1);
      max = z;
    } else {
      sum_exp += exp(z - max);
    }
    sum_z += z;
  }

  __device__ __forceinline__ void merge(const SoftmaxState& other) {
    sum_z += other.sum_z;
    if (other.max == -std::numeric_limits<opmath_t>::infinity()) return;
    if (max == -std::numeric_limits<opmath_t>::infinity()) {
      max = other.max;
      sum_exp = other.sum_exp;
      return;
    }
    const opmath_t merged = max > other.max ? max : other.max;
    sum_exp = sum_exp * exp(max - merged) + other.sum_exp * exp(other.max - merged);
    max = merged;
  }

  __device__ __forceinline__ SoftmaxState shuffled(int offset) const {
    SoftmaxState other;
    other.max = __shfl_xor_sync(0xffffffffu, max, offset);
    other.sum_exp = __shfl_xor_sync(0xffffffffu, sum_exp, offset);
    other.sum_z = __shfl_xor_sync(0xffffffffu, sum_z, offset);
    return other;
  }
};

template <typename scalar_t, bool kVectorized>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_rows_kernel(CrossEntropyRows p) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr int kWidth = kVectorized ? 16 / int(sizeof(scalar_t)) : 1;
  constexpr int kBytes = kWidth * int(sizeof(scalar_t));
  const int64_t row = blockIdx.x;
  scalar_t* z = static_cast<scalar_t*>(p.logits) + row * p.row_stride;
  const int64_t target = p.target[row];
  const opmath_t* grad_scale = static_cast<const opmath_t*>(p.grad_scale);
  const opmath_t softcap = static_cast<opmath_t>(p.softcap);
  const int64_t vectors = kVectorized ? p.classes / kWidth : 0;
  const int64_t tail_start = vectors * kWidth;

  if (target == p.ignore_index || target < 0 || target >= p.classes) {
    // Ignored: loss and gradient 0. Out of range: NaN (the host reports it; a kernel never reads there).
    const opmath_t value = target == p.ignore_index ? opmath_t(0) : std::numeric_limits<opmath_t>::quiet_NaN();
    if (threadIdx.x == 0) static_cast<opmath_t*>(p.loss)[row] = value;
    if (grad_scale == nullptr) return;
    for (int64_t j = threadIdx.x; j < p.classes; j += kRowThreads) z[j] = static_cast<scalar_t>(value);
    return;
  }

  SoftmaxState<opmath_t> state;
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    opmath_t values[kWidth];
    unpack_vec(load_vec<kBytes>(z, v), values);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) state.add(soft_capped(values[i], softcap));
  }
  for (int64_t j = tail_start + threadIdx.x; j < p.classes; j += kRowThreads) {
    state.add(soft_capped(static_cast<opmath_t>(z[j]), softcap));
  }
  state = block_merged<kRowThreads>(state);
  const opmath_t log_sum_exp = state.max + log(state.sum_exp);
  const opmath_t smoothing = static_cast<opmath_t>(p.label_smoothing);
  const opmath_t classes = static_cast<opmath_t>(p.classes);
  const opmath_t z_target = soft_capped(static_cast<opmath_t>(z[target]), softcap);
  if (threadIdx.x == 0) {
    static_cast<opmath_t*>(p.loss)[row] = log_sum_exp - (1 - smoothing) * z_target - smoothing * state.sum_z / classes;
  }
  if (grad_scale == nullptr) return;
  // Every thread has read z[target] before any writes it.
  __syncthreads();
  const opmath_t scale = grad_scale[row * p.grad_scale_stride];
  const opmath_t uniform = smoothing / classes;
  auto gradient = [&](opmath_t raw, int64_t j) {
    const opmath_t capped = soft_capped(raw, softcap);
    const opmath_t g = exp(capped - log_sum_exp) - uniform - (j == target ? 1 - smoothing : opmath_t(0));
    return g * soft_cap_slope(capped, softcap) * scale;
  };
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    opmath_t values[kWidth];
    unpack_vec(load_vec<kBytes>(z, v), values);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) values[i] = gradient(values[i], v * kWidth + i);
    store_vec<kBytes>(z, v, pack_vec<scalar_t, kBytes>(values));
  }
  for (int64_t j = tail_start + threadIdx.x; j < p.classes; j += kRowThreads) {
    z[j] = static_cast<scalar_t>(gradient(static_cast<opmath_t>(z[j]), j));
  }
}

void cross_entropy_rows_cuda(const CrossEntropyRows& p, at::ScalarType dtype) {
  if (p.rows == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_cross_entropy_cuda", [&] {
    const bool vectorized = is_aligned(p.logits) && (p.row_stride * int64_t(sizeof(scalar_t))) % 16 == 0;
    auto kernel = vectorized ? cross_entropy_rows_kernel<scalar_t, true> : cross_entropy_rows_kernel<scalar_t, false>;
    // Chunks hold far fewer than 2^31 rows (launch_plan.h), one block each.
    launch_kernel(kernel, static_cast<unsigned int>(p.rows), kRowThreads, 0, stream, p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// The current device's total memory, asked once per device.
int64_t device_total_memory(c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<c10::DeviceIndex, int64_t> totals;
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = totals.find(device);
  if (found != totals.end()) return found->second;
  size_t free_bytes = 0, total_bytes = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return totals[device] = static_cast<int64_t>(total_bytes);
}

}  // namespace
}  // namespace cuda

CrossEntropyBackend cross_entropy_cuda_backend() {
  const c10::DeviceIndex device = c10::cuda::current_device();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const int64_t allocated = stats.allocated_bytes[0].current;
  // The device's memory less what this process has allocated bounds what is free; cudaMemGetInfo (which
  // can take milliseconds of host time per call) is asked only when that bound could limit the chunk.
  int64_t available = cuda::device_total_memory(device) - allocated;
  if (available < kMemoryNeverBinding) {
    size_t free_bytes = 0, total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // Memory the caching allocator holds but does not use counts as available too.
    available = static_cast<int64_t>(free_bytes) + stats.reserved_bytes[0].current - allocated;
  }
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  return {cuda::cross_entropy_rows_cuda, available, !capturing};
}

}  // namespace fused_ops
