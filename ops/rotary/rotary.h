#pragma once
// rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved) -> (rope(q), rope(k)), the values of
// Hugging Face's apply_rotary_pos_emb: out = x * cos + rotate(x) * sin over the first R = cos.size(-1)
// dims of each head vector; dims R..D pass through (partial rotary). rotate(x) pairs element j with
// j + R/2 as rotate_half does ([-x2, x1]), or with `interleaved` element 2i with 2i + 1 (GPT-J).
// q and k are [B, H, S, D] (unsqueeze_dim 1) or [B, S, H, D] (unsqueeze_dim 2), k with its own number
// of heads (grouped-query attention); cos and sin [B or 1, S, R], or [S, R] taken as [1, S, R],
// broadcast over the heads, of q's dtype (or float32 for a 16-bit q).
// Backward: the transposed rotation of the output gradients (rotary_embedding_backward), which is
// linear, so its own gradient is the forward rotation again. cos and sin get no gradient.
#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

#include "../common/dtype_dispatch.h"
#include "../common/tensors.h"

namespace fused_ops {

// One rotated pair (a, b) = (x[j], x[j + R/2]) or (x[2i], x[2i + 1]), with cos and sin at the same
// positions. `transposed`: the backward's rotation (the transpose of the forward's).
template <typename opmath_t>
FUSED_HOST_DEVICE void rotate_pair(opmath_t& a, opmath_t& b, opmath_t cos_a, opmath_t cos_b, opmath_t sin_a,
                                   opmath_t sin_b, bool transposed) {
  const opmath_t first = transposed ? a * cos_a + b * sin_b : a * cos_a - b * sin_a;
  const opmath_t second = transposed ? b * cos_b - a * sin_a : b * cos_b + a * sin_b;
  a = first;
  b = second;
}

// q or k seen as [B, H, S, D] (heads second whatever the layout), its output likewise, and cos and sin
// broadcast to [B, H, S, R] (stride 0 along the heads, and along a batch of one). Strides in elements;
// a dim of size one has stride 0, so it never decides a layout or an alignment.
struct RotaryProblem {
  const void* x;
  int64_t x_strides[4];
  void* out;
  int64_t out_strides[4];
  const void* cos;
  int64_t cos_strides[4];
  const void* sin;
  int64_t sin_strides[4];
  int64_t sizes[4];  // B, H, S, D
  int64_t rotary_dim;
  bool interleaved;
  bool transposed;
};

inline int64_t rotary_heads_dim(int64_t unsqueeze_dim) { return unsqueeze_dim < 0 ? unsqueeze_dim + 4 : unsqueeze_dim; }

// Allocates the outputs and hands both problems, q's then k's, to
// `run` (the CPU or CUDA loop) in one call, so the GPU rotates both in one launch. The checks
// (registration/checks.cpp) have run.
template <typename Run>
std::tuple<at::Tensor, at::Tensor> rotary_embedding_apply(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& cos, const at::Tensor& sin,
                                                          int64_t unsqueeze_dim, bool interleaved, bool transposed,
                                                          Run run) {
  const bool heads_second = rotary_heads_dim(unsqueeze_dim) == 1;
  auto as_heads_second = [&](const at::Tensor& t) { return heads_second ? t : t.transpose(1, 2); };
  auto describe = [&](const at::Tensor& x, const at::Tensor& out) {
    const at::Tensor x_view = as_heads_second(x);
    const at::Tensor out_view = as_heads_second(out);
    auto table = [&](const at::Tensor& t) {  // [B or 1, S, R] -> [B, H, S, R]
      const at::Tensor batched = t.dim() == 2 ? t.unsqueeze(0) : t;
      return batched.unsqueeze(1).expand({x_view.size(0), x_view.size(1), x_view.size(2), batched.size(-1)});
    };
    const at::Tensor cos_view = table(cos);
    const at::Tensor sin_view = table(sin);
    RotaryProblem problem{};
    problem.x = x_view.const_data_ptr();
    problem.out = out_view.mutable_data_ptr();
    problem.cos = cos_view.const_data_ptr();
    problem.sin = sin_view.const_data_ptr();
    for (int d = 0; d < 4; ++d) {
      problem.x_strides[d] = x_view.size(d) == 1 ? 0 : x_view.stride(d);
      problem.out_strides[d] = out_view.size(d) == 1 ? 0 : out_view.stride(d);
      problem.cos_strides[d] = cos_view.size(d) == 1 ? 0 : cos_view.stride(d);
      problem.sin_strides[d] = sin_view.size(d) == 1 ? 0 : sin_view.stride(d);
      problem.sizes[d] = x_view.size(d);
    }
    problem.rotary_dim = cos.size(-1);
    problem.interleaved = interleaved;
    problem.transposed = transposed;
    return problem;
  };
  // Outputs keep a dense q's (k's) memory layout, as eager's q * cos does (a [B, H, S, D] view of a
  // [B, S, H, D] projection stays so), so each is read and written in one order; others are contiguous.
  at::Tensor q_out = at::empty_like(q, at::MemoryFormat::Preserve);
  at::Tensor k_out = at::empty_like(k, at::MemoryFormat::Preserve);
  const RotaryProblem problems[2] = {describe(q, q_out), describe(k, k_out)};
  if (q.numel() + k.numel() > 0) run(problems, q.scalar_type(), cos.scalar_type());
  return {q_out, k_out};
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                        const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved);
std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_cpu(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                                 int64_t unsqueeze_dim, bool interleaved);
std::tuple<at::Tensor, at::Tensor> rotary_embedding_cuda(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos, const at::Tensor& sin,
                                                         int64_t unsqueeze_dim, bool interleaved);
std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_cuda(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                  const at::Tensor& cos, const at::Tensor& sin,
                                                                  int64_t unsqueeze_dim, bool interleaved);

}  // namespace fused_ops
