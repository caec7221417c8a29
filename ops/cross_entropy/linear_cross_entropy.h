#pragma once
// linear_cross_entropy(input, weight, target, bias, ignore_index, label_smoothing, reduction, softcap):
// F.cross_entropy(z, target, ...) with z = input @ weight.T + bias (and z = softcap * tanh(z / softcap)
// when softcap > 0), without the [N, V] logits in memory. Rows go through in chunks: cuBLAS (through
// ATen) writes one chunk's logits, one row kernel turns them into each row's loss and, in place, the
// loss's gradient with respect to them, and two more products add that chunk's share to the input's
// and the weight's gradients. With the mean or the sum, the forward computes the gradients too (the
// backward scales them by grad_output); with 'none' the backward recomputes the chunks, each row's
// gradient scaled by its grad_output.
// Per row with target t (not ignore_index) and smoothing s over V classes:
//   loss = logsumexp(z) - (1 - s) z[t] - s mean(z),  d loss / d z[j] = softmax(z)[j] - (1 - s) [j = t] - s / V.
// Ignored rows have loss 0 and gradient 0; 'mean' divides by the number of rows not ignored, and is 0
// (not NaN, as torch gives) when every row is ignored.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>

#include "../common/dtype_dispatch.h"
#include "../common/fast_math.h"

namespace fused_ops {

enum class Reduction { Mean, Sum, None };

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::Mean;
  double softcap = 0.0;
};

// One chunk of rows for the row kernels (CPU or CUDA).
struct CrossEntropyRows {
  void* logits;  // [rows, classes], row_stride elements apart: z in; the gradient out when grad_scale is set
  int64_t row_stride;
  int64_t rows;
  int64_t classes;
  const int64_t* target;   // [rows]
  void* loss;              // [rows] in opmath (float, or double for double logits)
  const void* grad_scale;  // opmath factor of each row's gradient: one value (stride 0) or one per row
  int64_t grad_scale_stride;
  int64_t ignore_index;
  double label_smoothing;
  double softcap;
};

using CrossEntropyRowsFunction = void (*)(const CrossEntropyRows&, at::ScalarType);

// z after the soft cap, and d(capped z)/dz from the capped value.
template <typename opmath_t>
FUSED_HOST_DEVICE opmath_t soft_capped(opmath_t z, opmath_t softcap) {
  return softcap > opmath_t(0) ? softcap * fast_tanh(fast_divide(z, softcap)) : z;
}
template <typename opmath_t>
FUSED_HOST_DEVICE opmath_t soft_cap_slope(opmath_t capped, opmath_t softcap) {
  if (softcap <= opmath_t(0)) return opmath_t(1);
  const opmath_t ratio = capped / softcap;
  return opmath_t(1) - ratio * ratio;
}

// The device's part of the chunk loop.
struct CrossEntropyBackend {
  CrossEntropyRowsFunction rows;
  int64_t available_bytes;  // memory the logits chunk may take a share of (the device's free memory)
  bool check_targets;       // check the targets' range and read it back (false while a CUDA graph captures)
  // The device's products read a row's padding past the classes (multiplied by zero), so the chunk
  // buffer's padding is zeroed: a NaN or infinity that earlier memory left there would make gradient
  // rows NaN. ATen's CPU bfloat16 product does; cuBLAS reads only the classes.
  bool zero_row_padding = false;
};

struct LinearCrossEntropyResult {
  at::Tensor loss, grad_input, grad_weight, grad_bias;  // gradients not asked for are empty
};

// The loss and, for `gradients` (input, weight, bias), its gradients: of the mean or the sum for a
// unit grad_output when grad_loss is undefined, else with grad_loss (of the loss's shape) as grad_output.
LinearCrossEntropyResult linear_cross_entropy_chunked(const at::Tensor& input, const at::Tensor& weight,
                                                      const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                                      const CrossEntropyOptions& options,
                                                      std::array<bool, 3> gradients, const at::Tensor& grad_loss,
                                                      const CrossEntropyBackend& backend);

// The loss's dtype and shape: float32 (float64 for float64 input); [] or target's shape for 'none'.
at::ScalarType cross_entropy_loss_dtype(at::ScalarType input_dtype);

// Each backend's part: its row kernel and, read per call, its free memory and whether it may sync.
CrossEntropyBackend cross_entropy_cpu_backend();
CrossEntropyBackend cross_entropy_cuda_backend();

// The three ops' kernels of one backend (registration/cpu.cpp, registration/cuda.cpp), on input's device.
template <CrossEntropyBackend (*kBackend)()>
struct LinearCrossEntropyKernels {
  static LinearCrossEntropyResult run(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                      const std::optional<at::Tensor>& bias, const CrossEntropyOptions& options,
                                      std::array<bool, 3> gradients, const at::Tensor& grad_loss) {
    const c10::OptionalDeviceGuard device_guard(input.device());
    return linear_cross_entropy_chunked(input, weight, target, bias, options, gradients, grad_loss, kBackend());
  }
  static at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                            const std::optional<at::Tensor>& bias, const CrossEntropyOptions& options) {
    return run(input, weight, target, bias, options, {false, false, false}, at::Tensor()).loss;
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> with_gradients(
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
      const std::optional<at::Tensor>& bias, const CrossEntropyOptions& options, std::array<bool, 3> gradients) {
    LinearCrossEntropyResult result = run(input, weight, target, bias, options, gradients, at::Tensor());
    return {result.loss, result.grad_input, result.grad_weight, result.grad_bias};
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_loss, const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
      const std::optional<at::Tensor>& bias, const CrossEntropyOptions& options, std::array<bool, 3> gradients) {
    LinearCrossEntropyResult result = run(input, weight, target, bias, options, gradients, grad_loss);
    return {result.grad_input, result.grad_weight, result.grad_bias};
  }
};

}  // namespace fused_ops
