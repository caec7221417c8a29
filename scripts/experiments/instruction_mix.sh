#!/usr/bin/env bash
# Nsight Compute instruction counts per pipe (FMA, ALU, XU = MUFU, LSU), issue-active and DRAM
# throughput of the bias_gelu forwards (erf and tanh, bf16 and fp16, 16384x8192), one launch each:
# how many instructions per element an activation kernel issues, by pipe (docs/benchmarks.md, Change 4).
#   PYTHON=python3 scripts/experiments/instruction_mix.sh OUTFILE
set +e
OUTFILE="${1:?usage: instruction_mix.sh OUTFILE}"
source "$(dirname "${BASH_SOURCE[0]}")/../setup.sh" > /dev/null; set +e
METRICS=gpu__time_duration.sum,smsp__inst_executed.sum,smsp__thread_inst_executed.sum,sm__inst_executed_pipe_xu.sum,sm__inst_executed_pipe_fma.sum,sm__inst_executed_pipe_alu.sum,sm__inst_executed_pipe_lsu.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size
for dtype in bfloat16 float16; do
  for statement in "torch.ops.fused.bias_gelu(x, bias, 'none')" "torch.ops.fused.bias_gelu(x, bias, 'tanh')"; do
    echo "=== $dtype $statement" >> $OUTFILE
    ncu --kernel-name-base demangled --kernel-name regex:fused_ops --launch-skip 3 --launch-count 1 --metrics $METRICS \
      ${PY:-python3} -c "
import torch, fused_ops
x = torch.randn(16384, 8192, device='cuda', dtype=torch.$dtype)
bias = torch.randn(8192, device='cuda', dtype=torch.$dtype)
for _ in range(5):
    $statement
torch.cuda.synchronize()
" 2>&1 | grep -v "^==PROF==" | grep -E "fused_ops|duration|inst_executed|pct|registers|grid_size|block_size" >> $OUTFILE
  done
done
