#pragma once
// The cached path (launch_plan.h): each thread keeps its packs of a row in registers, so x (and grad)
// are read from memory once. Forward: one block per row. Backward: a persistent grid whose blocks add
// grad·n (and grad) for their rows into per-column sums and write one partial row each, which
// column_sum_kernel adds in block order (deterministic; none when one block covers every row); or,
// for decode rows, one block per row storing the row's mean and rstd for weight_gradient_sums.cuh.
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../../common/cuda_launch.cuh"
#include "../../common/vector.cuh"
#include "row_math.cuh"

namespace fused_ops {
namespace cuda {

// Mean of a row that the block holds as packs (pack k of a thread is threadIdx.x + k * blockDim.x);
// 0 for RMSNorm, which does not center.
template <NormKind kKind, typename acc_t, typename T, int kBytes, int kPacks>
__device__ __forceinline__ acc_t cached_row_mean(const Vec<T, kBytes> (&packs)[kPacks], int64_t packs_per_row,
                                                 acc_t inverse_columns, acc_t* shared) {
  constexpr int kWidth = Vec<T, kBytes>::kSize;
  if constexpr (kKind == NormKind::RMS) {
    return acc_t(0);
  } else {
    acc_t sum[1] = {0};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (threadIdx.x + int64_t(k) * blockDim.x >= packs_per_row) continue;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) sum[0] += static_cast<acc_t>(packs[k].values[j]);
    }
    block_sum(sum, shared);
    return sum[0] * inverse_columns;
  }
}


// Hides a 16-byte pack's words from the compiler (an empty asm statement, no instruction), so that
// values it converted to float before this point are converted again after it, not held in registers.
template <typename T, int kBytes>
__device__ __forceinline__ void drop_float_copies(Vec<T, kBytes>& pack) {
  static_assert(kBytes == 16, "drop_float_copies takes 16-byte packs");
  auto* words = reinterpret_cast<unsigned int*>(pack.values);
  asm volatile("" : "+r"(words[0]), "+r"(words[1]), "+r"(words[2]), "+r"(words[3]));
}

// kLoadsBeforeStores (a residual is required): every pack of x and residual is loaded before the
// first residual_out store. Interleaved, the compiler cannot move pack k+1's loads above pack k's
// store (residual_out may alias them), so a thread waits one memory latency per pack.
// kDropFloatCopies: the output pass converts the row's packs to float again (drop_float_copies).
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks, bool kLoadsBeforeStores,
          bool kDropFloatCopies = false>
__device__ __forceinline__ void norm_forward_cached_rows(const NormForwardProblem& p) {
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ acc_t shared[32];
  const int64_t packs_per_row = p.columns / kWidth;
  const acc_t inverse_columns = inverse_columns_of<acc_t>(p);
  auto add_residual = [&](XPack& sum, const XPack& residual) {
    add_residual_pack<kLoadsBeforeStores>(sum, residual);
  };
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    XPack h[kPacks];
    if constexpr (kLoadsBeforeStores) {
      // Only launched with a residual. Its load is unconditional: a branch around it let the
      // compiler unpack x, waiting for its load, before issuing the residual's (SASS).
      XPack residual[kPacks];
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
        if (pack >= packs_per_row) continue;
        h[k] = load_pack<scalar_t, kWidth>(p.x, row * p.x_row_stride, pack);
        residual[k] = load_pack<scalar_t, kWidth>(p.residual, row * p.residual_row_stride, pack);
      }
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
        if (pack >= packs_per_row) continue;
        add_residual(h[k], residual[k]);
        store_pack<scalar_t, kWidth>(p.residual_out, row * p.columns, pack, h[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
        if (pack >= packs_per_row) continue;
        h[k] = load_pack<scalar_t, kWidth>(p.x, row * p.x_row_stride, pack);
        if (p.residual) {
          add_residual(h[k], load_pack<scalar_t, kWidth>(p.residual, row * p.residual_row_stride, pack));
          store_pack<scalar_t, kWidth>(p.residual_out, row * p.columns, pack, h[k]);
        }
      }
    }
    const acc_t mean = cached_row_mean<kKind>(h, packs_per_row, inverse_columns, shared);
    acc_t squares[1] = {0};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (threadIdx.x + int64_t(k) * blockDim.x >= packs_per_row) continue;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const acc_t centered = static_cast<acc_t>(h[k].values[j]) - mean;
        squares[0] += centered * centered;
      }
    }
    block_sum(squares, shared);
    // RMSNorm divides: with a multiply ptxas hoists the weight loads above the reduction and the
    // two-pack forward needs 51 registers instead of 40.
    const acc_t variance = kKind == NormKind::RMS ? squares[0] / p.columns : squares[0] * inverse_columns;
    const acc_t rstd = reciprocal_sqrt(variance + static_cast<acc_t>(p.eps));
    if constexpr (kDropFloatCopies) {
#pragma unroll
      for (int k = 0; k < kPacks; ++k) drop_float_copies(h[k]);
    }
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
      if (pack >= packs_per_row) continue;
      const WPack weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
      WPack bias;
      if (p.bias) bias = load_pack<weight_t, kWidth>(p.bias, 0, pack);
      // normalized_pack's math written out: through the helper, the one-pack bf16 RMS forward over
      // float weights (with a residual) needs 40 registers instead of 32.
      XPack out;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        acc_t value = (static_cast<acc_t>(h[k].values[j]) - mean) * rstd * offset_weight<acc_t>(p, weight.values[j]);
        if (p.bias) value += static_cast<acc_t>(bias.values[j]);
        out.values[j] = static_cast<scalar_t>(value);
      }
      store_pack<scalar_t, kWidth>(p.out, row * p.columns, pack, out);
    }
  }
}

// kLoadsBeforeStores here only at one pack per thread; more packs load first in
// norm_forward_cached_loads_first_kernel below.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks, bool kLoadsBeforeStores = false>
__global__ void __launch_bounds__(kPacks == 1 ? kNormWideBlockThreads : kNormMaxThreads)
    norm_forward_cached_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  norm_forward_cached_rows<scalar_t, weight_t, kKind, kWidth, kPacks, kLoadsBeforeStores>(p);
}

// Many rows of four 16-bit packs per thread in blocks of 512, without a residual: three blocks per SM
// (40 registers, the float copies of the row dropped so nothing spills) instead of the plain kernel's
// two at 64 registers. Blocks of 256 lose with it, and the bound alone spills.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks>
__global__ void __launch_bounds__(kNormMaxThreads, 3) norm_forward_cached_three_blocks_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  norm_forward_cached_rows<scalar_t, weight_t, kKind, kWidth, kPacks, false, true>(p);
}

// Loads first with a residual, held to 64 registers (four blocks of 256 per SM, as the plain four-pack
// kernel), which ptxas schedules better than the unbounded kernel at the same count. A separate kernel:
// an explicit minimum of blocks on the plain kernel changes ptxas's choices there (80 registers).
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks>
__global__ void __launch_bounds__(kNormMaxThreads, 2) norm_forward_cached_loads_first_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  norm_forward_cached_rows<scalar_t, weight_t, kKind, kWidth, kPacks, true>(p);
}

// Loads first pay off for 16-bit packs (bf16 and float16, one to four packs per thread, with packed
// adds); float32 and float64 keep the plain kernel.
template <typename scalar_t, int kWidth>
constexpr bool forward_loads_first_fits() {
  return kWidth * sizeof(scalar_t) == 16 &&
         (std::is_same_v<scalar_t, c10::BFloat16> || std::is_same_v<scalar_t, c10::Half>);
}

// grad_x for the block's rows. The block's sums of grad·n (and grad) per column are kept either in
// registers (kSharedSums false) or in shared memory as 16-byte chunks laid out [chunk][pack], so a
// warp's accesses are consecutive and vectorized (each thread only touches its own columns). They
// end as row blockIdx.x of weight_partials / bias_partials ([gridDim.x, columns], opmath), or, for a
// grid of one block, directly in grad_weight / grad_bias. Registers win for RMSNorm rows of over 512
// packs, shared memory everywhere else (the launch plan's shared_sums).

// Staged (kStaged): while the block reduces and writes one row, cp.async copies the x and
// grad of its next row, then that row's grad_residual, into shared memory, so the row loop waits on
// memory only when a copy is late (unstaged, a block stalls twice per row: on its loads, and on
// grad_residual's). Each thread copies and reads only its own slots.
// Staging needs 16-byte packs; it is compiled only for several packs per thread (long rows).
template <int kWidth, int kPacks>
constexpr bool stageable_backward(size_t element_size) {
  return kPacks > 1 && kWidth * element_size == 16;
}

// Staging slots in bytes: x and grad (and grad_residual) per pack.
inline size_t backward_staging_bytes(bool has_grad_residual, int threads, int packs_per_thread) {
  return size_t(has_grad_residual ? 3 : 2) * threads * packs_per_thread * 16;
}

// kRowStatistics (decode, one block per row): no column sums; each row's mean and rstd go to
// `row_statistics` ([rows, 2]) for weight_grad_kernel, which sums by columns with every SM.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks, bool kSharedSums,
          bool kStaged, bool kRowStatistics = false>
__global__ void __launch_bounds__(kPacks == 1 ? kNormBackwardWideBlockThreads<kKind> : kNormMaxThreads)
    norm_backward_cached_kernel(NormBackwardProblem p, at::opmath_type<scalar_t>* weight_partials,
                                at::opmath_type<scalar_t>* bias_partials, at::opmath_type<scalar_t>* row_statistics) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  static_assert(!kRowStatistics || (!kSharedSums && !kStaged), "row statistics replace the column sums");
  // Decode rows (one per block) of up to two packs per thread load weight and grad_residual with x
  // and grad, not after the reduction, so their latency overlaps.
  constexpr bool kEarlyLoads = kRowStatistics && kPacks <= 2;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  constexpr int kChunk = std::min<int>(kWidth, 16 / sizeof(acc_t));
  constexpr int kChunksPerPack = kWidth / kChunk;
  using Chunk = Pack<acc_t, kChunk>;
  __shared__ acc_t shared[32 * 3];
  extern __shared__ __align__(16) unsigned char norm_shared_bytes[];
  const int64_t packs_per_row = p.columns / kWidth;
  const acc_t inverse_columns = inverse_columns_of<acc_t>(p);
  Chunk* weight_sums = reinterpret_cast<Chunk*>(norm_shared_bytes);
  Chunk* bias_sums = weight_sums + p.columns / kChunk;  // Layer only
  // Staging slots [input (x, grad, grad_residual)][k][threadIdx.x], after the sums.
  constexpr int kSumRows = kSharedSums ? (kKind == NormKind::Layer ? 2 : 1) : 0;
  XPack* staging = reinterpret_cast<XPack*>(norm_shared_bytes + kSumRows * p.columns * sizeof(acc_t));
  static_assert(!kStaged || stageable_backward<kWidth, kPacks>(sizeof(scalar_t)), "staging needs 16-byte packs");
  auto slot = [&](int input, int k) { return staging + (input * kPacks + k) * blockDim.x + threadIdx.x; };
  // The copy loops stay rolled: unrolled, their addresses stay live and the LayerNorm kernel spilled.
  auto stage_x_and_grad = [&](int64_t row) {
    if (row < p.rows) {
#pragma unroll 1
      for (int k = 0; k < kPacks; ++k) {
        const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
        if (pack >= packs_per_row) continue;
        copy_async<16>(slot(0, k), static_cast<const scalar_t*>(p.x) + row * p.x_row_stride + pack * kWidth);
        copy_async<16>(slot(1, k), static_cast<const scalar_t*>(p.grad) + row * p.grad_row_stride + pack * kWidth);
      }
    }
    commit_async_copies();  // an empty group past the last row keeps the waits' counts right
  };
  auto stage_grad_residual = [&](int64_t row) {
    if (p.grad_residual && row < p.rows) {
#pragma unroll 1
      for (int k = 0; k < kPacks; ++k) {
        const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
        if (pack >= packs_per_row) continue;
        copy_async<16>(slot(2, k), static_cast<const scalar_t*>(p.grad_residual) +
                                            row * p.grad_residual_row_stride + pack * kWidth);
      }
    }
    commit_async_copies();
  };
  // Groups are committed in the order x/grad(row), grad_residual(row), x/grad(next row), ..., so
  // waiting until one group is pending completes the older of the two in flight.
  if constexpr (kStaged) {
    stage_x_and_grad(blockIdx.x);
    stage_grad_residual(blockIdx.x);
  }
  Chunk weight_registers[kSharedSums ? 1 : kPacks][kChunksPerPack] = {};
  Chunk bias_registers[kSharedSums || kKind != NormKind::Layer ? 1 : kPacks][kChunksPerPack] = {};
  if constexpr (kSharedSums) {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
      if (pack >= packs_per_row) continue;
#pragma unroll
      for (int c = 0; c < kChunksPerPack; ++c) {
        weight_sums[c * packs_per_row + pack] = Chunk{};
        if constexpr (kKind == NormKind::Layer) bias_sums[c * packs_per_row + pack] = Chunk{};
      }
    }
  }
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    XPack x[kPacks];
    XPack grad[kPacks];
    WPack early_weight[kEarlyLoads ? kPacks : 1];
    XPack early_grad_residual[kEarlyLoads ? kPacks : 1];
    if constexpr (kStaged) wait_async_copies<1>();  // this row's x and grad
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
      if (pack >= packs_per_row) continue;
      if constexpr (kStaged) {
        x[k] = *slot(0, k);
        grad[k] = *slot(1, k);
      } else {
        x[k] = load_pack<scalar_t, kWidth>(p.x, row * p.x_row_stride, pack);
        grad[k] = load_pack<scalar_t, kWidth>(p.grad, row * p.grad_row_stride, pack);
      }
      if constexpr (kEarlyLoads) {
        early_weight[k] = load_pack<weight_t, kWidth>(p.weight, 0, pack);
        if (p.grad_residual) {
          early_grad_residual[k] =
              load_pack<scalar_t, kWidth>(p.grad_residual, row * p.grad_residual_row_stride, pack);
        }
      }
    }
    const acc_t mean = cached_row_mean<kKind>(x, packs_per_row, inverse_columns, shared);
    // Σ (h - mean)², Σ gw·(h - mean), Σ gw in one reduction.
    acc_t sums[3] = {0, 0, 0};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
      if (pack >= packs_per_row) continue;
      WPack weight;
      if constexpr (kEarlyLoads) {
        weight = early_weight[k];
      } else {
        weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
      }
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        add_backward_terms(sums, static_cast<acc_t>(x[k].values[j]), static_cast<acc_t>(grad[k].values[j]),
                           offset_weight<acc_t>(p, weight.values[j]), mean);
      }
    }
    // The slots' x and grad are in registers and used above: the next row's copies may land.
    if constexpr (kStaged) stage_x_and_grad(row + gridDim.x);
    const BackwardRow<acc_t> statistics = backward_row<kKind>(mean, sums, inverse_columns, p.eps, shared);
    if constexpr (kRowStatistics) {
      if (threadIdx.x == 0) {
        row_statistics[2 * row] = statistics.mean;
        row_statistics[2 * row + 1] = statistics.rstd;
      }
    }
    if constexpr (kStaged) wait_async_copies<1>();  // this row's grad_residual; the next row's x and grad may pend
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
      if (pack >= packs_per_row) continue;
      WPack weight;
      XPack grad_residual;
      if constexpr (kEarlyLoads) {
        weight = early_weight[k];
        grad_residual = early_grad_residual[k];
      } else {
        weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
        if (p.grad_residual) {
          grad_residual = kStaged ? *slot(2, k)
                                : load_pack<scalar_t, kWidth>(p.grad_residual, row * p.grad_residual_row_stride, pack);
        }
      }
      Chunk weight_chunks[kChunksPerPack];
      Chunk bias_chunks[kChunksPerPack];
#pragma unroll
      for (int c = 0; c < (kRowStatistics ? 0 : kChunksPerPack); ++c) {
        if constexpr (kSharedSums) {
          weight_chunks[c] = weight_sums[c * packs_per_row + pack];
          if constexpr (kKind == NormKind::Layer) bias_chunks[c] = bias_sums[c * packs_per_row + pack];
        } else {
          weight_chunks[c] = weight_registers[k][c];
          if constexpr (kKind == NormKind::Layer) bias_chunks[c] = bias_registers[k][c];
        }
      }
      XPack grad_x;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const acc_t g = static_cast<acc_t>(grad[k].values[j]);
        const acc_t n = statistics.normalized(static_cast<acc_t>(x[k].values[j]));
        acc_t value = statistics.grad_h(g, offset_weight<acc_t>(p, weight.values[j]), n);
        if (p.grad_residual) value += static_cast<acc_t>(grad_residual.values[j]);
        grad_x.values[j] = static_cast<scalar_t>(value);
        if constexpr (!kRowStatistics) {
          weight_chunks[j / kChunk].values[j % kChunk] += g * n;
          if constexpr (kKind == NormKind::Layer) bias_chunks[j / kChunk].values[j % kChunk] += g;
        }
      }
#pragma unroll
      for (int c = 0; c < (kRowStatistics ? 0 : kChunksPerPack); ++c) {
        if constexpr (kSharedSums) {
          weight_sums[c * packs_per_row + pack] = weight_chunks[c];
          if constexpr (kKind == NormKind::Layer) bias_sums[c * packs_per_row + pack] = bias_chunks[c];
        } else {
          weight_registers[k][c] = weight_chunks[c];
          if constexpr (kKind == NormKind::Layer) bias_registers[k][c] = bias_chunks[c];
        }
      }
      store_pack<scalar_t, kWidth>(p.grad_x, row * p.columns, pack, grad_x);
    }
    if constexpr (kStaged) stage_grad_residual(row + gridDim.x);
  }
  if constexpr (!kRowStatistics) {  // row statistics: weight_grad_kernel sums the columns
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      const int64_t pack = threadIdx.x + int64_t(k) * blockDim.x;
      if (pack >= packs_per_row) continue;
      acc_t weight_sum[kWidth], bias_sum[kWidth];
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const int64_t chunk = (j / kChunk) * packs_per_row + pack;
        if constexpr (kSharedSums) {
          weight_sum[j] = weight_sums[chunk].values[j % kChunk];
          if constexpr (kKind == NormKind::Layer) bias_sum[j] = bias_sums[chunk].values[j % kChunk];
        } else {
          weight_sum[j] = weight_registers[k][j / kChunk].values[j % kChunk];
          if constexpr (kKind == NormKind::Layer) bias_sum[j] = bias_registers[k][j / kChunk].values[j % kChunk];
        }
      }
      if (gridDim.x == 1) {
        weight_t weight_out[kWidth], bias_out[kWidth];
#pragma unroll
        for (int j = 0; j < kWidth; ++j) {
          weight_out[j] = static_cast<weight_t>(weight_sum[j]);
          if constexpr (kKind == NormKind::Layer) bias_out[j] = static_cast<weight_t>(bias_sum[j]);
        }
        store_consecutive(static_cast<weight_t*>(p.grad_weight) + pack * kWidth, weight_out);
        if constexpr (kKind == NormKind::Layer) {
          store_consecutive(static_cast<weight_t*>(p.grad_bias) + pack * kWidth, bias_out);
        }
      } else {
        store_consecutive(weight_partials + blockIdx.x * p.columns + pack * kWidth, weight_sum);
        if constexpr (kKind == NormKind::Layer) {
          store_consecutive(bias_partials + blockIdx.x * p.columns + pack * kWidth, bias_sum);
        }
      }
    }
  }
}

}  // namespace cuda
}  // namespace fused_ops
