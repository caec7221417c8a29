// CUDA kernels of the rotary family. q and k go in one launch: the first blocks take q, the rest k.
// The vectorized kernel moves whole vectors of a head (16 bytes where the layout allows, see
// launch_plan.h) with rows in the tensor's memory order, so the cos/sin rows that the heads of one
// position share stay in cache; the strided kernel takes any strides, one pair per thread.
#include <ATen/OpMathType.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <array>

#include "../common/async_copy.cuh"
#include "../common/cuda_launch.cuh"
#include "../common/vector.cuh"
#include "launch_plan.h"
#include "rotary.h"

namespace fused_ops {
namespace cuda {
namespace {

using Divider = at::cuda::detail::IntDivider<unsigned int>;

// Both tensors' problems; blocks [0, first_blocks) rotate q, the others k. The vectorized kernel splits
// an item index into (row, item of the row) and a row into (b, outer, inner) in memory order with
// multiply-shift dividers: a thread's index math would otherwise cost more than its 16-byte moves.
struct RotaryPair {
  RotaryProblem tensors[2];
  unsigned int first_blocks;
  bool sequence_outer[2];
  bool dense_rows[2];  // rotary_staged_kernel's rows r of q (k) and its output at r * D
  Divider items_per_row[2];
  Divider inner[2];  // heads (or head groups) when the sequence is outer, else the sequence
  Divider outer[2];
  uint32_t rows_per_tile[2];  // rotary_staged_kernel's whole rows per warp's tile
  Divider pairs_per_row[2];  // and its pairs of runs per row
};

struct BlockShare {
  int tensor;
  int64_t block, blocks;
};

__device__ __forceinline__ BlockShare block_share(unsigned int first_blocks) {
  const bool first = blockIdx.x < first_blocks;
  return first ? BlockShare{0, blockIdx.x, first_blocks}
               : BlockShare{1, blockIdx.x - first_blocks, gridDim.x - first_blocks};
}

template <typename scalar_t, typename table_t>
__global__ void __launch_bounds__(kThreadsPerBlock) rotary_strided_kernel(RotaryPair pair) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  const BlockShare share = block_share(pair.first_blocks);
  const RotaryProblem& p = pair.tensors[share.tensor];
  const int64_t heads = p.sizes[1], sequence = p.sizes[2], head_dim = p.sizes[3];
  const int64_t half = p.rotary_dim / 2;
  const int64_t items_per_row = half + (head_dim - p.rotary_dim);
  const int64_t items = p.sizes[0] * heads * sequence * items_per_row;
  const scalar_t* x = static_cast<const scalar_t*>(p.x);
  scalar_t* out = static_cast<scalar_t*>(p.out);
  const table_t* cos = static_cast<const table_t*>(p.cos);
  const table_t* sin = static_cast<const table_t*>(p.sin);
  for (int64_t item = share.block * blockDim.x + threadIdx.x; item < items; item += share.blocks * blockDim.x) {
    const int64_t row = item / items_per_row, j = item % items_per_row;
    const int64_t s = row % sequence, h = (row / sequence) % heads, b = row / (sequence * heads);
    auto offset = [&](const int64_t (&strides)[4], int64_t e) {
      return b * strides[0] + h * strides[1] + s * strides[2] + e * strides[3];
    };
    if (j < half) {
      const int64_t ia = p.interleaved ? 2 * j : j;
      const int64_t ib = p.interleaved ? 2 * j + 1 : j + half;
      opmath_t a = static_cast<opmath_t>(x[offset(p.x_strides, ia)]);
      opmath_t c = static_cast<opmath_t>(x[offset(p.x_strides, ib)]);
      rotate_pair(a, c, static_cast<opmath_t>(cos[offset(p.cos_strides, ia)]),
                  static_cast<opmath_t>(cos[offset(p.cos_strides, ib)]),
                  static_cast<opmath_t>(sin[offset(p.sin_strides, ia)]),
                  static_cast<opmath_t>(sin[offset(p.sin_strides, ib)]), p.transposed);
      out[offset(p.out_strides, ia)] = static_cast<scalar_t>(a);
      out[offset(p.out_strides, ib)] = static_cast<scalar_t>(c);
    } else {
      const int64_t e = p.rotary_dim + (j - half);
      out[offset(p.out_strides, e)] = x[offset(p.x_strides, e)];
    }
  }
}

// The word one load of kBytes moves.
template <int kBytes>
struct LoadWord;
template <>
struct LoadWord<16> { using type = uint4; };
template <>
struct LoadWord<8> { using type = uint2; };
template <>
struct LoadWord<4> { using type = unsigned int; };
template <>
struct LoadWord<2> { using type = unsigned short; };

// kWidth elements of a table row from an element aligned to them (as they are, or in opmath), in loads
// of at most 16 bytes through the read-only path: the compiler may then issue them ahead of earlier
// stores, which it could not otherwise tell apart from the tables.
template <int kWidth, typename table_t>
__device__ __forceinline__ Vec<table_t, kWidth * int(sizeof(table_t))> load_table_run(const table_t* first) {
  constexpr int kBytes = kWidth * int(sizeof(table_t));
  using Word = typename LoadWord<(kBytes < 16 ? kBytes : 16)>::type;
  Vec<table_t, kBytes> run;
#pragma unroll
  for (int c = 0; c < int(kBytes / sizeof(Word)); ++c) {
    reinterpret_cast<Word*>(&run)[c] = __ldg(reinterpret_cast<const Word*>(first) + c);
  }
  return run;
}

template <int kWidth, typename table_t, typename opmath_t>
__device__ __forceinline__ void load_table(const table_t* row, int64_t element, opmath_t (&values)[kWidth]) {
  unpack_vec(load_table_run<kWidth>(row + element), values);
}

// Heads one thread of the vectorized kernel rotates with the cos/sin values it loads once: the tables'
// loads are shared by the heads of one position.
constexpr int kHeadsPerThread = 4;

// The whole rotation (R = D) or GPT-J's pairs: a thread rotates pairs of vectors (j, j + R/2) of its
// heads, or the pairs inside one vector, and copies the passed-through dims of any.
template <typename scalar_t, typename table_t, int kWidth>
__global__ void __launch_bounds__(kThreadsPerBlock) rotary_pairs_kernel(RotaryPair pair) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  using Vector = Vec<scalar_t, kWidth * int(sizeof(scalar_t))>;
  constexpr int kBytes = kWidth * int(sizeof(scalar_t));
  const BlockShare share = block_share(pair.first_blocks);
  const RotaryProblem& p = pair.tensors[share.tensor];
  const bool sequence_outer = pair.sequence_outer[share.tensor];
  const uint32_t heads = p.sizes[1];
  const uint32_t rotary_dim = p.rotary_dim, half = rotary_dim / 2;
  const uint32_t rotated_items = (p.interleaved ? rotary_dim : half) / kWidth;
  const Divider& items_per_row = pair.items_per_row[share.tensor];
  const Divider& inner = pair.inner[share.tensor];
  const Divider& outer = pair.outer[share.tensor];
  const uint32_t groups = (heads + kHeadsPerThread - 1) / kHeadsPerThread;
  const uint32_t items = uint32_t(p.sizes[0] * p.sizes[2]) * groups * items_per_row.divisor;
  for (int64_t item = share.block * blockDim.x + threadIdx.x; item < items; item += share.blocks * blockDim.x) {
    // Items in memory order: (b, s, head group, vector) when the sequence is outer, else (b, group, s, vector).
    const auto [row, j] = items_per_row.divmod(uint32_t(item));
    const auto [rest, inner_index] = inner.divmod(row);
    const auto [b, outer_index] = outer.divmod(rest);
    const uint32_t first_head = (sequence_outer ? inner_index : outer_index) * kHeadsPerThread;
    const uint32_t s = sequence_outer ? outer_index : inner_index;
    const int heads_here = min(kHeadsPerThread, int(heads - first_head));
    auto row_offset = [&](const int64_t (&strides)[4], uint32_t h) {
      return int64_t(b) * strides[0] + int64_t(h) * strides[1] + int64_t(s) * strides[2];
    };
    const scalar_t* x = static_cast<const scalar_t*>(p.x) + row_offset(p.x_strides, first_head);
    scalar_t* out = static_cast<scalar_t*>(p.out) + row_offset(p.out_strides, first_head);
    const int64_t x_head = p.x_strides[1], out_head = p.out_strides[1];
    if (j >= rotated_items) {
      const int64_t e = rotary_dim + (j - rotated_items) * kWidth;
      Vector passed[kHeadsPerThread];
#pragma unroll
      for (int h = 0; h < kHeadsPerThread; ++h) {
        if (h < heads_here) passed[h] = load_vec<kBytes>(x + h * x_head + e, 0);
      }
#pragma unroll
      for (int h = 0; h < kHeadsPerThread; ++h) {
        if (h < heads_here) store_vec<kBytes>(out + h * out_head + e, 0, passed[h]);
      }
      continue;
    }
    const table_t* cos = static_cast<const table_t*>(p.cos) + row_offset(p.cos_strides, 0);
    const table_t* sin = static_cast<const table_t*>(p.sin) + row_offset(p.sin_strides, 0);
    // Pairs (first[i], second[i]): (j, j + R/2) vectors apart, or neighbours within one vector.
    const int64_t ea = int64_t(j) * kWidth, eb = p.interleaved ? ea : ea + half;
    Vector first[kHeadsPerThread], second[kHeadsPerThread];
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) {
      if (h < heads_here) {
        first[h] = load_vec<kBytes>(x + h * x_head + ea, 0);
        if (!p.interleaved) second[h] = load_vec<kBytes>(x + h * x_head + eb, 0);
      }
    }
    opmath_t cos_a[kWidth], cos_b[kWidth], sin_a[kWidth], sin_b[kWidth];
    load_table(cos, ea, cos_a);
    load_table(sin, ea, sin_a);
    if (!p.interleaved) {
      load_table(cos, eb, cos_b);
      load_table(sin, eb, sin_b);
    }
#pragma unroll
    for (int h = 0; h < kHeadsPerThread; ++h) {
      if (h >= heads_here) continue;
      opmath_t a[kWidth], c[kWidth];
      unpack_vec(first[h], a);
      if (p.interleaved) {
#pragma unroll
        for (int i = 0; i < kWidth; i += 2) {
          rotate_pair(a[i], a[i + 1], cos_a[i], cos_a[i + 1], sin_a[i], sin_a[i + 1], p.transposed);
        }
      } else {
        unpack_vec(second[h], c);
#pragma unroll
        for (int i = 0; i < kWidth; ++i) rotate_pair(a[i], c[i], cos_a[i], cos_b[i], sin_a[i], sin_b[i], p.transposed);
        store_vec<kBytes>(out + h * out_head + eb, 0, pack_vec<scalar_t, kBytes>(c));
      }
      store_vec<kBytes>(out + h * out_head + ea, 0, pack_vec<scalar_t, kBytes>(a));
    }
  }
}

// A partial rotation (R < D, rotate_half), whose partners R/2 away need not fall on vector boundaries.
// Each warp stages tiles of whole head rows in its own shared memory with full-width asynchronous
// copies, rotates the pairs of runs (j, j + R/2) in place, each run as wide as R/2 allows, and stores
// the rows with full-width stores. A warp takes kStagedTilesPerWarp tiles, the copies of the next in
// flight while it rotates and stores the current one. Every lane does the same work in each step, and
// warps never wait for each other.
constexpr int kStagedWarps = kThreadsPerBlock / 32;
constexpr int kStagedVectorsPerLane = kStagedWarpVectors / 32;

template <typename scalar_t, typename table_t, int kWidth>
__global__ void __launch_bounds__(kThreadsPerBlock, kStagedBlocksPerSM) rotary_staged_kernel(RotaryPair pair) {
  begin_dependent_kernel();
  using opmath_t = at::opmath_type<scalar_t>;
  constexpr int kBytes = kWidth * int(sizeof(scalar_t));
  using Vector = Vec<scalar_t, kBytes>;
  __shared__ Vector tiles[kStagedWarps][2][kStagedWarpVectors];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const BlockShare share = block_share(pair.first_blocks);
  const int tensor = share.tensor;
  const RotaryProblem& p = pair.tensors[tensor];
  const bool sequence_outer = pair.sequence_outer[tensor];
  const Divider& vectors_per_row = pair.items_per_row[tensor];
  const Divider& pairs_per_row = pair.pairs_per_row[tensor];
  const uint32_t head_dim = vectors_per_row.divisor * kWidth;
  const uint32_t rows = uint32_t(p.sizes[0] * p.sizes[1] * p.sizes[2]);
  const uint32_t rows_per_tile = pair.rows_per_tile[tensor];
  const uint32_t tile_count = (rows + rows_per_tile - 1) / rows_per_tile;
  const uint32_t half = p.rotary_dim / 2;
  const uint32_t run_bytes = half / pairs_per_row.divisor * uint32_t(sizeof(scalar_t));
  // A row of the tensor in memory order ((b, s, h) when the sequence is outer, else (b, h, s)).
  auto place = [&](uint32_t row) {
    const auto [rest, inner_index] = pair.inner[tensor].divmod(row);
    const auto [b, outer_index] = pair.outer[tensor].divmod(rest);
    return std::array<uint32_t, 3>{b, sequence_outer ? inner_index : outer_index,
                                   sequence_outer ? outer_index : inner_index};
  };
  const bool dense_rows = pair.dense_rows[tensor];
  auto row_offset = [&](uint32_t row, const int64_t (&strides)[4]) {
    if (dense_rows) return int64_t(row) * head_dim;
    const auto [b, h, s] = place(row);
    return int64_t(b) * strides[0] + int64_t(h) * strides[1] + int64_t(s) * strides[2];
  };
  // Lane's vector v = lane + 32k of a tile: (row of the tile, first element), the same in every tile and
  // recomputed where used (kept, the twelve registers made some dtypes spill at four blocks an SM).
  auto vector_place = [&](int k) {
    const auto [row, column] = vectors_per_row.divmod(uint32_t(lane + 32 * k));
    return std::array<uint32_t, 2>{row, column * kWidth};
  };
  auto rows_of = [&](uint32_t tile_index) { return min(rows_per_tile, rows - tile_index * rows_per_tile); };
  // Queues the copies of a tile's rows into `tile` as one group (an empty group past the last tile keeps
  // the waits' counts right).
  auto stage = [&](uint32_t tile_index, Vector* tile) {
    if (tile_index < tile_count) {
      const uint32_t first_row = tile_index * rows_per_tile, tile_rows = rows_of(tile_index);
#pragma unroll
      for (int k = 0; k < kStagedVectorsPerLane; ++k) {
        const auto [row, element] = vector_place(k);
        if (row >= tile_rows) continue;
        const int64_t offset = row_offset(first_row + row, p.x_strides) + element;
        copy_async<kBytes>(tile + lane + 32 * k, static_cast<const scalar_t*>(p.x) + offset);
      }
    }
    commit_async_copies();
  };
  // Rotates the pairs of runs of kRun elements of the tile's first `tile_rows` rows in place.
  auto rotate_runs_as = [&](auto run, auto transposed, scalar_t* tile_elements, uint32_t first_row,
                            uint32_t tile_rows) {
    constexpr int kRun = decltype(run)::value;
    using Run = Vec<scalar_t, kRun * int(sizeof(scalar_t))>;
    for (uint32_t item = lane; item < tile_rows * pairs_per_row.divisor; item += 32) {
      const auto [row, pair_index] = pairs_per_row.divmod(item);
      const auto [b, h, s] = place(first_row + row);
      const uint32_t ja = pair_index * kRun, jb = ja + half;
      const table_t* cos =
          static_cast<const table_t*>(p.cos) + int64_t(b) * p.cos_strides[0] + int64_t(s) * p.cos_strides[2];
      const table_t* sin =
          static_cast<const table_t*>(p.sin) + int64_t(b) * p.sin_strides[0] + int64_t(s) * p.sin_strides[2];
      using TableRun = Vec<table_t, kRun * int(sizeof(table_t))>;
      const TableRun cos_a = load_table_run<kRun>(cos + ja), cos_b = load_table_run<kRun>(cos + jb);
      const TableRun sin_a = load_table_run<kRun>(sin + ja), sin_b = load_table_run<kRun>(sin + jb);
      Run* first = reinterpret_cast<Run*>(tile_elements + row * head_dim + ja);
      Run* second = reinterpret_cast<Run*>(tile_elements + row * head_dim + jb);
      const Run x_a = *first, x_b = *second;
      // Elements are converted one at a time: the runs stay packed in registers until then.
      opmath_t a[kRun], c[kRun];
#pragma unroll
      for (int i = 0; i < kRun; ++i) {
        a[i] = static_cast<opmath_t>(x_a.values[i]);
        c[i] = static_cast<opmath_t>(x_b.values[i]);
        rotate_pair(a[i], c[i], static_cast<opmath_t>(cos_a.values[i]), static_cast<opmath_t>(cos_b.values[i]),
                    static_cast<opmath_t>(sin_a.values[i]), static_cast<opmath_t>(sin_b.values[i]),
                    decltype(transposed)::value);
      }
      *first = pack_vec<scalar_t, int(sizeof(Run))>(a);
      *second = pack_vec<scalar_t, int(sizeof(Run))>(c);
    }
  };
  // The direction decided once per warp rather than per element.
  auto rotate_runs = [&](auto run, scalar_t* tile_elements, uint32_t first_row, uint32_t tile_rows) {
    if (p.transposed) return rotate_runs_as(run, std::true_type{}, tile_elements, first_row, tile_rows);
    rotate_runs_as(run, std::false_type{}, tile_elements, first_row, tile_rows);
  };
  const uint32_t warps = share.blocks * kStagedWarps;
  uint32_t tile_index = share.block * kStagedWarps + warp;
  stage(tile_index, tiles[warp][0]);
  for (int buffer = 0; tile_index < tile_count; tile_index += warps, buffer ^= 1) {
    // The next tile's copies go out before this tile is touched; this tile's group is then complete.
    stage(tile_index + warps, tiles[warp][buffer ^ 1]);
    wait_async_copies<1>();
    __syncwarp();
    Vector* tile = tiles[warp][buffer];
    const uint32_t first_row = tile_index * rows_per_tile, tile_rows = rows_of(tile_index);
    // The runs' width, chosen by the launch plan (a power of two up to a vector; 0: nothing rotates).
    auto rotate_runs_of = [&](auto bytes) {
      rotate_runs(std::integral_constant<int, decltype(bytes)::value / int(sizeof(scalar_t))>{},
                  reinterpret_cast<scalar_t*>(tile), first_row, tile_rows);
    };
    switch (run_bytes) {
      case 0:
        break;
      case 16:
        if constexpr (kBytes >= 16) rotate_runs_of(std::integral_constant<int, 16>{});
        break;
      case 8:
        if constexpr (kBytes >= 8 && sizeof(scalar_t) <= 8) rotate_runs_of(std::integral_constant<int, 8>{});
        break;
      case 4:
        if constexpr (kBytes >= 4 && sizeof(scalar_t) <= 4) rotate_runs_of(std::integral_constant<int, 4>{});
        break;
      default:
        rotate_runs(std::integral_constant<int, 1>{}, reinterpret_cast<scalar_t*>(tile), first_row, tile_rows);
    }
    __syncwarp();
#pragma unroll
    for (int k = 0; k < kStagedVectorsPerLane; ++k) {
      const auto [row, element] = vector_place(k);
      if (row >= tile_rows) continue;
      const int64_t offset = row_offset(first_row + row, p.out_strides) + element;
      store_vec<kBytes>(static_cast<scalar_t*>(p.out) + offset, 0, tile[lane + 32 * k]);
    }
    // The tile is read before the copies two tiles on refill it.
    __syncwarp();
  }
}

// Vectors of a row that the plan's kernel gives a thread each: a (b, s, head group) row's, or a head
// row's whole vectors for the staged kernel.
int64_t rotary_items_per_row(const RotaryProblem& p, const RotaryLaunchPlan& plan) {
  if (plan.staged) return p.sizes[3] / plan.vector_elements;
  const int64_t rotated = p.interleaved ? p.rotary_dim : p.rotary_dim / 2;
  return (rotated + p.sizes[3] - p.rotary_dim) / plan.vector_elements;
}

int64_t rotary_heads_per_row(const RotaryLaunchPlan& plan) { return plan.staged ? 1 : kHeadsPerThread; }

int64_t rotary_rows_per_tile(const RotaryProblem& p, const RotaryLaunchPlan& plan) {
  return kStagedWarpVectors / rotary_items_per_row(p, plan);
}

// Work items that size the grid: one warp per kStagedTilesPerWarp staged tiles, else one thread per item.
int64_t rotary_items(const RotaryProblem& p, const RotaryLaunchPlan& plan) {
  if (plan.vector_elements == 1) return p.sizes[0] * p.sizes[1] * p.sizes[2] * (p.rotary_dim / 2 + p.sizes[3] - p.rotary_dim);
  if (plan.staged) {
    const int64_t rows = p.sizes[0] * p.sizes[1] * p.sizes[2], rows_per_tile = rotary_rows_per_tile(p, plan);
    const int64_t tiles = (rows + rows_per_tile - 1) / rows_per_tile;
    return (tiles + kStagedTilesPerWarp - 1) / kStagedTilesPerWarp * 32;
  }
  const int64_t groups = (p.sizes[1] + kHeadsPerThread - 1) / kHeadsPerThread;
  return p.sizes[0] * p.sizes[2] * groups * rotary_items_per_row(p, plan);
}

// The plan's kernel and width (templates, so the widths a dtype cannot have are never built).
template <typename scalar_t, typename table_t>
void launch_rotary(const RotaryLaunchPlan& plan, unsigned int blocks, cudaStream_t stream, const RotaryPair& pair) {
  auto launch = [&](auto kernel) {
    launch_kernel(kernel, blocks, kThreadsPerBlock, 0, stream, pair);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  auto launch_width = [&](auto width) {
    constexpr int kWidth = decltype(width)::value;
    if (plan.staged) return launch(rotary_staged_kernel<scalar_t, table_t, kWidth>);
    return launch(rotary_pairs_kernel<scalar_t, table_t, kWidth>);
  };
  switch (plan.vector_elements) {
    case 1:
      return launch(rotary_strided_kernel<scalar_t, table_t>);
    case 2:
      return launch_width(std::integral_constant<int, 2>{});
    case 4:
      if constexpr (sizeof(scalar_t) <= 4) return launch_width(std::integral_constant<int, 4>{});
      break;
    case 8:
      if constexpr (sizeof(scalar_t) <= 2) return launch_width(std::integral_constant<int, 8>{});
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "rotary_embedding: no kernel for ", plan.vector_elements, "-element vectors");
}

void rotary_cuda(const RotaryProblem (&problems)[2], at::ScalarType dtype, at::ScalarType table_dtype) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FUSED_DISPATCH_MIXED_TYPES(dtype, table_dtype, "rotary_cuda", [&] {
    const RotaryLaunchPlan plan = plan_rotary(problems, sizeof(scalar_t), sizeof(weight_t));
    RotaryPair pair{{problems[0], problems[1]}, 0, {plan.sequence_outer[0], plan.sequence_outer[1]},
                    {plan.dense_rows[0], plan.dense_rows[1]}};
    if (plan.vector_elements > 1) {
      for (int t = 0; t < 2; ++t) {
        const RotaryProblem& problem = problems[t];
        const int64_t per_row = rotary_items_per_row(problem, plan);
        const int64_t heads_per_row = rotary_heads_per_row(plan);
        const int64_t groups = (problem.sizes[1] + heads_per_row - 1) / heads_per_row, sequence = problem.sizes[2];
        pair.items_per_row[t] = Divider(std::max<int64_t>(1, per_row));
        pair.inner[t] = Divider(std::max<int64_t>(1, plan.sequence_outer[t] ? groups : sequence));
        pair.outer[t] = Divider(std::max<int64_t>(1, plan.sequence_outer[t] ? sequence : groups));
        if (plan.staged) {
          pair.rows_per_tile[t] = uint32_t(rotary_rows_per_tile(problem, plan));
          pair.pairs_per_row[t] = Divider(uint32_t(std::max<int64_t>(
              1, problem.rotary_dim / 2 / rotary_run_elements(problem, plan.vector_elements))));
        }
      }
    }
    // Each tensor's share of the grid is capped at half of grid_size's cap; the kernels loop.
    const unsigned int first_blocks = std::min(grid_size(rotary_items(problems[0], plan)), 1u << 29);
    const unsigned int second_blocks = std::min(grid_size(rotary_items(problems[1], plan)), 1u << 29);
    pair.first_blocks = first_blocks;
    const unsigned int blocks = first_blocks + second_blocks;
    launch_rotary<scalar_t, weight_t>(plan, blocks, stream, pair);
  });
}

}  // namespace
}  // namespace cuda

std::tuple<at::Tensor, at::Tensor> rotary_embedding_cuda(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos, const at::Tensor& sin,
                                                         int64_t unsqueeze_dim, bool interleaved) {
  const c10::cuda::CUDAGuard device_guard(q.device());
  return rotary_embedding_apply(q, k, cos, sin, unsqueeze_dim, interleaved, false, cuda::rotary_cuda);
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                  const at::Tensor& cos, const at::Tensor& sin,
                                                                  int64_t unsqueeze_dim, bool interleaved) {
  const c10::cuda::CUDAGuard device_guard(grad_q.device());
  return rotary_embedding_apply(grad_q, grad_k, cos, sin, unsqueeze_dim, interleaved, true, cuda::rotary_cuda);
}

}  // namespace fused_ops
