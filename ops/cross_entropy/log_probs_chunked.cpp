// The chunk loops of linear_log_probs, device-independent: ATen's products (cuBLAS on CUDA) around the
// backend's kernels; the forward by chunks of rows, the backward by chunks of classes
// (linear_log_probs.h). The checks (registration/checks.cpp) have run.
#include <ATen/OpMathType.h>

#include <optional>
#include <vector>

#include "../common/tensors.h"
#include "chunks.h"
#include "launch_plan.h"
#include "linear_cross_entropy.h"
#include "linear_log_probs.h"

namespace fused_ops {
namespace {

bool given(const std::optional<at::Tensor>& tensor) { return tensor.has_value() && tensor->defined(); }

// A per-row tensor as one contiguous opmath value per row, or undefined where none was given.
at::Tensor row_values(const std::optional<at::Tensor>& values, at::ScalarType dtype) {
  if (!given(values)) return at::Tensor();
  return values->to(dtype).reshape({-1}).contiguous();
}

const void* pointer_or_null(const at::Tensor& values) { return values.defined() ? values.const_data_ptr() : nullptr; }

}  // namespace

c10::SymInt log_probs_kept_classes(const at::Tensor& input, const at::Tensor& weight) {
  c10::SymInt rows = 1;
  for (int64_t dim = 0; dim + 1 < input.dim(); ++dim) rows = rows * input.sym_size(dim);
  return plan_log_probs_kept_classes(rows, weight.sym_size(0).guard_int(__FILE__, __LINE__),
                                     weight.sym_size(1).guard_int(__FILE__, __LINE__));
}

LinearLogProbsResult linear_log_probs_chunked(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                              const std::optional<at::Tensor>& bias, const LogProbsOptions& options,
                                              const LogProbsBackend& backend, int64_t kept_classes) {
  const int64_t classes = weight.size(0);
  const at::Tensor x = as_rows(input);
  const at::Tensor targets = target.reshape({-1}).contiguous();
  const int64_t rows = x.size(0);
  const at::TensorOptions output_options = input.options().dtype(cross_entropy_loss_dtype(input.scalar_type()));

  const LogitsChunks chunks(x, weight, bias, backend.available_bytes, backend.zero_row_padding);
  const int64_t chunk_rows = chunks.chunk_rows();
  // The first chunk's product is queued before the setup's small kernels, which the device then runs
  // behind it instead of waiting for each launch.
  at::Tensor first_logits;
  if (chunk_rows > 0) first_logits = chunks.product(0, std::min(chunk_rows, rows));

  LinearLogProbsResult result;
  result.log_probs = at::empty({rows}, output_options);
  result.entropy = at::empty({options.return_entropy ? rows : 0}, output_options);
  result.log_sum_exp = at::empty({rows}, output_options);
  result.kept_logits = at::empty({kept_classes > 0 ? rows : 0, kept_classes}, x.options());
  std::optional<TargetRangeCheck> target_check;
  if (backend.check_targets && rows > 0) target_check = start_target_range_check(targets, classes, options.ignore_index);
  for (int64_t start = 0; start < rows; start += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - start);
    const at::Tensor logits = start == 0 ? first_logits : chunks.product(start, count);
    auto row_pointer = [&](const at::Tensor& values) {
      return static_cast<char*>(values.data_ptr()) + start * values.element_size();
    };
    LogProbsRows chunk{};
    chunk.logits = logits.data_ptr();
    chunk.row_stride = logits.stride(0);
    chunk.rows = count;
    chunk.classes = classes;
    chunk.target = targets.const_data_ptr<int64_t>() + start;
    chunk.inverse_temperature = 1.0 / options.temperature;
    chunk.logit_scale = options.logit_scale;
    chunk.softcap = options.softcap;
    chunk.ignore_index = options.ignore_index;
    chunk.log_probs = row_pointer(result.log_probs);
    chunk.entropy = options.return_entropy ? row_pointer(result.entropy) : nullptr;
    chunk.log_sum_exp = row_pointer(result.log_sum_exp);
    backend.rows(chunk, x.scalar_type());
    if (kept_classes > 0) result.kept_logits.narrow(0, start, count).copy_(logits.narrow(1, 0, kept_classes));
  }
  if (target_check) finish_target_range_check(*target_check, targets, classes, options.ignore_index, "linear_log_probs");
  result.log_probs = result.log_probs.view(target.sizes());
  if (options.return_entropy) result.entropy = result.entropy.view(target.sizes());
  result.log_sum_exp = result.log_sum_exp.view(target.sizes());
  std::vector<int64_t> kept_shape(input.sizes().begin(), input.sizes().end() - 1);
  kept_shape.push_back(kept_classes);
  result.kept_logits = kept_classes > 0 ? result.kept_logits.view(kept_shape) : at::empty(kept_shape, x.options());
  return result;
}

LinearLogProbsGradients linear_log_probs_backward_by_classes(
    const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target, const std::optional<at::Tensor>& bias,
    const LogProbsOptions& options, std::array<bool, 3> gradients, const std::optional<at::Tensor>& grad_log_probs,
    const std::optional<at::Tensor>& grad_entropy, const std::optional<at::Tensor>& log_sum_exp,
    const std::optional<at::Tensor>& entropy, const std::optional<at::Tensor>& kept_logits,
    const LogProbsBackend& backend) {
  const bool has_bias = given(bias);
  const int64_t classes = weight.size(0);
  const at::Tensor x = as_rows(input);
  const int64_t rows = x.size(0);
  const at::ScalarType opmath = at::toOpMathType(input.scalar_type());
  LinearLogProbsGradients result;
  at::Tensor grad_input_sum = gradients[0] ? at::zeros({rows, x.size(1)}, x.options().dtype(opmath))
                                           : at::Tensor();
  result.grad_weight = gradients[1] ? at::empty_like(weight, at::MemoryFormat::Contiguous)
                                    : at::empty({0}, weight.options());
  at::Tensor grad_bias_sum = gradients[2] && has_bias ? at::empty({classes}, x.options().dtype(opmath)) : at::Tensor();

  const bool needs_entropy = given(grad_entropy);
  // Rows with neither gradient have a zero gradient over their logits: no chunk runs.
  const bool runs_chunks = rows > 0 && (given(grad_log_probs) || needs_entropy);
  at::Tensor row_log_sum_exp = row_values(log_sum_exp, opmath);
  at::Tensor row_entropy = needs_entropy ? row_values(entropy, opmath) : at::Tensor();
  if (runs_chunks && (!row_log_sum_exp.defined() || (needs_entropy && !row_entropy.defined()))) {
    // Called without the forward's statistics: they are computed again.
    LogProbsOptions forward_options = options;
    forward_options.return_entropy = needs_entropy;
    const LinearLogProbsResult forward = linear_log_probs_chunked(input, weight, target, bias, forward_options, backend);
    row_log_sum_exp = forward.log_sum_exp.reshape({-1}).to(opmath).contiguous();
    if (needs_entropy) row_entropy = forward.entropy.reshape({-1}).to(opmath).contiguous();
  }
  const at::Tensor targets = target.reshape({-1}).contiguous();
  const at::Tensor grad_log_prob_rows = row_values(grad_log_probs, opmath);
  const at::Tensor grad_entropy_rows = row_values(grad_entropy, opmath);

  const int64_t chunk_classes = runs_chunks ? plan_log_probs_gradient_classes(rows, classes, x.element_size(),
                                                                              backend.available_bytes)
                                            : 0;
  // The forward's logits of the first classes, [rows, kept], read in place of a product.
  at::Tensor kept;
  if (runs_chunks && given(kept_logits) && kept_logits->numel() > 0) kept = kept_logits->reshape({rows, -1}).contiguous();
  const int64_t kept_classes = kept.defined() ? kept.size(1) : 0;
  at::Tensor buffer;
  if (runs_chunks) {
    const int64_t row_stride = cross_entropy_row_stride(chunk_classes, x.element_size());
    // The device's products may read a row's padding (multiplied by zero): zeros, never stale NaN.
    buffer = backend.zero_row_padding ? at::zeros({rows, row_stride}, x.options())
                                      : at::empty({rows, row_stride}, x.options());
  }
  std::optional<TargetRangeCheck> target_check;
  if (runs_chunks && backend.check_targets) {
    target_check = start_target_range_check(targets, classes, options.ignore_index);
  }
  for (int64_t first = 0, count = 0; runs_chunks && first < classes; first += count) {
    // Chunks end where the kept classes end: those before read the kept logits, those after a product.
    const bool kept_chunk = first < kept_classes;
    count = std::min(chunk_classes, (kept_chunk ? kept_classes : classes) - first);
    at::Tensor logits = buffer.narrow(1, 0, count);
    const at::Tensor weight_rows = weight.narrow(0, first, count);
    const at::Tensor raw = kept_chunk ? kept.narrow(1, first, count) : logits;
    if (!kept_chunk && has_bias) at::addmm_out(logits, bias->narrow(0, first, count), x, weight_rows.t());
    if (!kept_chunk && !has_bias) at::mm_out(logits, x, weight_rows.t());
    LogProbsGradientTile tile{};
    tile.logits = raw.const_data_ptr();
    tile.row_stride = raw.stride(0);
    tile.grad_logits = logits.data_ptr();
    tile.grad_row_stride = logits.stride(0);
    tile.rows = rows;
    tile.classes = count;
    tile.first_class = first;
    tile.target = targets.const_data_ptr<int64_t>();
    tile.inverse_temperature = 1.0 / options.temperature;
    tile.logit_scale = options.logit_scale;
    tile.softcap = options.softcap;
    tile.ignore_index = options.ignore_index;
    tile.log_sum_exp = row_log_sum_exp.const_data_ptr();
    tile.entropy = pointer_or_null(row_entropy);
    tile.grad_log_probs = pointer_or_null(grad_log_prob_rows);
    tile.grad_entropy = pointer_or_null(grad_entropy_rows);
    backend.gradient(tile, classes, x.scalar_type());
    // logits now holds d L / d (x @ weight.T + bias) of the chunk's classes.
    if (gradients[1]) {
      at::Tensor grad_weight_rows = result.grad_weight.narrow(0, first, count);
      at::mm_out(grad_weight_rows, logits.t(), x);
    }
    if (gradients[0]) add_product(grad_input_sum, logits, weight_rows);
    if (grad_bias_sum.defined()) grad_bias_sum.narrow(0, first, count).copy_(at::sum(logits, {0}, false, opmath));
  }
  if (target_check) {
    finish_target_range_check(*target_check, targets, classes, options.ignore_index, "linear_log_probs_backward");
  }
  if (!runs_chunks) {
    if (gradients[1]) result.grad_weight.zero_();
    if (grad_bias_sum.defined()) grad_bias_sum.zero_();
  }
  result.grad_input = gradients[0] ? grad_input_sum.to(input.scalar_type()).view(input.sizes())
                                   : at::empty({0}, input.options());
  result.grad_bias = grad_bias_sum.defined() ? grad_bias_sum.to(bias->scalar_type()) : at::empty({0}, input.options());
  return result;
}

}  // namespace fused_ops
