#include "checks.h"

namespace fused_ops {

void check_floating(const char* op, const char* arg, const at::Tensor& tensor) {
  const auto dtype = tensor.scalar_type();
  TORCH_CHECK(dtype == at::kDouble || dtype == at::kFloat || dtype == at::kHalf ||
                  dtype == at::kBFloat16,
              "fused::", op, ": expected ", arg,
              " to be float64, float32, float16 or bfloat16, but got ", dtype);
}

void check_same_dtype(const char* op, const char* arg, const at::Tensor& tensor,
                      const char* reference_arg, const at::Tensor& reference) {
  TORCH_CHECK(tensor.scalar_type() == reference.scalar_type(), "fused::", op, ": expected ", arg,
              " to have the same dtype as ", reference_arg, " (", reference.scalar_type(),
              "), but got ", tensor.scalar_type());
}

void check_same_device(const char* op, const char* arg, const at::Tensor& tensor,
                       const char* reference_arg, const at::Tensor& reference) {
  TORCH_CHECK(tensor.device() == reference.device(), "fused::", op, ": expected ", arg,
              " to be on the same device as ", reference_arg, " (", reference.device(),
              "), but got ", tensor.device());
}

void check_broadcasts_to(const char* op, const char* arg, const at::Tensor& tensor,
                         const char* target_arg, const at::Tensor& target) {
  const c10::SymIntArrayRef sizes = tensor.sym_sizes();
  const c10::SymIntArrayRef target_sizes = target.sym_sizes();
  bool broadcasts = sizes.size() <= target_sizes.size();
  for (size_t i = 1; broadcasts && i <= sizes.size(); ++i) {
    const c10::SymInt& size = sizes[sizes.size() - i];
    broadcasts = size == 1 || size == target_sizes[target_sizes.size() - i];
  }
  TORCH_CHECK(broadcasts, "fused::", op, ": expected ", arg, " of shape ", sizes,
              " to broadcast to the shape of ", target_arg, " ", target_sizes,
              " (the result keeps ", target_arg, "'s shape)");
}

void check_same_shape(const char* op, const char* arg, const at::Tensor& tensor,
                      const char* reference_arg, const at::Tensor& reference) {
  TORCH_CHECK(tensor.sym_sizes() == reference.sym_sizes(), "fused::", op, ": expected ", arg,
              " to have the shape of ", reference_arg, " ", reference.sym_sizes(), ", but got ",
              tensor.sym_sizes());
}

void check_relu_add_arguments(const at::Tensor& x, const at::Tensor& y) {
  check_floating("relu_add", "x", x);
  check_same_dtype("relu_add", "y", y, "x", x);
  check_same_device("relu_add", "y", y, "x", x);
  check_broadcasts_to("relu_add", "y", y, "x", x);
}

void check_relu_add_backward_arguments(const at::Tensor& grad, const at::Tensor& x) {
  check_floating("relu_add_backward", "grad", grad);
  check_same_dtype("relu_add_backward", "x", x, "grad", grad);
  check_same_device("relu_add_backward", "x", x, "grad", grad);
  check_same_shape("relu_add_backward", "x", x, "grad", grad);
}

}  // namespace fused_ops
