// C++ autograd for every op, registered at the `Autograd` key. Forwards re-dispatch below
// autograd; backwards call only registered ops (fused::*_backward, aten), so AOTAutograd can
// trace them and gradients work in a C++ process too.
#include <torch/autograd.h>
#include <torch/library.h>

namespace fused_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_relu_add(const at::Tensor& x, const at::Tensor& y, double bias) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::relu_add", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, y, bias);
}

at::Tensor call_relu_add_backward(const at::Tensor& grad, const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::relu_add_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, x);
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

// Whether a call must record a graph node; otherwise the forward runs without one (the eager
// inference path stays as short as the op itself).
bool records_gradient(const at::Tensor& a, const at::Tensor& b) {
  return at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad());
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

}  // namespace
}  // namespace fused_ops

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("relu_add", &fused_ops::relu_add_autograd);
  m.impl("relu_add_backward", &fused_ops::relu_add_backward_autograd);
}
