#pragma once
// The pieces every LM-head op of this family shares around its row kernel (linear_cross_entropy,
// linear_log_probs): the targets' range check, one reused buffer that holds a chunk of rows' logits,
// and the chunk-by-chunk sums that turn a gradient over the logits into the input's, weight's and
// bias's gradients. The chunk's size comes from the family's launch plan (launch_plan.h).
#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <array>
#include <cstdint>
#include <optional>

namespace fused_ops {

// The targets' range check, started on the device before the chunks and read back after them: its
// flag reaches pinned host memory while the chunks are still queued, so reading it waits for the
// check alone and the device never idles between this op and the next. Invalid rows get NaN from the
// row kernels meanwhile, never a fault.
struct TargetRangeCheck {
  at::Tensor invalid;  // per row, on the targets' device
  at::Tensor any_invalid_host;
  std::optional<c10::Event> copied;
};

TargetRangeCheck start_target_range_check(const at::Tensor& target, int64_t classes, int64_t ignore_index);
// Raises the error, naming `op`, when a target was out of range.
void finish_target_range_check(const TargetRangeCheck& check, const at::Tensor& target, int64_t classes,
                               int64_t ignore_index, const char* op);

// The logits x @ weight.T + bias of rows [start, start + count) of x [rows, H], written by the device's
// product (cuBLAS on CUDA) into one buffer of chunk_rows rows reused by every chunk.
class LogitsChunks {
 public:
  // zero_row_padding: the device's products read a row's padding past the classes (multiplied by zero),
  // so it is zeroed: a NaN or infinity that earlier memory left there would make gradient rows NaN.
  // adds_weight_gradient: each chunk's product will be added into the weight's gradient (the plan's
  // fewest rows then apply).
  LogitsChunks(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
               int64_t available_bytes, bool zero_row_padding, bool adds_weight_gradient = false);
  int64_t chunk_rows() const { return chunk_rows_; }
  at::Tensor product(int64_t start, int64_t count) const;

 private:
  at::Tensor x_, weight_t_, buffer_;
  std::optional<at::Tensor> bias_;
  int64_t chunk_rows_ = 0;
};

// accumulator (+)= a @ b (`first`: =) with the product's sum kept in the accumulator's dtype: cuBLAS
// writes a float32 result of 16-bit operands itself; elsewhere the operands are widened first.
void add_product(at::Tensor& accumulator, const at::Tensor& a, const at::Tensor& b, bool first = false);

// The gradients of input, weight and bias (where `wanted` says) summed chunk by chunk from the gradient
// over each chunk's logits (the weight's in opmath over several chunks); those not wanted are empty tensors.
class LinearGradients {
 public:
  LinearGradients(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  std::array<bool, 3> wanted, at::ScalarType bias_sum_dtype, bool several_chunks);
  bool any() const { return wanted_[0] || wanted_[1] || wanted_[2]; }
  // grad_logits [count, V]: d loss / d logits of rows [start, start + count) of x.
  void add_chunk(const at::Tensor& grad_logits, const at::Tensor& x, int64_t start, int64_t count);
  // grad_input in input's shape, grad_weight, grad_bias in bias's dtype.
  std::array<at::Tensor, 3> finish(const at::Tensor& input, const std::optional<at::Tensor>& bias);

 private:
  std::array<bool, 3> wanted_;
  at::Tensor weight_;
  at::Tensor grad_input_, grad_weight_, grad_bias_sum_;
  at::ScalarType bias_sum_dtype_;
  bool chunk_added_ = false;
};

}  // namespace fused_ops
