#pragma once
// The floating dtypes every op supports, dispatched once so all ops agree on the list.
#include <ATen/Dispatch.h>

#define FUSED_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

// Mixed precision: an op's parameters (norm weights, RoPE tables), as weight_t, are float32 while x is
// 16-bit, else of x's dtype (the checks reject every other pair, so only these are instantiated).
#define FUSED_DISPATCH_MIXED_TYPES(X_TYPE, WEIGHT_TYPE, NAME, ...)                      \
  FUSED_DISPATCH_FLOATING_TYPES(X_TYPE, NAME, [&] {                                    \
    if constexpr (sizeof(scalar_t) == 2) {                                             \
      if (WEIGHT_TYPE == at::kFloat) {                                                 \
        using weight_t = float;                                                        \
        __VA_ARGS__();                                                                 \
        return;                                                                        \
      }                                                                                \
    }                                                                                  \
    using weight_t = scalar_t;                                                         \
    __VA_ARGS__();                                                                     \
  })

#if defined(__CUDACC__)
#define FUSED_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FUSED_HOST_DEVICE inline
#endif
