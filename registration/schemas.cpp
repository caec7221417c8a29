// Every schema of the `fused` namespace. Kernels are registered per dispatch key in the
// neighbouring files; the math lives in ops/<op>/.
#include <torch/library.h>

TORCH_LIBRARY(fused, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  // relu(x) + y + bias; y broadcasts to x's shape.
  m.def("relu_add(Tensor x, Tensor y, float bias=0.0) -> Tensor", tags);
  // grad where relu passed x through, else 0 (the gradient of relu_add w.r.t. x).
  m.def("relu_add_backward(Tensor grad, Tensor x) -> Tensor", tags);
}
