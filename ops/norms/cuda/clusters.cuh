#pragma once
// The cluster path (a few rows, on code for sm_90 and later): each row's packs are split over a
// thread-block cluster of up to eight blocks of four warps, on as many SMs, which reduce through
// distributed shared memory. A decode row in one block is issue-bound on its one SM (its four schedulers
// spend about half the kernel's time issuing); split over a cluster it is not (docs/design.md).

#include <ATen/OpMathType.h>
#include <cooperative_groups.h>

#include <cstdint>

#include "../../common/cuda_launch.cuh"
#include "../../common/vector.cuh"
#include "row_math.cuh"

namespace fused_ops {
namespace cuda {

constexpr int kClusterWarps = kClusterBlockThreads / 32;

// Cluster sums are pushed, not pulled. On sm_90 every cluster-scope release (cooperative_groups'
// sync, barrier.cluster.arrive.release, fence.acq_rel.cluster) compiles to MEMBAR.ALL.GPU, which waits
// for every store in flight; a sum read after such a barrier, and an exit barrier that keeps each
// block's slots alive for the others, cost a decode row a fifth of its time. Instead each warp sends its
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
  template <typename T, int kBytes, int kPacks>
  __device__ __forceinline__ void load(Vec<T, kBytes> (&values)[kPacks], const void* base,
                                       int64_t row_offset = 0) const {
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      if (in_row(k)) values[k] = load_pack<T, Vec<T, kBytes>::kSize>(base, row_offset, pack(k));
    }
  }
};

// With a residual: h += residual for this thread's packs of the row, stored as residual_out.
template <typename scalar_t, int kBytes, int kPacks>
__device__ __forceinline__ void add_cluster_residual(const ClusterRowPacks& packs, const NormForwardProblem& p,
                                                     int64_t row, Vec<scalar_t, kBytes> (&h)[kPacks],
                                                     const Vec<scalar_t, kBytes> (&residual)[kPacks]) {
  constexpr int kWidth = Vec<scalar_t, kBytes>::kSize;
  if (!p.residual) return;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (!packs.in_row(k)) continue;
    add_residual_pack<true>(h[k], residual[k]);
    store_pack<scalar_t, kWidth>(p.residual_out, row * p.columns, packs.pack(k), h[k]);
  }
}
#endif

// kWeightFirst (launched without a residual): weight loads before x, so its latency overlaps x's (with
// a residual the early load costs more than it hides).
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
          static_cast<scalar_t>(static_cast<acc_t>(h[k].values[j]) * rstd * offset_weight<acc_t>(p, weight.values[j]));
    }
    store_pack<scalar_t, kWidth>(p.out, row * p.columns, packs.pack(k), out);
  }
#endif
}

// The LayerNorm forward on the same split, with two pushed sums: the mean, then the centred squares
// (two passes over registers, so a row far from zero keeps its precision). Only pushed sums make the
// second reduction cheap enough for the cluster to win.
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
    const XPack out = normalized_pack(p, h[k], mean, rstd, weight[k], bias[k]);
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
  // Every input loads at once: weight and grad_residual loaded after the reductions would add their
  // latency to the row's.
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
                         offset_weight<acc_t>(p, weight[k].values[j]), mean);
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
      acc_t value = row_statistics.grad_h(g, offset_weight<acc_t>(p, weight[k].values[j]), n);
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

// Launches `kernel` on `clusters` clusters of `blocks` blocks.
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

// One cluster per row, as the plan splits it.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
void launch_norm_forward_cluster(const NormForwardProblem& p, const NormLaunchPlan& plan, cudaStream_t stream) {
  if constexpr (kKind != NormKind::RMS) {
    if (plan.packs_per_thread == 1) {
      cluster_launch(layer_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 1>, plan.cluster_blocks, p.rows,
                     stream, p);
    } else {
      cluster_launch(layer_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 2>, plan.cluster_blocks, p.rows,
                     stream, p);
    }
  } else {
    auto launch = [&](auto weight_first_constant) {
      constexpr bool kWeightFirst = decltype(weight_first_constant)::value;
      if (plan.packs_per_thread == 1) {
        cluster_launch(rms_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 1, kWeightFirst>,
                       plan.cluster_blocks, p.rows, stream, p);
      } else {
        cluster_launch(rms_norm_forward_cluster_kernel<scalar_t, weight_t, kWidth, 2, kWeightFirst>,
                       plan.cluster_blocks, p.rows, stream, p);
      }
    };
    if (plan.weight_first) {
      launch(std::true_type{});
    } else {
      launch(std::false_type{});
    }
  }
}

// One cluster per row; from two rows on, each row's statistics go to `statistics` ([rows, 2]) for the
// column sums.
template <typename scalar_t, typename weight_t, NormKind kKind, int kWidth>
void launch_norm_backward_cluster(const NormBackwardProblem& p, const NormLaunchPlan& plan,
                                  at::opmath_type<scalar_t>* statistics, cudaStream_t stream) {
  auto launch = [&](auto row_statistics_constant) {
    constexpr bool kRowStatistics = decltype(row_statistics_constant)::value;
    if (plan.packs_per_thread == 1) {
      cluster_launch(norm_backward_cluster_kernel<scalar_t, weight_t, kKind, kWidth, 1, kRowStatistics>,
                     plan.cluster_blocks, p.rows, stream, p, statistics);
    } else {
      cluster_launch(norm_backward_cluster_kernel<scalar_t, weight_t, kKind, kWidth, 2, kRowStatistics>,
                     plan.cluster_blocks, p.rows, stream, p, statistics);
    }
  };
  if (plan.row_statistics) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
}

}  // namespace cuda
}  // namespace fused_ops
