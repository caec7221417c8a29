#pragma once
// The activations' launch policy: every tuned threshold of the family's row loops (cuda_rows.cuh) and
// launchers, with the reason for each. Host and device code read the same constants; docs/design.md
// gives the figure behind each rule.
#include <cstdint>

#include "math.h"

namespace fused_ops {
namespace cuda {

constexpr int64_t kMaxGridRows = 65535;  // CUDA's limit on gridDim.y; the kernels loop past it

// Each thread takes up to kMaxRowsPerThread rows of its column vector and issues all their loads before
// computing: the activations spend tens of instructions per element, so one load in flight per thread
// leaves the memory system idle while warps compute.
constexpr int kMaxRowsPerThread = 2;

// Decode grids run rowwise_decode_kernel in blocks of 128; where its 32-bit offsets do not fit, the
// looping kernel in blocks of 64, so that a row of 8192 16-bit values spreads over 16 SMs, not 4.
constexpr int kDecodeThreadsPerBlock = 128;
constexpr int kSmallGridThreadsPerBlock = 64;

// Decode grids give each thread the fewest elements (a power of two, at most a 16-byte vector's) that
// keep the grid to kDecodeThreadsPerSm threads per SM: one row is fastest at 1-2 elements per thread,
// eight rows and more at 8.
constexpr int64_t kDecodeThreadsPerSm = 64;

inline int decode_elements_per_thread(int64_t elements, int max_elements, int sms) {
  const int64_t threads = kDecodeThreadsPerSm * int64_t(sms);
  int per_thread = 1;
  while (per_thread < max_elements && elements > threads * per_thread) per_thread *= 2;
  return per_thread;
}

// A grid of fewer than four blocks per SM is a decode grid: latency matters more than loads in flight.
inline bool uses_decode_grid(int64_t row_groups, int64_t column_blocks, int sms) {
  return row_groups * column_blocks < 4 * int64_t(sms);
}

// Column sums over few rows (bias gradients of decode calls) take one launch with each element in its
// own thread, kFewRowsLanes row lanes per block, up to kMaxFewRows rows; up to kMaxFewRowsDecode rows on
// the decode kernel's compact parameters (at 64 rows the general kernel is faster).
constexpr int kFewRowsLanes = 16;
constexpr int64_t kMaxFewRows = 4 * kFewRowsLanes;
constexpr int64_t kMaxFewRowsDecode = 2 * kFewRowsLanes;

// Many rows with column sums: enough row blocks to fill the GPU at 8 blocks per SM, each looping over its
// rows; each partial row costs about 1 / (rows per block) of the output's traffic.
constexpr int kColumnSumBlocksPerSm = 8;

// The erf GELU forward with 16-bit results is issue-bound: each thread takes two row groups, so its
// setup is paid once for both. Memory-bound ops (tanh, float32, the gated ops) take one.
inline int64_t bias_gelu_row_groups_per_thread(GeluApproximation kernel_approximation) {
  return kernel_approximation == GeluApproximation::NoneRoundedTo16Bits ? 2 : 1;
}

// Decode calls (up to 64 rows) get one kernel per GELU approximation, fixed when compiled: no branch on
// it, one straight-line body per row. Many rows keep the runtime choice, where fixed kernels win nothing.
constexpr int64_t kFixedApproximationMaxRows = 64;

}  // namespace cuda
}  // namespace fused_ops
