#pragma once
// The activation ops as composite ops call them: through the dispatcher, so that each call reaches the
// backend's kernel (and a tracer sees the op), typed once per op.
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

namespace fused_ops {
namespace registered {

inline at::Tensor gated_mul(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::gated_mul", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(gate, up, activation);
}

inline std::tuple<at::Tensor, at::Tensor> gated_mul_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                             const at::Tensor& up, c10::string_view activation) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fused::gated_mul_backward", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                    c10::string_view)>();
  return op.call(grad, gate, up, activation);
}

inline at::Tensor silu_mul(const at::Tensor& x) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("fused::silu_mul", "").typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

inline at::Tensor silu_mul_backward(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::silu_mul_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, x);
}

inline at::Tensor gelu_mul(const at::Tensor& x, c10::string_view approximate) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::gelu_mul", "")
                             .typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  return op.call(x, approximate);
}

inline at::Tensor gelu_mul_backward(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::gelu_mul_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op.call(grad, x, approximate);
}

}  // namespace registered
}  // namespace fused_ops
