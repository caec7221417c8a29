#pragma once
// Exponentials and quotients in float through the SFU on the GPU; the exact library calls elsewhere
// (the CPU references, double).
#include <cmath>

#include "dtype_dispatch.h"

namespace fused_ops {

// On the GPU in float: the SFU's exp2 and reciprocal (a few ulp, far inside float32's test
// tolerance) instead of the IEEE-exact library calls, which cost several times the instructions
// and turn streaming kernels (the activations, the cross-entropy rows) compute-bound. Elsewhere the
// exact calls.
template <typename T>
FUSED_HOST_DEVICE T fast_exp(T x) {
  return std::exp(x);
}

template <typename T>
FUSED_HOST_DEVICE T fast_divide(T numerator, T denominator) {
  return numerator / denominator;
}

// tanh: on the GPU in float 1 - 2 / (exp(2|x|) + 1) through the SFU (absolute error about 1e-7; the library
// tanhf's branches and polynomial made the soft-capped row kernels compute-bound), the exact call elsewhere.
template <typename T>
FUSED_HOST_DEVICE T fast_tanh(T x) {
  using std::tanh;
  return tanh(x);
}

// 2^x: the SFU's exp2 on the GPU, the exact call on the CPU. The .ftz forms: __expf and __fdividef
// add a compare and two predicated multiplies each to produce subnormal results, which these formulas
// never need (a term below 2^-126 next to 1, or a result below 1e-38 whose absolute error is nil).
FUSED_HOST_DEVICE float exp2_approx(float x) {
#if defined(__CUDA_ARCH__)
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(x));
  return result;
#else
  return std::exp2(x);
#endif
}

#if defined(__CUDA_ARCH__)
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

// exp(2|x|) of infinity (|x| > 44) gives 1 exactly; NaN stays NaN.
template <>
__device__ __forceinline__ float fast_tanh<float>(float x) {
  const float magnitude = 1.0f - fast_divide(2.0f, fast_exp(2.0f * fabsf(x)) + 1.0f);
  return copysignf(magnitude, x);
}
#endif

}  // namespace fused_ops
