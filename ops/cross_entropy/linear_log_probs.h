#pragma once
// linear_log_probs(input, weight, target, bias, temperature, ignore_index, return_entropy, logit_scale,
// softcap): per row, with y = (input @ weight.T + bias) * logit_scale, the soft cap
// c = softcap * tanh(y / softcap) (c = y without one) and z = c / temperature, as the models apply them,
// the log-probability log_softmax(z)[target] and the entropy -sum(softmax(z) * log_softmax(z)), without
// the [N, V] logits in memory. The rows go through
// in chunks as linear_cross_entropy's do (chunks.h): the device's product writes a chunk's logits, one
// row kernel reads them. The backward recomputes each chunk's logits (the per-row weights of both
// outputs are known only then), the row kernel turns them in place into
//   d L / d z[j] = g1 ([j = t] - p[j]) - g2 p[j] (log p[j] + H)      (p = softmax(z), H the entropy)
// times d z / d (input @ weight.T + bias), and two more products add the chunk's share to the input's and weight's
// gradients. Ignored rows have log-probability, entropy and gradient 0.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "../common/dtype_dispatch.h"
#include "linear_cross_entropy.h"

namespace fused_ops {

struct LogProbsOptions {
  double temperature = 1.0;
  int64_t ignore_index = -100;
  bool return_entropy = false;
  double logit_scale = 1.0;
  double softcap = 0.0;  // 0: no cap
};

// One chunk of rows for the row kernels (CPU or CUDA). The forward sets log_probs (and entropy); the
// backward sets grad_log_probs and/or grad_entropy, and the kernel writes the gradient over the logits.
struct LogProbsRows {
  void* logits;  // [rows, classes], row_stride elements apart: the raw logits in, their gradient out
  int64_t row_stride;
  int64_t rows;
  int64_t classes;
  const int64_t* target;  // [rows]
  double inverse_temperature;
  double logit_scale;
  double softcap;
  int64_t ignore_index;
  void* log_probs;             // [rows] in opmath, or null
  void* entropy;               // [rows] in opmath, or null
  const void* grad_log_probs;  // [rows] in opmath, or null (a zero gradient)
  const void* grad_entropy;    // [rows] in opmath, or null (a zero gradient)
};

// d L / d z[j] of one row before the division by the temperature, for z[j] (already divided by it),
// the row's log-sum-exp and entropy, and the two outputs' gradients g1 and g2. A class of probability
// 0 (a logit of -inf) adds nothing to the entropy's gradient, where p log p would give NaN.
template <typename opmath_t>
FUSED_HOST_DEVICE opmath_t log_probs_logit_gradient(opmath_t z, bool is_target, opmath_t log_sum_exp, opmath_t entropy,
                                                    opmath_t grad_log_prob, opmath_t grad_entropy) {
  using std::exp;
  const opmath_t log_p = z - log_sum_exp;
  const opmath_t p = exp(log_p);
  opmath_t gradient = grad_log_prob * ((is_target ? opmath_t(1) : opmath_t(0)) - p);
  if (p != opmath_t(0)) gradient -= grad_entropy * p * (log_p + entropy);
  return gradient;
}

// The head's logit z from a raw product value (HeadLogit::of) and d z / d raw from the raw value and its
// capped value (HeadLogit::slope).
template <typename opmath_t>
struct HeadLogit {
  opmath_t logit_scale, softcap, inverse_temperature;

  FUSED_HOST_DEVICE opmath_t capped(opmath_t raw) const { return soft_capped(raw * logit_scale, softcap); }
  FUSED_HOST_DEVICE opmath_t of(opmath_t raw) const { return capped(raw) * inverse_temperature; }
  FUSED_HOST_DEVICE opmath_t slope(opmath_t capped_value) const {
    return inverse_temperature * soft_cap_slope(capped_value, softcap) * logit_scale;
  }
};

template <typename opmath_t>
FUSED_HOST_DEVICE HeadLogit<opmath_t> head_logit(const LogProbsRows& rows) {
  return {static_cast<opmath_t>(rows.logit_scale), static_cast<opmath_t>(rows.softcap),
          static_cast<opmath_t>(rows.inverse_temperature)};
}

using LogProbsRowsFunction = void (*)(const LogProbsRows&, at::ScalarType);

// The device's part of the chunk loop (as CrossEntropyBackend, linear_cross_entropy.h).
struct LogProbsBackend {
  LogProbsRowsFunction rows;
  int64_t available_bytes;
  bool check_targets;
  bool zero_row_padding;
};

LogProbsBackend log_probs_cpu_backend();
LogProbsBackend log_probs_cuda_backend();

struct LinearLogProbsResult {
  at::Tensor log_probs, entropy, grad_input, grad_weight, grad_bias;  // what was not asked for is empty
};

// The forward (gradients all false, both grads undefined) or the backward: the gradients where
// `gradients` says (input, weight, bias) for grad_log_probs and grad_entropy (target's shape; either
// may be undefined, a zero gradient).
LinearLogProbsResult linear_log_probs_chunked(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                              const std::optional<at::Tensor>& bias, const LogProbsOptions& options,
                                              std::array<bool, 3> gradients, const std::optional<at::Tensor>& grad_log_probs,
                                              const std::optional<at::Tensor>& grad_entropy,
                                              const LogProbsBackend& backend);

// The two ops' kernels of one backend (registration/cpu.cpp, registration/cuda.cpp), on input's device.
template <LogProbsBackend (*kBackend)()>
struct LinearLogProbsKernels {
  static std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& input, const at::Tensor& weight,
                                                    const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                                    const LogProbsOptions& options) {
    const c10::OptionalDeviceGuard device_guard(input.device());
    LinearLogProbsResult result = linear_log_probs_chunked(input, weight, target, bias, options, {false, false, false},
                                                           std::nullopt, std::nullopt, kBackend());
    return {result.log_probs, result.entropy};
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const std::optional<at::Tensor>& grad_log_probs, const std::optional<at::Tensor>& grad_entropy,
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
      const LogProbsOptions& options, std::array<bool, 3> gradients) {
    const c10::OptionalDeviceGuard device_guard(input.device());
    LinearLogProbsResult result = linear_log_probs_chunked(input, weight, target, bias, options, gradients,
                                                           grad_log_probs, grad_entropy, kBackend());
    return {result.grad_input, result.grad_weight, result.grad_bias};
  }
};

}  // namespace fused_ops
