// attention_with_sinks on the GPU through torch's flash kernels: the sink rescales the output by
// sigmoid(lse - sink), and the backward is flash's own at grad_output * s with the output in the place of the
// attention output (attention.h). Heads and dtypes the flash kernels do not take run the reference.
//
// The flash kernels run on the values less their mean over the sequence. The op does not depend on that shift
// (a query's weights over its keys sum to s, the sink's value row is zero), but flash rounds its output to the
// input dtype, and the backward's row sums <dO, O> cancel against the kernel's own P V: a common part of the
// values (a value bias) in that rounding would reach dq many times larger than eager attention's error.
#include <ATen/Context.h>
#include <c10/cuda/CUDAGuard.h>

#include "../common/cuda_attributes.h"
#include "attention.h"

namespace fused_ops {
namespace {

// torch's flash kernels, forward and backward: half types on Ampere and Hopper, heads a multiple of 8 up to 256
// (192 on Ampere but the A100, where the backward's tiles do not fit the shared memory), unless SDPA's flash
// backend is switched off (`torch.backends.cuda.enable_flash_sdp(False)`).
bool takes_flash(const at::Tensor& query, const at::Tensor& key) {
  const int64_t head_size = query.size(-1);
  const bool half = query.scalar_type() == at::kHalf || query.scalar_type() == at::kBFloat16;
  if (!half || head_size % 8 != 0 || query.size(2) % key.size(2) != 0 || !at::globalContext().userEnabledFlashSDP()) {
    return false;
  }
  const int device = query.device().index();
  const int major = cuda::compute_capability_major(device);
  const int64_t largest_head = cuda::compute_capability_minor(device) == 0 ? 256 : 192;
  return (major == 8 || major == 9) && head_size <= largest_head;
}

// flash's window: keys from `window - 1` before each query to the query itself; -1 leaves that side open.
std::optional<int64_t> left_window(const AttentionWithSinksOptions& options) {
  return options.window > 0 ? std::optional<int64_t>(options.window - 1) : std::optional<int64_t>(-1);
}

at::Tensor last_dim_contiguous(const at::Tensor& tensor) {
  return tensor.stride(-1) == 1 ? tensor : tensor.contiguous();
}

// The values less their mean over the sequence, and that mean [B, 1, Hkv, D] in float32.
struct CenteredValues {
  at::Tensor values;
  at::Tensor mean;
};

CenteredValues center_values(const at::Tensor& value) {
  const at::Tensor opmath = value.to(at::kFloat);
  const at::Tensor mean = opmath.mean(1, /*keepdim=*/true);
  return {(opmath - mean).to(value.scalar_type()), mean};
}

// The mean of each query head's key-value head, [B, 1, Hq, D] (flash's grouping: consecutive query heads).
at::Tensor mean_per_query_head(const at::Tensor& mean, int64_t query_heads) {
  return mean.repeat_interleave(query_heads / mean.size(2), 2);
}

// flash over the centred values: their attention [B, S, Hq, D] and the log-sum-exp [B, Hq, S] in float32.
std::tuple<at::Tensor, at::Tensor> flash_forward(const at::Tensor& query, const at::Tensor& key,
                                                 const at::Tensor& centered_values,
                                                 const AttentionWithSinksOptions& options) {
  const int64_t length = query.size(1);
  auto flash = at::_flash_attention_forward(last_dim_contiguous(query), last_dim_contiguous(key),
                                            last_dim_contiguous(centered_values), std::nullopt, std::nullopt, length,
                                            length, 0.0, /*is_causal=*/true, /*return_debug_mask=*/false,
                                            options.scale, left_window(options), std::optional<int64_t>(0));
  return {std::get<0>(flash), std::get<1>(flash)};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_with_sinks_cuda(const at::Tensor& query, const at::Tensor& key,
                                                             const at::Tensor& value, const at::Tensor& sinks,
                                                             const AttentionWithSinksOptions& options) {
  if (!takes_flash(query, key)) return attention_with_sinks_reference(query, key, value, sinks, options);
  const c10::cuda::CUDAGuard guard(query.device());
  const CenteredValues centered = center_values(value);
  auto [attended, log_sum_exp] = flash_forward(query, key, centered.values, options);
  const at::Tensor mean = mean_per_query_head(centered.mean, query.size(2));
  const at::Tensor output = sink_factor(log_sum_exp, sinks) * (attended.to(at::kFloat) + mean);
  return {output.to(query.scalar_type()).contiguous(), log_sum_exp};
}

AttentionGradients attention_with_sinks_backward_cuda(const at::Tensor& grad_output, const at::Tensor& query,
                                                      const at::Tensor& key, const at::Tensor& value,
                                                      const at::Tensor& sinks, const at::Tensor& output,
                                                      const at::Tensor& log_sum_exp,
                                                      const AttentionWithSinksOptions& options) {
  if (!takes_flash(query, key)) {
    return attention_with_sinks_backward_reference(grad_output, query, key, value, sinks, output, log_sum_exp,
                                                   options);
  }
  const c10::cuda::CUDAGuard guard(query.device());
  const int64_t length = query.size(1);
  const at::Tensor factor = sink_factor(log_sum_exp, sinks);  // [B, S, Hq, 1] float32
  // flash's output over the centred values again (a forward's work, not an [S, S] tensor): the output less the
  // mean, s * attended - (1 - s) * mean, rounded once, stands in flash's backward for its attention output.
  const CenteredValues centered = center_values(value);
  const at::Tensor attended = std::get<0>(flash_forward(query, key, centered.values, options));
  const at::Tensor mean = mean_per_query_head(centered.mean, query.size(2));
  const at::Tensor centered_output =
      (factor * attended.to(at::kFloat) - (1 - factor) * mean).to(query.scalar_type());
  const at::Tensor scaled_grad = (grad_output.to(at::kFloat) * factor).to(query.scalar_type());
  const at::Tensor no_rng = at::empty({2}, query.options().dtype(at::kLong));
  const at::Tensor unused = at::empty({}, query.options().dtype(at::kLong));
  const at::Tensor no_offsets;
  auto [grad_query, grad_key, grad_value] = at::_flash_attention_backward(
      scaled_grad.contiguous(), last_dim_contiguous(query), last_dim_contiguous(key),
      last_dim_contiguous(centered.values), centered_output.contiguous(), log_sum_exp, no_offsets, no_offsets,
      length, length, 0.0, /*is_causal=*/true, no_rng, unused, options.scale, left_window(options),
      std::optional<int64_t>(0));
  return {grad_query, grad_key, grad_value, sink_gradient(grad_output, output, factor, sinks)};
}

}  // namespace fused_ops
