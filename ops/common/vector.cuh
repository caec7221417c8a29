#pragma once
// The one vector type of the CUDA kernels: kBytes of T (16 on every fast path) moved by one load or
// store, its conversions to and from opmath values, and the alignment test that decides whether a
// pointer may take it.
#include <ATen/OpMathType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fused_ops {
namespace cuda {

// Whether `pointer` is a multiple of `bytes` (null counts as aligned: an absent operand).
inline bool is_aligned(const void* pointer, int64_t bytes = 16) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// Rows starting at `pointer`, `row_stride` elements of `element_size` bytes apart, all 16-byte aligned.
inline bool rows_aligned(const void* pointer, int64_t row_stride, int64_t element_size) {
  return is_aligned(pointer) && (row_stride * element_size) % 16 == 0;
}

// kBytes of T in one load or store: 16 (one LDG.128) streams best; decode grids take fewer bytes per
// thread so that a small tensor spreads over more threads (activations/cuda_rows.cuh).
template <typename T, int kBytes>
struct alignas(kBytes) Vec {
  static_assert(kBytes >= int(sizeof(T)) && kBytes % int(sizeof(T)) == 0, "a vector holds whole elements");
  static constexpr int kSize = kBytes / sizeof(T);
  T values[kSize];
};

template <typename T>
using Vec16 = Vec<T, 16>;

// kWidth elements of T as one vector (the norms count in elements per load, not bytes).
template <typename T, int kWidth>
using Pack = Vec<T, int(sizeof(T)) * kWidth>;

template <typename T, int kWidth>
__device__ __forceinline__ Pack<T, kWidth> load_pack(const void* base, int64_t row_offset, int64_t pack) {
  return reinterpret_cast<const Pack<T, kWidth>*>(static_cast<const T*>(base) + row_offset)[pack];
}

template <typename T, int kWidth>
__device__ __forceinline__ void store_pack(void* base, int64_t row_offset, int64_t pack, const Pack<T, kWidth>& value) {
  reinterpret_cast<Pack<T, kWidth>*>(static_cast<T*>(base) + row_offset)[pack] = value;
}

template <int kBytes = 16, typename T>
__device__ __forceinline__ Vec<T, kBytes> load_vec(const T* base, int64_t vector_index) {
  return reinterpret_cast<const Vec<T, kBytes>*>(base)[vector_index];
}

template <int kBytes, typename T>
__device__ __forceinline__ void store_vec(T* base, int64_t vector_index, const Vec<T, kBytes>& value) {
  reinterpret_cast<Vec<T, kBytes>*>(base)[vector_index] = value;
}

template <typename T>
__device__ __forceinline__ Vec16<T> load_vec16(const T* base, int64_t vector_index) {
  return load_vec<16>(base, vector_index);
}

template <typename T>
__device__ __forceinline__ void store_vec16(T* base, int64_t vector_index, const Vec16<T>& value) {
  store_vec<16>(base, vector_index, value);
}

// Stores kCount consecutive values at `destination` (16-byte aligned when they fill whole 16-byte
// vectors) with vector stores: a warp then writes whole sectors, where element-by-element stores
// from threads 16-32 bytes apart touch 32 sectors per instruction (the norm backward's per-column
// sums took microseconds per block that way).
template <typename T, int kCount>
__device__ __forceinline__ void store_consecutive(T* destination, const T (&values)[kCount]) {
  constexpr int kPerVector = Vec16<T>::kSize;
  if constexpr (kCount % kPerVector != 0) {
#pragma unroll
    for (int j = 0; j < kCount; ++j) destination[j] = values[j];
  } else {
#pragma unroll
    for (int v = 0; v < kCount / kPerVector; ++v) {
      Vec16<T> vector;
#pragma unroll
      for (int j = 0; j < kPerVector; ++j) vector.values[j] = values[v * kPerVector + j];
      store_vec16(destination, v, vector);
    }
  }
}

// A vector's elements in opmath, and back. 16-bit floats go two at a time: bf16 -> float is one
// shift or mask per element on the 32-bit word (c10's per-element path extracts each half first),
// and float -> bf16/half one cvt per pair (cvt.rn.{bf16x2,f16x2}.f32), both round-to-nearest-even.
template <typename T, int kBytes, typename opmath_t>
__device__ __forceinline__ void unpack_vec(const Vec<T, kBytes>& vector, opmath_t (&values)[Vec<T, kBytes>::kSize]) {
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) {
      values[2 * k] = __uint_as_float(words[k] << 16);
      values[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
    }
  } else if constexpr (std::is_same_v<T, c10::Half> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    const __half2* pairs = reinterpret_cast<const __half2*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) {
      const float2 pair = __half22float2(pairs[k]);
      values[2 * k] = pair.x;
      values[2 * k + 1] = pair.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < Vec<T, kBytes>::kSize; ++j) values[j] = static_cast<opmath_t>(vector.values[j]);
  }
}

template <typename T, int kBytes, typename opmath_t>
__device__ __forceinline__ Vec<T, kBytes> pack_vec(const opmath_t (&values)[Vec<T, kBytes>::kSize]) {
  Vec<T, kBytes> vector;
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) pairs[k] = __floats2bfloat162_rn(values[2 * k], values[2 * k + 1]);
  } else if constexpr (std::is_same_v<T, c10::Half> && std::is_same_v<opmath_t, float> && kBytes >= 4) {
    __half2* pairs = reinterpret_cast<__half2*>(&vector);
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) pairs[k] = __floats2half2_rn(values[2 * k], values[2 * k + 1]);
  } else {
#pragma unroll
    for (int j = 0; j < Vec<T, kBytes>::kSize; ++j) vector.values[j] = static_cast<T>(values[j]);
  }
  return vector;
}

template <typename T, typename opmath_t>
__device__ __forceinline__ void unpack_vec16(const Vec16<T>& vector, opmath_t (&values)[Vec16<T>::kSize]) {
  unpack_vec(vector, values);
}

template <typename T, typename opmath_t>
__device__ __forceinline__ Vec16<T> pack_vec16(const opmath_t (&values)[Vec16<T>::kSize]) {
  return pack_vec<T, 16>(values);
}

// Calls function(std::integral_constant<int, bytes>) with the bytes of a vector of `elements`
// scalar_t (a power of two), at most 16.
template <typename scalar_t, typename Function>
void with_vector_bytes(int elements, const Function& function) {
  const int64_t bytes = std::max<int64_t>(sizeof(scalar_t), std::min<int64_t>(16, elements * int64_t(sizeof(scalar_t))));
  if constexpr (sizeof(scalar_t) <= 2) {
    if (bytes <= 2) return function(std::integral_constant<int, 2>{});
  }
  if constexpr (sizeof(scalar_t) <= 4) {
    if (bytes <= 4) return function(std::integral_constant<int, 4>{});
  }
  if constexpr (sizeof(scalar_t) <= 8) {
    if (bytes <= 8) return function(std::integral_constant<int, 8>{});
  }
  function(std::integral_constant<int, 16>{});
}


}  // namespace cuda
}  // namespace fused_ops
