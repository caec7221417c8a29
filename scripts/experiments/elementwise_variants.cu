// Standalone timing of binary elementwise kernel variants (no torch), to pick the layout of
// ops/common/cuda_elementwise.cuh. Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 scripts/experiments/elementwise_variants.cu -o /tmp/variants && /tmp/variants
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <vector>

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

template <typename T> struct alignas(16) Vec { static constexpr int N = 16 / sizeof(T); T v[N]; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T, bool kStreaming>
__device__ __forceinline__ Vec<T> load(const T* p, int64_t i) {
  if constexpr (kStreaming) {
    int4 raw = __ldcs(reinterpret_cast<const int4*>(p) + i);
    return *reinterpret_cast<Vec<T>*>(&raw);
  } else {
    return reinterpret_cast<const Vec<T>*>(p)[i];
  }
}
template <typename T, bool kStreaming>
__device__ __forceinline__ void store(T* p, int64_t i, const Vec<T>& v) {
  if constexpr (kStreaming) {
    __stcs(reinterpret_cast<int4*>(p) + i, *reinterpret_cast<const int4*>(&v));
  } else {
    reinterpret_cast<Vec<T>*>(p)[i] = v;
  }
}

template <typename T>
__device__ __forceinline__ Vec<T> compute(const Vec<T>& a, const Vec<T>& b) {
  Vec<T> r;
#pragma unroll
  for (int j = 0; j < Vec<T>::N; ++j) {
    float x = to_float(a.v[j]);
    float relu = (x > 0.f || x != x) ? x : 0.f;
    r.v[j] = from_float<T>(relu + to_float(b.v[j]) + 0.5f);
  }
  return r;
}

// Grid-stride over vectors, U vectors in flight per thread.
template <typename T, int U, bool kStreaming>
__global__ void __launch_bounds__(256) grid_stride(T* out, const T* a, const T* b, int64_t nvec) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = t; base < nvec; base += stride * U) {
    Vec<T> av[U], bv[U];
#pragma unroll
    for (int k = 0; k < U; ++k) { int64_t i = base + k * stride; if (i < nvec) { av[k] = load<T, kStreaming>(a, i); bv[k] = load<T, kStreaming>(b, i); } }
#pragma unroll
    for (int k = 0; k < U; ++k) { int64_t i = base + k * stride; if (i < nvec) store<T, kStreaming>(out, i, compute(av[k], bv[k])); }
  }
}

// One tile of 256*U vectors per block, no loop (the launch covers the tensor).
template <typename T, int U, bool kStreaming>
__global__ void __launch_bounds__(256) one_shot(T* out, const T* a, const T* b, int64_t nvec) {
  const int64_t base = int64_t(blockIdx.x) * 256 * U + threadIdx.x;
  Vec<T> av[U], bv[U];
#pragma unroll
  for (int k = 0; k < U; ++k) { int64_t i = base + k * 256; if (i < nvec) { av[k] = load<T, kStreaming>(a, i); bv[k] = load<T, kStreaming>(b, i); } }
#pragma unroll
  for (int k = 0; k < U; ++k) { int64_t i = base + k * 256; if (i < nvec) store<T, kStreaming>(out, i, compute(av[k], bv[k])); }
}

struct Result { const char* name; float us; };

template <typename Launch>
float time_us(Launch launch, bool graph, int reps = 30) {
  cudaStream_t s; CHECK(cudaStreamCreate(&s));
  cudaEvent_t e0, e1; CHECK(cudaEventCreate(&e0)); CHECK(cudaEventCreate(&e1));
  int per = graph ? 20 : 5;
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < per; ++i) launch(s);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&exec, g, 0));
  }
  auto once = [&] { if (graph) CHECK(cudaGraphLaunch(exec, s)); else for (int i = 0; i < per; ++i) launch(s); };
  for (int i = 0; i < 3; ++i) once();
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(e0, s)); once(); CHECK(cudaEventRecord(e1, s)); CHECK(cudaEventSynchronize(e1));
    float ms; CHECK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms * 1000.f / per);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename T>
void run(const char* dtype, int64_t n, int sms, double copy_gbs) {
  T *a, *b, *o;
  CHECK(cudaMalloc(&a, n * sizeof(T))); CHECK(cudaMalloc(&b, n * sizeof(T))); CHECK(cudaMalloc(&o, n * sizeof(T)));
  CHECK(cudaMemset(a, 0x3c, n * sizeof(T))); CHECK(cudaMemset(b, 0x3b, n * sizeof(T)));
  const int64_t nvec = n / Vec<T>::N;
  const bool graph = n <= (1 << 22);
  const double bytes = 3.0 * n * sizeof(T);
  auto grid = [&](int64_t per_block) { return (unsigned)std::max<int64_t>(1, (nvec + per_block - 1) / per_block); };
  auto persistent = [&](int per_sm) { return (unsigned)std::min<int64_t>(int64_t(sms) * per_sm, grid(256)); };
  struct V { const char* name; float us; };
  std::vector<V> results;
#define VARIANT(NAME, ...) results.push_back({NAME, time_us([&](cudaStream_t s) { __VA_ARGS__; }, graph)})
  VARIANT("grid_stride U4 8/SM (current)", grid_stride<T, 4, false><<<persistent(8), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("grid_stride U4 8/SM streaming", grid_stride<T, 4, true><<<persistent(8), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("grid_stride U2 8/SM", grid_stride<T, 2, false><<<persistent(8), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("grid_stride U8 8/SM", grid_stride<T, 8, false><<<persistent(8), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("grid_stride U4 4/SM", grid_stride<T, 4, false><<<persistent(4), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("grid_stride U4 16/SM", grid_stride<T, 4, false><<<persistent(16), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("one_shot U1", one_shot<T, 1, false><<<grid(256), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("one_shot U2", one_shot<T, 2, false><<<grid(512), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("one_shot U4", one_shot<T, 4, false><<<grid(1024), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("one_shot U4 streaming", one_shot<T, 4, true><<<grid(1024), 256, 0, s>>>(o, a, b, nvec));
  VARIANT("one_shot U8", one_shot<T, 8, false><<<grid(2048), 256, 0, s>>>(o, a, b, nvec));
  for (auto& r : results)
    printf("%-9s n=2^%-2d %-32s %9.2f us %7.0f GB/s %5.1f%% of copy\n", dtype, 63 - __builtin_clzll(n), r.name, r.us,
           bytes / r.us / 1e3, 100.0 * bytes / r.us / 1e3 / copy_gbs);
  CHECK(cudaFree(a)); CHECK(cudaFree(b)); CHECK(cudaFree(o));
}

int main() {
  int sms; CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t copy_bytes = size_t(1) << 30;
  void *src, *dst; CHECK(cudaMalloc(&src, copy_bytes)); CHECK(cudaMalloc(&dst, copy_bytes));
  CHECK(cudaMemset(src, 1, copy_bytes));
  float copy_us = time_us([&](cudaStream_t s) { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, s)); }, false);
  double copy_gbs = 2.0 * copy_bytes / copy_us / 1e3;
  printf("copy 1 GiB: %.1f us, %.0f GB/s (read + write)\n", copy_us, copy_gbs);
  CHECK(cudaFree(src)); CHECK(cudaFree(dst));
  for (int64_t n : {int64_t(1) << 28, int64_t(1) << 27, int64_t(1) << 24}) { run<float>("float32", n, sms, copy_gbs); run<__nv_bfloat16>("bfloat16", n, sms, copy_gbs); }
  for (int64_t n : {int64_t(4096), int64_t(65536)}) { run<float>("float32", n, sms, copy_gbs); run<__nv_bfloat16>("bfloat16", n, sms, copy_gbs); }
  return 0;
}
