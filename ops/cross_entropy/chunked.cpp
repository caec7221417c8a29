// The chunk loop of linear_cross_entropy, device-independent: ATen's products (cuBLAS on CUDA) around
// the backend's row kernel. The checks (registration/checks.cpp) have run.
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>

#include "../common/tensors.h"
#include "launch_plan.h"
#include "linear_cross_entropy.h"

namespace fused_ops {

at::ScalarType cross_entropy_loss_dtype(at::ScalarType input_dtype) {
  return input_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

namespace {

// The targets' range check, started on the device before the chunks and read back after them: its
// flag reaches pinned host memory while the chunks are still queued, so reading it waits for the
// check alone and the device never idles between this op and the next. Invalid rows get NaN from the
// row kernels meanwhile, never a fault.
struct TargetRangeCheck {
  at::Tensor invalid;  // per row, on the targets' device
  at::Tensor any_invalid_host;
  std::optional<c10::Event> copied;
};

TargetRangeCheck start_target_range_check(const at::Tensor& target, int64_t classes, int64_t ignore_index) {
  TargetRangeCheck check;
  check.invalid = (target.lt(0) | target.ge(classes)) & target.ne(ignore_index);
  const at::Tensor any_invalid = check.invalid.any();
  if (target.is_cpu()) {
    check.any_invalid_host = any_invalid;
    return check;
  }
  check.any_invalid_host = at::empty({}, any_invalid.options().device(at::kCPU).pinned_memory(true));
  check.any_invalid_host.copy_(any_invalid, /*non_blocking=*/true);
  const c10::impl::VirtualGuardImpl guard(target.device().type());
  check.copied.emplace(target.device().type());
  check.copied->record(guard.getStream(target.device()));
  return check;
}

void finish_target_range_check(const TargetRangeCheck& check, const at::Tensor& target, int64_t classes,
                               int64_t ignore_index) {
  if (check.copied) check.copied->synchronize();
  if (!check.any_invalid_host.item<bool>()) return;
  const int64_t value = target.masked_select(check.invalid).index({0}).item<int64_t>();
  TORCH_CHECK(false, "fused::linear_cross_entropy: expected target values in [0, ", classes, ") or ignore_index (",
              ignore_index, "), but got ", value);
}

}  // namespace

LinearCrossEntropyResult linear_cross_entropy_chunked(const at::Tensor& input, const at::Tensor& weight,
                                                      const at::Tensor& target, const std::optional<at::Tensor>& bias,
                                                      const CrossEntropyOptions& options,
                                                      std::array<bool, 3> gradients, const at::Tensor& grad_loss,
                                                      const CrossEntropyBackend& backend) {
  const int64_t hidden = input.size(-1);
  const int64_t classes = weight.size(0);
  const at::Tensor x = as_rows(input);
  const at::Tensor targets = target.reshape({-1}).contiguous();
  const int64_t rows = x.size(0);
  const at::ScalarType loss_dtype = cross_entropy_loss_dtype(input.scalar_type());
  const at::TensorOptions loss_options = input.options().dtype(loss_dtype);
  const bool has_bias = bias.has_value() && bias->defined();
  gradients[2] = gradients[2] && has_bias;
  const bool any_gradient = gradients[0] || gradients[1] || gradients[2];

  const int64_t chunk_rows = rows == 0 ? 0 : plan_cross_entropy_chunk_rows(rows, classes, x.element_size(),
                                                                           backend.available_bytes);
  at::Tensor buffer;
  if (chunk_rows > 0) {
    const int64_t row_stride = cross_entropy_row_stride(classes, x.element_size());
    buffer = at::empty({chunk_rows, row_stride}, x.options());
    if (backend.zero_row_padding && row_stride > classes) buffer.narrow(1, classes, row_stride - classes).zero_();
    buffer = buffer.narrow(1, 0, classes);
  }
  const at::Tensor weight_t = weight.t();
  // The logits of the rows from `start` into the chunk buffer.
  auto logits_product = [&](int64_t start, int64_t count) {
    at::Tensor logits = buffer.narrow(0, 0, count);
    const at::Tensor x_chunk = x.narrow(0, start, count);
    if (has_bias) {
      at::addmm_out(logits, *bias, x_chunk, weight_t);
    } else {
      at::mm_out(logits, x_chunk, weight_t);
    }
    return logits;
  };
  // The first chunk's product is queued before the small kernels of the setup below: the device runs it
  // while the host launches them, where it would otherwise wait for each launch.
  at::Tensor first_logits;
  if (chunk_rows > 0) first_logits = logits_product(0, std::min(chunk_rows, rows));

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

  at::Tensor grad_input = gradients[0] ? at::empty({rows, hidden}, x.options()) : at::empty({0}, x.options());
  at::Tensor grad_weight = gradients[1] ? at::empty_like(weight, at::MemoryFormat::Contiguous) : at::empty({0}, weight.options());
  at::Tensor grad_bias_sum = gradients[2] ? at::zeros({classes}, loss_options) : at::Tensor();

  std::optional<TargetRangeCheck> target_check;
  if (backend.check_targets && rows > 0) target_check = start_target_range_check(targets, classes, options.ignore_index);
  for (int64_t start = 0; start < rows; start += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - start);
    const at::Tensor logits = start == 0 ? first_logits : logits_product(start, count);
    const at::Tensor x_chunk = x.narrow(0, start, count);
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
    if (gradients[0]) {
      at::Tensor grad_input_rows = grad_input.narrow(0, start, count);
      at::mm_out(grad_input_rows, logits, weight);
    }
    if (gradients[1]) {
      if (start == 0) {
        at::mm_out(grad_weight, logits.t(), x_chunk);
      } else {
        at::addmm_out(grad_weight, grad_weight, logits.t(), x_chunk);
      }
    }
    if (gradients[2]) grad_bias_sum.add_(at::sum(logits, {0}, false, loss_dtype));
  }
  if (gradients[1] && rows == 0) grad_weight.zero_();
  if (target_check) finish_target_range_check(*target_check, targets, classes, options.ignore_index);

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
  result.grad_input = gradients[0] ? grad_input.view(input.sizes()) : grad_input;
  result.grad_weight = grad_weight;
  result.grad_bias = gradients[2] ? grad_bias_sum.to(bias->scalar_type()) : at::empty({0}, input.options());
  return result;
}

}  // namespace fused_ops

// The chunk plan's rows, for tests through ctypes: no GPU needed. -1 where the plan raises (a bad
// FUSED_OPS_LOGITS_CHUNK_MB): no exception crosses the C boundary.
extern "C" int64_t fused_ops_cross_entropy_chunk_rows(int64_t rows, int64_t classes, int64_t element_size,
                                                      int64_t available_bytes) {
  try {
    return fused_ops::plan_cross_entropy_chunk_rows(rows, classes, element_size, available_bytes);
  } catch (const std::exception&) {
    return -1;
  }
}
