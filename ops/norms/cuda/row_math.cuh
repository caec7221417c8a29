#pragma once
// Device math every norm path shares: block sums in a fixed order, the row statistics of the backward,
// and the residual add. The norms' formulas are in ../norm.h.
#include <ATen/OpMathType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../../common/async_copy.cuh"
#include "../../common/vector.cuh"
#include "../norm.h"
#include "launch_plan.h"

namespace fused_ops {
namespace cuda {

template <typename acc_t>
__device__ __forceinline__ acc_t warp_sum(acc_t value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Sums kCount values over the block (blockDim.x a multiple of 32) in a fixed order; every thread
// gets the sums. `shared` holds 32 * kCount values.
template <int kCount, typename acc_t>
__device__ __forceinline__ void block_sum(acc_t (&values)[kCount], acc_t* shared) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kCount; ++i) values[i] = warp_sum(values[i]);
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kCount; ++i) shared[i * 32 + warp] = values[i];
  }
  __syncthreads();
  const int warps = blockDim.x / 32;
#pragma unroll
  for (int i = 0; i < kCount; ++i) values[i] = warp_sum(lane < warps ? shared[i * 32 + lane] : acc_t(0));
}

template <typename acc_t>
__device__ __forceinline__ acc_t reciprocal_sqrt(acc_t value) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return ::rsqrt(value);
  } else {
    return rsqrtf(value);
  }
}

// 1 / columns from the problem (a kernel parameter, which an FMUL reads as its operand): the row
// statistics multiply by it instead of dividing (an IEEE division is a dozen instructions with its
// slow-path check, on each reduction's critical path); the two-pack LayerNorm forward then needs 40
// registers instead of 53. Exact for power-of-two rows, else within one rounding of the division.
template <typename acc_t, typename Problem>
__device__ __forceinline__ acc_t inverse_columns_of(const Problem& p) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return p.inverse_columns_double;
  } else {
    return p.inverse_columns_float;
  }
}

// offset + weight (norm.h) in the compute type: one add on each weight value read, its operand a
// kernel parameter (0 for a plain norm), so no kernel is instantiated twice.
template <typename acc_t, typename Problem, typename weight_t>
__device__ __forceinline__ acc_t offset_weight(const Problem& p, weight_t weight) {
  if constexpr (std::is_same_v<acc_t, double>) {
    return p.offset_double + static_cast<acc_t>(weight);
  } else {
    return p.offset_float + static_cast<acc_t>(weight);
  }
}

// One pack of the forward's output in x's type: (h - mean) · rstd · (offset + weight), plus the bias
// where the norm has one (`bias` is not read otherwise).
template <typename acc_t, typename Problem, typename scalar_t, typename weight_t, int kBytes, int kWeightBytes>
__device__ __forceinline__ Vec<scalar_t, kBytes> normalized_pack(const Problem& p, const Vec<scalar_t, kBytes>& h,
                                                                 acc_t mean, acc_t rstd,
                                                                 const Vec<weight_t, kWeightBytes>& weight,
                                                                 const Vec<weight_t, kWeightBytes>& bias) {
  constexpr int kWidth = Vec<scalar_t, kBytes>::kSize;
  static_assert(Vec<weight_t, kWeightBytes>::kSize == kWidth, "one weight per element");
  Vec<scalar_t, kBytes> out;
#pragma unroll
  for (int j = 0; j < kWidth; ++j) {
    acc_t value = (static_cast<acc_t>(h.values[j]) - mean) * rstd * offset_weight<acc_t>(p, weight.values[j]);
    if (p.bias) value += static_cast<acc_t>(bias.values[j]);
    out.values[j] = static_cast<scalar_t>(value);
  }
  return out;
}

// Backward of one row: its sums Σ (h - mean)², Σ gw·(h - mean), Σ gw (gw = grad · weight) over
// the block give rstd and the means in grad_h = rstd · (gw - mean(gw) - n · mean(gw · n)),
// n = (h - mean) · rstd (RMS: mean = mean(gw) = 0); `weight` is offset + weight.
template <typename acc_t>
__device__ __forceinline__ void add_backward_terms(acc_t (&sums)[3], acc_t h, acc_t grad, acc_t weight, acc_t mean) {
  const acc_t centered = h - mean;
  const acc_t gw = grad * weight;
  sums[0] += centered * centered;
  sums[1] += gw * centered;
  sums[2] += gw;
}

template <typename acc_t>
struct BackwardRow {
  acc_t mean;
  acc_t rstd;
  acc_t mean_gw;
  acc_t mean_gw_n;
  __device__ __forceinline__ acc_t normalized(acc_t h) const { return (h - mean) * rstd; }
  __device__ __forceinline__ acc_t grad_h(acc_t grad, acc_t weight, acc_t n) const {
    return rstd * (grad * weight - mean_gw - n * mean_gw_n);
  }
};

// From the row's sums, already reduced.
template <NormKind kKind, typename acc_t>
__device__ __forceinline__ BackwardRow<acc_t> backward_row_of_sums(acc_t mean, const acc_t (&sums)[3],
                                                                  acc_t inverse_columns, double eps) {
  const acc_t rstd = reciprocal_sqrt(sums[0] * inverse_columns + static_cast<acc_t>(eps));
  return {mean, rstd, kKind == NormKind::Layer ? sums[2] * inverse_columns : acc_t(0),
          sums[1] * rstd * inverse_columns};
}

template <NormKind kKind, typename acc_t>
__device__ __forceinline__ BackwardRow<acc_t> backward_row(acc_t mean, acc_t (&sums)[3], acc_t inverse_columns,
                                                          double eps, acc_t* shared) {
  block_sum(sums, shared);
  return backward_row_of_sums<kKind>(mean, sums, inverse_columns, eps);
}

// sum = x + residual, rounded to x's type. kPacked (16-bit pairs): HADD2, the exact sum rounded once,
// which is float addition then rounding (for float16 checked on every pair of finite values); the
// sums stay packed: bf16 four packs load first in 64 registers (96-98 with float additions).
template <bool kPacked, typename scalar_t, int kBytes>
__device__ __forceinline__ void add_residual_pack(Vec<scalar_t, kBytes>& sum, const Vec<scalar_t, kBytes>& residual) {
  constexpr int kWidth = Vec<scalar_t, kBytes>::kSize;
  using acc_t = at::opmath_type<scalar_t>;
  constexpr bool kBFloat16 = std::is_same_v<scalar_t, c10::BFloat16>;
  if constexpr (kPacked && (kBFloat16 || std::is_same_v<scalar_t, c10::Half>) && kWidth % 2 == 0) {
    using Pair = std::conditional_t<kBFloat16, __nv_bfloat162, __half2>;
    auto* sum_pairs = reinterpret_cast<Pair*>(sum.values);
    const auto* residual_pairs = reinterpret_cast<const Pair*>(residual.values);
#pragma unroll
    for (int j = 0; j < kWidth / 2; ++j) sum_pairs[j] = __hadd2(sum_pairs[j], residual_pairs[j]);
  } else {
#pragma unroll
    for (int j = 0; j < kWidth; ++j) {
      sum.values[j] = static_cast<scalar_t>(static_cast<acc_t>(sum.values[j]) + static_cast<acc_t>(residual.values[j]));
    }
  }
}

}  // namespace cuda
}  // namespace fused_ops
