#pragma once
// gated_mul(gate, up, activation) = act(gate) * up for gate and up [..., d] of any strides (a gated MLP
// whose gate_proj and up_proj stay two modules, or the halves of one gate/up output). The functors are
// silu_mul's and gelu_mul's (their inputs are gate, up), so the gated ops of every layout share one
// row loop and one set of kernels: silu_mul and gelu_mul are gated_mul on x[..., :d] and x[..., d:].
// Backward: grad_gate = grad * up * act'(gate), grad_up = grad * act(gate).
#include <ATen/ATen.h>

#include <tuple>

#include "math.h"
#include "rows.h"

namespace fused_ops {

// 'silu', 'gelu' (erf) and 'gelu_tanh' (F.gelu(approximate='tanh')).
enum class GatedActivation { Silu, Gelu, GeluTanh };

// gelu_mul's approximate as the gated activation it names.
inline GatedActivation gated_gelu(GeluApproximation approximation) {
  return approximation == GeluApproximation::Tanh ? GatedActivation::GeluTanh : GatedActivation::Gelu;
}

inline GeluApproximation gelu_approximation_of(GatedActivation activation) {
  return activation == GatedActivation::GeluTanh ? GeluApproximation::Tanh : GeluApproximation::None;
}

// The gated row loops of one backend over problems built by rows.h's gated_forward / gated_backward.
void gated_mul_rows_cpu(const RowwiseProblem<2, 1>& problem, at::ScalarType dtype, GatedActivation activation);
void gated_mul_backward_rows_cpu(const RowwiseProblem<3, 2>& problem, at::ScalarType dtype,
                                 GatedActivation activation);
void gated_mul_rows_cuda(const RowwiseProblem<2, 1>& problem, at::ScalarType dtype, c10::Device device,
                         GatedActivation activation);
void gated_mul_backward_rows_cuda(const RowwiseProblem<3, 2>& problem, at::ScalarType dtype, c10::Device device,
                                  GatedActivation activation);

at::Tensor gated_mul_cpu(const at::Tensor& gate, const at::Tensor& up, GatedActivation activation);
std::tuple<at::Tensor, at::Tensor> gated_mul_backward_cpu(const at::Tensor& grad, const at::Tensor& gate,
                                                          const at::Tensor& up, GatedActivation activation);
at::Tensor gated_mul_cuda(const at::Tensor& gate, const at::Tensor& up, GatedActivation activation);
std::tuple<at::Tensor, at::Tensor> gated_mul_backward_cuda(const at::Tensor& grad, const at::Tensor& gate,
                                                           const at::Tensor& up, GatedActivation activation);

}  // namespace fused_ops
