#pragma once
// The rotary family's launch policy: the kernel (rotated pairs of vectors for a whole rotation or
// GPT-J's pairs; head rows staged through each warp's shared memory for a partial rotate_half
// rotation, its pairs rotated in runs as wide as R/2 allows), the widest vector every operand of both
// tensors allows (16 bytes of q's dtype at most) or the strided kernel, and the row order that follows
// each tensor's memory.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "rotary.h"

namespace fused_ops {
namespace cuda {

// Vectors of one warp's tile in rotary_staged_kernel (whole head rows, 3 KB at 16 bytes each): with two
// tiles a warp (one rotating, the next one's copies in flight), a block of 256 threads takes 48 KB of
// shared memory, and four blocks fit an SM.
constexpr int kStagedWarpVectors = 192;
constexpr int kStagedBlocksPerSM = 4;
// Tiles a warp of rotary_staged_kernel takes in turn: two let the second one's copies fly while the
// first rotates; more would only leave fewer warps for the same rows.
constexpr int kStagedTilesPerWarp = 2;

struct RotaryLaunchPlan {
  int vector_elements = 1;  // 1: the strided kernel
  bool staged = false;  // rotary_staged_kernel (partial rotate_half) rather than rotary_pairs_kernel
  bool sequence_outer[2] = {false, false};  // rows ordered (b, s, h) rather than (b, h, s)
  bool dense_rows[2] = {false, false};  // row r of q (k) and of its output at r * D: no place to compute
};

// Whether the rows of `strides` (in the order `sequence_outer` gives) lie back to back, D elements
// apart, as in any contiguous tensor of either layout (a dim of size one has stride 0 and any place).
inline bool rotary_rows_dense(const RotaryProblem& problem, const int64_t (&strides)[4], bool sequence_outer) {
  const int inner = sequence_outer ? 1 : 2, outer = sequence_outer ? 2 : 1;
  int64_t expected = problem.sizes[3];
  for (int d : {inner, outer, 0}) {
    if (problem.sizes[d] != 1 && strides[d] != expected) return false;
    expected *= problem.sizes[d];
  }
  return strides[3] == 1;
}

// Whether `problem` can move `width` elements per load: unit-stride head vectors, every other stride
// and both region lengths (rotated pairs' halves or rotated dims, passed-through dims) multiples of
// `width`, pointers aligned to the vector, and 32-bit row and item counts.
// `staged` vectors are whole rows' vectors (D a multiple of the width; R and R/2 need not be), and a tile
// of kStagedWarpVectors holds at least one row.
inline bool rotary_vector_fits(const RotaryProblem& problem, int width, int64_t element_size,
                               int64_t table_element_size, bool staged) {
  const int64_t rotated = problem.interleaved ? problem.rotary_dim : problem.rotary_dim / 2;
  if (staged) {
    if (problem.sizes[3] % width != 0 || problem.sizes[3] / width > kStagedWarpVectors) return false;
  } else if (rotated % width != 0 || (problem.sizes[3] - problem.rotary_dim) % width != 0) {
    return false;
  }
  if (problem.x_strides[3] != 1 || problem.out_strides[3] != 1) return false;
  if (problem.rotary_dim > 0 && (problem.cos_strides[3] != 1 || problem.sin_strides[3] != 1)) return false;
  for (const int64_t* stride : {problem.x_strides, problem.out_strides, problem.cos_strides, problem.sin_strides}) {
    for (int d = 0; d < 3; ++d) {
      if (stride[d] % width != 0) return false;
    }
  }
  auto aligned = [](const void* pointer, int64_t bytes) { return reinterpret_cast<uintptr_t>(pointer) % bytes == 0; };
  const int64_t vector_bytes = width * element_size;
  const int64_t table_bytes = std::min<int64_t>(16, width * table_element_size);
  if (!aligned(problem.x, vector_bytes) || !aligned(problem.out, vector_bytes) || !aligned(problem.cos, table_bytes) ||
      !aligned(problem.sin, table_bytes)) {
    return false;
  }
  const int64_t rows = problem.sizes[0] * problem.sizes[1] * problem.sizes[2];
  const int64_t per_row =
      staged ? problem.sizes[3] / width : rotated / width + (problem.sizes[3] - problem.rotary_dim) / width;
  const int64_t items = rows * per_row;
  return items < std::numeric_limits<int32_t>::max();
}

// The staged kernel's runs of rotated pairs (j, j + R/2): the widest power of two of elements, up to a
// vector of `width`, that R/2 is a multiple of, so that both runs of a pair keep the tile's alignment.
inline int64_t rotary_run_elements(const RotaryProblem& problem, int width) {
  const int64_t half = problem.rotary_dim / 2;
  int64_t run = width;
  while (run > 1 && half % run != 0) run /= 2;
  return run;
}

inline RotaryLaunchPlan plan_rotary(const RotaryProblem (&problems)[2], int64_t element_size,
                                    int64_t table_element_size) {
  RotaryLaunchPlan plan;
  for (int t = 0; t < 2; ++t) {
    const RotaryProblem& problem = problems[t];
    plan.sequence_outer[t] = problem.x_strides[2] > problem.x_strides[1];
    plan.dense_rows[t] = rotary_rows_dense(problem, problem.x_strides, plan.sequence_outer[t]) &&
                         rotary_rows_dense(problem, problem.out_strides, plan.sequence_outer[t]);
  }
  plan.staged = !problems[0].interleaved && problems[0].rotary_dim < problems[0].sizes[3];
  // Pairs of the interleaved form must sit inside one vector, so vectors hold at least two elements.
  for (int width = int(16 / element_size); width >= 2; width /= 2) {
    if (rotary_vector_fits(problems[0], width, element_size, table_element_size, plan.staged) &&
        rotary_vector_fits(problems[1], width, element_size, table_element_size, plan.staged)) {
      plan.vector_elements = width;
      return plan;
    }
  }
  return plan;
}

}  // namespace cuda
}  // namespace fused_ops
