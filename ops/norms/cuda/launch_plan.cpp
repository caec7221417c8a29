#include "launch_plan.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace fused_ops {
namespace cuda {
namespace {

struct BlockShape {
  int threads;
  int packs_per_thread;
};

// The fewest packs per thread that keep a cached row's block at or below `max_threads`.
BlockShape cached_block(int64_t packs, int max_threads) {
  int packs_per_thread = 1;
  while (packs_per_thread < kNormMaxPacksPerThread && (packs + packs_per_thread - 1) / packs_per_thread > max_threads) {
    packs_per_thread *= 2;
  }
  const int64_t threads = (packs + packs_per_thread - 1) / packs_per_thread;
  return {static_cast<int>(std::max<int64_t>(32, (threads + 31) / 32 * 32)), packs_per_thread};
}

// Decode rows short enough for one pack per thread in a block of kNormWideBlockThreads.
bool wide_block_rows(int64_t rows, int64_t packs) { return rows <= kNormFewRows && packs <= kNormWideBlockThreads; }

int cached_forward_max_threads(int64_t rows, int64_t packs, bool residual_loads_first) {
  // Decode: wider blocks read each row with more threads at once, except where the residual loads
  // first, which reduces over fewer warps in blocks of 512.
  if (wide_block_rows(rows, packs)) return residual_loads_first ? kNormMaxThreads : kNormWideBlockThreads;
  if (rows < 1024) return kNormMaxThreads;
  // Many rows stream best in blocks of 256, except rows of over 512 packs whose residual loads first.
  return residual_loads_first && packs > kNormMaxThreads ? kNormMaxThreads : 256;
}

int cached_backward_max_threads(int64_t rows, int64_t packs) {
  // Blocks of 256 give rows of 257-512 packs two packs per thread, which the staged kernel needs;
  // decode rows take blocks of up to 512.
  return wide_block_rows(rows, packs) ? kNormMaxThreads : 256;
}

// One row's split over a cluster; 0 blocks where a row fits one block, needs more than eight blocks of
// two packs per thread, or the GPU runs no cluster code.
BlockShape cluster_split(int64_t packs, bool runs_clusters, int64_t& blocks) {
  const int packs_per_thread = packs <= int64_t(kMaxClusterBlocks) * kClusterBlockThreads ? 1 : 2;
  const int64_t packs_per_block = int64_t(kClusterBlockThreads) * packs_per_thread;
  blocks = (packs + packs_per_block - 1) / packs_per_block;
  if (blocks < 2 || blocks > kMaxClusterBlocks || !runs_clusters) blocks = 0;
  return {kClusterBlockThreads, packs_per_thread};
}

// Rows that run one cluster each: up to 32 of four to eight blocks of one pack per thread, 16 of two
// packs; rows of two or three blocks only alone.
int64_t cluster_rows(int64_t blocks, int packs_per_thread) {
  if (blocks < 4) return 1;
  return packs_per_thread == 1 ? 32 : 16;
}

// Row groups of the column sums: 4 for up to 16 rows (more groups would leave threads one row), 8 for
// decode rows of 16384 columns or more (16 groups' blocks of 512 would need a second wave), else 16.
// One shape always takes the same groups, so the sums are bit-identical run to run.
int weight_gradient_row_groups(int64_t rows, int64_t columns) {
  if (rows <= 16) return 4;
  if (rows <= kNormFewRows && columns >= 16384) return 8;
  return 16;
}

}  // namespace

NormLaunchPlan plan_norm(const NormProblemShape& shape) {
  NormLaunchPlan plan{};
  const int64_t element_size = int64_t(c10::elementSize(shape.dtype));
  const int64_t packs = shape.columns / (shape.vectorized ? 16 / element_size : 1);
  plan.weight_gradient_row_groups = weight_gradient_row_groups(shape.rows, shape.columns);

  int64_t cluster_blocks = 0;
  const BlockShape cluster = cluster_split(packs, shape.runs_clusters, cluster_blocks);
  bool clustered = cluster_blocks != 0 && shape.rows <= cluster_rows(cluster_blocks, cluster.packs_per_thread);
  // A LayerNorm forward without a residual gains from a cluster only on rows of a full one.
  if (!shape.backward && shape.kind == NormKind::Layer && !shape.has_residual && cluster_blocks < kMaxClusterBlocks) {
    clustered = false;
  }
  if (clustered) {
    plan.path = NormPath::Cluster;
    plan.threads = cluster.threads;
    plan.packs_per_thread = cluster.packs_per_thread;
    plan.cluster_blocks = cluster_blocks;
    // The weight's latency overlaps x's only without a residual; with one it costs.
    plan.weight_first = !shape.backward && shape.kind == NormKind::RMS && !shape.has_residual;
    plan.row_statistics = shape.backward && shape.rows > 1;
    return plan;
  }

  // Short rows: one block per row would leave most of a block idle and, in the backward's persistent
  // grid, keep only a few rows' loads in flight per SM.
  if (shape.vectorized && packs <= kShortRowMaxPacks && shape.rows > kNormFewRows) {
    plan.path = NormPath::ShortRows;
    plan.threads = kShortRowBlockThreads;
    plan.packs_per_thread = 1;
    plan.threads_per_row = packs <= 8 ? 8 : packs <= 16 ? 16 : 32;
    if (shape.backward) plan.max_blocks_per_sm = kBackwardBlocksPerSm;
    return plan;
  }

  if (packs > kMaxCachedPacks) {
    plan.path = NormPath::LongRows;
    plan.threads = kLongRowThreads;
    plan.row_statistics = shape.backward;
    return plan;
  }

  plan.path = NormPath::Cached;
  if (!shape.backward) {
    // 16-bit packs with a residual load x and residual for the whole row first: one memory latency per
    // row instead of one per pack (residual_out may alias the inputs, so the compiler cannot reorder).
    plan.residual_loads_first = shape.has_residual && shape.vectorized && element_size == 2;
    const BlockShape block = cached_block(packs, cached_forward_max_threads(shape.rows, packs, plan.residual_loads_first));
    plan.threads = block.threads;
    plan.packs_per_thread = block.packs_per_thread;
    // Many bf16 rows of four packs per thread in blocks of 512 (bf16 weights): three blocks per SM.
    plan.three_blocks = !plan.residual_loads_first && shape.dtype == at::kBFloat16 &&
                        shape.weight_dtype == at::kBFloat16 && shape.vectorized && block.packs_per_thread == 4 &&
                        shape.rows >= 1024 && block.threads == kNormMaxThreads;
    return plan;
  }

  const BlockShape block = cached_block(packs, cached_backward_max_threads(shape.rows, packs));
  plan.threads = block.threads;
  plan.packs_per_thread = block.packs_per_thread;
  if (shape.rows > 1 && shape.rows <= kNormFewRows) {
    // Decode: one block per row; the weight gradients are summed by columns afterwards on every SM
    // instead of in partial rows by the rows' few blocks.
    plan.row_statistics = true;
    return plan;
  }
  plan.max_blocks_per_sm = kBackwardBlocksPerSm;
  // Sums in registers for RMS rows of over 512 packs, and for one row of up to two packs per thread,
  // whose block writes the gradients itself (shared sums would be zeroed and copied out for nothing).
  const bool single_short_row = shape.rows == 1 && block.packs_per_thread <= 2;
  plan.shared_sums = !single_short_row && (shape.kind == NormKind::Layer || packs <= 512);
  return plan;
}

std::string describe(const NormLaunchPlan& plan) {
  static const char* const kPaths[] = {"cluster", "cached", "long_rows", "short_rows"};
  std::ostringstream text;
  text << "path=" << kPaths[static_cast<int>(plan.path)] << " threads=" << plan.threads
       << " packs_per_thread=" << plan.packs_per_thread << " cluster_blocks=" << plan.cluster_blocks
       << " residual_loads_first=" << plan.residual_loads_first << " three_blocks=" << plan.three_blocks
       << " weight_first=" << plan.weight_first << " row_statistics=" << plan.row_statistics
       << " shared_sums=" << plan.shared_sums << " weight_gradient_row_groups=" << plan.weight_gradient_row_groups
       << " max_blocks_per_sm=" << plan.max_blocks_per_sm << " threads_per_row=" << plan.threads_per_row;
  return text.str();
}

}  // namespace cuda
}  // namespace fused_ops

// The plan as text ("path=cached threads=256 ..."), for tests through ctypes: no GPU needed. dtype and
// weight_dtype are torch's names ("bfloat16"); returns the length written, or -1 for an unknown dtype.
extern "C" int fused_ops_describe_norm_launch_plan(int64_t rows, int64_t columns, const char* dtype,
                                                   const char* weight_dtype, int layer_norm, int backward,
                                                   int has_residual, int vectorized, int runs_clusters,
                                                   char* text, int capacity) {
  auto scalar_type = [](const char* name, at::ScalarType& type) {
    static const std::pair<const char*, at::ScalarType> kTypes[] = {
        {"float64", at::kDouble}, {"float32", at::kFloat}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16}};
    for (const auto& [known, known_type] : kTypes) {
      if (std::strcmp(name, known) == 0) {
        type = known_type;
        return true;
      }
    }
    return false;
  };
  fused_ops::cuda::NormProblemShape shape{rows, columns, at::kFloat, at::kFloat,
                                          layer_norm ? fused_ops::NormKind::Layer : fused_ops::NormKind::RMS,
                                          backward != 0, has_residual != 0, vectorized != 0, runs_clusters != 0};
  if (!scalar_type(dtype, shape.dtype) || !scalar_type(weight_dtype, shape.weight_dtype)) return -1;
  const std::string description = fused_ops::cuda::describe(fused_ops::cuda::plan_norm(shape));
  const int length = static_cast<int>(std::min<size_t>(description.size(), size_t(std::max(capacity - 1, 0))));
  if (capacity > 0) {
    std::memcpy(text, description.data(), length);
    text[length] = '\0';
  }
  return length;
}
