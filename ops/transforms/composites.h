#pragma once
// Every forward op as a composition of ATen's differentiable ops: what the Autograd kernels run under a
// torch.func transform (grad, vjp, jvp, vmap) or forward-mode AD, where a C++ autograd node cannot take
// part. ATen's own derivative, forward-derivative and batching rules then make each transform right. The
// values are the fused kernels' (computed in float32 for 16-bit inputs, rounded once), not their speed.
#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace fused_ops::composite {

using OptionalTensor = std::optional<at::Tensor>;
using TwoTensors = std::tuple<at::Tensor, at::Tensor>;

at::Tensor relu_add(const at::Tensor& x, const at::Tensor& y, double bias);
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate);
// activation: "silu", "gelu" (erf) or "gelu_tanh".
at::Tensor gated_mul(const at::Tensor& gate, const at::Tensor& up, c10::string_view activation);
at::Tensor gated_mul_linear(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                            const OptionalTensor& bias, c10::string_view activation);
at::Tensor rms_norm(const at::Tensor& x, const OptionalTensor& weight, double eps, double offset);
at::Tensor layer_norm(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias, double eps,
                      double offset);
// (x + residual rounded to x's dtype, as eager stores it): the residual stream the add norms return.
at::Tensor residual_sum(const at::Tensor& x, const at::Tensor& residual);
TwoTensors rotary_embedding(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t unsqueeze_dim, bool interleaved);
at::Tensor linear_cross_entropy(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                const OptionalTensor& bias, int64_t ignore_index, double label_smoothing,
                                c10::string_view reduction, double softcap);
TwoTensors linear_log_probs(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                            const OptionalTensor& bias, double temperature, int64_t ignore_index, bool return_entropy,
                            double logit_scale, double softcap);

}  // namespace fused_ops::composite
