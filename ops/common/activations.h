#pragma once
// Activation functions and their derivatives, written once for the CPU reference and the CUDA
// kernels (opmath_t is float for half types, double for double). Values, NaN and Inf agree with
// eager PyTorch's kernels; the tanh GELU and SiLU are written as x * sigmoid(z) = x / (1 + exp(-z)),
// which is exact algebra (0.5 * (1 + tanh(u)) = sigmoid(2u)) and avoids the cancellation of
// 1 + tanh(u) for negative u.
#include <cmath>

#include "dtype_dispatch.h"

namespace fused_ops {

enum class GeluApproximation { None, Tanh };

// On the GPU in float: the SFU's exp2 and reciprocal (a few ulp, far inside float32's test
// tolerance) instead of the IEEE-exact library calls, which cost several times the instructions
// and made the activation kernels compute-bound (docs/benchmarks.md). Elsewhere the exact calls.
template <typename T>
FUSED_HOST_DEVICE T fast_exp(T x) {
  return std::exp(x);
}

template <typename T>
FUSED_HOST_DEVICE T fast_divide(T numerator, T denominator) {
  return numerator / denominator;
}

#if defined(__CUDA_ARCH__)
// The .ftz forms: __expf and __fdividef add a compare and two predicated multiplies each to produce
// subnormal results, which these formulas never need (a term below 2^-126 next to 1, or a result
// below 1e-38 whose absolute error is nil).
__device__ __forceinline__ float exp2_approx(float x) {
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

__device__ __forceinline__ float reciprocal_approx(float x) {
  float result;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
}

template <>
__device__ __forceinline__ float fast_exp<float>(float x) {
  return exp2_approx(x * 1.4426950408889634f);  // log2(e)
}

// 0 for denominators of infinity or above 2^126 (x / (1 + exp(z)) for z > 87: 0 is the limit).
template <>
__device__ __forceinline__ float fast_divide<float>(float numerator, float denominator) {
  return numerator * reciprocal_approx(denominator);
}
#endif

// Φ(x) = P(N(0, 1) ≤ x) = 0.5 (1 + erf(x / sqrt(2))), the erf GELU's gate.
template <typename T>
FUSED_HOST_DEVICE T gaussian_cdf(T x) {
  constexpr T kAlpha = T(0.7071067811865476);  // 1 / sqrt(2)
  return T(0.5) * (T(1) + std::erf(x * kAlpha));
}

// φ(x) = exp(-x^2 / 2) / sqrt(2 pi), the standard normal density.
template <typename T>
FUSED_HOST_DEVICE T gaussian_pdf(T x) {
  constexpr T kBeta = T(0.3989422804014327);  // 1 / sqrt(2 pi)
  return kBeta * fast_exp(T(-0.5) * x * x);
}

#if defined(__CUDA_ARCH__)
// On the GPU in float: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2) (Numerical Recipes' erfcc,
// relative error below 1.2e-7 for every z >= 0), so Φ(x) = 0.5 erfc(|x| / sqrt(2)) for x < 0 and
// 1 - that for x >= 0: one polynomial, one exp2 and one reciprocal, no cancellation for negative x.
// P is evaluated in log2 units with the 0.5 folded in (coefficients times log2(e), constant term
// minus 1), and z^2 = x^2 / 2, so 0.5 erfc = t exp2(P2(t) - x^2 log2(e) / 2): no separate scalings.
// Checked in float32 against float64 by scripts/experiments/erfc_accuracy.py.
template <>
__device__ __forceinline__ float gaussian_cdf<float>(float x) {
  const float t = reciprocal_approx(fmaf(fabsf(x), 0.35355339059327373f, 1.0f));  // 1 + |x| / (2 sqrt(2))
  float p = 0.246517298f;  // Numerical Recipes' 0.17087277 times log2(e), and so on down to
  p = fmaf(p, t, -1.18611495f);
  p = fmaf(p, t, 2.14747446f);
  p = fmaf(p, t, -1.63775315f);
  p = fmaf(p, t, 0.402321582f);
  p = fmaf(p, t, -0.26875686f);
  p = fmaf(p, t, 0.139630057f);
  p = fmaf(p, t, 0.539700616f);
  p = fmaf(p, t, 1.4427292f);
  p = fmaf(p, t, -2.82574822f);  // -1.26551223 log2(e) - 1
  const float half_erfc = t * exp2_approx(fmaf(x * x, -0.7213475204444817f, p));  // log2(e) / 2
  return x >= 0.0f ? 1.0f - half_erfc : half_erfc;
}

// kBeta exp(-x^2 / 2) = exp2(x^2 (-log2(e) / 2) + log2(kBeta)): one multiply, one fma, one exp2.
template <>
__device__ __forceinline__ float gaussian_pdf<float>(float x) {
  return exp2_approx(fmaf(x * x, -0.7213475204444817f, -1.3257480647361593f));
}
#endif

// x * sigmoid(z)
template <typename T>
FUSED_HOST_DEVICE T times_sigmoid(T x, T z) {
  return fast_divide(x, T(1) + fast_exp(-z));
}

template <typename T>
FUSED_HOST_DEVICE T sigmoid(T z) {
  return times_sigmoid(T(1), z);
}

// The tanh GELU's inner argument doubled: 2u = 2 * sqrt(2 / pi) * (x + 0.044715 x^3).
template <typename T>
FUSED_HOST_DEVICE T gelu_tanh_twice_inner(T x) {
  constexpr T kTwoBeta = T(1.5957691216057308);  // 2 * sqrt(2 / pi)
  constexpr T kKappa = T(0.044715);
  return kTwoBeta * x * (T(1) + kKappa * x * x);
}

template <typename T>
FUSED_HOST_DEVICE T gelu(T x, GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh) {
    return times_sigmoid(x, gelu_tanh_twice_inner(x));  // 0.5 x (1 + tanh(u)) = x sigmoid(2u)
  }
  return x * gaussian_cdf(x);
}

template <typename T>
FUSED_HOST_DEVICE T gelu_derivative(T x, GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh) {
    // d/dx [x s(2u)] = s + 2 x s (1 - s) u',  u' = sqrt(2 / pi) (1 + 3 * 0.044715 x^2)
    constexpr T kTwoBeta = T(1.5957691216057308);
    constexpr T kThreeKappa = T(3 * 0.044715);
    const T s = sigmoid(gelu_tanh_twice_inner(x));
    const T twice_inner_derivative = kTwoBeta * (T(1) + kThreeKappa * x * x);
    return s + x * s * (T(1) - s) * twice_inner_derivative;
  }
  return gaussian_cdf(x) + x * gaussian_pdf(x);
}

template <typename T>
FUSED_HOST_DEVICE T silu(T x) {
  return times_sigmoid(x, x);
}

template <typename T>
FUSED_HOST_DEVICE T silu_derivative(T x) {
  const T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}

}  // namespace fused_ops
