#!/usr/bin/env bash
# Nsight Compute on one launch of a fused_ops kernel: achieved occupancy, issue-slot use, warp
# stall reasons and memory throughput, to tell an issue-bound kernel from a latency-bound one
# (e.g. bias_gelu's erf forward: 154 µs where ≈ 26 instructions per element give ≈ 103 µs of issue
# and the bytes ≈ 128 µs, docs/benchmarks.md "Change 2"). Needs the GPU machine's ncu.
#   PYTHON=python3 scripts/experiments/stall_reasons.sh OUTFILE [python statement]
# The statement runs after `import torch, fused_ops` with x [16384, 8192] and bias [8192] (bf16) and
# grad like x; default: the erf bias_gelu forward.
set -euo pipefail
OUTFILE="${1:?usage: stall_reasons.sh OUTFILE [python statement]}"
STATEMENT="${2:-torch.ops.fused.bias_gelu(x, bias, 'none')}"
source "$(dirname "${BASH_SOURCE[0]}")/../setup.sh" > /dev/null
ncu --kernel-name-base demangled --kernel-name regex:fused_ops --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section LaunchStats \
    "$PY" -c "
import torch, fused_ops
x = torch.randn(16384, 8192, device='cuda', dtype=torch.bfloat16)
bias = torch.randn(8192, device='cuda', dtype=torch.bfloat16)
grad = torch.randn_like(x)
for _ in range(5):
    $STATEMENT
torch.cuda.synchronize()
" > "$OUTFILE" 2>&1
grep -E "Duration|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|Memory Throughput|DRAM Throughput|Registers Per" "$OUTFILE" | head -n 40
