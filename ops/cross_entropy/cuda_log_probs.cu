// CUDA kernel of linear_log_probs' rows: one block per row of logits. One pass keeps each thread's
// running maximum, sum of exponentials and (for the entropy) sum of exp(z - maximum) (z - maximum),
// merged across the block; the forward then writes the row's log-probability and entropy, the backward
// a second pass of the gradient over the logits. 16-byte vectors where the chunk buffer's rows allow
// them (launch_plan.h pads the rows so they always do), element by element for the rest.
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <limits>

#include "../common/cuda_block_merge.cuh"
#include "../common/cuda_launch.cuh"
#include "../common/vector.cuh"
#include "linear_cross_entropy.h"
#include "linear_log_probs.h"

namespace fused_ops {
namespace cuda {
namespace {

constexpr int kRowThreads = 512;

// A running softmax with the entropy's sum: m = the maximum, s = sum exp(z - m), and with kEntropy
// t = sum exp(z - m) (z - m), so that log-sum-exp = m + log s and the entropy = log s - t / s (a sum of
// two non-negative terms: no cancellation). Logits of -inf add nothing.
template <typename opmath_t, bool kEntropy>
struct EntropyState {
  opmath_t max = -std::numeric_limits<opmath_t>::infinity();
  opmath_t sum_exp = 0;
  opmath_t sum_shifted = 0;

  // The same sums against a larger maximum `to` (this state holds at least one term).
  __device__ __forceinline__ void rebase(opmath_t to) {
    const opmath_t shift = max - to;
    const opmath_t scale = exp(shift);
    if (kEntropy) sum_shifted = scale * (sum_shifted + shift * sum_exp);
    sum_exp *= scale;
    max = to;
  }

  __device__ __forceinline__ void add(opmath_t z) {
    if (z == -std::numeric_limits<opmath_t>::infinity()) return;
    if (z > max) {
      if (max == -std::numeric_limits<opmath_t>::infinity()) {
        max = z;
      } else {
        rebase(z);
      }
      sum_exp += opmath_t(1);  // exp(0); its term of t is 0
    } else {
      const opmath_t shifted = z - max;
      const opmath_t e = exp(shifted);
      sum_exp += e;
      if (kEntropy) sum_shifted += e * shifted;
    }
  }

  __device__ __forceinline__ void merge(EntropyState other) {
    if (other.max == -std::numeric_limits<opmath_t>::infinity()) return;
    if (max == -std::numeric_limits<opmath_t>::infinity()) {
      *this = other;
      return;
    }
    if (other.max > max) {
      rebase(other.max);
    } else {
      other.rebase(max);
    }
    sum_exp += other.sum_exp;
    if (kEntropy) sum_shifted += other.sum_shifted;
  }

  __device__ __forceinline__ EntropyState shuffled(int offset) const {
    EntropyState other;
    other.max = __shfl_xor_sync(0xffffffffu, max, offset);
    other.sum_exp = __shfl_xor_sync(0xffffffffu, sum_exp, offset);
    if (kEntropy) other.sum_shifted = __shfl_xor_sync(0xffffffffu, sum_shifted, offset);
    return other;
  }
};

template <typename scalar_t, bool kVectorized, bool kEntropy, bool kSoftcap>
__global__ void __launch_bounds__(kRowThreads) log_probs_rows_kernel(LogProbsRows p) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr int kWidth = kVectorized ? 16 / int(sizeof(scalar_t)) : 1;
  constexpr int kBytes = kWidth * int(sizeof(scalar_t));
  const int64_t row = blockIdx.x;
  scalar_t* logits = static_cast<scalar_t*>(p.logits) + row * p.row_stride;
  const int64_t target = p.target[row];
  HeadLogit<opmath_t> head = head_logit<opmath_t>(p);
  if constexpr (!kSoftcap) head.softcap = opmath_t(0);
  const opmath_t* grad_log_probs = static_cast<const opmath_t*>(p.grad_log_probs);
  const opmath_t* grad_entropy = static_cast<const opmath_t*>(p.grad_entropy);
  const bool backward = grad_log_probs != nullptr || grad_entropy != nullptr;
  const int64_t vectors = kVectorized ? p.classes / kWidth : 0;
  const int64_t tail_start = vectors * kWidth;

  if (target == p.ignore_index || target < 0 || target >= p.classes) {
    // Ignored: 0. Out of range: NaN (the host reports it; a kernel never reads there).
    const opmath_t value = target == p.ignore_index ? opmath_t(0) : std::numeric_limits<opmath_t>::quiet_NaN();
    if (threadIdx.x == 0) {
      if (p.log_probs != nullptr) static_cast<opmath_t*>(p.log_probs)[row] = value;
      if (p.entropy != nullptr) static_cast<opmath_t*>(p.entropy)[row] = value;
    }
    if (!backward) return;
    for (int64_t j = threadIdx.x; j < p.classes; j += kRowThreads) logits[j] = static_cast<scalar_t>(value);
    return;
  }

  EntropyState<opmath_t, kEntropy> state;
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    opmath_t values[kWidth];
    unpack_vec(load_vec<kBytes>(logits, v), values);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) state.add(head.of(values[i]));
  }
  for (int64_t j = tail_start + threadIdx.x; j < p.classes; j += kRowThreads) {
    state.add(head.of(static_cast<opmath_t>(logits[j])));
  }
  state = block_merged<kRowThreads>(state);
  const opmath_t log_sum_exp = state.max + log(state.sum_exp);
  const opmath_t entropy = kEntropy ? log(state.sum_exp) - state.sum_shifted / state.sum_exp : opmath_t(0);
  if (!backward) {
    if (threadIdx.x == 0) {
      static_cast<opmath_t*>(p.log_probs)[row] = head.of(static_cast<opmath_t>(logits[target])) - log_sum_exp;
      if (p.entropy != nullptr) static_cast<opmath_t*>(p.entropy)[row] = entropy;
    }
    return;
  }
  // Each thread rewrites only the elements it read above: no barrier needed before the writes.
  const opmath_t grad_log_prob = grad_log_probs == nullptr ? opmath_t(0) : grad_log_probs[row];
  const opmath_t grad_row_entropy = grad_entropy == nullptr ? opmath_t(0) : grad_entropy[row];
  auto gradient = [&](opmath_t raw, int64_t j) {
    const opmath_t capped = head.capped(raw);
    return log_probs_logit_gradient(capped * head.inverse_temperature, j == target, log_sum_exp, entropy,
                                    grad_log_prob, grad_row_entropy) *
           head.slope(capped);
  };
  for (int64_t v = threadIdx.x; v < vectors; v += kRowThreads) {
    opmath_t values[kWidth];
    unpack_vec(load_vec<kBytes>(logits, v), values);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) values[i] = gradient(values[i], v * kWidth + i);
    store_vec<kBytes>(logits, v, pack_vec<scalar_t, kBytes>(values));
  }
  for (int64_t j = tail_start + threadIdx.x; j < p.classes; j += kRowThreads) {
    logits[j] = static_cast<scalar_t>(gradient(static_cast<opmath_t>(logits[j]), j));
  }
}

template <typename scalar_t, bool kVectorized>
void launch_log_probs_rows(const LogProbsRows& p, bool entropy, cudaStream_t stream) {
  // The cap's tanh is compiled in only where a cap is asked for.
  const bool softcap = p.softcap > 0;
  auto kernel = entropy && softcap ? log_probs_rows_kernel<scalar_t, kVectorized, true, true>
                : entropy          ? log_probs_rows_kernel<scalar_t, kVectorized, true, false>
                : softcap          ? log_probs_rows_kernel<scalar_t, kVectorized, false, true>
                                   : log_probs_rows_kernel<scalar_t, kVectorized, false, false>;
  // Chunks hold far fewer than 2^31 rows (launch_plan.h), one block each.
  launch_kernel(kernel, static_cast<unsigned int>(p.rows), kRowThreads, 0, stream, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void log_probs_rows_cuda(const LogProbsRows& p, at::ScalarType dtype) {
  if (p.rows == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // The entropy's sum is kept only where the entropy is written or its gradient read.
  const bool entropy = p.entropy != nullptr || p.grad_entropy != nullptr;
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_log_probs_cuda", [&] {
    const bool vectorized = is_aligned(p.logits) && (p.row_stride * int64_t(sizeof(scalar_t))) % 16 == 0;
    if (vectorized) {
      launch_log_probs_rows<scalar_t, true>(p, entropy, stream);
    } else {
      launch_log_probs_rows<scalar_t, false>(p, entropy, stream);
    }
  });
}

}  // namespace
}  // namespace cuda

LogProbsBackend log_probs_cuda_backend() {
  const CrossEntropyBackend device = cross_entropy_cuda_backend();
  return {cuda::log_probs_rows_cuda, device.available_bytes, device.check_targets, device.zero_row_padding};
}

}  // namespace fused_ops
