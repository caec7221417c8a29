#pragma once
// The elementwise family's launch policy: which kernel path a binary op's operands take. Blocks are
// kThreadsPerBlock threads, one per 16-byte vector (ops/common/cuda_launch.cuh); docs/design.md gives
// the figures behind the rules.
#include <cstdint>
#include <limits>

#include "../common/cuda_launch.cuh"

namespace fused_ops {
namespace cuda {

// Dims the strided kernels' index math unrolls for; operands with more (after coalescing) are copied
// to contiguous ones first.
constexpr int kMaxStridedDims = 8;

enum class BinaryPath {
  ExactGrid,   // dense, aligned, and whole blocks of 16-byte vectors cover every element
  Vectorized,  // dense and aligned
  Strided,     // anything else
};

// Dense, 16-byte-aligned operands take 16-byte vectors; where whole blocks cover them exactly (with
// 32-bit vector indices), the kernel without a loop, tail or bounds check, whose parameter reads then
// issue at once.
inline BinaryPath plan_binary_path(bool dense_and_aligned, int64_t numel, int vector_elements) {
  if (!dense_and_aligned) return BinaryPath::Strided;
  const bool whole_blocks = numel % (int64_t(vector_elements) * kThreadsPerBlock) == 0 &&
                            numel / vector_elements <= std::numeric_limits<int>::max();
  return whole_blocks ? BinaryPath::ExactGrid : BinaryPath::Vectorized;
}

}  // namespace cuda
}  // namespace fused_ops
