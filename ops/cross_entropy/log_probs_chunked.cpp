// The chunk loop of linear_log_probs, device-independent: ATen's products (cuBLAS on CUDA) around the
// backend's row kernel. The checks (registration/checks.cpp) have run.
#include <optional>

#include "../common/tensors.h"
#include "chunks.h"
#include "linear_cross_entropy.h"
#include "linear_log_probs.h"

namespace fused_ops {
namespace {

bool given(const std::optional<at::Tensor>& gradient) { return gradient.has_value() && gradient->defined(); }

// A per-row gradient as one contiguous opmath value per row, or undefined where none was given.
at::Tensor row_values(const std::optional<at::Tensor>& gradient, at::ScalarType dtype) {
  if (!given(gradient)) return at::Tensor();
  return gradient->to(dtype).reshape({-1}).contiguous();
}

const void* row_pointer(const at::Tensor& values, int64_t start) {
  if (!values.defined()) return nullptr;
  return static_cast<const char*>(values.const_data_ptr()) + start * values.element_size();
}

}  // namespace

LinearLogProbsResult linear_log_probs_chunked(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& target,
                                              const std::optional<at::Tensor>& bias, const LogProbsOptions& options,
                                              std::array<bool, 3> gradients, const std::optional<at::Tensor>& grad_log_probs,
                                              const std::optional<at::Tensor>& grad_entropy,
                                              const LogProbsBackend& backend) {
  const int64_t classes = weight.size(0);
  const at::Tensor x = as_rows(input);
  const at::Tensor targets = target.reshape({-1}).contiguous();
  const int64_t rows = x.size(0);
  const at::ScalarType output_dtype = cross_entropy_loss_dtype(input.scalar_type());
  const at::TensorOptions output_options = input.options().dtype(output_dtype);
  const bool backward = gradients[0] || gradients[1] || gradients[2];
  // In the backward, rows with neither gradient have a zero gradient over their logits: no chunk runs.
  const bool runs_chunks = !backward || given(grad_log_probs) || given(grad_entropy);

  const LogitsChunks chunks(x, weight, bias, backend.available_bytes, backend.zero_row_padding);
  const int64_t chunk_rows = chunks.chunk_rows();
  // The first chunk's product is queued before the setup's small kernels, which the device then runs
  // behind it instead of waiting for each launch.
  at::Tensor first_logits;
  if (chunk_rows > 0 && runs_chunks) first_logits = chunks.product(0, std::min(chunk_rows, rows));

  LinearGradients linear_gradients(x, weight, bias, gradients, output_dtype);
  at::Tensor log_probs, entropy, grad_log_prob_rows, grad_entropy_rows;
  if (backward) {
    grad_log_prob_rows = row_values(grad_log_probs, output_dtype);
    grad_entropy_rows = row_values(grad_entropy, output_dtype);
  } else {
    log_probs = at::empty({rows}, output_options);
    entropy = at::empty({options.return_entropy ? rows : 0}, output_options);
  }

  std::optional<TargetRangeCheck> target_check;
  if (backend.check_targets && rows > 0) target_check = start_target_range_check(targets, classes, options.ignore_index);
  for (int64_t start = 0; runs_chunks && start < rows; start += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - start);
    const at::Tensor logits = start == 0 ? first_logits : chunks.product(start, count);
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
    if (backward) {
      chunk.grad_log_probs = row_pointer(grad_log_prob_rows, start);
      chunk.grad_entropy = row_pointer(grad_entropy_rows, start);
    } else {
      chunk.log_probs = static_cast<char*>(log_probs.data_ptr()) + start * log_probs.element_size();
      if (options.return_entropy) chunk.entropy = static_cast<char*>(entropy.data_ptr()) + start * entropy.element_size();
    }
    backend.rows(chunk, x.scalar_type());
    // logits now holds d L / d (x @ weight.T + bias) of the chunk's rows.
    if (backward) linear_gradients.add_chunk(logits, x, start, count);
  }
  if (target_check) finish_target_range_check(*target_check, targets, classes, options.ignore_index, "linear_log_probs");

  LinearLogProbsResult result;
  if (!backward) {
    result.log_probs = log_probs.view(target.sizes());
    result.entropy = options.return_entropy ? entropy.view(target.sizes()) : entropy;
    return result;
  }
  const std::array<at::Tensor, 3> gradient_tensors = linear_gradients.finish(input, bias);
  result.grad_input = gradient_tensors[0];
  result.grad_weight = gradient_tensors[1];
  result.grad_bias = gradient_tensors[2];
  return result;
}

}  // namespace fused_ops
