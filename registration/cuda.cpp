#include <torch/library.h>

#include "../ops/activations/bias_gelu.h"
#include "../ops/activations/gated_mul.h"
#include "../ops/activations/gelu_mul.h"
#include "../ops/activations/silu_mul.h"
#include "../ops/cross_entropy/linear_cross_entropy.h"
#include "../ops/cross_entropy/linear_log_probs.h"
#include "../ops/elementwise/relu_add.h"
#include "../ops/norms/norm.h"
#include "../ops/rotary/rotary.h"
#include "../ops/common/cuda_targets.h"
#include "entry_points.h"

#include <optional>
#include <type_traits>
#include <utility>

using namespace fused_ops;

namespace {

// Every CUDA kernel first checks that the build has code for the GPU of its first CUDA tensor: a build for
// other GPUs then names them and the rebuild, instead of failing with CUDA's bare launch error.
template <typename... Arguments>
void check_kernels_run_where(const Arguments&... arguments) {
  int device = -1;
  auto find = [&device](const auto& argument) {
    if constexpr (std::is_same_v<std::decay_t<decltype(argument)>, at::Tensor>) {
      if (device < 0 && argument.defined() && argument.is_cuda()) device = argument.get_device();
    }
  };
  (find(arguments), ...);
  if (device >= 0) cuda::check_kernels_run_on(device);
}

template <auto kernel>
struct OnAGpuItRuns;

template <typename Result, typename... Arguments, Result (*kernel)(Arguments...)>
struct OnAGpuItRuns<kernel> {
  static Result call(Arguments... arguments) {
    check_kernels_run_where(arguments...);
    return kernel(std::forward<Arguments>(arguments)...);
  }
};

template <auto kernel>
constexpr auto checked = &OnAGpuItRuns<kernel>::call;

// The same for the head + loss kernels, which the entries call as Kernels::forward and so on.
template <typename Kernels>
struct CheckedKernels {
  template <typename... Arguments>
  static auto forward(const Arguments&... arguments) {
    check_kernels_run_where(arguments...);
    return Kernels::forward(arguments...);
  }
  template <typename... Arguments>
  static auto with_gradients(const Arguments&... arguments) {
    check_kernels_run_where(arguments...);
    return Kernels::with_gradients(arguments...);
  }
  template <typename... Arguments>
  static auto backward(const Arguments&... arguments) {
    check_kernels_run_where(arguments...);
    return Kernels::backward(arguments...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("relu_add", &relu_add_entry<checked<relu_add_cuda>>);
  m.impl("relu_add_backward", &relu_add_backward_entry<checked<relu_add_backward_cuda>>);
  m.impl("relu_add_with_mask", &relu_add_with_mask_entry<checked<relu_add_with_mask_cuda>>);
  m.impl("relu_add_backward_masked", &relu_add_backward_masked_entry<checked<relu_add_backward_masked_cuda>>);
  m.impl("bias_gelu", &bias_gelu_entry<checked<bias_gelu_cuda>>);
  m.impl("bias_gelu_backward", &bias_gelu_backward_entry<checked<bias_gelu_backward_cuda>>);
  m.impl("silu_mul", &silu_mul_entry<checked<silu_mul_cuda>>);
  m.impl("silu_mul_backward", &silu_mul_backward_entry<checked<silu_mul_backward_cuda>>);
  m.impl("gelu_mul", &gelu_mul_entry<checked<gelu_mul_cuda>>);
  m.impl("gelu_mul_backward", &gelu_mul_backward_entry<checked<gelu_mul_backward_cuda>>);
  m.impl("gated_mul", &gated_mul_entry<checked<gated_mul_cuda>>);
  m.impl("gated_mul_backward", &gated_mul_backward_entry<checked<gated_mul_backward_cuda>>);
  m.impl("rms_norm", &rms_norm_entry<checked<rms_norm_cuda>>);
  m.impl("add_rms_norm", &add_rms_norm_entry<checked<add_rms_norm_cuda>>);
  m.impl("rms_norm_backward", &rms_norm_backward_entry<checked<rms_norm_backward_cuda>>);
  m.impl("layer_norm", &layer_norm_entry<checked<layer_norm_cuda>>);
  m.impl("add_layer_norm", &add_layer_norm_entry<checked<add_layer_norm_cuda>>);
  m.impl("layer_norm_backward", &layer_norm_backward_entry<checked<layer_norm_backward_cuda>>);
  m.impl("rotary_embedding", &rotary_embedding_entry<checked<rotary_embedding_cuda>>);
  m.impl("rotary_embedding_backward", &rotary_embedding_backward_entry<checked<rotary_embedding_backward_cuda>>);
  using CrossEntropy = CheckedKernels<LinearCrossEntropyKernels<cross_entropy_cuda_backend>>;
  m.impl("linear_cross_entropy", &linear_cross_entropy_entry<CrossEntropy>);
  m.impl("linear_cross_entropy_with_gradients", &linear_cross_entropy_with_gradients_entry<CrossEntropy>);
  m.impl("linear_cross_entropy_backward", &linear_cross_entropy_backward_entry<CrossEntropy>);
  using LogProbs = CheckedKernels<LinearLogProbsKernels<log_probs_cuda_backend>>;
  m.impl("linear_log_probs", &linear_log_probs_entry<LogProbs>);
  m.impl("linear_log_probs_backward", &linear_log_probs_backward_entry<LogProbs>);
}
