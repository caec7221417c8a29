#pragma once
// The floating dtypes every op supports, dispatched once so all ops agree on the list.
#include <ATen/Dispatch.h>

#define FUSED_DISPATCH_FLOATING_TYPES(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, TYPE, NAME, __VA_ARGS__)

#if defined(__CUDACC__)
#define FUSED_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FUSED_HOST_DEVICE inline
#endif
