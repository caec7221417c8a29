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

// A chunk's memory: at most an eighth of the whole logits, held between 120 MB and 1 GB, and at most an
// eighth of the memory available (at least one `unit`: a row, or a class of every row), or
// FUSED_OPS_LOGITS_CHUNK_MB.
inline int64_t plan_chunk_bytes(int64_t whole, int64_t unit_bytes, int64_t available_bytes) {
  int64_t budget = std::clamp<int64_t>(whole / 8, kSmallestChunkBytes, kLargestChunkBytes);
  budget = std::min(budget, std::max<int64_t>(available_bytes / 8, unit_bytes));
  const int64_t requested = requested_chunk_bytes();
  return requested > 0 ? requested : budget;
}

// `total` units split into as few chunks of at most `budget_units` as allow, as evenly as whole multiples
// of `multiple` (of `small_multiple` for chunks under `multiple`) allow.
inline int64_t split_evenly(int64_t total, int64_t budget_units, int64_t multiple, int64_t small_multiple) {
  int64_t largest = std::max<int64_t>(1, budget_units);
  if (largest < multiple) multiple = small_multiple;
  if (largest > multiple) largest = largest / multiple * multiple;
  if (largest >= total) return std::max<int64_t>(1, total);
  const int64_t chunks = (total + largest - 1) / largest;
  int64_t chunk = (total + chunks - 1) / chunks;
  if (chunk > multiple) chunk = std::min(largest, (chunk + multiple - 1) / multiple * multiple);
  return chunk;
}

// The forward's chunk of rows: whole multiples of 512 rows (64 for chunks under 512 rows).
inline int64_t plan_cross_entropy_chunk_rows(int64_t rows, int64_t classes, int64_t element_size,
                                             int64_t available_bytes) {
  const int64_t row_bytes = cross_entropy_row_stride(classes, element_size) * element_size;
  const int64_t budget = plan_chunk_bytes(rows * row_bytes, row_bytes, available_bytes);
  return split_evenly(rows, budget / row_bytes, kChunkRowMultiple, kSmallChunkRowMultiple);
}

// linear_log_probs' backward's chunk of classes, of every row: whole multiples of 256 classes (8 for
// chunks under 256), so that every chunk's rows start on 16-byte vectors and its products tile evenly.
constexpr int64_t kChunkClassMultiple = 256;
constexpr int64_t kSmallChunkClassMultiple = 8;
inline int64_t plan_log_probs_gradient_classes(int64_t rows, int64_t classes, int64_t element_size,
                                               int64_t available_bytes) {
  const int64_t class_bytes = std::max<int64_t>(1, rows) * element_size;
  const int64_t budget = plan_chunk_bytes(classes * class_bytes, class_bytes, available_bytes);
  return split_evenly(classes, budget / class_bytes, kChunkClassMultiple, kSmallChunkClassMultiple);
}

}  // namespace fused_ops
