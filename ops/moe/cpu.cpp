// CPU reference of the experts' row kernels: plain loops in opmath over contiguous rows, rows in parallel.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <vector>

#include "../common/dtype_dispatch.h"
#include "../common/tensors.h"
#include "moe.h"

namespace fused_ops {
namespace {

// The pairs that belong to an expert: offsets' last end (0 without experts).
int64_t paired_rows_cpu(const at::Tensor& offsets) {
  return offsets.numel() == 0 ? 0 : offsets.select(0, -1).item<int64_t>();
}

// Each expert's rows [start, end) by offsets, read on the host.
std::vector<int64_t> expert_ends_cpu(const at::Tensor& offsets) {
  const at::Tensor ends = offsets.to(at::kLong).contiguous();
  return std::vector<int64_t>(ends.const_data_ptr<int64_t>(), ends.const_data_ptr<int64_t>() + ends.numel());
}

// body(expert, row) for every row of an expert, the rows of each expert in parallel.
template <typename Body>
void for_each_expert_row(const std::vector<int64_t>& ends, Body body) {
  for (int64_t expert = 0, start = 0; expert < int64_t(ends.size()); start = ends[expert], ++expert) {
    at::parallel_for(start, ends[expert], 16, [&](int64_t begin, int64_t stop) {
      for (int64_t row = begin; row < stop; ++row) body(expert, row);
    });
  }
}

}  // namespace

void moe_add_expert_bias_cpu(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets,
                             const at::Tensor& row_scale) {
  TORCH_INTERNAL_ASSERT(rows.is_contiguous(), "moe_add_expert_bias_cpu: rows must be contiguous");
  const at::Tensor biases = bias.to(rows.scalar_type()).contiguous();
  const std::vector<int64_t> ends = expert_ends_cpu(offsets);
  const int64_t width = rows.size(1);
  FUSED_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "moe_add_expert_bias_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const at::Tensor scale = row_values_as(row_scale, c10::CppTypeToScalarType<opmath_t>::value);
    scalar_t* row_values = rows.data_ptr<scalar_t>();
    for_each_expert_row(ends, [&](int64_t expert, int64_t s) {
      const scalar_t* b = biases.const_data_ptr<scalar_t>() + expert * width;
      const opmath_t factor = scale.defined() ? scale.const_data_ptr<opmath_t>()[s] : opmath_t(1);
      scalar_t* row = row_values + s * width;
      for (int64_t c = 0; c < width; ++c) {
        row[c] = static_cast<scalar_t>(static_cast<opmath_t>(row[c]) + factor * static_cast<opmath_t>(b[c]));
      }
    });
  });
}

at::Tensor moe_expert_column_sums_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& row_scale) {
  const at::Tensor rows = values.contiguous();
  const std::vector<int64_t> ends = expert_ends_cpu(offsets);
  const int64_t width = rows.size(1), experts = offsets.numel();
  const at::ScalarType opmath_type = at::toOpMathType(rows.scalar_type());
  at::Tensor sums = at::zeros({experts, width}, rows.options().dtype(opmath_type));
  FUSED_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "moe_expert_column_sums_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const at::Tensor scale = row_values_as(row_scale, opmath_type);
    const scalar_t* in = rows.const_data_ptr<scalar_t>();
    opmath_t* out = sums.data_ptr<opmath_t>();
    at::parallel_for(0, experts, 1, [&](int64_t begin, int64_t stop) {
      for (int64_t expert = begin; expert < stop; ++expert) {
        for (int64_t s = expert == 0 ? 0 : ends[expert - 1]; s < ends[expert]; ++s) {
          const opmath_t factor = scale.defined() ? scale.const_data_ptr<opmath_t>()[s] : opmath_t(1);
          for (int64_t c = 0; c < width; ++c) out[expert * width + c] += factor * static_cast<opmath_t>(in[s * width + c]);
        }
      }
    });
  });
  return sums;
}

at::Tensor moe_expert_bias_dots_cpu(const at::Tensor& rows, const at::Tensor& bias, const at::Tensor& offsets) {
  const at::Tensor values = rows.contiguous();
  const at::Tensor biases = bias.to(values.scalar_type()).contiguous();
  const std::vector<int64_t> ends = expert_ends_cpu(offsets);
  const int64_t width = values.size(1);
  const at::ScalarType opmath_type = at::toOpMathType(values.scalar_type());
  at::Tensor dots = at::zeros({values.size(0)}, values.options().dtype(opmath_type));
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_expert_bias_dots_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* in = values.const_data_ptr<scalar_t>();
    opmath_t* out = dots.data_ptr<opmath_t>();
    for_each_expert_row(ends, [&](int64_t expert, int64_t s) {
      const scalar_t* b = biases.const_data_ptr<scalar_t>() + expert * width;
      opmath_t sum = 0;
      for (int64_t c = 0; c < width; ++c) sum += static_cast<opmath_t>(in[s * width + c]) * static_cast<opmath_t>(b[c]);
      out[s] = sum;
    });
  });
  return dots;
}

at::Tensor moe_gather_cpu(const at::Tensor& source, const at::Tensor& order, const at::Tensor& offsets, int64_t top_k) {
  const at::Tensor rows = source.contiguous();
  const at::Tensor pairs = order.contiguous();
  const int64_t count = pairs.numel(), width = rows.size(1), end = paired_rows_cpu(offsets);
  at::Tensor out = empty_contiguous({count, width}, rows.options());
  FUSED_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "moe_gather_cpu", [&] {
    const scalar_t* in = rows.const_data_ptr<scalar_t>();
    const int64_t* pair = pairs.const_data_ptr<int64_t>();
    scalar_t* result = out.data_ptr<scalar_t>();
    at::parallel_for(0, count, 16, [&](int64_t begin, int64_t stop) {
      for (int64_t s = begin; s < stop; ++s) {
        scalar_t* row = result + s * width;
        if (s >= end) {
          std::fill(row, row + width, scalar_t(0));
          continue;
        }
        const scalar_t* from = in + (pair[s] / top_k) * width;
        std::copy(from, from + width, row);
      }
    });
  });
  return out;
}

at::Tensor moe_sum_pairs_cpu(const at::Tensor& rows, const at::Tensor& position, const at::Tensor& offsets,
                             const at::Tensor& weights, int64_t top_k, int64_t tokens) {
  const at::Tensor values = rows.contiguous();
  const at::Tensor where = position.contiguous();
  const int64_t width = values.size(1), end = paired_rows_cpu(offsets);
  at::Tensor out = empty_contiguous({tokens, width}, values.options());
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_sum_pairs_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const at::Tensor scale = weights.defined() ? weights.to(c10::CppTypeToScalarType<opmath_t>::value).contiguous()
                                               : at::Tensor();
    const opmath_t* weight = scale.defined() ? scale.const_data_ptr<opmath_t>() : nullptr;
    const scalar_t* in = values.const_data_ptr<scalar_t>();
    const int64_t* pair_position = where.const_data_ptr<int64_t>();
    scalar_t* result = out.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t stop) {
      std::vector<opmath_t> sum(width);
      for (int64_t t = begin; t < stop; ++t) {
        std::fill(sum.begin(), sum.end(), opmath_t(0));
        for (int64_t j = 0; j < top_k; ++j) {
          const int64_t pair = t * top_k + j, at_row = pair_position[pair];
          if (at_row >= end) continue;
          const opmath_t factor = weight == nullptr ? opmath_t(1) : weight[pair];
          const scalar_t* row = in + at_row * width;
          for (int64_t c = 0; c < width; ++c) sum[c] += factor * static_cast<opmath_t>(row[c]);
        }
        for (int64_t c = 0; c < width; ++c) result[t * width + c] = static_cast<scalar_t>(sum[c]);
      }
    });
  });
  return out;
}

void moe_zero_rows_past_end_cpu(const at::Tensor& rows, const at::Tensor& offsets) {
  const int64_t end = std::min(paired_rows_cpu(offsets), rows.size(0));
  if (end < rows.size(0)) rows.narrow(0, end, rows.size(0) - end).zero_();
}

std::tuple<at::Tensor, at::Tensor> moe_routing_backward_cpu(const at::Tensor& h, const at::Tensor& activation,
                                                            const at::Tensor& row_weights) {
  const at::Tensor gradient = h.contiguous(), values = activation.contiguous();
  const int64_t rows = gradient.size(0), width = gradient.size(1);
  at::Tensor grad_activation = empty_contiguous({rows, width}, values.options());
  const at::ScalarType opmath_type = at::toOpMathType(values.scalar_type());
  at::Tensor dots = at::empty({rows}, values.options().dtype(opmath_type));
  const at::Tensor weights = row_weights.to(opmath_type).contiguous();
  FUSED_DISPATCH_FLOATING_TYPES(values.scalar_type(), "moe_routing_backward_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* g = gradient.const_data_ptr<scalar_t>();
    const scalar_t* a = values.const_data_ptr<scalar_t>();
    const opmath_t* w = weights.const_data_ptr<opmath_t>();
    scalar_t* out = grad_activation.data_ptr<scalar_t>();
    opmath_t* dot = dots.data_ptr<opmath_t>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t stop) {
      for (int64_t s = begin; s < stop; ++s) {
        opmath_t sum = 0;
        for (int64_t c = 0; c < width; ++c) {
          const opmath_t value = static_cast<opmath_t>(g[s * width + c]);
          sum += value * static_cast<opmath_t>(a[s * width + c]);
          out[s * width + c] = static_cast<scalar_t>(value * w[s]);
        }
        dot[s] = sum;
      }
    });
  });
  return {grad_activation, dots};
}

}  // namespace fused_ops
