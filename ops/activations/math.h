#pragma once
// Activation functions and their derivatives, written once for the CPU reference and the CUDA
// kernels (opmath_t is float for half types, double for double). Values, NaN and Inf agree with
// eager PyTorch's kernels; the tanh GELU and SiLU are written as x * sigmoid(z) = x / (1 + exp(-z)),
// which is exact algebra (0.5 * (1 + tanh(u)) = sigmoid(2u)) and avoids the cancellation of
// 1 + tanh(u) for negative u.
#include <cmath>
#include <cstdint>

#include "../common/dtype_dispatch.h"
#include "../common/fast_math.h"

namespace fused_ops {

// NoneRoundedTo16Bits is None for results that are rounded to float16 or bfloat16: on the GPU its
// Φ is a shorter polynomial (gaussian_cdf_for_16_bit_results); the CUDA launchers pick it
// (for_16_bit_results below), users never name it.
enum class GeluApproximation { None, Tanh, NoneRoundedTo16Bits };

inline GeluApproximation for_16_bit_results(GeluApproximation approximation, bool results_are_16_bit) {
  return approximation == GeluApproximation::None && results_are_16_bit ? GeluApproximation::NoneRoundedTo16Bits
                                                                          : approximation;
}

// An approximation fixed when a kernel is compiled. The GELU ops' functors hold their approximation
// as a type: GeluApproximation (chosen per element at run time) or FixedGeluApproximation (one kernel
// per approximation: no branch on it, one straight-line body per row).
template <GeluApproximation kApproximation>
struct FixedGeluApproximation {
  FUSED_HOST_DEVICE constexpr operator GeluApproximation() const { return kApproximation; }
};

// The CUDA launchers' choice; calls function with a GeluApproximation, or up to `fixed_max_rows` rows
// (launch_plan.h) a FixedGeluApproximation.
template <typename Function>
void with_kernel_gelu_approximation(GeluApproximation approximation, int64_t rows, int64_t fixed_max_rows,
                                    const Function& function) {
  if (rows <= fixed_max_rows) {
    switch (approximation) {
      case GeluApproximation::None:
        return function(FixedGeluApproximation<GeluApproximation::None>{});
      case GeluApproximation::Tanh:
        return function(FixedGeluApproximation<GeluApproximation::Tanh>{});
      case GeluApproximation::NoneRoundedTo16Bits:
        return function(FixedGeluApproximation<GeluApproximation::NoneRoundedTo16Bits>{});
    }
  }
  function(approximation);
}

// Φ(x) = P(N(0, 1) ≤ x) = 0.5 (1 + erf(x / sqrt(2))), the erf GELU's gate.
template <typename T>
FUSED_HOST_DEVICE T gaussian_cdf(T x) {
  constexpr T kAlpha = T(0.7071067811865476);  // 1 / sqrt(2)
  return T(0.5) * (T(1) + std::erf(x * kAlpha));
}

// Φ where the result is rounded to 16 bits; the exact Φ except on the GPU (below).
template <typename T>
FUSED_HOST_DEVICE T gaussian_cdf_for_16_bit_results(T x) {
  return gaussian_cdf(x);
}

// φ(x) = exp(-x^2 / 2) / sqrt(2 pi), the standard normal density.
template <typename T>
FUSED_HOST_DEVICE T gaussian_pdf(T x) {
  constexpr T kBeta = T(0.3989422804014327);  // 1 / sqrt(2 pi)
  return kBeta * fast_exp(T(-0.5) * x * x);
}

#if defined(__CUDA_ARCH__)
// On the GPU in float: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + p z), so Φ(x) = 0.5 erfc(|x| / sqrt(2))
// for x < 0 and 1 - that for x >= 0: one polynomial, one exp2 and one reciprocal, no cancellation
// for negative x. P is evaluated in log2 units with the 0.5 folded in (coefficients times log2(e),
// constant term minus 1), and z^2 = x^2 / 2, so 0.5 erfc = t exp2(P2(t) - x^2 log2(e) / 2).
// `coefficients` are P2's, constant term first; `t_slope` is p / sqrt(2).
template <int kTerms>
__device__ __forceinline__ float gaussian_cdf_from_erfc(float x, float t_slope, const float (&coefficients)[kTerms]) {
  const float t = reciprocal_approx(fmaf(fabsf(x), t_slope, 1.0f));
  float p = coefficients[kTerms - 1];
#pragma unroll
  for (int i = kTerms - 2; i >= 0; --i) p = fmaf(p, t, coefficients[i]);
  const float half_erfc = t * exp2_approx(fmaf(x * x, -0.7213475204444817f, p));  // log2(e) / 2
  return x >= 0.0f ? 1.0f - half_erfc : half_erfc;
}

// Numerical Recipes' erfcc (p = 1/2, degree 9): relative error below 1.2e-7 for every z >= 0.
// Checked in float32 against float64 by scripts/tools/erfc_accuracy.py.
template <>
__device__ __forceinline__ float gaussian_cdf<float>(float x) {
  constexpr float kCoefficients[] = {-2.82574822f, 1.4427292f,    0.539700616f, 0.139630057f, -0.26875686f,
                                     0.402321582f, -1.63775315f,  2.14747446f,  -1.18611495f, 0.246517298f};
  return gaussian_cdf_from_erfc(x, 0.35355339059327373f, kCoefficients);
}

// Degree 6 with p = 0.425, fitted (minimax, relative) by scripts/tools/erfc_accuracy.py --fit:
// relative error of erfc below 5.8e-6; gelu in float32 stays inside float32's test tolerance, and
// 0.03% (bfloat16) / 0.17% (float16) of results round one ulp away from the correctly rounded value
// (0.004% / 0.009% with degree 9).
// Three fewer fma per element: the erf GELU's forward is issue-bound.
template <>
__device__ __forceinline__ float gaussian_cdf_for_16_bit_results<float>(float x) {
  constexpr float kCoefficients[] = {-3.06021452f, 1.44212461f,   0.605197251f, 0.107930101f,
                                     0.396736562f, -0.776008487f, 0.28424269f};
  return gaussian_cdf_from_erfc(x, 0.30052039f, kCoefficients);
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
  if (approximation == GeluApproximation::NoneRoundedTo16Bits) return x * gaussian_cdf_for_16_bit_results(x);
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
  if (approximation == GeluApproximation::NoneRoundedTo16Bits) {
    return gaussian_cdf_for_16_bit_results(x) + x * gaussian_pdf(x);
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
