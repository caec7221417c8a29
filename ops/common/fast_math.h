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
#endif

}  // namespace fused_ops
