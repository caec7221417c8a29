#pragma once
// Argument checks shared by every backend of an op, so CPU, CUDA and Meta reject the same
// inputs with the same messages. Sizes are read as SymInts so the Meta kernel can use them.
#include <ATen/ATen.h>

#include <optional>

#include "../ops/activations/gated_mul.h"
#include "../ops/activations/math.h"
#include "../ops/cross_entropy/linear_cross_entropy.h"
#include "../ops/cross_entropy/linear_log_probs.h"

namespace fused_ops {

// A tensor argument given as None (an undefined tensor): every check below starts with this one, so
// every op names the argument that is missing.
void check_defined(const char* op, const char* arg, const at::Tensor& tensor);
// Floating dtype the library has kernels for (float64, float32, float16, bfloat16).
void check_floating(const char* op, const char* arg, const at::Tensor& tensor);
void check_same_dtype(const char* op, const char* arg, const at::Tensor& tensor,
                      const char* reference_arg, const at::Tensor& reference);
void check_same_device(const char* op, const char* arg, const at::Tensor& tensor,
                       const char* reference_arg, const at::Tensor& reference);
// `tensor` broadcasts to `target`'s shape without changing that shape.
void check_broadcasts_to(const char* op, const char* arg, const at::Tensor& tensor,
                         const char* target_arg, const at::Tensor& target);
void check_same_shape(const char* op, const char* arg, const at::Tensor& tensor,
                      const char* reference_arg, const at::Tensor& reference);

// 'none' or 'tanh', as torch.nn.functional.gelu takes it.
GeluApproximation parse_gelu_approximation(const char* op, c10::string_view approximate);

// relu_add and relu_add_with_mask.
void check_relu_add_arguments(const char* op, const at::Tensor& x, const at::Tensor& y);
void check_relu_add_backward_arguments(const at::Tensor& grad, const at::Tensor& x);
// mask: uint8, 1-D, one bit per element of grad (relu_add_with_mask's mask).
void check_relu_add_backward_masked_arguments(const at::Tensor& grad, const at::Tensor& mask);
void check_bias_gelu_arguments(const char* op, const at::Tensor& x, const at::Tensor& bias);
void check_bias_gelu_backward_arguments(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& bias);
// x [..., 2d] with an even last dim.
void check_gated_arguments(const char* op, const at::Tensor& x);
// grad [..., d] for x [..., 2d].
void check_gated_backward_arguments(const char* op, const at::Tensor& grad, const at::Tensor& x);
void check_silu_mul_linear_arguments(const char* op, const at::Tensor& x, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias);
void check_silu_mul_linear_backward_arguments(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight);

// 'silu', 'gelu' or 'gelu_tanh'.
GatedActivation parse_gated_activation(const char* op, c10::string_view activation);
// gate floating; up of gate's shape, dtype and device.
void check_gated_mul_arguments(const char* op, const at::Tensor& gate, const at::Tensor& up);
// grad of gate's shape, dtype and device, then the forward's checks.
void check_gated_mul_backward_arguments(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up);
// gate and up [..., d] (at least 1-D), weight [n, d], bias [n] or absent, of gate's dtype and device.
void check_gated_mul_linear_arguments(const char* op, const at::Tensor& gate, const at::Tensor& up,
                                      const at::Tensor& weight, const std::optional<at::Tensor>& bias);
void check_gated_mul_linear_backward_arguments(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                               const at::Tensor& weight);

// Norms: x [..., H] (at least 1-D); residual like x; weight (or None) and bias 1-D of size H with x's
// dtype, or float32 for 16-bit x (bias: the weight's dtype, x's without a weight); eps >= 0; offset 0
// without a weight.
void check_norm_arguments(const char* op, const at::Tensor& x, const at::Tensor* residual,
                          const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                          double offset);
// grad and grad_residual like x, then the forward's checks.
void check_norm_backward_arguments(const char* op, const at::Tensor& grad, const at::Tensor& x,
                                   const std::optional<at::Tensor>& weight,
                                   const std::optional<at::Tensor>& grad_residual, double eps, double offset);

// rotary_embedding (and its backward, grad_q and grad_k in q's and k's places): q and k 4-D of one
// dtype, heads at unsqueeze_dim (1 or 2, or -3 / -2), alike in every other dim; cos and sin of one shape
// [B or 1, S, R] or [S, R] with R even and at most D, of q's dtype or float32.
void check_rotary_arguments(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t unsqueeze_dim);

// linear_cross_entropy and its two gradient ops: input [..., H] floating, weight [V, H] and bias [V] of
// input's dtype, target int64 of input's leading shape, one device; reduction 'mean', 'sum' or 'none';
// label_smoothing in [0, 1]; softcap >= 0. Returns the options parsed. Target values are checked by
// the kernels (they read the targets).
CrossEntropyOptions check_linear_cross_entropy_arguments(const char* op, const at::Tensor& input,
                                                         const at::Tensor& weight, const at::Tensor& target,
                                                         const std::optional<at::Tensor>& bias, int64_t ignore_index,
                                                         double label_smoothing, c10::string_view reduction,
                                                         double softcap);
// grad_loss: floating, on input's device, of the loss's shape ([] or, for 'none', target's).
void check_linear_cross_entropy_grad_loss(const at::Tensor& grad_loss, const at::Tensor& input,
                                          const at::Tensor& target, const CrossEntropyOptions& options);

// linear_log_probs and its backward: input, weight, target and bias as for linear_cross_entropy;
// temperature > 0, logit_scale not 0 and softcap >= 0, all finite. Returns the options. Target values
// are checked by the kernels.
LogProbsOptions check_linear_log_probs_arguments(const char* op, const at::Tensor& input, const at::Tensor& weight,
                                                 const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                                 double temperature, int64_t ignore_index, bool return_entropy,
                                                 double logit_scale, double softcap);
// grad_log_probs, grad_entropy and the forward's log_sum_exp and entropy (each may be absent): floating, on
// input's device, of target's shape; the forward's kept logits (may be absent or [0]): input's dtype and
// device, input's leading dims and at most V classes.
void check_linear_log_probs_gradients(const std::optional<at::Tensor>& grad_log_probs,
                                      const std::optional<at::Tensor>& grad_entropy,
                                      const std::optional<at::Tensor>& log_sum_exp,
                                      const std::optional<at::Tensor>& entropy,
                                      const std::optional<at::Tensor>& kept_logits, const at::Tensor& input,
                                      const at::Tensor& weight, const at::Tensor& target);
// How many classes' logits a forward keeps: 0 to V.
void check_kept_classes(const char* op, const c10::SymInt& kept_classes, const at::Tensor& weight);

}  // namespace fused_ops
