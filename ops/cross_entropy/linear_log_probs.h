#pragma once
// linear_log_probs(input, weight, target, bias, temperature, ignore_index, return_entropy, logit_scale,
// softcap): per row, with y = (input @ weight.T + bias) * logit_scale, the soft cap
// c = softcap * tanh(y / softcap) (c = y without one) and z = c / temperature, as the models apply them,
// the log-probability log_softmax(z)[target] and the entropy -sum(softmax(z) * log_softmax(z)), without
// the [N, V] logits in memory.
//
// The forward takes the rows in chunks (chunks.h): the device's product writes a chunk's logits, one row
// kernel reads them and writes each row's log-probability, entropy and log-sum-exp. The backward takes the
// classes in chunks instead, with every row: the per-row weights of both outputs are known only then, and
// with the forward's log-sum-exp and entropy in hand the gradient over a logit needs no other logit of its
// row. For each chunk of classes one product recomputes the logits (the forward keeps those of the first
// classes, launch_plan.h: no product for them), one elementwise kernel turns them into
//   d L / d z[j] = g1 ([j = t] - p[j]) - g2 p[j] (log p[j] + H)      (p = softmax(z), H the entropy)
// times d z / d (input @ weight.T + bias), and two products give the chunk's rows of the weight's gradient
// (whole, over every row: one rounding) and add its share to the input's gradient (kept in float32 for
// 16-bit inputs: one rounding at the end). Ignored rows have log-probability, entropy and gradient 0.
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
  void* log_probs;    // [rows] in opmath
  void* entropy;      // [rows] in opmath, or null
  void* log_sum_exp;  // [rows] in opmath, or null
};

// One chunk of classes of the backward: the logits of every row for classes [first_class, first_class +
// classes), row_stride elements apart, which the kernel turns into their gradient at grad_logits
// (grad_row_stride apart; the same memory or apart); per row the forward's log-sum-exp and entropy and
// the two outputs' gradients.
struct LogProbsGradientTile {
  const void* logits;
  int64_t row_stride;
  void* grad_logits;
  int64_t grad_row_stride;
  int64_t rows;
  int64_t classes;
  int64_t first_class;
  const int64_t* target;  // [rows]
  double inverse_temperature;
  double logit_scale;
  double softcap;
  int64_t ignore_index;
  const void* log_sum_exp;     // [rows] in opmath
  const void* entropy;         // [rows] in opmath, or null (no entropy gradient)
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

template <typename opmath_t, typename Chunk>
FUSED_HOST_DEVICE HeadLogit<opmath_t> head_logit(const Chunk& chunk) {
  return {static_cast<opmath_t>(chunk.logit_scale), static_cast<opmath_t>(chunk.softcap),
          static_cast<opmath_t>(chunk.inverse_temperature)};
}

// d L / d raw of one logit of a tile: 0 on an ignored row, NaN for an out-of-range target (the host
// reports it).
template <typename opmath_t>
FUSED_HOST_DEVICE opmath_t log_probs_raw_gradient(opmath_t raw, const HeadLogit<opmath_t>& head, int64_t target,
                                                  int64_t ignore_index, int64_t classes_total, bool is_target,
                                                  opmath_t log_sum_exp, opmath_t entropy, opmath_t grad_log_prob,
                                                  opmath_t grad_entropy) {
  if (target == ignore_index) return opmath_t(0);
  if (target < 0 || target >= classes_total) return opmath_t(NAN);
  const opmath_t capped = head.capped(raw);
  return log_probs_logit_gradient(capped * head.inverse_temperature, is_target, log_sum_exp, entropy, grad_log_prob,
                                  grad_entropy) *
         head.slope(capped);
}

using LogProbsRowsFunction = void (*)(const LogProbsRows&, at::ScalarType);
// classes_total: the weight's V, against which the targets are checked.
using LogProbsGradientFunction = void (*)(const LogProbsGradientTile&, int64_t classes_total, at::ScalarType);

// The device's part of the chunk loop (as CrossEntropyBackend, linear_cross_entropy.h).
struct LogProbsBackend {
  LogProbsRowsFunction rows;
  LogProbsGradientFunction gradient;
  int64_t available_bytes;
  bool check_targets;
  bool zero_row_padding;
};

LogProbsBackend log_probs_cpu_backend();
LogProbsBackend log_probs_cuda_backend();

struct LinearLogProbsResult {
  at::Tensor log_probs, entropy, log_sum_exp;  // the entropy [0] when not asked for
  at::Tensor kept_logits;  // [..., K] (input's leading dims): the raw logits of the first K classes (K may be 0)
};

struct LinearLogProbsGradients {
  at::Tensor grad_input, grad_weight, grad_bias;  // what was not asked for is empty
};

// The forward: both outputs and each row's log-sum-exp of z, in opmath, of target's shape, and the raw
// logits of the first kept_classes classes for the backward.
LinearLogProbsResult linear_log_probs_chunked(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                              const std::optional<at::Tensor>& bias, const LogProbsOptions& options,
                                              const LogProbsBackend& backend, int64_t kept_classes = 0);

// How many classes' logits the forward keeps for a backward (plan_log_probs_kept_classes) for input's rows
// (symbolic where they are) and the weight's [V, H] (specialized where symbolic).
c10::SymInt log_probs_kept_classes(const at::Tensor& input, const at::Tensor& weight);

// The backward: the gradients where `gradients` says (input, weight, bias) for grad_log_probs and
// grad_entropy (target's shape; either may be undefined, a zero gradient), from the forward's
// log-sum-exp and entropy (computed again where not given) and the logits it kept (recomputed where not
// given).
LinearLogProbsGradients linear_log_probs_backward_by_classes(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    const LogProbsOptions& options, std::array<bool, 3> gradients, const std::optional<at::Tensor>& grad_log_probs,
    const std::optional<at::Tensor>& grad_entropy, const std::optional<at::Tensor>& log_sum_exp,
    const std::optional<at::Tensor>& entropy, const std::optional<at::Tensor>& kept_logits,
    const LogProbsBackend& backend);

// The ops' kernels of one backend (registration/cpu.cpp, registration/cuda.cpp), on input's device.
template <LogProbsBackend (*kBackend)()>
struct LinearLogProbsKernels {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
      const LogProbsOptions& options, const c10::SymInt& kept_classes) {
    const c10::OptionalDeviceGuard device_guard(input.device());
    LinearLogProbsResult result =
        linear_log_probs_chunked(input, weight, target, bias, options, kBackend(), kept_classes.expect_int());
    return {result.log_probs, result.entropy, result.log_sum_exp, result.kept_logits};
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const std::optional<at::Tensor>& grad_log_probs, const std::optional<at::Tensor>& grad_entropy,
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
      const LogProbsOptions& options, std::array<bool, 3> gradients, const std::optional<at::Tensor>& log_sum_exp,
      const std::optional<at::Tensor>& entropy, const std::optional<at::Tensor>& kept_logits) {
    const c10::OptionalDeviceGuard device_guard(input.device());
    LinearLogProbsGradients result =
        linear_log_probs_backward_by_classes(input, weight, target, bias, options, gradients, grad_log_probs,
                                             grad_entropy, log_sum_exp, entropy, kept_logits, kBackend());
    return {result.grad_input, result.grad_weight, result.grad_bias};
  }
};

}  // namespace fused_ops
