#pragma once
// The cross-entropy family's tuned choices: how many rows of logits a chunk holds (larger chunks keep
// the products efficient and add the weight gradient's read-modify-write, V x H per chunk, fewer times;
// smaller ones hold less memory) and how many loads of a row a thread of the row kernel keeps in
// flight. docs/design.md gives the figures.
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>

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

// A whole-number environment setting in [0, largest] (`unit` follows "whole number" in the error,
// `meaning` says what it sets): none when unset or empty; anything else is an error naming the op, never
// a silently ignored setting.
inline std::optional<int64_t> whole_number_setting(const char* name, long long largest, const char* op, const char* unit,
                                    const char* meaning) {
  const char* setting = std::getenv(name);
  if (setting == nullptr || *setting == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(setting, &end, 10);
  const bool whole_number = end != setting && *end == '\0' && errno == 0;
  TORCH_CHECK(whole_number && value >= 0 && value <= largest, "fused::", op, ": expected the environment variable ",
              name, " to be a whole number", unit, " from 0 to ", largest, " (", meaning, "), but got '",
              setting, "'");
  return value;
}

// FUSED_OPS_LOGITS_CHUNK_MB=n sets a chunk's memory to n MB (at least one row): less memory for more
// passes over the weight's gradient, or the reverse. 0, empty or unset: the plan's own size.
inline int64_t requested_chunk_bytes() {
  constexpr long long kLargestSetting = int64_t(1) << 20;  // 1 TB: far past any device's memory
  return whole_number_setting("FUSED_OPS_LOGITS_CHUNK_MB", kLargestSetting, "linear_cross_entropy", " of megabytes",
                              "the memory of one chunk of logits; 0 or unset: the op's own choice")
             .value_or(0) *
         kMegabyte;
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

// A chunk whose product adds into the weight's float32 gradient holds at least this many rows (at most 1 GB
// and an eighth of the memory available): each chunk reads and writes the whole V x H gradient, which costs
// more than the chunk's product under about 700 rows on an H100 (4 x its FLOP/s over its bandwidth).
constexpr int64_t kWeightGradientChunkRows = 2048;

// The forward's chunk of rows: whole multiples of 512 rows (64 for chunks under 512 rows); at least
// kWeightGradientChunkRows where `adds_weight_gradient` (linear_cross_entropy's gradients in the forward).
inline int64_t plan_cross_entropy_chunk_rows(int64_t rows, int64_t classes, int64_t element_size,
                                             int64_t available_bytes, bool adds_weight_gradient = false) {
  const int64_t row_bytes = cross_entropy_row_stride(classes, element_size) * element_size;
  int64_t budget = plan_chunk_bytes(rows * row_bytes, row_bytes, available_bytes);
  if (adds_weight_gradient && requested_chunk_bytes() == 0) {
    const int64_t fewest_rows_bytes = std::min(kLargestChunkBytes, kWeightGradientChunkRows * row_bytes);
    budget = std::max(budget, std::min(fewest_rows_bytes, std::max(available_bytes / 8, row_bytes)));
  }
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

// How many classes' logits linear_log_probs' forward keeps for its backward, which then recomputes only
// the others' (one product fewer over them): the first 24 x H classes (whole multiples of 256), as much
// memory per row as 24 of the head's H-wide inputs, and at most 1.5 weights' worth in all (rows x K <= 1.5
// x V x H, whole multiples of 256), so that long batches keep fewer classes rather than more memory than a
// float32 copy of the weight's gradient. FUSED_OPS_KEPT_CLASSES=n keeps n classes instead (rounded down to
// 256; 0: none, the least memory). `rows` is symbolic under torch.compile with dynamic shapes: the count
// is then an expression of it, never a specialization.
constexpr int64_t kKeptClassesPerHidden = 24;
constexpr int64_t kKeptWeightHalves = 3;  // 1.5 weights' worth, in halves of the weight's V x H
inline c10::SymInt plan_log_probs_kept_classes(const c10::SymInt& rows, int64_t classes, int64_t hidden) {
  const std::optional<int64_t> setting =
      whole_number_setting("FUSED_OPS_KEPT_CLASSES", int64_t(1) << 40, "linear_log_probs", " of classes",
                           "the logits of how many classes the forward keeps; 0: none");
  if (setting) return std::min(classes, *setting / kChunkClassMultiple * kChunkClassMultiple);
  const int64_t per_hidden =
      std::min(classes, kKeptClassesPerHidden * hidden / kChunkClassMultiple * kChunkClassMultiple);
  const c10::SymInt per_row = c10::SymInt(kKeptWeightHalves * classes * hidden) / (2 * rows.max(1));
  return (per_row / kChunkClassMultiple * kChunkClassMultiple).min(per_hidden);
}

}  // namespace fused_ops
