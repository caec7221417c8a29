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
template <>
__device__ __forceinline__ float fast_exp<float>(float x) {
  return __expf(x);
}

// __fdividef gives 0 for denominators above 2^126 (x / (1 + exp(z)) for z > 87: 0 is the limit).
template <>
__device__ __forceinline__ float fast_divide<float>(float numerator, float denominator) {
  return __fdividef(numerator, denominator);
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
  constexpr T kAlpha = T(0.7071067811865476);  // 1 / sqrt(2)
  return T(0.5) * x * (T(1) + std::erf(x * kAlpha));
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
  constexpr T kAlpha = T(0.7071067811865476);
  constexpr T kBeta = T(0.3989422804014327);  // 1 / sqrt(2 pi)
  const T cdf = T(0.5) * (T(1) + std::erf(x * kAlpha));
  const T pdf = kBeta * fast_exp(T(-0.5) * x * x);
  return cdf + x * pdf;
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
