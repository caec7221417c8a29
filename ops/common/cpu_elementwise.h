#pragma once
// Reference loop for binary elementwise ops on the CPU: simple over speed.
// `b` broadcasts to `a`'s shape; the result is a new contiguous tensor of `a`'s shape.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "dtype_dispatch.h"

namespace fused_ops {

// Op<opmath_t> is a functor `opmath_t(opmath_t a, opmath_t b)` built from `params`.
template <template <typename> class Op, typename... Params>
at::Tensor binary_elementwise_cpu(const at::Tensor& a, const at::Tensor& b,
                                  Params... params) {
  const at::Tensor a_contiguous = a.contiguous();
  const at::Tensor b_contiguous = b.expand(a.sizes()).contiguous();
  at::Tensor out = at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t numel = out.numel();
  FUSED_DISPATCH_FLOATING_TYPES(a.scalar_type(), "binary_elementwise_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{static_cast<opmath_t>(params)...};
    const scalar_t* a_data = a_contiguous.const_data_ptr<scalar_t>();
    const scalar_t* b_data = b_contiguous.const_data_ptr<scalar_t>();
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, numel, at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        out_data[i] = static_cast<scalar_t>(
            op(static_cast<opmath_t>(a_data[i]), static_cast<opmath_t>(b_data[i])));
      }
    });
  });
  return out;
}

}  // namespace fused_ops
