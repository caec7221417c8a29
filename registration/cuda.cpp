#include <torch/library.h>

#include "../ops/bias_gelu/bias_gelu.h"
#include "../ops/gelu_mul/gelu_mul.h"
#include "../ops/relu_add/relu_add.h"
#include "../ops/silu_mul/silu_mul.h"
#include "entry_points.h"

using namespace fused_ops;

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("relu_add", &relu_add_entry<relu_add_cuda>);
  m.impl("relu_add_backward", &relu_add_backward_entry<relu_add_backward_cuda>);
  m.impl("bias_gelu", &bias_gelu_entry<bias_gelu_cuda>);
  m.impl("bias_gelu_backward", &bias_gelu_backward_entry<bias_gelu_backward_cuda>);
  m.impl("silu_mul", &silu_mul_entry<silu_mul_cuda>);
  m.impl("silu_mul_backward", &silu_mul_backward_entry<silu_mul_backward_cuda>);
  m.impl("gelu_mul", &gelu_mul_entry<gelu_mul_cuda>);
  m.impl("gelu_mul_backward", &gelu_mul_backward_entry<gelu_mul_backward_cuda>);
}
