// CUDA kernels of linear_log_probs. The forward's rows: one block per row of logits, one pass keeping
// each thread's running maximum, sum of exponentials and (for the entropy) sum of exp(z - maximum)
// (z - maximum), merged across the block; then the row's log-probability, entropy and log-sum-exp. The
// backward's tiles of classes: each thread turns one 16-byte vector of a row's logits into their gradient
// (in place, or from the forward's kept logits into the chunk's buffer) from the row's log-sum-exp and
// entropy. 16-byte vectors where the buffers' rows allow them
// (launch_plan.h pads the rows so they always do), element by element for the rest.
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
  const scalar_t* logits = static_cast<const scalar_t*>(p.logits) + row * p.row_stride;
  const int64_t target = p.target[row];
  HeadLogit<opmath_t> head = head_logit<opmath_t>(p);
  if constexpr (!kSoftcap) head.softcap = opmath_t(0);
  const int64_t vectors = kVectorized ? p.classes / kWidth : 0;
  const int64_t tail_start = vectors * kWidth;

  if (target == p.ignore_index || target < 0 || target >= p.classes) {
    // Ignored: 0. Out of range: NaN (the host reports it; a kernel never reads there).
    const opmath_t value = target == p.ignore_index ? opmath_t(0) : std::numeric_limits<opmath_t>::quiet_NaN();
    if (threadIdx.x == 0) {
      static_cast<opmath_t*>(p.log_probs)[row] = value;
      if (p.entropy != nullptr) static_cast<opmath_t*>(p.entropy)[row] = value;
      if (p.log_sum_exp != nullptr) static_cast<opmath_t*>(p.log_sum_exp)[row] = value;
    }
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
  if (threadIdx.x == 0) {
    const opmath_t log_sum_exp = state.max + log(state.sum_exp);
    static_cast<opmath_t*>(p.log_probs)[row] = head.of(static_cast<opmath_t>(logits[target])) - log_sum_exp;
    if (p.entropy != nullptr) {
      static_cast<opmath_t*>(p.entropy)[row] = log(state.sum_exp) - state.sum_shifted / state.sum_exp;
    }
    if (p.log_sum_exp != nullptr) static_cast<opmath_t*>(p.log_sum_exp)[row] = log_sum_exp;
  }
}

constexpr int kTileThreads = 256;

// One row per blockIdx.x, kTileThreads vectors of its classes per blockIdx.y.
template <typename scalar_t, bool kVectorized, bool kSoftcap>
__global__ void __launch_bounds__(kTileThreads) log_probs_gradient_kernel(LogProbsGradientTile p,
                                                                          int64_t classes_total) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr int kWidth = kVectorized ? 16 / int(sizeof(scalar_t)) : 1;
  constexpr int kBytes = kWidth * int(sizeof(scalar_t));
  const int64_t row = blockIdx.x;
  const int64_t first = (int64_t(blockIdx.y) * kTileThreads + threadIdx.x) * kWidth;
  if (first >= p.classes) return;
  const scalar_t* logits = static_cast<const scalar_t*>(p.logits) + row * p.row_stride;
  scalar_t* grad_logits = static_cast<scalar_t*>(p.grad_logits) + row * p.grad_row_stride;
  HeadLogit<opmath_t> head = head_logit<opmath_t>(p);
  if constexpr (!kSoftcap) head.softcap = opmath_t(0);
  auto value = [row](const void* values) {
    return values == nullptr ? opmath_t(0) : static_cast<const opmath_t*>(values)[row];
  };
  const int64_t target = p.target[row];
  const opmath_t log_sum_exp = value(p.log_sum_exp), entropy = value(p.entropy);
  const opmath_t grad_log_prob = value(p.grad_log_probs), grad_entropy = value(p.grad_entropy);
  auto gradient = [&](opmath_t raw, int64_t j) {
    return log_probs_raw_gradient(raw, head, target, p.ignore_index, classes_total, p.first_class + j == target,
                                  log_sum_exp, entropy, grad_log_prob, grad_entropy);
  };
  if (kVectorized && first + kWidth <= p.classes) {
    opmath_t values[kWidth];
    const int64_t v = first / kWidth;
    unpack_vec(load_vec<kBytes>(logits, v), values);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) values[i] = gradient(values[i], first + i);
    store_vec<kBytes>(grad_logits, v, pack_vec<scalar_t, kBytes>(values));
    return;
  }
  const int64_t end = first + kWidth < p.classes ? first + kWidth : p.classes;
  for (int64_t j = first; j < end; ++j) {
    grad_logits[j] = static_cast<scalar_t>(gradient(static_cast<opmath_t>(logits[j]), j));
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
  // The entropy's sum is kept only where the entropy is written.
  const bool entropy = p.entropy != nullptr;
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_log_probs_cuda", [&] {
    const bool vectorized = rows_aligned(p.logits, p.row_stride, sizeof(scalar_t));
    if (vectorized) {
      launch_log_probs_rows<scalar_t, true>(p, entropy, stream);
    } else {
      launch_log_probs_rows<scalar_t, false>(p, entropy, stream);
    }
  });
}

template <typename scalar_t, bool kVectorized>
void launch_log_probs_gradient(const LogProbsGradientTile& p, int64_t classes_total, cudaStream_t stream) {
  auto kernel = p.softcap > 0 ? log_probs_gradient_kernel<scalar_t, kVectorized, true>
                              : log_probs_gradient_kernel<scalar_t, kVectorized, false>;
  constexpr int64_t kWidth = kVectorized ? 16 / int64_t(sizeof(scalar_t)) : 1;
  const int64_t column_blocks = (p.classes + kTileThreads * kWidth - 1) / (kTileThreads * kWidth);
  // Rows on x (up to 2^31 - 1), a row's classes on y: a chunk of classes (launch_plan.h) needs far fewer
  // than 65535 blocks of 2048 or more.
  TORCH_CHECK(column_blocks <= 65535 && p.rows < (int64_t(1) << 31),
              "fused::linear_log_probs_backward: a chunk of ", p.rows, " rows x ", p.classes,
              " classes is past the kernel's grid");
  launch_kernel(kernel, dim3(static_cast<unsigned int>(p.rows), static_cast<unsigned int>(column_blocks)),
                kTileThreads, 0, stream, p, classes_total);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void log_probs_gradient_cuda(const LogProbsGradientTile& p, int64_t classes_total, at::ScalarType dtype) {
  if (p.rows == 0 || p.classes == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "linear_log_probs_backward_cuda", [&] {
    const bool vectorized = rows_aligned(p.logits, p.row_stride, sizeof(scalar_t)) &&
                            rows_aligned(p.grad_logits, p.grad_row_stride, sizeof(scalar_t));
    if (vectorized) {
      launch_log_probs_gradient<scalar_t, true>(p, classes_total, stream);
    } else {
      launch_log_probs_gradient<scalar_t, false>(p, classes_total, stream);
    }
  });
}

}  // namespace
}  // namespace cuda

LogProbsBackend log_probs_cuda_backend() {
  const CrossEntropyBackend device = cross_entropy_cuda_backend();
  return {cuda::log_probs_rows_cuda, cuda::log_probs_gradient_cuda, device.available_bytes, device.check_targets,
          device.zero_row_padding};
}

}  // namespace fused_ops
