#pragma once
// Activation functions and their derivatives, written once for the CPU reference and the CUDA
// kernels (opmath_t is float for half types, double for double). Formulas follow eager PyTorch's
// kernels so values, NaN and Inf agree.
#include <cmath>

#include "dtype_dispatch.h"

namespace fused_ops {

enum class GeluApproximation { None, Tanh };

template <typename T>
FUSED_HOST_DEVICE T gelu(T x, GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh) {
    constexpr T kBeta = T(0.7978845608028654);  // sqrt(2 / pi)
    constexpr T kKappa = T(0.044715);
    const T inner = kBeta * (x + kKappa * x * x * x);
    return T(0.5) * x * (T(1) + std::tanh(inner));
  }
  constexpr T kAlpha = T(0.7071067811865476);  // 1 / sqrt(2)
  return T(0.5) * x * (T(1) + std::erf(x * kAlpha));
}

template <typename T>
FUSED_HOST_DEVICE T gelu_derivative(T x, GeluApproximation approximation) {
  if (approximation == GeluApproximation::Tanh) {
    constexpr T kBeta = T(0.7978845608028654);
    constexpr T kKappa = T(0.044715);
    const T x_squared = x * x;
    const T tanh_inner = std::tanh(kBeta * (x + kKappa * x_squared * x));
    const T left = T(0.5) * x;
    const T right = T(1) + tanh_inner;
    const T left_derivative = T(0.5) * right;
    const T right_derivative = (T(1) - tanh_inner * tanh_inner) * kBeta * (T(1) + T(3) * kKappa * x_squared);
    return left_derivative + left * right_derivative;
  }
  constexpr T kAlpha = T(0.7071067811865476);
  constexpr T kBeta = T(0.3989422804014327);  // 1 / sqrt(2 pi)
  const T cdf = T(0.5) * (T(1) + std::erf(x * kAlpha));
  const T pdf = kBeta * std::exp(T(-0.5) * x * x);
  return cdf + x * pdf;
}

template <typename T>
FUSED_HOST_DEVICE T silu(T x) {
  return x / (T(1) + std::exp(-x));
}

template <typename T>
FUSED_HOST_DEVICE T silu_derivative(T x) {
  const T sigmoid = T(1) / (T(1) + std::exp(-x));
  return sigmoid * (T(1) + x * (T(1) - sigmoid));
}

}  // namespace fused_ops
