#pragma once
// The cross-entropy family's tuned choices: how many rows of logits a chunk holds (larger chunks keep
// the products efficient and add the weight gradient's read-modify-write, V x H per chunk, fewer times;
// smaller ones hold less memory) and how many loads of a row a thread of the row kernel keeps in
// flight. docs/design.md gives the figures.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace fused_ops {

constexpr int64_t kMegabyte = int64_t(1) << 20;
// The plan's smallest and largest chunks (below the smallest, the weight gradient's read-modify-write
// per chunk costs more than a smaller chunk saves), and the free memory above which the free-memory
// cap cannot bind.
constexpr int64_t kSmallestChunkBytes = 120 * kMegabyte;
constexpr int64_t kLargestChunkBytes = 1024 * kMegabyte;
constexpr int64_t kMemoryNeverBinding = 8 * kLargestChunkBytes;
// Chunks of at least this many rows hold whole multiples of it: the head over 1536- or 2048-row chunks
// runs about 10% faster than over 1664- or 2368-row ones, whose input-gradient products cuBLAS runs
// split-K; smaller chunks hold whole multiples of 64 rows.
constexpr int64_t kChunkRowMultiple = 512;
constexpr int64_t kSmallChunkRowMultiple = 64;

// The row kernel's 16-byte loads that a thread issues before it uses any of them.
constexpr int kRowVectorsInFlight = 8;

// Row stride of the chunk buffer in elements: whole 16-byte vectors, so every row starts aligned.
inline int64_t cross_entropy_row_stride(int64_t classes, int64_t element_size) {
  const int64_t per_vector = std::max<int64_t>(1, 16 / element_size);
  return (classes + per_vector - 1) / per_vector * per_vector;
}

// FUSED_OPS_LOGITS_CHUNK_MB=n sets a chunk's memory to n MB (at least one row): less memory for more
// passes over the weight's gradient, or the reverse. 0, empty or unset: the plan's own size. Anything
// but a whole number in [0, 2^20] is an error, not a silently ignored setting.
inline int64_t requested_chunk_bytes() {
  constexpr long long kLargestSetting = int64_t(1) << 20;  // 1 TB: far past any device's memory
  const char* setting = std::getenv("FUSED_OPS_LOGITS_CHUNK_MB");
  if (setting == nullptr || *setting == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long long megabytes = std::strtoll(setting, &end, 10);
  const bool whole_number = end != setting && *end == '\0' && errno == 0;
  TORCH_CHECK(whole_number && megabytes >= 0 && megabytes <= kLargestSetting,
              "fused::linear_cross_entropy: expected the environment variable FUSED_OPS_LOGITS_CHUNK_MB to be a "
              "whole number of megabytes from 0 to ", kLargestSetting,
              " (the memory of one chunk of logits; 0 or unset: the op's own choice), but got '", setting, "'");
  return megabytes * kMegabyte;
}

// At most an eighth of the whole logits, held between 120 MB and 1 GB, and at most an eighth of the
// memory available; then the rows split as evenly as whole multiples of 512 rows allow (64 for chunks
// under 512 rows) into as few chunks as that allows.
inline int64_t plan_cross_entropy_chunk_rows(int64_t rows, int64_t classes, int64_t element_size,
                                             int64_t available_bytes) {
  const int64_t row_bytes = cross_entropy_row_stride(classes, element_size) * element_size;
  const int64_t whole = rows * row_bytes;
  int64_t budget = std::clamp<int64_t>(whole / 8, kSmallestChunkBytes, kLargestChunkBytes);
  budget = std::min(budget, std::max<int64_t>(available_bytes / 8, row_bytes));
  const int64_t requested = requested_chunk_bytes();
  if (requested > 0) budget = requested;
  int64_t largest = std::max<int64_t>(1, budget / row_bytes);
  const int64_t multiple = largest >= kChunkRowMultiple ? kChunkRowMultiple : kSmallChunkRowMultiple;
  if (largest > multiple) largest = largest / multiple * multiple;
  if (largest >= rows) return std::max<int64_t>(1, rows);
  const int64_t chunks = (rows + largest - 1) / largest;
  int64_t chunk = (rows + chunks - 1) / chunks;
  if (chunk > multiple) chunk = std::min(largest, (chunk + multiple - 1) / multiple * multiple);
  return chunk;
}

}  // namespace fused_ops
