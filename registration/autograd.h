#pragma once
// What every op's autograd registration uses: a typed handle to a registered op, the test for whether
// a call records a graph node, and the Autograd kernel built from a torch::autograd::Function.
#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <mutex>
#include <optional>
#include <tuple>
#include <type_traits>

namespace fused_ops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A registered op of the `fused` namespace, called through the dispatcher. Its handle is looked up on
// the first call: the schemas register when the library loads, after these objects are built.
template <typename Signature>
class FusedOp;

// Forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) carries tangents the ops have no
// rule for: an error naming the op, never an output with a silently missing (zero) tangent.
inline bool has_forward_gradient(const at::Tensor& tensor) {
  return tensor.defined() && tensor._fw_grad(/*level=*/0).defined();
}
inline bool has_forward_gradient(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() && has_forward_gradient(*tensor);
}
template <typename Option>
bool has_forward_gradient(const Option&) {
  return false;
}

// The forward ops run as ATen compositions there (autograd_transforms.h); the gradient ops, which have no
// composition, say so.
template <typename... Arguments>
void check_no_forward_gradient(const char* op, const Arguments&... arguments) {
  TORCH_CHECK(!(has_forward_gradient(arguments) || ...), op,
              ": forward-mode AD (torch.func.jvp, torch.func.jacfwd, torch.autograd.forward_ad) is not supported "
              "by this gradient op; differentiate its forward op instead, which runs as a composition of ATen ops "
              "under forward-mode AD and torch.func transforms");
}

// Whether a torch.func transform is active on this thread: functorch includes its dynamic-layer keys in the
// thread's dispatch keys while its layer stack is not empty.
inline bool functorch_transform_active() {
  return c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
         c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerBackMode);
}

// Under a torch.func transform or forward-mode AD, where a C++ autograd node cannot take part.
template <typename... Arguments>
bool under_a_transform(const Arguments&... arguments) {
  return functorch_transform_active() || (has_forward_gradient(arguments) || ...);
}

// A C++ autograd node cannot record under a torch.func transform (grad, vjp, vmap of grad).
inline void check_no_functorch_transform(const char* op) {
  TORCH_CHECK(!functorch_transform_active(), op,
              ": torch.func transforms (grad, vjp, jvp, vmap) are not supported by this gradient op; transform its "
              "forward op instead, which runs as a composition of ATen ops there");
}

template <typename Return, typename... Args>
class FusedOp<Return(Args...)> {
 public:
  using Signature = Return(Args...);

  explicit FusedOp(const char* name) : name_(name) {}

  Return operator()(Args... args) const {
    std::call_once(found_, [this] {
      handle_ = c10::Dispatcher::singleton().findSchemaOrThrow(name_, "").template typed<Signature>();
    });
    return handle_->call(args...);
  }

  const char* name() const { return name_; }

  // The backend's kernel, with no graph recorded.
  Return below_autograd(Args... args) const {
    check_no_forward_gradient(name_, args...);
    at::AutoDispatchBelowADInplaceOrView below;
    return (*this)(args...);
  }

 private:
  const char* name_;
  mutable std::once_flag found_;
  mutable std::optional<c10::TypedOperatorHandle<Signature>> handle_;
};

inline bool requires_grad(const at::Tensor& tensor) { return tensor.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() && tensor->defined() && tensor->requires_grad();
}
template <typename Option>
bool requires_grad(const Option&) {
  return false;
}

inline bool is_undefined(const at::Tensor& tensor) { return !tensor.defined(); }
template <typename Option>
bool is_undefined(const Option&) {
  return false;
}

// Whether a call must record a graph node; otherwise the op runs without one (the eager inference
// path stays as short as the op itself). A tensor argument given as None records none: the op's
// checks below autograd name it.
template <typename... Arguments>
bool records_gradient(const Arguments&... arguments) {
  return at::GradMode::is_enabled() && !(is_undefined(arguments) || ...) && (requires_grad(arguments) || ...);
}

// The Autograd kernel of an op whose graph node is `Function`: the op below autograd when no input
// needs a gradient (the eager inference path stays as short as the op itself), else Function::apply.
template <typename Function, const auto& kOp, typename Signature = typename std::decay_t<decltype(kOp)>::Signature>
struct AutogradKernel;

template <typename Function, const auto& kOp, typename Return, typename... Args>
struct AutogradKernel<Function, kOp, Return(Args...)> {
  static Return call(Args... args) {
    check_no_forward_gradient(kOp.name(), args...);
    if (!records_gradient(args...)) return kOp.below_autograd(args...);
    check_no_functorch_transform(kOp.name());
    if constexpr (std::is_same_v<Return, at::Tensor>) {
      return Function::apply(args...);
    } else {  // a Function of several outputs returns them as a list
      const variable_list outputs = Function::apply(args...);
      return {outputs[0], outputs[1]};
    }
  }
};

}  // namespace fused_ops
