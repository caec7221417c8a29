// The chunk loop of linear_cross_entropy, device-independent: ATen's products (cuBLAS on CUDA) around
// the backend's row kernel. The checks (registration/checks.cpp) have run.
#include <optional>

#include "../common/tensors.h"
#include "chunks.h"
#include "launch_plan.h"
#include "linear_cross_entropy.h"

namespace fused_ops {

at::ScalarType cross_entropy_loss_dtype(at::ScalarType input_dtype) {
  return input_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

LinearCrossEntropyResult linear_cross_entropy_chunked(const at::Tensor& input, const at::Tensor& weight,
                                                      const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                                      const CrossEntropyOptions& options,
                                                      std::array<bool, 3> gradients, const at::Tensor& grad_loss,
                                                      const CrossEntropyBackend& backend) {
  const int64_t classes = weight.size(0);
  const at::Tensor x = as_rows(input);
  const at::Tensor targets = target.reshape({-1}).contiguous();
  const int64_t rows = x.size(0);
  const at::ScalarType loss_dtype = cross_entropy_loss_dtype(input.scalar_type());
  const at::TensorOptions loss_options = input.options().dtype(loss_dtype);
  const LogitsChunks chunks(x, weight, bias, backend.available_bytes, backend.zero_row_padding, gradients[1]);
  const int64_t chunk_rows = chunks.chunk_rows();
  // The first chunk's product is queued before the small kernels of the setup below: the device runs it
  // while the host launches them, where it would otherwise wait for each launch.
  at::Tensor first_logits;
  if (chunk_rows > 0) first_logits = chunks.product(0, std::min(chunk_rows, rows));

  LinearGradients linear_gradients(x, weight, bias, gradients, loss_dtype, chunk_rows < rows);
  const bool any_gradient = linear_gradients.any();
  at::Tensor loss_rows = at::empty({rows}, loss_options);
  at::Tensor counted;  // rows not ignored, for the mean
  if (options.reduction == Reduction::Mean) counted = targets.ne(options.ignore_index).sum().to(loss_dtype).clamp_min(1);
  at::Tensor grad_scale;  // each row's factor of its gradient
  if (any_gradient) {
    if (grad_loss.defined()) {
      grad_scale = grad_loss.to(loss_dtype);
      grad_scale = options.reduction == Reduction::None ? grad_scale.reshape({-1}).contiguous() : grad_scale.reshape({1});
      if (options.reduction == Reduction::Mean) grad_scale = grad_scale / counted;
    } else {
      grad_scale = options.reduction == Reduction::Mean ? counted.reciprocal().reshape({1}) : at::ones({1}, loss_options);
    }
  }
  const int64_t grad_scale_stride = options.reduction == Reduction::None && grad_loss.defined() ? 1 : 0;

  std::optional<TargetRangeCheck> target_check;
  if (backend.check_targets && rows > 0) target_check = start_target_range_check(targets, classes, options.ignore_index);
  for (int64_t start = 0; start < rows; start += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - start);
    const at::Tensor logits = start == 0 ? first_logits : chunks.product(start, count);
    CrossEntropyRows chunk{};
    chunk.logits = logits.data_ptr();
    chunk.row_stride = logits.stride(0);
    chunk.rows = count;
    chunk.classes = classes;
    chunk.target = targets.const_data_ptr<int64_t>() + start;
    chunk.loss = static_cast<char*>(loss_rows.data_ptr()) + start * loss_rows.element_size();
    chunk.grad_scale = any_gradient ? static_cast<const char*>(grad_scale.const_data_ptr()) +
                                          start * grad_scale_stride * grad_scale.element_size()
                                    : nullptr;
    chunk.grad_scale_stride = grad_scale_stride;
    chunk.ignore_index = options.ignore_index;
    chunk.label_smoothing = options.label_smoothing;
    chunk.softcap = options.softcap;
    backend.rows(chunk, x.scalar_type());
    if (!any_gradient) continue;
    // logits now holds d loss / d z of the chunk's rows.
    linear_gradients.add_chunk(logits, x, start, count);
  }
  if (target_check) finish_target_range_check(*target_check, targets, classes, options.ignore_index, "linear_cross_entropy");

  LinearCrossEntropyResult result;
  switch (options.reduction) {
    case Reduction::Mean:
      result.loss = loss_rows.sum() / counted;
      break;
    case Reduction::Sum:
      result.loss = loss_rows.sum();
      break;
    case Reduction::None:
      result.loss = loss_rows.view(target.sizes());
      break;
  }
  const std::array<at::Tensor, 3> parameter_gradients = linear_gradients.finish(input, bias);
  result.grad_input = parameter_gradients[0];
  result.grad_weight = parameter_gradients[1];
  result.grad_bias = parameter_gradients[2];
  return result;
}

}  // namespace fused_ops

// The chunk plan's rows, for tests through ctypes: no GPU needed. -1 where the plan raises (a bad
// FUSED_OPS_LOGITS_CHUNK_MB): no exception crosses the C boundary.
extern "C" int64_t fused_ops_cross_entropy_chunk_rows(int64_t rows, int64_t classes, int64_t element_size,
                                                      int64_t available_bytes, int64_t adds_weight_gradient) {
  try {
    return fused_ops::plan_cross_entropy_chunk_rows(rows, classes, element_size, available_bytes,
                                                    adds_weight_gradient != 0);
  } catch (const std::exception&) {
    return -1;
  }
}
