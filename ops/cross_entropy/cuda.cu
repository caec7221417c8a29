// CUDA kernel of the cross-entropy rows: one block per row of logits. A first pass keeps each thread's
// running maximum and sum of exponentials (online softmax, the maximum moved at most once per vector)
// and the sum of z, merged across the block; a second pass writes the gradient over the logits. 16-byte
// vectors where the chunk buffer's rows allow them (launch_plan.h pads the rows so they always do),
// element by element for the rest.
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
#include "../common/fast_math.h"
#include "../common/vector.cuh"
#include "launch_plan.h"
#include "linear_cross_entropy.h"

namespace fused_ops {
namespace cuda {
namespace {

constexpr int kRowThreads = 512;

// exp(z - shift) for one shift and many z: in float one FMA and the SFU's exp2 (fast_math.h: a few
// ulp, where the exact call's instructions made this kernel compute-bound), the exact call in double.
template <typename opmath_t>
struct ShiftedExp {
  opmath_t shift;
  __device__ explicit ShiftedExp(opmath_t shift_by) : shift(shift_by) {}
  __device__ __forceinline__ opmath_t operator()(opmath_t z) const { return exp(z - shift); }
};

template <>
struct ShiftedExp<float> {
  static constexpr float kLog2e = 1.4426950408889634f;
  float scaled_shift;
  __device__ explicit ShiftedExp(float shift_by) : scaled_shift(shift_by * kLog2e) {}
  __device__ __forceinline__ float operator()(float z) const { return exp2_approx(fmaf(z, kLog2e, -scaled_shift)); }
};

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

  // One vector's values: the maximum moves at most once, one exponential each.
  template <bool kSumZ, int kCount>
  __device__ __forceinline__ void add_all(const opmath_t (&z)[kCount]) {
    opmath_t vector_max = z[0];
#pragma unroll
    for (int i = 1; i < kCount; ++i) vector_max = z[i] > vector_max ? z[i] : vector_max;
    if (vector_max > max) {
      sum_exp *= ShiftedExp<opmath_t>(vector_max)(max);
      max = vector_max;
    }
    const ShiftedExp<opmath_t> exp_above_max(max);
#pragma unroll
    for (int i = 0; i < kCount; ++i) sum_exp += exp_above_max(z[i]);
    if constexpr (kSumZ) {
#pragma unroll
      for (int i = 0; i < kCount; ++i) sum_z += z[i];
    }
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

// visit(vector, index) for each vector of a row, thread t taking vectors t, t + kRowThreads, ...: a
// thread issues kRowVectorsInFlight loads (launch_plan.h) before it uses any of them, then the rest one
// by one.
template <int kBytes, typename scalar_t, typename Visit>
__device__ __forceinline__ void for_each_row_vector(const scalar_t* row, int64_t vectors, Visit&& visit) {
  constexpr int64_t kGroupStride = int64_t(kRowVectorsInFlight) * kRowThreads;
  int64_t v = threadIdx.x;
  for (; v + (kRowVectorsInFlight - 1) * kRowThreads < vectors; v += kGroupStride) {
    Vec<scalar_t, kBytes> loaded[kRowVectorsInFlight];
#pragma unroll
    for (int u = 0; u < kRowVectorsInFlight; ++u) loaded[u] = load_vec<kBytes>(row, v + u * kRowThreads);
#pragma unroll
    for (int u = 0; u < kRowVectorsInFlight; ++u) visit(loaded[u], v + u * kRowThreads);
  }
  for (; v < vectors; v += kRowThreads) visit(load_vec<kBytes>(row, v), v);
}

// kSoftcap and kSmoothing false compile the soft cap and label smoothing out of the row (the usual
// loss); true handles any value of them, 0 included.
template <typename scalar_t, bool kVectorized, bool kSoftcap, bool kSmoothing>
__global__ void __launch_bounds__(kRowThreads) cross_entropy_rows_kernel(CrossEntropyRows p) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr int kWidth = kVectorized ? 16 / int(sizeof(scalar_t)) : 1;
  constexpr int kBytes = kWidth * int(sizeof(scalar_t));
  using Vector = Vec<scalar_t, kBytes>;
  const int64_t row = blockIdx.x;
  scalar_t* z = static_cast<scalar_t*>(p.logits) + row * p.row_stride;
  const int64_t target = p.target[row];
  const opmath_t* grad_scale = static_cast<const opmath_t*>(p.grad_scale);
  const opmath_t softcap = kSoftcap ? static_cast<opmath_t>(p.softcap) : opmath_t(0);
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

  auto capped = [&](opmath_t raw) { return kSoftcap ? soft_capped(raw, softcap) : raw; };
  SoftmaxState<opmath_t> state;
  for_each_row_vector<kBytes>(z, vectors, [&](const Vector& vector, int64_t) {
    opmath_t values[kWidth];
    unpack_vec(vector, values);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) values[i] = capped(values[i]);
    state.template add_all<kSmoothing>(values);
  });
  for (int64_t j = tail_start + threadIdx.x; j < p.classes; j += kRowThreads) {
    state.add(capped(static_cast<opmath_t>(z[j])));
  }
  state = block_merged<kRowThreads>(state);
  const opmath_t log_sum_exp = state.max + log(state.sum_exp);
  const opmath_t smoothing = kSmoothing ? static_cast<opmath_t>(p.label_smoothing) : opmath_t(0);
  const opmath_t classes = static_cast<opmath_t>(p.classes);
  const opmath_t z_target = capped(static_cast<opmath_t>(z[target]));
  if (threadIdx.x == 0) {
    static_cast<opmath_t*>(p.loss)[row] = log_sum_exp - (1 - smoothing) * z_target - smoothing * state.sum_z / classes;
  }
  if (grad_scale == nullptr) return;
  // Every thread has read z[target] before any writes it.
  __syncthreads();
  const opmath_t scale = grad_scale[row * p.grad_scale_stride];
  const opmath_t uniform = smoothing / classes;
  const opmath_t target_weight = 1 - smoothing;
  const ShiftedExp<opmath_t> probability(log_sum_exp);
  auto gradient = [&](opmath_t raw, bool is_target) {
    const opmath_t z_capped = capped(raw);
    opmath_t g = probability(z_capped) - (is_target ? target_weight : opmath_t(0));
    if constexpr (kSmoothing) g -= uniform;
    if constexpr (kSoftcap) g *= soft_cap_slope(z_capped, softcap);
    return g * scale;
  };
  for_each_row_vector<kBytes>(z, vectors, [&](const Vector& vector, int64_t index) {
    opmath_t values[kWidth];
    unpack_vec(vector, values);
    // The target's place in this vector, if it is there: one 64-bit comparison per vector.
    const int64_t offset = target - index * kWidth;
    const int target_place = offset >= 0 && offset < kWidth ? static_cast<int>(offset) : -1;
#pragma unroll
    for (int i = 0; i < kWidth; ++i) values[i] = gradient(values[i], i == target_place);
    store_vec<kBytes>(z, index, pack_vec<scalar_t, kBytes>(values));
  });
  for (int64_t j = tail_start + threadIdx.x; j < p.classes; j += kRowThreads) {
    z[j] = static_cast<scalar_t>(gradient(static_cast<opmath_t>(z[j]), j == target));
  }
}

void cross_entropy_rows_cuda(const CrossEntropyRows& p, at::ScalarType dtype) {
  if (p.rows == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_cross_entropy_cuda", [&] {
    const bool vectorized = is_aligned(p.logits) && (p.row_stride * int64_t(sizeof(scalar_t))) % 16 == 0;
    const bool softcap = p.softcap > 0;
    const bool smoothing = p.label_smoothing > 0;
    // The chunk buffer is always vectorized (launch_plan.h pads its rows); other rows take the general kernel.
    auto kernel = !vectorized            ? cross_entropy_rows_kernel<scalar_t, false, true, true>
                  : softcap && smoothing ? cross_entropy_rows_kernel<scalar_t, true, true, true>
                  : softcap              ? cross_entropy_rows_kernel<scalar_t, true, true, false>
                  : smoothing            ? cross_entropy_rows_kernel<scalar_t, true, false, true>
                                         : cross_entropy_rows_kernel<scalar_t, true, false, false>;
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
