#pragma once
// Reference loop for rowwise ops on the CPU (see rows.h): simple over speed.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "../common/dtype_dispatch.h"
#include "rows.h"

namespace fused_ops {

template <template <typename> class Op, int kInputs, int kOutputs, typename... Params>
void rowwise_cpu(const RowwiseProblem<kInputs, kOutputs>& problem, at::ScalarType dtype,
                 Params... params) {
  if (problem.rows == 0 || problem.columns == 0) return;
  FUSED_DISPATCH_FLOATING_TYPES(dtype, "rowwise_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Op<opmath_t> op{params...};
    const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / problem.columns);
    at::parallel_for(0, problem.rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        for (int64_t column = 0; column < problem.columns; ++column) {
          opmath_t in[kInputs];
          opmath_t out[kOutputs];
          for (int i = 0; i < kInputs; ++i) {
            const RowOperand& operand = problem.inputs[i];
            in[i] = static_cast<opmath_t>(static_cast<const scalar_t*>(operand.data)[
                row * operand.row_stride + column * operand.column_stride]);
          }
          op(in, out);
          for (int o = 0; o < kOutputs; ++o) {
            static_cast<scalar_t*>(problem.outputs[o].data)[row * problem.outputs[o].row_stride + column] =
                static_cast<scalar_t>(out[o]);
          }
        }
      }
    });
  });
}

}  // namespace fused_ops
