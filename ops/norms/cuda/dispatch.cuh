#pragma once
// The norms' CUDA entry: check which operands take 16-byte packs, ask the launch plan for the path and
// block shape, and launch that path's kernels on the current stream.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "../../common/cuda_column_sum.cuh"
#include "../../common/cuda_device.cuh"
#include "../../common/cuda_launch.cuh"
#include "../../common/vector.cuh"
#include "../norm.h"
#include "cached_rows.cuh"
#include "clusters.cuh"
#include "launch_plan.h"
#include "long_rows.cuh"
#include "short_rows.cuh"
#include "weight_gradient_sums.cuh"

namespace fused_ops {
namespace cuda {

// Resident blocks of `kernel` on the current GPU (SMs × blocks per SM; 0 when `shared_bytes` does
// not fit), cached per (kernel, threads, shared bytes, device): the queries cost microseconds.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int threads, size_t shared_bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int64_t> cache;
  const int device = c10::cuda::current_device();
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, shared_bytes, device);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  int blocks_per_sm = 0;
  cudaFuncAttributes attributes;
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const size_t dynamic_limit = size_t(max_shared_bytes_per_block(device)) - attributes.sharedSizeBytes;
  if (shared_bytes > dynamic_limit) return cache.emplace(key, 0).first->second;
  // Without the opt-in a block gets 48 KiB of shared memory, static and dynamic together: test both,
  // or the staging that fits exactly beside the static arrays would count as not fitting.
  if (shared_bytes + attributes.sharedSizeBytes > 48 * 1024) {
    // Opt in to the whole limit, not to this size: a later launch may need more.
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dynamic_limit)));
  }
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads, shared_bytes));
  return cache.emplace(key, int64_t(blocks_per_sm) * sm_count(device)).first->second;
}

// Blocks of a persistent grid: as many as fit on the GPU at once, at most max_blocks_per_sm per SM.
template <typename Kernel>
int64_t persistent_blocks(Kernel kernel, int threads, size_t shared_bytes, int max_blocks_per_sm) {
  return std::min(resident_blocks(kernel, threads, shared_bytes), int64_t(sm_count()) * max_blocks_per_sm);
}

// One block per row (the kernels still loop, so the cap keeps them correct).
inline unsigned int row_grid(int64_t rows) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(rows, std::numeric_limits<int32_t>::max())));
}

// Calls body(std::integral_constant<int, kPacks>) for the packs per thread chosen at run time.
template <typename Body>
void with_packs_per_thread(int packs_per_thread, Body body) {
  switch (packs_per_thread) {
    case 1: body(std::integral_constant<int, 1>{}); break;
    case 2: body(std::integral_constant<int, 2>{}); break;
    default: body(std::integral_constant<int, 4>{}); break;
  }
}

// Calls body(std::integral_constant<int, kWidth>) with the vector width or 1.
template <typename scalar_t, typename Body>
void with_pack_width(bool vectorized, Body body) {
  if (vectorized) {
    body(std::integral_constant<int, 16 / sizeof(scalar_t)>{});
  } else {
    body(std::integral_constant<int, 1>{});
  }
}

template <typename scalar_t, typename weight_t>
bool forward_vectorizable(const NormForwardProblem& p) {
  constexpr int width = 16 / sizeof(scalar_t);
  constexpr int64_t weight_pack_bytes = int64_t(sizeof(weight_t)) * width;
  return p.columns % width == 0 && rows_aligned(p.x, p.x_row_stride, sizeof(scalar_t)) &&
         rows_aligned(p.residual, p.residual_row_stride, sizeof(scalar_t)) && is_aligned(p.out) &&
         is_aligned(p.residual_out) && is_aligned(p.weight, weight_pack_bytes) && is_aligned(p.bias, weight_pack_bytes);
}

template <typename scalar_t, typename weight_t>
bool backward_vectorizable(const NormBackwardProblem& p) {
  constexpr int width = 16 / sizeof(scalar_t);
  return p.columns % width == 0 && rows_aligned(p.x, p.x_row_stride, sizeof(scalar_t)) &&
         rows_aligned(p.grad, p.grad_row_stride, sizeof(scalar_t)) &&
         rows_aligned(p.grad_residual, p.grad_residual_row_stride, sizeof(scalar_t)) && is_aligned(p.grad_x) &&
         is_aligned(p.weight, int64_t(sizeof(weight_t)) * width) && is_aligned(p.grad_weight) &&
         is_aligned(p.grad_bias);
}

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
void launch_norm_forward_cached(const NormForwardProblem& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  with_packs_per_thread(plan.packs_per_thread, [&](auto packs_constant) {
    constexpr int kPacks = decltype(packs_constant)::value;
    const dim3 grid = row_grid(p.rows);
    if constexpr (forward_loads_first_fits<scalar_t, kWidth>()) {
      if (plan.residual_loads_first) {
        if constexpr (kPacks >= 2) {
          launch_kernel(norm_forward_cached_loads_first_kernel<scalar_t, weight_t, kKind, kWidth, kPacks>, grid,
                        plan.threads, 0, stream, p);
        } else {
          launch_kernel(norm_forward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, true>, grid,
                        plan.threads, 0, stream, p);
        }
        return;
      }
    }
    if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && std::is_same_v<weight_t, scalar_t> && kWidth == 8 &&
                  kPacks == 4) {
      if (plan.three_blocks) {
        launch_kernel(norm_forward_cached_three_blocks_kernel<scalar_t, weight_t, kKind, kWidth, kPacks>, grid,
                      plan.threads, 0, stream, p);
        return;
      }
    }
    launch_kernel(norm_forward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks>, grid, plan.threads, 0,
                  stream, p);
  });
}

// Calls body(std::integral_constant<int, kThreadsPerRow>) for the plan's lanes per short row.
template <typename Body>
void with_threads_per_row(int threads_per_row, Body body) {
  switch (threads_per_row) {
    case 8: body(std::integral_constant<int, 8>{}); break;
    case 16: body(std::integral_constant<int, 16>{}); break;
    default: body(std::integral_constant<int, 32>{}); break;
  }
}

// Short rows come in 16-byte packs only (the plan asks for them); other widths compile no kernel.
template <typename scalar_t, int kWidth>
constexpr bool short_rows_width() {
  return kWidth * sizeof(scalar_t) == 16;
}

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
void launch_norm_forward_short_rows(const NormForwardProblem& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  with_threads_per_row(plan.threads_per_row, [&](auto lanes_constant) {
    constexpr int kThreadsPerRow = decltype(lanes_constant)::value;
    constexpr int64_t kRowsPerBlock = kShortRowBlockThreads / kThreadsPerRow;
    launch_kernel(norm_forward_short_rows_kernel<scalar_t, weight_t, kKind, kWidth, kThreadsPerRow>,
                  row_grid((p.rows + kRowsPerBlock - 1) / kRowsPerBlock), plan.threads, 0, stream, p);
  });
}

template <NormKind kKind>
void norm_forward_cuda(const NormForwardProblem& p, at::ScalarType dtype, at::ScalarType weight_dtype,
                       c10::Device device) {
  if (p.rows == 0 || p.columns == 0) return;
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_MIXED_TYPES(dtype, weight_dtype, "norm_forward_cuda", [&] {
    const bool vectorized = forward_vectorizable<scalar_t, weight_t>(p);
    const NormLaunchPlan plan = plan_norm(
        {p.rows, p.columns, dtype, weight_dtype, kKind, false, p.residual != nullptr, vectorized, runs_sm90_code()});
    with_pack_width<scalar_t>(vectorized, [&](auto width_constant) {
      constexpr int kWidth = decltype(width_constant)::value;
      switch (plan.path) {
        case NormPath::Cluster:
          launch_norm_forward_cluster<scalar_t, weight_t, kKind, kWidth>(p, plan, stream);
          break;
        case NormPath::Cached:
          launch_norm_forward_cached<scalar_t, weight_t, kKind, kWidth>(p, plan, stream);
          break;
        case NormPath::ShortRows:
          if constexpr (short_rows_width<scalar_t, kWidth>()) {
            launch_norm_forward_short_rows<scalar_t, weight_t, kKind, kWidth>(p, plan, stream);
          } else {
            TORCH_INTERNAL_ASSERT(false, "norm_forward_cuda: short rows are planned for 16-byte packs only");
          }
          break;
        case NormPath::LongRows:
          launch_kernel(norm_forward_long_row_kernel<scalar_t, weight_t, kKind, kWidth>, row_grid(p.rows),
                        plan.threads, 0, stream, p);
          break;
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
}

// A persistent backward grid over `work_items` (rows, or groups of rows) of at most `blocks` blocks,
// each writing one partial row of column sums (one block writes the gradients itself), then
// column_sum_kernel over the partial rows. `extra` follows the kernel's partials arguments.
template <typename scalar_t, typename weight_t, NormKind kKind, typename Kernel, typename... Extra>
void launch_backward_with_column_sums(Kernel kernel, int64_t work_items, int64_t blocks, int threads,
                                      size_t shared_bytes, const NormBackwardProblem& p,
                                      const at::TensorOptions& acc_options, cudaStream_t stream, Extra... extra) {
  using acc_t = at::opmath_type<scalar_t>;
  const int sums = kKind == NormKind::Layer ? 2 : 1;  // weight (and bias)
  const unsigned int grid = static_cast<unsigned int>(std::max<int64_t>(1, std::min(work_items, blocks)));
  const at::Tensor partials = grid > 1 ? at::empty({sums, grid, p.columns}, acc_options) : at::Tensor();
  acc_t* weight_partials = grid > 1 ? partials.mutable_data_ptr<acc_t>() : nullptr;
  acc_t* bias_partials = grid > 1 && sums == 2 ? weight_partials + int64_t(grid) * p.columns : nullptr;
  const bool early = persistent_backward_launches_early(work_items, blocks);
  launch_kernel_at(early, kernel, grid, threads, shared_bytes, stream, p, weight_partials, bias_partials, extra...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (grid > 1) {
    launch_column_sums(weight_partials, sums, int64_t(grid), p.columns, static_cast<weight_t*>(p.grad_weight),
                       static_cast<weight_t*>(p.grad_bias), stream, early);
  }
}

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
void launch_norm_backward_short_rows(const NormBackwardProblem& p, const NormLaunchPlan& plan,
                                     const at::TensorOptions& acc_options, cudaStream_t stream) {
  with_threads_per_row(plan.threads_per_row, [&](auto lanes_constant) {
    constexpr int kThreadsPerRow = decltype(lanes_constant)::value;
    constexpr int64_t kRowsPerBlock = kShortRowBlockThreads / kThreadsPerRow;
    const auto kernel = norm_backward_short_rows_kernel<scalar_t, weight_t, kKind, kWidth, kThreadsPerRow>;
    launch_backward_with_column_sums<scalar_t, weight_t, kKind>(
        kernel, (p.rows + kRowsPerBlock - 1) / kRowsPerBlock,
        persistent_blocks(kernel, plan.threads, 0, plan.max_blocks_per_sm), plan.threads, 0, p, acc_options, stream);
  });
}

// The persistent cached backward: the staged kernel where the plan's rule prefers it, else the plain
// one. Returns false when neither fits this GPU's shared memory (the caller takes the long-row path).
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks, bool kSharedSums>
bool launch_norm_backward_persistent(const NormBackwardProblem& p, const NormLaunchPlan& plan,
                                     const at::TensorOptions& acc_options, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const int sums = kKind == NormKind::Layer ? 2 : 1;  // weight (and bias)
  auto launch = [&](auto kernel, size_t shared_bytes, int64_t blocks) {
    launch_backward_with_column_sums<scalar_t, weight_t, kKind>(kernel, p.rows, blocks, plan.threads, shared_bytes,
                                                                p, acc_options, stream, static_cast<acc_t*>(nullptr));
  };
  const auto plain_kernel = norm_backward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, kSharedSums, false>;
  const size_t sum_bytes = kSharedSums ? size_t(sums) * p.columns * sizeof(acc_t) : 0;
  const int64_t plain_blocks = persistent_blocks(plain_kernel, plan.threads, sum_bytes, plan.max_blocks_per_sm);
  if constexpr (stageable_backward<kWidth, kPacks>(sizeof(scalar_t))) {
    const auto staged_kernel = norm_backward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, kSharedSums, true>;
    const size_t staged_bytes =
        sum_bytes + backward_staging_bytes(p.grad_residual != nullptr, plan.threads, plan.packs_per_thread);
    const int64_t staged_blocks = persistent_blocks(staged_kernel, plan.threads, staged_bytes, plan.max_blocks_per_sm);
    if (prefer_staged_backward(p.rows, plain_blocks, staged_blocks)) {
      launch(staged_kernel, staged_bytes, staged_blocks);
      return true;
    }
  }
  if (plain_blocks == 0) return false;
  launch(plain_kernel, sum_bytes, plain_blocks);
  return true;
}

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
bool launch_norm_backward_cached(const NormBackwardProblem& p, const NormLaunchPlan& plan,
                                 const at::TensorOptions& acc_options, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  bool launched = false;
  with_packs_per_thread(plan.packs_per_thread, [&](auto packs_constant) {
    constexpr int kPacks = decltype(packs_constant)::value;
    if (plan.row_statistics) {  // decode: one block per row
      const at::Tensor statistics = at::empty({p.rows, 2}, acc_options);
      launch_kernel(norm_backward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, false, false, true>,
                    static_cast<unsigned int>(p.rows), plan.threads, 0, stream, p, nullptr, nullptr,
                    statistics.mutable_data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      launch_weight_grad<scalar_t, weight_t, kKind>(p, statistics, plan.weight_gradient_row_groups, stream);
      launched = true;
    } else if (plan.shared_sums) {
      launched = launch_norm_backward_persistent<scalar_t, weight_t, kKind, kWidth, kPacks, true>(p, plan, acc_options,
                                                                                                 stream);
    } else {
      launched = launch_norm_backward_persistent<scalar_t, weight_t, kKind, kWidth, kPacks, false>(p, plan, acc_options,
                                                                                                  stream);
    }
  });
  return launched;
}

template <NormKind kKind>
void norm_backward_cuda(const NormBackwardProblem& p, at::ScalarType dtype, at::ScalarType weight_dtype,
                        c10::Device device) {
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (p.columns == 0) return;
  const auto weight_options = at::TensorOptions().dtype(weight_dtype).device(device);
  if (p.rows == 0) {  // sums over no rows
    at::from_blob(p.grad_weight, {p.columns}, weight_options).zero_();
    if (p.grad_bias) at::from_blob(p.grad_bias, {p.columns}, weight_options).zero_();
    return;
  }
  FUSED_DISPATCH_MIXED_TYPES(dtype, weight_dtype, "norm_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_options = at::TensorOptions().dtype(c10::CppTypeToScalarType<acc_t>::value).device(device);
    const bool vectorized = backward_vectorizable<scalar_t, weight_t>(p);
    const NormLaunchPlan plan =
        plan_norm({p.rows, p.columns, dtype, weight_dtype, kKind, true, false, vectorized, runs_sm90_code()});
    with_pack_width<scalar_t>(vectorized, [&](auto width_constant) {
      constexpr int kWidth = decltype(width_constant)::value;
      if (plan.path == NormPath::Cluster) {
        const at::Tensor statistics = plan.row_statistics ? at::empty({p.rows, 2}, acc_options) : at::Tensor();
        launch_norm_backward_cluster<scalar_t, weight_t, kKind, kWidth>(
            p, plan, plan.row_statistics ? statistics.mutable_data_ptr<acc_t>() : nullptr, stream);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        if (plan.row_statistics) {
          launch_weight_grad<scalar_t, weight_t, kKind>(p, statistics, plan.weight_gradient_row_groups, stream);
        }
        return;
      }
      if constexpr (short_rows_width<scalar_t, kWidth>()) {
        if (plan.path == NormPath::ShortRows) {
          launch_norm_backward_short_rows<scalar_t, weight_t, kKind, kWidth>(p, plan, acc_options, stream);
          return;
        }
      }
      if (plan.path == NormPath::Cached && launch_norm_backward_cached<scalar_t, weight_t, kKind, kWidth>(
                                               p, plan, acc_options, stream)) {
        return;
      }
      // Long rows, or cached rows whose block's shared memory does not fit this GPU.
      const at::Tensor statistics = at::empty({p.rows, 2}, acc_options);
      launch_kernel(norm_backward_long_row_kernel<scalar_t, weight_t, kKind, kWidth>, row_grid(p.rows),
                    kLongRowThreads, 0, stream, p, statistics.mutable_data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      launch_weight_grad<scalar_t, weight_t, kKind>(p, statistics, plan.weight_gradient_row_groups, stream);
    });
  });
}

}  // namespace cuda
}  // namespace fused_ops
