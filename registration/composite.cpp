// The ops with one implementation for every backend (CPU, CUDA and Meta alike): compositions of
// other registered ops and ATen's, below autograd (registration/autograd.cpp holds their nodes).
#include <torch/library.h>

#include "entry_points.h"
#include "entry_points_moe.h"

using namespace fused_ops;

TORCH_LIBRARY_IMPL(fused, CompositeExplicitAutograd, m) {
  m.impl("silu_mul_linear", &silu_mul_linear_entry);
  m.impl("silu_mul_linear_backward", &silu_mul_linear_backward_entry);
  m.impl("gated_mul_linear", &gated_mul_linear_entry);
  m.impl("gated_mul_linear_backward", &gated_mul_linear_backward_entry);
  m.impl("moe_permute", &moe_permute_entry);
}
