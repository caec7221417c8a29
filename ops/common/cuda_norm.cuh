#pragma once
// CUDA loops for the norms (see norm.h).
//   cached path (rows of up to kMaxCachedPacks packs): each thread keeps its packs of the row in
//     registers, as raw 16-bit or 32-bit values, so x (and grad) are read from memory once.
//     Forward: one block per row (measured faster than a persistent grid, as for relu_add).
//     Backward: a persistent grid; each block adds grad·n (and grad) for its rows into per-column
//     sums (registers or shared memory), writes them as one partial row, and column_sum_kernel
//     adds the partial rows in block order: deterministic weight and bias gradients for the cost
//     of one small pass (none when one block covers all rows). With several rows per block and
//     several packs per thread, each block's next row is copied into shared memory (cp.async)
//     while it works on the current one. Decode (2 to kNormFewRows rows): one block per row stores
//     the row's mean and rstd, and weight_grad_kernel sums by columns, as on the long-row path.
//   long-row path (longer rows): one block of 1024 threads per row passes over the row in memory
//     two or three times (the rows in flight fit in L2), and the backward stores each row's mean
//     and rstd so weight_grad_kernel sums grad·n by columns.
//   cluster path (rows of 2 to 8 blocks' packs, sm_90 and later): each row is split over a
//     thread-block cluster of blocks of 4 warps on as many SMs, reduced through distributed shared
//     memory; one row of 2 to 8 blocks, or up to 32 rows of 4 to 8 blocks (16 at 16384), one cluster
//     per row, forward and backward (a LayerNorm forward without residual only on eight blocks).
//     From 2 rows the backward stores each row's mean and rstd for weight_grad_kernel.
// A pack is 16 bytes of x when every row is 16-byte aligned and H fills whole packs, otherwise one
// element.
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "cuda_column_sum.cuh"
#include "cuda_device.cuh"
#include "cuda_elementwise.cuh"
#include "norm.h"

namespace fused_ops {
namespace cuda {

constexpr int kNormMaxThreads = 512;
// Decode (at most kNormFewRows rows, about one per SM): a forward row of up to kNormWideBlockThreads
// packs gets one pack per thread in a block of that many threads, so that one SM's row work is spread
// over 32 warps instead of 8. Measured on an H200: decode forward+backward 0.3-1.0 µs faster
// (docs/benchmarks.md, Change 3). Forwards whose residual loads first, and every backward since
// Change 16, keep blocks of 512 (cached_max_threads, cached_backward_max_threads).
constexpr int kNormWideBlockThreads = 1024;
constexpr int64_t kNormFewRows = 128;
constexpr int kNormMaxPacksPerThread = 4;
constexpr int64_t kMaxCachedPacks = int64_t(kNormMaxThreads) * kNormMaxPacksPerThread;
constexpr int kLongRowThreads = 1024;

template <typename T, int kWidth>
struct alignas(sizeof(T) * kWidth) Pack {
  T values[kWidth];
};

template <typename T, int kWidth>
__device__ __forceinline__ Pack<T, kWidth> load_pack(const void* base, int64_t row_offset, int64_t pack) {
  return reinterpret_cast<const Pack<T, kWidth>*>(static_cast<const T*>(base) + row_offset)[pack];
}

template <typename T, int kWidth>
__device__ __forceinline__ void store_pack(void* base, int64_t row_offset, int64_t pack, const Pack<T, kWidth>& value) {
  reinterpret_cast<Pack<T, kWidth>*>(static_cast<T*>(base) + row_offset)[pack] = value;
}

// The 32-bit shared-window address of a pointer to shared memory, as PTX's shared-space operands take.
__device__ __forceinline__ unsigned int shared_address(const void* pointer) {
  return static_cast<unsigned int>(__cvta_generic_to_shared(pointer));
}

// Asynchronous 16-byte copies from global to shared memory (cp.async, sm_80 and later): the copy
// occupies no registers while in flight. Copies committed together form a group; groups complete in
// order, and wait_async_copies<N> returns once at most N of this thread's groups are pending.
__device__ __forceinline__ void copy_16_bytes_async(void* shared_destination, const void* global_source) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared_destination)),
               "l"(global_source)
               : "memory");
#else
  *static_cast<uint4*>(shared_destination) = *static_cast<const uint4*>(global_source);
#endif
}

__device__ __forceinline__ void commit_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Sums kCount values over the block (blockDim.x a multiple of 32) in a fixed order; every thread
// gets the sums. `shared` holds 32 * kCount values.
template <int kCount, typename acc_t>
__device__ __forceinline__ void block_sum(acc_t (&values)[kCount], acc_t* shared) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kCount; ++i) values[i] = warp_sum(values[i]);
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) shared[i * 32 + warp] = values[i];
  }
  __syncthreads();
  const int warps = blockDim.x / 32;
#pragma unroll
  for (int i = 0; i < kCount; ++i) values[i] = warp_sum(lane < warps ? shared[i * 32 + lane] : acc_t(0));
}

template <typename acc_t>
__device__ __forceinline__ acc_t reciprocal_sqrt(acc_t value) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return ::rsqrt(value);
  } else {
    return rsqrtf(value);
  }
}

// 1 / columns from the problem (a kernel parameter, which an FMUL reads as its operand): the row
// statistics multiply by it instead of dividing (an IEEE division is a dozen instructions with its
// slow-path check, on each reduction's critical path). The two-pack LayerNorm forward needs 40
// registers instead of 53 (H200 bf16 4096x4096: 25.5 -> 21.7 us). Exact for power-of-two rows, else
// within one rounding of the division.
template <typename acc_t, typename Problem>
__device__ __forceinline__ acc_t inverse_columns_of(const Problem& p) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return p.inverse_columns_double;
  } else {
    return p.inverse_columns_float;
  }
}

// Backward of one row: its sums Σ (h - mean)², Σ gw·(h - mean), Σ gw (gw = grad · weight) over
// the block give rstd and the means in grad_h = rstd · (gw - mean(gw) - n · mean(gw · n)),
// n = (h - mean) · rstd (RMS: mean = mean(gw) = 0).
template <typename acc_t>
__device__ __forceinline__ void add_backward_terms(acc_t (&sums)[3], acc_t h, acc_t grad, acc_t weight, acc_t mean) {
  const acc_t centered = h - mean;
  const acc_t gw = grad * weight;
  sums[0] += centered * centered;
  sums[1] += gw * centered;
  sums[2] += gw;
}

template <typename acc_t>
struct BackwardRow {
  acc_t mean;
  acc_t rstd;
  acc_t mean_gw;
  acc_t mean_gw_n;
  __device__ __forceinline__ acc_t normalized(acc_t h) const { return (h - mean) * rstd; }
  __device__ __forceinline__ acc_t grad_h(acc_t grad, acc_t weight, acc_t n) const {
    return rstd * (grad * weight - mean_gw - n * mean_gw_n);
  }
};

// From the row's sums, already reduced.
template <NormKind kKind, typename acc_t>
__device__ __forceinline__ BackwardRow<acc_t> backward_row_of_sums(acc_t mean, const acc_t (&sums)[3],
                                                                  acc_t inverse_columns, double eps) {
  const acc_t rstd = reciprocal_sqrt(sums[0] * inverse_columns + static_cast<acc_t>(eps));
  return {mean, rstd, kKind == NormKind::Layer ? sums[2] * inverse_columns : acc_t(0),
          sums[1] * rstd * inverse_columns};
}

template <NormKind kKind, typename acc_t>
__device__ __forceinline__ BackwardRow<acc_t> backward_row(acc_t mean, acc_t (&sums)[3], acc_t inverse_columns,
                                                          double eps, acc_t* shared) {
  block_sum(sums, shared);
  return backward_row_of_sums<kKind>(mean, sums, inverse_columns, eps);
}

// ---------------------------------------------------------------------------------------------
// Cached path.

// Mean of a row that the block holds as packs (pack k of a thread is threadIdx.x + k * blockDim.x);
// 0 for RMSNorm, which does not center.
template <NormKind kKind, typename acc_t, typename T, int kWidth, int kPacks>
__device__ __forceinline__ acc_t cached_row_mean(const Pack<T, kWidth> (&packs)[kPacks], int64_t packs_per_row,
                                                 acc_t inverse_columns, acc_t* shared) {
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


// sum = x + residual, rounded to x's type. kPacked (16-bit pairs): HADD2, the exact sum rounded once,
// which is float addition then rounding (for float16 checked on every pair of finite values); the
// sums stay packed: bf16 four packs load first in 64 registers (96-98 with float additions).
template <bool kPacked, typename scalar_t, int kWidth>
__device__ __forceinline__ void add_residual_pack(Pack<scalar_t, kWidth>& sum, const Pack<scalar_t, kWidth>& residual) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool kBFloat16 = std::is_same_v<scalar_t, c10::BFloat16>;
  if constexpr (kPacked && (kBFloat16 || std::is_same_v<scalar_t, c10::Half>) && kWidth % 2 == 0) {
    using Pair = std::conditional_t<kBFloat16, __nv_bfloat162, __half2>;
    auto* sum_pairs = reinterpret_cast<Pair*>(sum.values);
    const auto* residual_pairs = reinterpret_cast<const Pair*>(residual.values);
#pragma unroll
    for (int j = 0; j < kWidth / 2; ++j) sum_pairs[j] = __hadd2(sum_pairs[j], residual_pairs[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      sum.values[j] = static_cast<scalar_t>(static_cast<acc_t>(sum.values[j]) + static_cast<acc_t>(residual.values[j]));
    }
  }
}

// Hides a 16-byte pack's words from the compiler (an empty asm statement, no instruction), so that
// values it converted to float before this point are converted again after it, not held in registers.
template <typename T, int kWidth>
__device__ __forceinline__ void drop_float_copies(Pack<T, kWidth>& pack) {
  static_assert(sizeof(Pack<T, kWidth>) == 16, "drop_float_copies takes 16-byte packs");
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
    // RMSNorm divides: its multiply let ptxas hoist the weight loads above the reduction, 40 -> 51
    // registers in the two-pack forward (H200 bf16 4096x4096: 19.5 -> 21.5 us).
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
      XPack out;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        acc_t value = (static_cast<acc_t>(h[k].values[j]) - mean) * rstd * static_cast<acc_t>(weight.values[j]);
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
// (40 registers, the float copies of the row dropped so nothing spills) instead of two at the plain
// kernel's 64. H200 bf16 4096x16384 forward: rms_norm 66.4 -> 65.2 µs, layer_norm 72.3 -> 67.7
// (torch.compile 66.4 and 69.8). At 256 threads (16384x8192) it lost (rms_norm 128.7 -> 131.7), and
// the bound alone spilled 64-104 bytes (docs/benchmarks.md Change 19).
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks>
__global__ void __launch_bounds__(kNormMaxThreads, 3) norm_forward_cached_three_blocks_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  norm_forward_cached_rows<scalar_t, weight_t, kKind, kWidth, kPacks, false, true>(p);
}

// Loads first with a residual, held to 64 registers (4 blocks of 256 per SM, as the plain four-pack
// kernel): float16 four packs (add_layer_norm 4096x16384) ran 137 µs bounded, 143-148
// unbounded (both 64 registers, scheduled differently). A separate kernel: an explicit minimum of
// one block on the plain kernel changes ptxas's choices (bf16 four packs 64 -> 80 registers).
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks>
__global__ void __launch_bounds__(kNormMaxThreads, 2) norm_forward_cached_loads_first_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  norm_forward_cached_rows<scalar_t, weight_t, kKind, kWidth, kPacks, true>(p);
}

// Where loads first were measured to win (H200, add_rms_norm/add_layer_norm forwards, fused only):
// bf16 with two packs (add_layer_norm 4096x4096 39.3 -> 35.9-36.3 µs), bf16 with four and packed
// adds (add_layer_norm 4096x16384 149-153 -> 138-140, 16384x8192 274-275 -> 268) and float16 with
// four (add_layer_norm 4096x16384 150 -> 137, 16384x8192 273 -> 264-268), and float16 with two once
// its adds were packed too (add_layer_norm 4096x4096 37.1-37.8 -> 35.8; with float adds it ran 2-3 µs
// slower than the plain kernel). One pack per thread (bf16 and float16, fused only, the plain
// kernel issued the residual's load after x's arrived): add_layer_norm 16384x2048 70.4 -> 66.4 µs,
// 512x4096 4.99 -> 4.73, add_rms_norm 16384x2048 67.5 -> 65.9, 64x4096 2.57 -> 2.37 (Change 12).
// float32/float64: not measured.
template <typename scalar_t, int kWidth>
constexpr bool forward_loads_first_fits() {
  return kWidth * sizeof(scalar_t) == 16 &&
         (std::is_same_v<scalar_t, c10::BFloat16> || std::is_same_v<scalar_t, c10::Half>);
}

// ---------------------------------------------------------------------------------------------
// Cluster path (a few rows, on Hopper and later): each row's packs are split over a cluster of up to
// eight blocks of four warps, on as many SMs, which reduce through distributed shared memory. A row
// in one block runs 32 warps on one SM: ncu counts 11,296 warp instructions in the one-row
// add_layer_norm forward, at least 2,824 cycles of its SM's four schedulers, about half its time
// (docs/benchmarks.md, Change 10). The path takes only what gained on an H200 when each cluster-wide
// sum still cost a cluster barrier (bf16, one row of 8192, kernel times, docs/benchmarks.md Change 11):
// every backward (rms_norm 2.99 -> 2.35 us, layer_norm 3.54 -> 3.16) and the RMSNorm forwards
// (rms_norm 2.15 -> 1.95, add_rms_norm 2.57 -> 2.00). A LayerNorm forward over a cluster, with its
// second reduction, lost (layer_norm 2.56 -> 2.81), and so did 16 rows in clusters of eight
// (layer_norm backward 3.00 -> 3.61). With pushed sums the LayerNorm forward gains (1 x 8192
// 2.54 -> 1.98, add_layer_norm 16 x 8192 2.87 -> 2.15; Change 18).

constexpr int kClusterBlockThreads = 128;
constexpr int kClusterWarps = kClusterBlockThreads / 32;
constexpr int kMaxClusterBlocks = 8;  // the portable cluster size

// Cluster sums are pushed, not pulled. On sm_90 every cluster-scope release (cooperative_groups'
// sync, barrier.cluster.arrive.release, fence.acq_rel.cluster) compiles to MEMBAR.ALL.GPU, which waits
// for every store in flight; a sum read after such a barrier, and the exit barrier that kept each
// block's slots alive for the others, cost the one-row rms_norm forward 0.42 us of its 1.90 and its
// backward 0.51 of 2.10 (H200 bf16 x8192, docs/benchmarks.md Change 17). Instead each warp sends its
// partials to every block's inbox with st.async, whose bytes complete on the receiver's mbarrier: a
// block waits only for its own inbox, and no block reads another's shared memory, so none waits to exit.
// The inboxes are opened (mbarrier init, expected bytes) at the kernel's start, before one relaxed
// cluster barrier that every block passes before its first push.
template <int kCount, typename acc_t>
struct ClusterInbox {
  acc_t values[kMaxClusterBlocks][kClusterWarps][kCount];
  unsigned long long arrived;  // mbarrier: completes when every block's partials are in
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Thread 0 only, before cluster_inboxes_opened().
template <int kCount, typename acc_t>
__device__ __forceinline__ void open_inbox(ClusterInbox<kCount, acc_t>& inbox, int blocks) {
  const unsigned int bytes = static_cast<unsigned int>(blocks * kClusterWarps * kCount * sizeof(acc_t));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(&inbox.arrived)) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(&inbox.arrived)),
               "r"(bytes)
               : "memory");
}

// Every thread: thread 0 has opened this block's inboxes; arrive now, wait (cluster_inboxes_ready)
// before the first push.
__device__ __forceinline__ void cluster_inboxes_opened() {
  if (threadIdx.x == 0) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_inboxes_ready() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void push_value(float value, unsigned int remote_slot, unsigned int remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];\n" ::"r"(remote_slot),
               "f"(value), "r"(remote_barrier)
               : "memory");
}
__device__ __forceinline__ void push_value(double value, unsigned int remote_slot, unsigned int remote_barrier) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f64 [%0], %1, [%2];\n" ::"r"(remote_slot),
               "d"(value), "r"(remote_barrier)
               : "memory");
}

__device__ __forceinline__ unsigned int cluster_map(unsigned int address, int rank) {
  unsigned int remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  return remote;
}

// `values` summed over the cluster, the same in every thread (every warp adds the same partials in the
// same lanes, so the sum is deterministic). Each `inbox` serves one sum per kernel; the first sum waits
// in cluster_inboxes_ready() before it pushes.
template <int kCount, typename acc_t>
__device__ __forceinline__ void cluster_sum(acc_t (&values)[kCount], ClusterInbox<kCount, acc_t>& inbox) {
  namespace cg = cooperative_groups;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int blocks = static_cast<int>(cg::this_cluster().num_blocks());
  const int rank = static_cast<int>(cg::this_cluster().block_rank());
#pragma unroll
  for (int i = 0; i < kCount; ++i) values[i] = warp_sum(values[i]);
  if (lane < blocks) {  // lane r sends this warp's partials to block r
    const unsigned int remote_barrier = cluster_map(shared_address(&inbox.arrived), lane);
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      push_value(values[i], cluster_map(shared_address(&inbox.values[rank][warp][i]), lane), remote_barrier);
    }
  }
  const unsigned int barrier = shared_address(&inbox.arrived);
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(barrier)
      : "memory");
  const int partials = blocks * kClusterWarps;  // at most 32
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    const acc_t partial = lane < partials ? inbox.values[lane / kClusterWarps][lane % kClusterWarps][i] : acc_t(0);
    values[i] = warp_sum(partial);
  }
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// This thread's packs of its block's row: thread t of the cluster's block r holds packs
// r * kClusterBlockThreads * packs_per_thread + t + k * kClusterBlockThreads.
struct ClusterRowPacks {
  int64_t first_pack;
  int64_t packs_per_row;
  __device__ __forceinline__ ClusterRowPacks(int64_t packs_per_row, int packs_per_thread)
      : first_pack(int64_t(cooperative_groups::this_cluster().block_rank()) * kClusterBlockThreads * packs_per_thread +
                   threadIdx.x),
        packs_per_row(packs_per_row) {}
  __device__ __forceinline__ int64_t pack(int k) const { return first_pack + int64_t(k) * kClusterBlockThreads; }
  __device__ __forceinline__ bool in_row(int k) const { return pack(k) < packs_per_row; }
  template <typename T, int kWidth, int kPacks>
  __device__ __forceinline__ void load(Pack<T, kWidth> (&values)[kPacks], const void* base,
                                       int64_t row_offset = 0) const {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (in_row(k)) values[k] = load_pack<T, kWidth>(base, row_offset, pack(k));
    }
  }
};

// With a residual: h += residual for this thread's packs of the row, stored as residual_out.
template <typename scalar_t, int kWidth, int kPacks>
__device__ __forceinline__ void add_cluster_residual(const ClusterRowPacks& packs, const NormForwardProblem& p,
                                                     int64_t row, Pack<scalar_t, kWidth> (&h)[kPacks],
                                                     const Pack<scalar_t, kWidth> (&residual)[kPacks]) {
  if (!p.residual) return;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
    add_residual_pack<true>(h[k], residual[k]);
    store_pack<scalar_t, kWidth>(p.residual_out, row * p.columns, packs.pack(k), h[k]);
  }
}
#endif

// kWeightFirst (launched without a residual): weight loads before x, so its latency overlaps x's; one
// row of 8192 0.12 us faster on an H200 bf16, and 0.06 us slower with a residual (Change 13).
template <typename scalar_t, typename weight_t, int kWidth, int kPacks, bool kWeightFirst>
__global__ void __launch_bounds__(kClusterBlockThreads) rms_norm_forward_cluster_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ ClusterInbox<1, acc_t> square_inbox;
  if (threadIdx.x == 0) open_inbox(square_inbox, static_cast<int>(cg::this_cluster().num_blocks()));
  cluster_inboxes_opened();
  const ClusterRowPacks packs(p.columns / kWidth, kPacks);
  const int64_t row = blockIdx.x / cg::this_cluster().num_blocks();  // one cluster per row
  XPack h[kPacks];
  XPack residual[kPacks];
  WPack early_weight[kWeightFirst ? kPacks : 1];
  if constexpr (kWeightFirst) packs.load(early_weight, p.weight);
  // Every load before the first store (see kLoadsBeforeStores).
  packs.load(h, p.x, row * p.x_row_stride);
  if (p.residual) packs.load(residual, p.residual, row * p.residual_row_stride);
  add_cluster_residual(packs, p, row, h, residual);
  acc_t squares[1] = {0};
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const acc_t value = static_cast<acc_t>(h[k].values[j]);
      squares[0] += value * value;
    }
  }
  cluster_inboxes_ready();
  cluster_sum(squares, square_inbox);
  const acc_t rstd = reciprocal_sqrt(squares[0] * inverse_columns_of<acc_t>(p) + static_cast<acc_t>(p.eps));
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
    WPack weight;
    if constexpr (kWeightFirst) {
      weight = early_weight[k];
    } else {
      weight = load_pack<weight_t, kWidth>(p.weight, 0, packs.pack(k));
    }
    XPack out;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      out.values[j] =
          static_cast<scalar_t>(static_cast<acc_t>(h[k].values[j]) * rstd * static_cast<acc_t>(weight.values[j]));
    }
    store_pack<scalar_t, kWidth>(p.out, row * p.columns, packs.pack(k), out);
  }
#endif
}

// The LayerNorm forward on the same split, with two pushed sums: the mean, then the centred squares
// (two passes over registers, so a row far from zero keeps its precision). Barrier sums made this
// design lose (Change 11: layer_norm 1 x 8192 2.56 -> 2.81 us); pushed, it gains (Change 18).
template <typename scalar_t, typename weight_t, int kWidth, int kPacks>
__global__ void __launch_bounds__(kClusterBlockThreads) layer_norm_forward_cluster_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ ClusterInbox<1, acc_t> mean_inbox;
  __shared__ ClusterInbox<1, acc_t> square_inbox;
  if (threadIdx.x == 0) {
    const int blocks = static_cast<int>(cg::this_cluster().num_blocks());
    open_inbox(mean_inbox, blocks);
    open_inbox(square_inbox, blocks);
  }
  cluster_inboxes_opened();
  const ClusterRowPacks packs(p.columns / kWidth, kPacks);
  const int64_t row = blockIdx.x / cg::this_cluster().num_blocks();  // one cluster per row
  XPack h[kPacks];
  XPack residual[kPacks];
  WPack weight[kPacks];
  WPack bias[kPacks];
  packs.load(h, p.x, row * p.x_row_stride);
  if (p.residual) packs.load(residual, p.residual, row * p.residual_row_stride);
  packs.load(weight, p.weight);
  if (p.bias) packs.load(bias, p.bias);
  add_cluster_residual(packs, p, row, h, residual);
  acc_t sum[1] = {0};
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) sum[0] += static_cast<acc_t>(h[k].values[j]);
  }
  cluster_inboxes_ready();
  cluster_sum(sum, mean_inbox);
  const acc_t mean = sum[0] * inverse_columns_of<acc_t>(p);
  acc_t squares[1] = {0};
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const acc_t centered = static_cast<acc_t>(h[k].values[j]) - mean;
      squares[0] += centered * centered;
    }
  }
  cluster_sum(squares, square_inbox);
  const acc_t rstd = reciprocal_sqrt(squares[0] * inverse_columns_of<acc_t>(p) + static_cast<acc_t>(p.eps));
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
    XPack out;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      acc_t value = (static_cast<acc_t>(h[k].values[j]) - mean) * rstd * static_cast<acc_t>(weight[k].values[j]);
      if (p.bias) value += static_cast<acc_t>(bias[k].values[j]);
      out.values[j] = static_cast<scalar_t>(value);
    }
    store_pack<scalar_t, kWidth>(p.out, row * p.columns, packs.pack(k), out);
  }
#endif
}

// The backward of the row split as in rms_norm_forward_cluster_kernel, one cluster per row. One row
// (kRowStatistics false): its grad·n and grad are the weight gradients, written straight to them.
// Several rows: each row's mean and rstd go to `statistics` ([rows, 2]) for weight_grad_kernel.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth, int kPacks, bool kRowStatistics>
__global__ void __launch_bounds__(kClusterBlockThreads)
    norm_backward_cluster_kernel(NormBackwardProblem p, at::opmath_type<scalar_t>* statistics) {
  begin_dependent_kernel();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ ClusterInbox<1, acc_t> mean_inbox;
  __shared__ ClusterInbox<3, acc_t> sum_inbox;
  if (threadIdx.x == 0) {
    const int blocks = static_cast<int>(cg::this_cluster().num_blocks());
    if constexpr (kKind == NormKind::Layer) open_inbox(mean_inbox, blocks);
    open_inbox(sum_inbox, blocks);
  }
  cluster_inboxes_opened();
  const ClusterRowPacks packs(p.columns / kWidth, kPacks);
  const int64_t row = kRowStatistics ? blockIdx.x / cg::this_cluster().num_blocks() : 0;
  // Every input loads at once: weight and grad_residual after the reductions cost the one-row
  // backwards 0.26-0.49 us (H200 bf16 x8192, docs/benchmarks.md Change 13).
  XPack x[kPacks];
  XPack grad[kPacks];
  WPack weight[kPacks];
  XPack grad_residual[kPacks];
  packs.load(x, p.x, row * p.x_row_stride);
  packs.load(grad, p.grad, row * p.grad_row_stride);
  packs.load(weight, p.weight);
  if (p.grad_residual) packs.load(grad_residual, p.grad_residual, row * p.grad_residual_row_stride);
  acc_t mean = 0;
  if constexpr (kKind == NormKind::Layer) {
    acc_t sum[1] = {0};
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (!packs.in_row(k)) continue;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) sum[0] += static_cast<acc_t>(x[k].values[j]);
    }
    cluster_inboxes_ready();
    cluster_sum(sum, mean_inbox);
    mean = sum[0] * inverse_columns_of<acc_t>(p);
  }
  acc_t sums[3] = {0, 0, 0};
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      add_backward_terms(sums, static_cast<acc_t>(x[k].values[j]), static_cast<acc_t>(grad[k].values[j]),
                         static_cast<acc_t>(weight[k].values[j]), mean);
    }
  }
  if constexpr (kKind != NormKind::Layer) cluster_inboxes_ready();
  cluster_sum(sums, sum_inbox);
  const BackwardRow<acc_t> row_statistics =
      backward_row_of_sums<kKind>(mean, sums, inverse_columns_of<acc_t>(p), p.eps);
  if constexpr (kRowStatistics) {
    if (threadIdx.x == 0 && cg::this_cluster().block_rank() == 0) {
      statistics[2 * row] = row_statistics.mean;
      statistics[2 * row + 1] = row_statistics.rstd;
    }
  }
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
    const int64_t pack = packs.pack(k);
    XPack grad_x;
    weight_t weight_grad[kWidth];
    weight_t bias_grad[kWidth];
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      const acc_t g = static_cast<acc_t>(grad[k].values[j]);
      const acc_t n = row_statistics.normalized(static_cast<acc_t>(x[k].values[j]));
      acc_t value = row_statistics.grad_h(g, static_cast<acc_t>(weight[k].values[j]), n);
      if (p.grad_residual) value += static_cast<acc_t>(grad_residual[k].values[j]);
      grad_x.values[j] = static_cast<scalar_t>(value);
      weight_grad[j] = static_cast<weight_t>(g * n);
      bias_grad[j] = static_cast<weight_t>(g);
    }
    store_pack<scalar_t, kWidth>(p.grad_x, row * p.columns, pack, grad_x);
    if constexpr (!kRowStatistics) {
      store_consecutive(static_cast<weight_t*>(p.grad_weight) + pack * kWidth, weight_grad);
      if constexpr (kKind == NormKind::Layer) {
        store_consecutive(static_cast<weight_t*>(p.grad_bias) + pack * kWidth, bias_grad);
      }
    }
  }
#endif
}

// grad_x for the block's rows. The block's sums of grad·n (and grad) per column are kept either in
// registers (kSharedSums false) or in shared memory as 16-byte chunks laid out [chunk][pack], so a
// warp's accesses are consecutive and vectorized (each thread only touches its own columns). They
// end as row blockIdx.x of weight_partials / bias_partials ([gridDim.x, columns], opmath), or, for a
// grid of one block, directly in grad_weight / grad_bias. Measured on an H200 (docs/benchmarks.md):
// registers win for RMSNorm rows of over 512 packs, shared memory everywhere else.
// The one-pack backward's launch bound: 1024 for RMS rows (64 registers, the code measured since Change 3,
// although no backward launches more than 512 threads since Change 16); the LayerNorm's kNormMaxThreads,
// since at 64 registers it spills.
template <NormKind kKind>
constexpr int kNormBackwardWideBlockThreads = kKind == NormKind::RMS ? kNormWideBlockThreads : kNormMaxThreads;

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
  // and grad, not after the reduction: H200 bf16 16x8192 backward kernels 0.02-0.24 us faster
  // (docs/benchmarks.md Change 13; four packs not measured).
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
        copy_16_bytes_async(slot(0, k), static_cast<const scalar_t*>(p.x) + row * p.x_row_stride + pack * kWidth);
        copy_16_bytes_async(slot(1, k), static_cast<const scalar_t*>(p.grad) + row * p.grad_row_stride + pack * kWidth);
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
        copy_16_bytes_async(slot(2, k), static_cast<const scalar_t*>(p.grad_residual) +
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
                           static_cast<acc_t>(weight.values[j]), mean);
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
        acc_t value = statistics.grad_h(g, static_cast<acc_t>(weight.values[j]), n);
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

// ---------------------------------------------------------------------------------------------
// Long-row path: each thread steps through the row's packs; rows are read more than once (from L2).

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
__global__ void __launch_bounds__(kLongRowThreads) norm_forward_long_row_kernel(NormForwardProblem p) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ acc_t shared[32];
  const int64_t packs_per_row = p.columns / kWidth;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    // With a residual, h is written to residual_out in the first pass; later passes read it back
    // (each thread reads only what it wrote).
    const void* h = p.residual ? p.residual_out : p.x;
    const int64_t h_offset = p.residual ? row * p.columns : row * p.x_row_stride;
    acc_t sum[1] = {0};
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      XPack values = load_pack<scalar_t, kWidth>(p.x, row * p.x_row_stride, pack);
      if (p.residual) {
        const XPack residual = load_pack<scalar_t, kWidth>(p.residual, row * p.residual_row_stride, pack);
#pragma unroll
        for (int j = 0; j < kWidth; ++j) {
          values.values[j] =
              static_cast<scalar_t>(static_cast<acc_t>(values.values[j]) + static_cast<acc_t>(residual.values[j]));
        }
        store_pack<scalar_t, kWidth>(p.residual_out, row * p.columns, pack, values);
      }
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const acc_t value = static_cast<acc_t>(values.values[j]);
        sum[0] += kKind == NormKind::Layer ? value : value * value;
      }
    }
    block_sum(sum, shared);
    acc_t mean = 0;
    // Divides: multiplying by 1 / columns took this kernel from 32 to 42 registers, one block of 1024
    // threads per SM instead of two (H200 bf16 1024x65536 layer_norm forward 111 -> 120 us).
    acc_t variance = sum[0] / p.columns;
    if constexpr (kKind == NormKind::Layer) {
      mean = sum[0] / p.columns;
      acc_t squares[1] = {0};
      for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
        const XPack values = load_pack<scalar_t, kWidth>(h, h_offset, pack);
#pragma unroll
        for (int j = 0; j < kWidth; ++j) {
          const acc_t centered = static_cast<acc_t>(values.values[j]) - mean;
          squares[0] += centered * centered;
        }
      }
      block_sum(squares, shared);
      variance = squares[0] / p.columns;
    }
    const acc_t rstd = reciprocal_sqrt(variance + static_cast<acc_t>(p.eps));
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      const XPack values = load_pack<scalar_t, kWidth>(h, h_offset, pack);
      const WPack weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
      WPack bias;
      if (p.bias) bias = load_pack<weight_t, kWidth>(p.bias, 0, pack);
      XPack out;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        acc_t value = (static_cast<acc_t>(values.values[j]) - mean) * rstd * static_cast<acc_t>(weight.values[j]);
        if (p.bias) value += static_cast<acc_t>(bias.values[j]);
        out.values[j] = static_cast<scalar_t>(value);
      }
      store_pack<scalar_t, kWidth>(p.out, row * p.columns, pack, out);
    }
  }
}

// grad_x per row; each row's mean and rstd go to `statistics` ([rows, 2]) for weight_grad_kernel.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
__global__ void __launch_bounds__(kLongRowThreads)
    norm_backward_long_row_kernel(NormBackwardProblem p, at::opmath_type<scalar_t>* statistics) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  using XPack = Pack<scalar_t, kWidth>;
  using WPack = Pack<weight_t, kWidth>;
  __shared__ acc_t shared[32 * 3];
  const int64_t packs_per_row = p.columns / kWidth;
  const acc_t inverse_columns = inverse_columns_of<acc_t>(p);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t x_offset = row * p.x_row_stride;
    const int64_t grad_offset = row * p.grad_row_stride;
    acc_t mean = 0;
    if constexpr (kKind == NormKind::Layer) {
      acc_t sum[1] = {0};
      for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
        const XPack x = load_pack<scalar_t, kWidth>(p.x, x_offset, pack);
#pragma unroll
        for (int j = 0; j < kWidth; ++j) sum[0] += static_cast<acc_t>(x.values[j]);
      }
      block_sum(sum, shared);
      mean = sum[0] * inverse_columns;
    }
    acc_t sums[3] = {0, 0, 0};
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      const XPack x = load_pack<scalar_t, kWidth>(p.x, x_offset, pack);
      const XPack grad = load_pack<scalar_t, kWidth>(p.grad, grad_offset, pack);
      const WPack weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        add_backward_terms(sums, static_cast<acc_t>(x.values[j]), static_cast<acc_t>(grad.values[j]),
                           static_cast<acc_t>(weight.values[j]), mean);
      }
    }
    const BackwardRow<acc_t> row_statistics = backward_row<kKind>(mean, sums, inverse_columns, p.eps, shared);
    for (int64_t pack = threadIdx.x; pack < packs_per_row; pack += blockDim.x) {
      const XPack x = load_pack<scalar_t, kWidth>(p.x, x_offset, pack);
      const XPack grad = load_pack<scalar_t, kWidth>(p.grad, grad_offset, pack);
      const WPack weight = load_pack<weight_t, kWidth>(p.weight, 0, pack);
      XPack grad_residual;
      if (p.grad_residual) {
        grad_residual = load_pack<scalar_t, kWidth>(p.grad_residual, row * p.grad_residual_row_stride, pack);
      }
      XPack grad_x;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const acc_t n = row_statistics.normalized(static_cast<acc_t>(x.values[j]));
        acc_t value =
            row_statistics.grad_h(static_cast<acc_t>(grad.values[j]), static_cast<acc_t>(weight.values[j]), n);
        if (p.grad_residual) value += static_cast<acc_t>(grad_residual.values[j]);
        grad_x.values[j] = static_cast<scalar_t>(value);
      }
      store_pack<scalar_t, kWidth>(p.grad_x, row * p.columns, pack, grad_x);
    }
    if (threadIdx.x == 0) {
      statistics[2 * row] = mean;
      statistics[2 * row + 1] = row_statistics.rstd;
    }
  }
}

// Weight (and bias) gradients by columns, from grad, h and the row statistics (the long-row and
// decode paths). A block takes 32 columns in kGroups row groups; each thread sums every kGroups-th row
// in order, then the groups are added in order.
template <typename scalar_t, typename weight_t, NormKind kKind, int kGroups>
__global__ void __launch_bounds__(kColumnsPerBlock * kGroups)
    weight_grad_kernel(NormBackwardProblem p, const at::opmath_type<scalar_t>* statistics) {
  begin_dependent_kernel();
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[2][kGroups][kColumnsPerBlock];
  const int64_t column = int64_t(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  acc_t weight_sum = 0, bias_sum = 0;
  if (column < p.columns) {
    auto add_row = [&](int64_t row) {
      const acc_t grad = static_cast<acc_t>(static_cast<const scalar_t*>(p.grad)[row * p.grad_row_stride + column]);
      const acc_t x = static_cast<acc_t>(static_cast<const scalar_t*>(p.x)[row * p.x_row_stride + column]);
      weight_sum += grad * (x - statistics[2 * row]) * statistics[2 * row + 1];
      bias_sum += grad;
    };
    if constexpr (kGroups < kRowGroups) {  // several rows per thread: four loads in flight
#pragma unroll 4
      for (int64_t row = threadIdx.y; row < p.rows; row += kGroups) add_row(row);
    } else {
      for (int64_t row = threadIdx.y; row < p.rows; row += kGroups) add_row(row);
    }
  }
  shared[0][threadIdx.y][threadIdx.x] = weight_sum;
  shared[1][threadIdx.y][threadIdx.x] = bias_sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < p.columns) {
    for (int group = 1; group < kGroups; ++group) {
      weight_sum += shared[0][group][threadIdx.x];
      bias_sum += shared[1][group][threadIdx.x];
    }
    static_cast<weight_t*>(p.grad_weight)[column] = static_cast<weight_t>(weight_sum);
    if (kKind == NormKind::Layer) static_cast<weight_t*>(p.grad_bias)[column] = static_cast<weight_t>(bias_sum);
  }
}

// Row groups of the column sum, as measured (H200 bf16 fwd+bwd kernel us, docs/benchmarks.md Change 18):
// 4 for up to 16 rows (rms_norm 16 x 8192 5.99 -> 5.90, 16 x 16384 8.53 -> 7.61), where 16 groups left
// most threads one row; 8 for more rows of 16384 columns or more, where 16 groups' 512-thread blocks
// need a second wave (rms_norm 128 x 16384 13.16 -> 12.19); 16 elsewhere (128 x 8192 8.51, at 4 groups
// 9.42). One shape always takes the same groups, so the sums stay bit-identical run to run.
inline int weight_grad_row_groups(int64_t rows, int64_t columns) {
  if (rows <= 16) return 4;
  if (rows <= kNormFewRows && columns >= 16384) return 8;
  return kRowGroups;
}

template <typename scalar_t, typename weight_t, NormKind kKind>
void launch_weight_grad(const NormBackwardProblem& p, const at::Tensor& statistics, cudaStream_t stream) {
  const int groups = weight_grad_row_groups(p.rows, p.columns);
  auto kernel = groups == 4   ? weight_grad_kernel<scalar_t, weight_t, kKind, 4>
                : groups == 8 ? weight_grad_kernel<scalar_t, weight_t, kKind, 8>
                              : weight_grad_kernel<scalar_t, weight_t, kKind, kRowGroups>;
  launch_kernel(kernel, column_sum_blocks(p.columns), dim3(kColumnsPerBlock, groups), 0, stream, p,
                statistics.const_data_ptr<at::opmath_type<scalar_t>>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
// Launch configuration.

inline bool pointer_aligned(const void* pointer, int64_t bytes) {
  return pointer == nullptr || reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

inline bool row_aligned(const void* pointer, int64_t row_stride, int64_t element_size) {
  return pointer_aligned(pointer, 16) && (row_stride * element_size) % 16 == 0;
}

// Threads per block and packs per thread for a cached row of `packs` packs: the fewest packs per
// thread that keep the block at or below `max_threads`.
struct CachedConfig {
  int threads;
  int packs_per_thread;
};

inline CachedConfig cached_config(int64_t packs, int max_threads) {
  int packs_per_thread = 1;
  while (packs_per_thread < kNormMaxPacksPerThread && (packs + packs_per_thread - 1) / packs_per_thread > max_threads) {
    packs_per_thread *= 2;
  }
  const int64_t threads = (packs + packs_per_thread - 1) / packs_per_thread;
  return {static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32)), packs_per_thread};
}

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
  // Without the opt-in a block gets 48 KiB of shared memory, static and dynamic together. Testing the
  // dynamic bytes alone left exactly 48 KiB of staging beside the static arrays at 0 blocks, so the
  // residual norms' backward at 16384x8192 bf16 ran unstaged (H200: add_rms_norm fwd+bwd kernels
  // 590.5 -> 543.3 us with the opt-in, docs/benchmarks.md Change 14).
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

template <typename scalar_t, typename weight_t>
bool forward_vectorizable(const NormForwardProblem& p) {
  constexpr int width = 16 / sizeof(scalar_t);
  constexpr int64_t weight_pack_bytes = int64_t(sizeof(weight_t)) * width;
  return p.columns % width == 0 && row_aligned(p.x, p.x_row_stride, sizeof(scalar_t)) &&
         row_aligned(p.residual, p.residual_row_stride, sizeof(scalar_t)) &&
         pointer_aligned(p.out, 16) && pointer_aligned(p.residual_out, 16) &&
         pointer_aligned(p.weight, weight_pack_bytes) && pointer_aligned(p.bias, weight_pack_bytes);
}

template <typename scalar_t, typename weight_t>
bool backward_vectorizable(const NormBackwardProblem& p) {
  constexpr int width = 16 / sizeof(scalar_t);
  return p.columns % width == 0 && row_aligned(p.x, p.x_row_stride, sizeof(scalar_t)) &&
         row_aligned(p.grad, p.grad_row_stride, sizeof(scalar_t)) &&
         row_aligned(p.grad_residual, p.grad_residual_row_stride, sizeof(scalar_t)) &&
         pointer_aligned(p.grad_x, 16) && pointer_aligned(p.weight, int64_t(sizeof(weight_t)) * width) &&
         pointer_aligned(p.grad_weight, 16) && pointer_aligned(p.grad_bias, 16);
}

// Backward blocks per SM (occupancy allows two to four): each adds one partial row to sum.
constexpr int kBackwardBlocksPerSm = 4;

// Calls body(std::integral_constant<int, kWidth>) with the vector width or 1.
template <typename scalar_t, typename Body>
void with_pack_width(bool vectorized, Body body) {
  if (vectorized) {
    body(std::integral_constant<int, 16 / sizeof(scalar_t)>{});
  } else {
    body(std::integral_constant<int, 1>{});
  }
}

// Decode rows that get one pack per thread (kNormWideBlockThreads).
inline bool wide_block_rows(int64_t rows, int64_t packs) {
  return rows <= kNormFewRows && packs <= kNormWideBlockThreads;
}

// Threads per block for cached forward rows: many rows stream best with blocks of 256, except rows of
// 513-1024 packs whose residual loads first, which take 512 (two packs per thread; H200 bf16
// 16384x8192 kernels: add_rms_norm 262.5 -> 257.0 us, add_layer_norm 263.4 -> 258.3, while rms_norm
// lost 130.7 -> 136.3 and 4096x4096 stayed level; docs/benchmarks.md Change 18). A few rows (decode)
// get wider blocks so each row is read by more threads at once, except where the residual loads
// first: blocks of 512 reduce over half the warps (H200 bf16, 16x8192: add_rms_norm 2.49 -> 2.34 µs,
// add_layer_norm 3.04 -> 2.82; rms_norm 2.21 -> 2.18 and layer_norm 2.62 -> 2.68 without a
// residual, which stay at 1024; docs/benchmarks.md Change 12).
inline int cached_max_threads(int64_t rows, int64_t packs, bool residual_loads_first) {
  if (wide_block_rows(rows, packs)) return residual_loads_first ? kNormMaxThreads : kNormWideBlockThreads;
  if (rows < 1024) return kNormMaxThreads;
  return residual_loads_first && packs > kNormMaxThreads ? kNormMaxThreads : 256;
}

// Threads per block for cached backward rows: blocks of 256, so rows of 257-512 packs get two packs
// per thread and the staged kernel (measured on an H200, docs/benchmarks.md Change 7: add_layer_norm
// 4096x4096 fwd+bwd 130 -> 88 us against 512 threads); decode rows blocks of up to 512, one or two
// packs per thread. The RMSNorm's were 1024 wide until Change 16 (H200 bf16 fwd+bwd under graphs:
// rms_norm 16x8192 7.34 -> 7.20 us, add_rms_norm 7.87 -> 7.70, 64 rows 8.33 -> 8.14 and 8.72 -> 8.43,
// 4 rows 6.91 -> 6.79 and 7.32 -> 7.21; blocks of 256 lost everywhere).
inline int cached_backward_max_threads(int64_t rows, int64_t packs) {
  if (wide_block_rows(rows, packs)) return kNormMaxThreads;
  return 256;
}

// Cluster path launches.
struct ClusterConfig {
  int64_t blocks;  // 0: not this path
  int packs_per_thread;
};

// The split of one row over a cluster. A row one block covers, one longer than eight blocks of two
// packs per thread, GPUs without clusters and code built for them (where the cluster kernels have no
// body) take the cached path.
inline ClusterConfig cluster_config(int64_t packs) {
  const int packs_per_thread = packs <= int64_t(kMaxClusterBlocks) * kClusterBlockThreads ? 1 : 2;
  const int64_t packs_per_block = int64_t(kClusterBlockThreads) * packs_per_thread;
  const int64_t blocks = (packs + packs_per_block - 1) / packs_per_block;
  if (blocks < 2 || blocks > kMaxClusterBlocks || !runs_sm90_code()) return {0, 0};
  return {blocks, packs_per_thread};
}

// Rows that run one cluster each, forward and backward, as measured with pushed sums (H200 bf16 kernel
// times): up to 32 rows of four to eight blocks of one pack per thread, up to 16 of two packs (x 16384).
// RMSNorm forwards (Change 17): rms_norm 4-16 x 4096 1.70-1.76 -> 1.52-1.55 us, 32 x 8192 2.24 -> 1.87;
// add_rms_norm 16 x 8192 2.34 -> 1.82 (64 rows gained at most 0.07). The LayerNorm forwards and every
// backward gained under the same rule (Change 18; fwd+bwd rms_norm 16 x 8192 5.82 -> 5.16, 16 x 16384
// 7.58 -> 5.90, 32 x 8192 6.54 -> 6.28). Rows of two blocks (x 2048) stay at one: add_rms_norm forwards
// of 2-16 rows lost 1.56-1.61 -> 1.66-1.69, backwards of 16 rows 0.07-0.21.
inline int64_t cluster_rows(const ClusterConfig& single_row) {
  if (single_row.blocks < 4) return 1;
  return single_row.packs_per_thread == 1 ? 32 : 16;
}

// Launches `kernel` on `clusters` clusters of `blocks` blocks (a configuration from cluster_config).
template <typename... Arguments>
void cluster_launch(void (*kernel)(Arguments...), int64_t blocks, int64_t clusters, cudaStream_t stream,
                    Arguments... arguments) {
  cudaLaunchAttribute attributes[2];  // the cluster shape, and room for launch_kernel_with's
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = static_cast<unsigned int>(blocks);
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned int>(blocks * clusters));
  config.blockDim = dim3(kClusterBlockThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.numAttrs = 1;
  launch_kernel_with(config, attributes, true, kernel, arguments...);
}

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
bool launch_norm_forward_cluster(const NormForwardProblem& p, cudaStream_t stream) {
  const ClusterConfig config = cluster_config(p.columns / kWidth);  // one row's split
  if (config.blocks == 0 || p.rows > cluster_rows(config)) return false;
  if constexpr (kKind != NormKind::RMS) {
    // Without a residual, only rows of a full cluster gained (H200 bf16, graph us, Change 18):
    // layer_norm 1 x 8192 2.90 -> 2.40, but 1 x 4096 2.20 -> 2.29 and 1 x 3000 2.26 -> 2.30.
    if (p.residual == nullptr && config.blocks < kMaxClusterBlocks) return false;
    if (config.packs_per_thread == 1) {
      cluster_launch(layer_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 1>, config.blocks, p.rows, stream,
                     p);
    } else {
      cluster_launch(layer_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 2>, config.blocks, p.rows, stream,
                     p);
    }
  } else {
    auto launch = [&](auto weight_first_constant) {
      constexpr bool kWeightFirst = decltype(weight_first_constant)::value;
      if (config.packs_per_thread == 1) {
        cluster_launch(rms_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 1, kWeightFirst>, config.blocks,
                       p.rows, stream, p);
      } else {
        cluster_launch(rms_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 2, kWeightFirst>, config.blocks,
                       p.rows, stream, p);
      }
    };
    // The weight loads first only without a residual (see rms_norm_forward_cluster_kernel).
    if (p.residual == nullptr) {
      launch(std::true_type{});
    } else {
      launch(std::false_type{});
    }
  }
  return true;
}

template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
bool launch_norm_backward_cluster(const NormBackwardProblem& p, const at::TensorOptions& acc_options,
                                  cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const ClusterConfig config = cluster_config(p.columns / kWidth);
  if (config.blocks == 0 || p.rows > cluster_rows(config)) return false;
  auto launch = [&](auto row_statistics_constant, acc_t* statistics) {
    constexpr bool kRowStatistics = decltype(row_statistics_constant)::value;
    if (config.packs_per_thread == 1) {
      cluster_launch(norm_backward_cluster_kernel<scalar_t, weight_t, kKind, kWidth, 1, kRowStatistics>, config.blocks,
                     p.rows, stream, p, statistics);
    } else {
      cluster_launch(norm_backward_cluster_kernel<scalar_t, weight_t, kKind, kWidth, 2, kRowStatistics>, config.blocks,
                     p.rows, stream, p, statistics);
    }
  };
  if (p.rows == 1) {
    launch(std::false_type{}, nullptr);
    return true;
  }
  const at::Tensor statistics = at::empty({p.rows, 2}, acc_options);
  launch(std::true_type{}, statistics.mutable_data_ptr<acc_t>());
  launch_weight_grad<scalar_t, weight_t, kKind>(p, statistics, stream);
  return true;
}

template <NormKind kKind>
void norm_forward_cuda(const NormForwardProblem& p, at::ScalarType dtype, at::ScalarType weight_dtype,
                       c10::Device device) {
  if (p.rows == 0 || p.columns == 0) return;
  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_NORM_TYPES(dtype, weight_dtype, "norm_forward_cuda", [&] {
    const bool vectorized = forward_vectorizable<scalar_t, weight_t>(p);
    with_pack_width<scalar_t>(vectorized, [&](auto width_constant) {
      constexpr int kWidth = decltype(width_constant)::value;
      const int64_t packs = p.columns / kWidth;
      if (launch_norm_forward_cluster<scalar_t, weight_t, kKind, kWidth>(p, stream)) {
        // decode rows over clusters of SMs
      } else if (packs <= kMaxCachedPacks) {
        constexpr bool kLoadsFirstFits = forward_loads_first_fits<scalar_t, kWidth>();
        const bool residual_loads_first = kLoadsFirstFits && p.residual != nullptr;
        const CachedConfig config = cached_config(packs, cached_max_threads(p.rows, packs, residual_loads_first));
        with_packs_per_thread(config.packs_per_thread, [&](auto packs_constant) {
          constexpr int kPacks = decltype(packs_constant)::value;
          const dim3 grid = row_grid(p.rows);
          if constexpr (kLoadsFirstFits) {
            // With a residual, loads first: one memory latency per row instead of one per pack.
            if (residual_loads_first) {
              if constexpr (kPacks >= 2) {
                launch_kernel(norm_forward_cached_loads_first_kernel<scalar_t, weight_t, kKind, kWidth, kPacks>, grid,
                              config.threads, 0, stream, p);
              } else {
                launch_kernel(norm_forward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, true>, grid,
                              config.threads, 0, stream, p);
              }
              return;
            }
          }
          // Measured in bf16 with bf16 weights only; float16 (50 registers plain) and float32 weights
          // keep the plain kernel.
          if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && std::is_same_v<weight_t, scalar_t> &&
                        kWidth == 8 && kPacks == 4) {
            if (p.rows >= 1024 && config.threads == kNormMaxThreads) {
              launch_kernel(norm_forward_cached_three_blocks_kernel<scalar_t, weight_t, kKind, kWidth, kPacks>, grid,
                            config.threads, 0, stream, p);
              return;
            }
          }
          launch_kernel(norm_forward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks>, grid, config.threads, 0,
                        stream, p);
        });
      } else {
        launch_kernel(norm_forward_long_row_kernel<scalar_t, weight_t, kKind, kWidth>, row_grid(p.rows),
                      kLongRowThreads, 0, stream, p);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
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
  FUSED_DISPATCH_NORM_TYPES(dtype, weight_dtype, "norm_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_options = at::TensorOptions().dtype(c10::CppTypeToScalarType<acc_t>::value).device(device);
    const int sums = kKind == NormKind::Layer ? 2 : 1;  // weight (and bias)
    const bool vectorized = backward_vectorizable<scalar_t, weight_t>(p);
    with_pack_width<scalar_t>(vectorized, [&](auto width_constant) {
      constexpr int kWidth = decltype(width_constant)::value;
      const int64_t packs = p.columns / kWidth;
      if (launch_norm_backward_cluster<scalar_t, weight_t, kKind, kWidth>(p, acc_options, stream)) return;
      // Cached unless the row is too long, or its block's shared memory does not fit this GPU.
      bool cached = packs <= kMaxCachedPacks;
      if (cached) {
        const CachedConfig config = cached_config(packs, cached_backward_max_threads(p.rows, packs));
        // Sums in registers for RMS rows of over 512 packs (measured, as the block sizes), and for a
        // single row of up to two packs per thread, whose block writes grad·n and grad straight to the
        // gradients: shared sums would zero, add into and copy out a row of shared memory for nothing
        // (the four-pack LayerNorm kernel with register sums spills).
        const bool single_short_row = p.rows == 1 && config.packs_per_thread <= 2;
        const bool shared_sums = !single_short_row && (kKind == NormKind::Layer || packs <= 512);
        auto launch = [&](auto kernel, size_t shared_bytes, int64_t blocks) {
          const unsigned int grid = static_cast<unsigned int>(std::min(p.rows, blocks));
          // One block writes the gradients itself; more write partial rows for column_sum_kernel.
          const at::Tensor partials = grid > 1 ? at::empty({sums, grid, p.columns}, acc_options) : at::Tensor();
          acc_t* weight_partials = grid > 1 ? partials.mutable_data_ptr<acc_t>() : nullptr;
          acc_t* bias_partials = grid > 1 && sums == 2 ? weight_partials + int64_t(grid) * p.columns : nullptr;
          // A persistent grid (blocks striding over more rows than there are blocks) and the column sums
          // after it start only once the kernel before each has finished. Launched early, the column sums
          // may be scheduled as soon as every persistent block has started, and wait on the SMs while the
          // grid runs: H200 bf16 16384x8192 add_layer_norm forward + backward 583 -> 620 us (both late:
          // 582-587; docs/benchmarks.md Change 21; why waiting blocks cost that much was not profiled).
          // Blocks of one row each start early.
          const bool early = p.rows <= blocks;
          launch_kernel_at(early, kernel, grid, config.threads, shared_bytes, stream, p, weight_partials, bias_partials,
                           nullptr);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
          if (grid > 1) {
            launch_column_sums(weight_partials, sums, int64_t(grid), p.columns, static_cast<weight_t*>(p.grad_weight),
                               static_cast<weight_t*>(p.grad_bias), stream, early);
          }
        };
        // Launches the staged kernel when each block gets several rows and its slots cost no
        // occupancy, else the plain one; false when neither fits this GPU's shared memory.
        auto launch_plain_or_staged = [&](auto plain_kernel, auto staged_kernel, bool uses_shared) {
          const size_t sum_bytes = uses_shared ? size_t(sums) * p.columns * sizeof(acc_t) : 0;
          const int64_t plain_blocks = persistent_blocks(plain_kernel, config.threads, sum_bytes, kBackwardBlocksPerSm);
          if (staged_kernel != nullptr) {
            const size_t staged_bytes = sum_bytes + backward_staging_bytes(p.grad_residual != nullptr, config.threads,
                                                                           config.packs_per_thread);
            const int64_t staged_blocks =
                persistent_blocks(staged_kernel, config.threads, staged_bytes, kBackwardBlocksPerSm);
            if (staged_blocks > 0 && staged_blocks >= plain_blocks && p.rows > staged_blocks) {
              launch(staged_kernel, staged_bytes, staged_blocks);
              return true;
            }
          }
          if (plain_blocks == 0) return false;
          launch(plain_kernel, sum_bytes, plain_blocks);
          return true;
        };
        with_packs_per_thread(config.packs_per_thread, [&](auto packs_constant) {
          constexpr int kPacks = decltype(packs_constant)::value;
          if (p.rows > 1 && p.rows <= kNormFewRows) {
            // Decode: the weight gradients are summed by columns afterwards, on every SM, instead of
            // in partial rows by the rows' few blocks. H200, bf16 16x8192 fwd+bwd kernels:
            // add_layer_norm 11.3 -> 8.3 us, rms_norm 7.9 -> 6.8 (docs/benchmarks.md, Change 9).
            const at::Tensor statistics = at::empty({p.rows, 2}, acc_options);
            launch_kernel(norm_backward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, false, false, true>,
                          static_cast<unsigned int>(p.rows), config.threads, 0, stream, p, nullptr, nullptr,
                          statistics.mutable_data_ptr<acc_t>());
            C10_CUDA_KERNEL_LAUNCH_CHECK();
            launch_weight_grad<scalar_t, weight_t, kKind>(p, statistics, stream);
            return;
          }
          auto launch_with_sums = [&](auto shared_sums_constant) {
            constexpr bool kSharedSums = decltype(shared_sums_constant)::value;
            void (*staged)(NormBackwardProblem, acc_t*, acc_t*, acc_t*) = nullptr;
            if constexpr (stageable_backward<kWidth, kPacks>(sizeof(scalar_t))) {
              staged = norm_backward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, kSharedSums, true>;
            }
            return launch_plain_or_staged(
                norm_backward_cached_kernel<scalar_t, weight_t, kKind, kWidth, kPacks, kSharedSums, false>, staged,
                kSharedSums);
          };
          cached = shared_sums ? launch_with_sums(std::true_type{}) : launch_with_sums(std::false_type{});
        });
      }
      if (!cached) {
        const at::Tensor statistics = at::empty({p.rows, 2}, acc_options);
        launch_kernel(norm_backward_long_row_kernel<scalar_t, weight_t, kKind, kWidth>, row_grid(p.rows),
                      kLongRowThreads, 0, stream, p, statistics.mutable_data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        launch_weight_grad<scalar_t, weight_t, kKind>(p, statistics, stream);
      }
    });
  });
}

}  // namespace cuda
}  // namespace fused_ops
