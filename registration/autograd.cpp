// C++ autograd for every op, registered at the `Autograd` key. Forwards re-dispatch below
// autograd; backwards call only registered ops (fused::*_backward, aten), so AOTAutograd can
// trace them and gradients work in a C++ process too.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <numeric>

namespace fused_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

at::Tensor call_relu_add(const at::Tensor& x, const at::Tensor& y, double bias) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("fused::relu_add");
  return op.call(x, y, bias);
}

at::Tensor call_relu_add_backward(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("fused::relu_add_backward");
  return op.call(grad, x);
}

at::Tensor call_bias_gelu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  static const auto op =
      find_op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>("fused::bias_gelu");
  return op.call(x, bias, approximate);
}

at::Tensor call_silu_mul(const at::Tensor& x) {
  static const auto op = find_op<at::Tensor(const at::Tensor&)>("fused::silu_mul");
  return op.call(x);
}

at::Tensor call_gelu_mul(const at::Tensor& x, c10::string_view approximate) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, c10::string_view)>("fused::gelu_mul");
  return op.call(x, approximate);
}

class ReluAddFunction : public torch::autograd::Function<ReluAddFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y,
                            double bias) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x});
    ctx->saved_data["y_sizes"] = c10::IValue(y.sym_sizes());
    return call_relu_add(x, y, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor& grad = grad_outputs[0];
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor grad_x, grad_y;
    if (ctx->needs_input_grad(0)) grad_x = call_relu_add_backward(grad, x);
    if (ctx->needs_input_grad(1)) {
      grad_y = grad.sum_to_size_symint(ctx->saved_data["y_sizes"].toSymIntVector());
    }
    return {grad_x, grad_y, at::Tensor()};
  }
};

// relu_add_backward is linear in `grad` and piecewise constant in `x`.
class ReluAddBackwardFunction : public torch::autograd::Function<ReluAddBackwardFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x});
    return call_relu_add_backward(grad, x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor grad_grad;
    if (ctx->needs_input_grad(0)) grad_grad = call_relu_add_backward(grad_outputs[0], x);
    return {grad_grad, at::Tensor()};
  }
};

at::Tensor call_bias_gelu_backward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias,
                                   c10::string_view approximate) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            c10::string_view)>("fused::bias_gelu_backward");
  return op.call(grad, x, bias, approximate);
}

at::Tensor call_silu_mul_backward(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("fused::silu_mul_backward");
  return op.call(grad, x);
}

at::Tensor call_gelu_mul_backward(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>(
      "fused::gelu_mul_backward");
  return op.call(grad, x, approximate);
}

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                            c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x, bias});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call_bias_gelu(x, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor grad_h =
        call_bias_gelu_backward(grad_outputs[0], x, saved[1], ctx->saved_data["approximate"].toStringRef());
    at::Tensor grad_bias;
    if (ctx->needs_input_grad(1)) {
      // Summed over every leading dim (none for a 1-D x); aten's sum is deterministic.
      std::vector<int64_t> leading(x.dim() - 1);
      std::iota(leading.begin(), leading.end(), 0);
      grad_bias = leading.empty() ? grad_h : grad_h.sum(leading);
    }
    return {ctx->needs_input_grad(0) ? grad_h : at::Tensor(), grad_bias, at::Tensor()};
  }
};

// silu_mul and gelu_mul: the gradient of x [..., 2d] from the backward op.
template <typename Derived>
class GatedFunction : public torch::autograd::Function<Derived> {
 public:
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {Derived::backward_op(grad_outputs[0], x, ctx), at::Tensor()};
  }
};

class SiluMulFunction : public GatedFunction<SiluMulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x});
    return call_silu_mul(x);
  }
  static at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& x, AutogradContext*) {
    return call_silu_mul_backward(grad, x);
  }
};

class GeluMulFunction : public GatedFunction<GeluMulFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::string_view approximate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->save_for_backward({x});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call_gelu_mul(x, approximate);
  }
  static at::Tensor backward_op(const at::Tensor& grad, const at::Tensor& x, AutogradContext* ctx) {
    return call_gelu_mul_backward(grad, x, ctx->saved_data["approximate"].toStringRef());
  }
};

// Whether a call must record a graph node; otherwise the forward runs without one (the eager
// inference path stays as short as the op itself).
template <typename... Tensors>
bool records_gradient(const Tensors&... tensors) {
  return at::GradMode::is_enabled() && (tensors.requires_grad() || ...);
}

at::Tensor relu_add_autograd(const at::Tensor& x, const at::Tensor& y, double bias) {
  if (!records_gradient(x, y)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_relu_add(x, y, bias);
  }
  return ReluAddFunction::apply(x, y, bias);
}

at::Tensor relu_add_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  if (!records_gradient(grad, x)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_relu_add_backward(grad, x);
  }
  return ReluAddBackwardFunction::apply(grad, x);
}


at::Tensor bias_gelu_autograd(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  if (!records_gradient(x, bias)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_bias_gelu(x, bias, approximate);
  }
  return BiasGeluFunction::apply(x, bias, approximate);
}

at::Tensor silu_mul_autograd(const at::Tensor& x) {
  if (!records_gradient(x)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_silu_mul(x);
  }
  return SiluMulFunction::apply(x);
}

at::Tensor gelu_mul_autograd(const at::Tensor& x, c10::string_view approximate) {
  if (!records_gradient(x)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_gelu_mul(x, approximate);
  }
  return GeluMulFunction::apply(x, approximate);
}

// Backward ops of the activations. Recording a graph through them (double backward) runs the same
// math as differentiable aten ops (gelu_backward has a derivative of its own);
// otherwise the fused kernel runs below autograd.
at::Tensor bias_gelu_backward_autograd(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias,
                                       c10::string_view approximate) {
  if (records_gradient(grad, x, bias)) return at::gelu_backward(grad, x + bias, approximate);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_bias_gelu_backward(grad, x, bias, approximate);
}

at::Tensor silu_mul_backward_autograd(const at::Tensor& grad, const at::Tensor& x) {
  if (records_gradient(grad, x)) {
    const auto halves = x.chunk(2, -1);
    const at::Tensor sigmoid = at::sigmoid(halves[0]);  // aten's silu_backward has no derivative
    const at::Tensor silu_derivative = sigmoid * (1 + halves[0] * (1 - sigmoid));
    return at::cat({grad * halves[1] * silu_derivative, grad * halves[0] * sigmoid}, -1);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_silu_mul_backward(grad, x);
}

at::Tensor gelu_mul_backward_autograd(const at::Tensor& grad, const at::Tensor& x, c10::string_view approximate) {
  if (records_gradient(grad, x)) {
    const auto halves = x.chunk(2, -1);
    return at::cat({at::gelu_backward(grad * halves[1], halves[0], approximate),
                    grad * at::gelu(halves[0], approximate)}, -1);
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_gelu_mul_backward(grad, x, approximate);
}

}  // namespace
}  // namespace fused_ops

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("relu_add", &fused_ops::relu_add_autograd);
  m.impl("relu_add_backward", &fused_ops::relu_add_backward_autograd);
  m.impl("bias_gelu", &fused_ops::bias_gelu_autograd);
  m.impl("bias_gelu_backward", &fused_ops::bias_gelu_backward_autograd);
  m.impl("silu_mul", &fused_ops::silu_mul_autograd);
  m.impl("silu_mul_backward", &fused_ops::silu_mul_backward_autograd);
  m.impl("gelu_mul", &fused_ops::gelu_mul_autograd);
  m.impl("gelu_mul_backward", &fused_ops::gelu_mul_backward_autograd);
}
