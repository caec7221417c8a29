// CPU reference of the rotary family: each head vector's pairs rotated in opmath, rows in parallel.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "rotary.h"

namespace fused_ops {
namespace {

void rotary_cpu(const RotaryProblem& p, at::ScalarType dtype, at::ScalarType table_dtype) {
  FUSED_DISPATCH_MIXED_TYPES(dtype, table_dtype, "rotary_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* x = static_cast<const scalar_t*>(p.x);
    scalar_t* out = static_cast<scalar_t*>(p.out);
    const weight_t* cos = static_cast<const weight_t*>(p.cos);
    const weight_t* sin = static_cast<const weight_t*>(p.sin);
    const int64_t heads = p.sizes[1], sequence = p.sizes[2], head_dim = p.sizes[3];
    const int64_t half = p.rotary_dim / 2;
    const int64_t rows = p.sizes[0] * heads * sequence;
    at::parallel_for(0, rows, std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, head_dim)),
                     [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t s = row % sequence, h = (row / sequence) % heads, b = row / (sequence * heads);
        auto offset = [&](const int64_t (&strides)[4]) { return b * strides[0] + h * strides[1] + s * strides[2]; };
        const scalar_t* x_row = x + offset(p.x_strides);
        scalar_t* out_row = out + offset(p.out_strides);
        const weight_t* cos_row = cos + offset(p.cos_strides);
        const weight_t* sin_row = sin + offset(p.sin_strides);
        for (int64_t j = 0; j < half; ++j) {
          const int64_t ia = p.interleaved ? 2 * j : j;
          const int64_t ib = p.interleaved ? 2 * j + 1 : j + half;
          opmath_t a = static_cast<opmath_t>(x_row[ia * p.x_strides[3]]);
          opmath_t c = static_cast<opmath_t>(x_row[ib * p.x_strides[3]]);
          rotate_pair(a, c, static_cast<opmath_t>(cos_row[ia * p.cos_strides[3]]),
                      static_cast<opmath_t>(cos_row[ib * p.cos_strides[3]]),
                      static_cast<opmath_t>(sin_row[ia * p.sin_strides[3]]),
                      static_cast<opmath_t>(sin_row[ib * p.sin_strides[3]]), p.transposed);
          out_row[ia * p.out_strides[3]] = static_cast<scalar_t>(a);
          out_row[ib * p.out_strides[3]] = static_cast<scalar_t>(c);
        }
        for (int64_t e = p.rotary_dim; e < head_dim; ++e) out_row[e * p.out_strides[3]] = x_row[e * p.x_strides[3]];
      }
    });
  });
}

void rotary_cpu_both(const RotaryProblem (&problems)[2], at::ScalarType dtype, at::ScalarType table_dtype) {
  for (const RotaryProblem& problem : problems) rotary_cpu(problem, dtype, table_dtype);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> rotary_embedding_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                        const at::Tensor& sin, int64_t unsqueeze_dim, bool interleaved) {
  return rotary_embedding_apply(q, k, cos, sin, unsqueeze_dim, interleaved, false, rotary_cpu_both);
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_cpu(const at::Tensor& grad_q, const at::Tensor& grad_k,
                                                                 const at::Tensor& cos, const at::Tensor& sin,
                                                                 int64_t unsqueeze_dim, bool interleaved) {
  return rotary_embedding_apply(grad_q, grad_k, cos, sin, unsqueeze_dim, interleaved, true, rotary_cpu_both);
}

}  // namespace fused_ops
