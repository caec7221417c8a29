#pragma once
// Reference loop for binary elementwise ops on the CPU: simple over speed.
// `b` broadcasts to `a`'s shape; the result is a new contiguous tensor of `a`'s shape.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "../common/bit_mask.h"
#include "../common/dtype_dispatch.h"
#include "../common/tensors.h"

namespace fused_ops {

// Op<opmath_t> is a functor `opmath_t(opmath_t a, opmath_t b)` built from `params`.
template <template <typename> class Op, typename... Params>
at::Tensor binary_elementwise_cpu(const at::Tensor& a, const at::Tensor& b,
                                  Params... params) {
  const at::Tensor a_contiguous = a.contiguous();
  const at::Tensor b_contiguous = b.expand(a.sizes()).contiguous();
  at::Tensor out = empty_contiguous_like(a);
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

// One bit per element of `a` (C order), bit_op(a[e]) in bit e % 8 of byte e / 8; the layout of
// cuda_masked.cuh. BitOp<opmath_t> is a functor `bool(opmath_t a)`.
template <template <typename> class BitOp>
at::Tensor bit_mask_cpu(const at::Tensor& a) {
  const at::Tensor a_contiguous = a.contiguous();
  const int64_t numel = a.numel();
  at::Tensor mask = at::empty({bit_mask_bytes(numel)}, a.options().dtype(at::kByte));
  FUSED_DISPATCH_FLOATING_TYPES(a.scalar_type(), "bit_mask_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const BitOp<opmath_t> bit_op{};
    const scalar_t* a_data = a_contiguous.const_data_ptr<scalar_t>();
    uint8_t* mask_data = mask.mutable_data_ptr<uint8_t>();
    at::parallel_for(0, mask.numel(), at::internal::GRAIN_SIZE / 8, [&](int64_t begin, int64_t end) {
      for (int64_t byte = begin; byte < end; ++byte) {
        uint8_t bits = 0;
        for (int64_t bit = 0; bit < 8 && 8 * byte + bit < numel; ++bit) {
          bits |= uint8_t(bit_op(static_cast<opmath_t>(a_data[8 * byte + bit])) ? 1 : 0) << bit;
        }
        mask_data[byte] = bits;
      }
    });
  });
  return mask;
}

// grad where the element's bit (bit_mask_cpu's layout) is set, else 0.
inline at::Tensor masked_gradient_cpu(const at::Tensor& grad, const at::Tensor& mask) {
  const at::Tensor grad_contiguous = grad.contiguous();
  const at::Tensor mask_contiguous = mask.contiguous();
  at::Tensor out = empty_contiguous_like(grad);
  FUSED_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "masked_gradient_cpu", [&] {
    const scalar_t* grad_data = grad_contiguous.const_data_ptr<scalar_t>();
    const uint8_t* mask_data = mask_contiguous.const_data_ptr<uint8_t>();
    scalar_t* out_data = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, out.numel(), at::internal::GRAIN_SIZE, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        out_data[i] = (mask_data[i / 8] >> (i % 8)) & 1 ? grad_data[i] : scalar_t(0);
      }
    });
  });
  return out;
}

}  // namespace fused_ops
