// The shared pieces of the family's chunk loops (chunks.h).
#include "chunks.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/version.h>

#include <ATen/OpMathType.h>

#include "launch_plan.h"

namespace fused_ops {

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
                               int64_t ignore_index, const char* op) {
  if (check.copied) check.copied->synchronize();
  if (!check.any_invalid_host.item<bool>()) return;
  const int64_t value = target.masked_select(check.invalid).index({0}).item<int64_t>();
  TORCH_CHECK(false, "fused::", op, ": expected target values in [0, ", classes, ") or ignore_index (", ignore_index,
              "), but got ", value);
}

void add_product(at::Tensor& accumulator, const at::Tensor& a, const at::Tensor& b, bool first) {
  const at::Scalar beta = first ? 0 : 1;  // 0: the accumulator's earlier contents (even NaN) are not read
  if (accumulator.scalar_type() == a.scalar_type()) {
    at::addmm_out(accumulator, accumulator, a, b, beta);
    return;
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  if (accumulator.is_cuda()) {
    at::addmm_out(accumulator, accumulator, a, b, accumulator.scalar_type(), beta);
    return;
  }
#endif
  at::addmm_out(accumulator, accumulator, a.to(accumulator.scalar_type()), b.to(accumulator.scalar_type()), beta);
}

LogitsChunks::LogitsChunks(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           int64_t available_bytes, bool zero_row_padding, bool adds_weight_gradient)
    : x_(x), weight_t_(weight.t()) {
  if (bias.has_value() && bias->defined()) bias_ = *bias;
  const int64_t rows = x.size(0);
  const int64_t classes = weight.size(0);
  if (rows == 0) return;
  chunk_rows_ = plan_cross_entropy_chunk_rows(rows, classes, x.element_size(), available_bytes, adds_weight_gradient);
  const int64_t row_stride = cross_entropy_row_stride(classes, x.element_size());
  buffer_ = at::empty({chunk_rows_, row_stride}, x.options());
  if (zero_row_padding && row_stride > classes) buffer_.narrow(1, classes, row_stride - classes).zero_();
  buffer_ = buffer_.narrow(1, 0, classes);
}

at::Tensor LogitsChunks::product(int64_t start, int64_t count) const {
  at::Tensor logits = buffer_.narrow(0, 0, count);
  const at::Tensor x_chunk = x_.narrow(0, start, count);
  if (bias_) {
    at::addmm_out(logits, *bias_, x_chunk, weight_t_);
  } else {
    at::mm_out(logits, x_chunk, weight_t_);
  }
  return logits;
}

LinearGradients::LinearGradients(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 std::array<bool, 3> wanted, at::ScalarType bias_sum_dtype, bool several_chunks)
    : wanted_(wanted), weight_(weight), bias_sum_dtype_(bias_sum_dtype) {
  wanted_[2] = wanted_[2] && bias.has_value() && bias->defined();
  grad_input_ = wanted_[0] ? at::empty({x.size(0), x.size(1)}, x.options()) : at::empty({0}, x.options());
  // The weight's gradient sums a product per chunk: in opmath, rounded once at the end, as one product over
  // every row would be.
  const at::ScalarType weight_sum_dtype = several_chunks ? at::toOpMathType(weight.scalar_type()) : weight.scalar_type();
  grad_weight_ = wanted_[1] ? at::empty(weight.sizes(), weight.options().dtype(weight_sum_dtype))
                            : at::empty({0}, weight.options());
  if (wanted_[2]) grad_bias_sum_ = at::zeros({weight.size(0)}, x.options().dtype(bias_sum_dtype));
}

void LinearGradients::add_chunk(const at::Tensor& grad_logits, const at::Tensor& x, int64_t start, int64_t count) {
  if (wanted_[0]) {
    at::Tensor grad_input_rows = grad_input_.narrow(0, start, count);
    at::mm_out(grad_input_rows, grad_logits, weight_);
  }
  if (wanted_[1]) add_product(grad_weight_, grad_logits.t(), x.narrow(0, start, count), !chunk_added_);
  if (wanted_[2]) grad_bias_sum_.add_(at::sum(grad_logits, {0}, false, bias_sum_dtype_));
  chunk_added_ = true;
}

std::array<at::Tensor, 3> LinearGradients::finish(const at::Tensor& input, const std::optional<at::Tensor>& bias) {
  // No chunk (no rows, or no gradient reaching them): zero gradients.
  if (!chunk_added_) {
    if (wanted_[0]) grad_input_.zero_();
    if (wanted_[1]) grad_weight_.zero_();
  }
  if (grad_weight_.scalar_type() != weight_.scalar_type()) grad_weight_ = grad_weight_.to(weight_.scalar_type());
  return {wanted_[0] ? grad_input_.view(input.sizes()) : grad_input_, grad_weight_,
          wanted_[2] ? grad_bias_sum_.to(bias->scalar_type()) : at::empty({0}, input.options())};
}

}  // namespace fused_ops
