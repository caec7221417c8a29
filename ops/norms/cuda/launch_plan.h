#pragma once
// The norms' launch policy: every tuned threshold of the family, as one function of the problem's
// shape, its dtypes and what the GPU runs. Host code only, so tests check it on any machine
// (fused_ops_describe_norm_launch_plan). docs/design.md gives the figure behind each rule.
//
// Paths (a pack is 16 bytes of x when every row is 16-byte aligned and H fills whole packs, else one
// element):
//   Cluster   a few rows of 2-8 blocks' packs, on code for sm_90+: each row is split over a thread-block
//             cluster on as many SMs, which reduce through distributed shared memory (clusters.cuh).
//   Cached    rows of up to kMaxCachedPacks packs: each thread keeps its packs of the row in registers,
//             so x (and grad) are read once (cached_rows.cuh). Forward: one block per row. Backward: a
//             persistent grid adding per-column partial sums, or for decode rows one block per row
//             storing row statistics for the column sums (weight_gradient_sums.cuh).
//   ShortRows rows of up to kShortRowMaxPacks packs (per-head norms) when there are more than decode's
//             rows: a group of 8, 16 or 32 lanes per row, reduced by shuffles, many rows per block of
//             kShortRowBlockThreads. Backward: a persistent grid adding per-column partial sums
//             (short_rows.cuh).
//   LongRows  longer rows: one block of 1024 threads per row passes over the row two or three times,
//             from L2 (long_rows.cuh).
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "../norm.h"

namespace fused_ops {
namespace cuda {

// Block shapes the kernels are compiled for (their launch bounds).
constexpr int kNormMaxThreads = 512;
constexpr int kNormWideBlockThreads = 1024;
constexpr int kNormMaxPacksPerThread = 4;
constexpr int64_t kMaxCachedPacks = int64_t(kNormMaxThreads) * kNormMaxPacksPerThread;
constexpr int kLongRowThreads = 1024;
constexpr int kClusterBlockThreads = 128;
constexpr int kMaxClusterBlocks = 8;  // the portable cluster size
// The one-pack backward's bound: RMS rows keep 1024 (64 registers); the LayerNorm spills at 64.
template <NormKind kKind>
constexpr int kNormBackwardWideBlockThreads = kKind == NormKind::RMS ? kNormWideBlockThreads : kNormMaxThreads;
constexpr int64_t kNormFewRows = 128;  // decode: about one row per SM
constexpr int kBackwardBlocksPerSm = 4;  // persistent backward: each block adds one partial row to sum
constexpr int kShortRowBlockThreads = 512;
constexpr int64_t kShortRowMaxPacks = 32;  // a warp's lanes, one pack each

enum class NormPath { Cluster, Cached, LongRows, ShortRows };

struct NormProblemShape {
  int64_t rows;
  int64_t columns;
  at::ScalarType dtype;
  at::ScalarType weight_dtype;
  NormKind kind;
  bool backward;
  bool has_residual;   // forward only
  bool vectorized;     // every operand takes 16-byte packs
  bool runs_clusters;  // the GPU runs this library's sm_90 code (runs_sm90_code)
};

struct NormLaunchPlan {
  NormPath path;
  int threads;                      // per block
  int packs_per_thread;             // Cluster, Cached: 1, 2 or 4
  int64_t cluster_blocks;           // Cluster: blocks per row
  bool residual_loads_first;        // Cached forward: all of a row's loads before its first store
  bool three_blocks;                // Cached forward: the 40-register kernel, three blocks of 512 per SM
  bool weight_first;                // Cluster RMS forward: weight loads before x
  bool row_statistics;              // backward: rows store mean and rstd, weights are summed by columns
  bool shared_sums;                 // Cached backward, persistent grid: column sums in shared memory
  int weight_gradient_row_groups;   // backward: row groups of the column sums (weight_gradient_sums.cuh)
  int max_blocks_per_sm;            // Cached and ShortRows backward, persistent grid
  int threads_per_row;              // ShortRows: lanes per row, 8, 16 or 32
};

NormLaunchPlan plan_norm(const NormProblemShape& shape);

// The persistent backward after the occupancy queries: the staged kernel (next row copied into shared
// memory while the block works on this one) when each block gets several rows and the staging costs no
// occupancy.
inline bool prefer_staged_backward(int64_t rows, int64_t plain_blocks, int64_t staged_blocks) {
  return staged_blocks > 0 && staged_blocks >= plain_blocks && rows > staged_blocks;
}

// A persistent grid (blocks striding over more rows than there are blocks) and the column sums after it
// start only once the kernel before each has finished: launched early, the column sums' blocks would
// wait on SMs the grid needs. Blocks of one row each launch early.
inline bool persistent_backward_launches_early(int64_t rows, int64_t blocks) { return rows <= blocks; }

std::string describe(const NormLaunchPlan& plan);

}  // namespace cuda
}  // namespace fused_ops
