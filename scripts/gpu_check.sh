#!/usr/bin/env bash
# GPU check: build against the installed torch, run the whole test suite on CUDA, run
# compute-sanitizer over the CUDA tests, run the benchmark; logs, JSON and plot go to OUTDIR.
#   PYTHON=python3 scripts/gpu_check.sh OUTDIR
#   GPU_CHECK_STEPS="tests sanitizer bench" selects steps; BENCH_ARGS is passed to bench.py.
set -uo pipefail
OUTDIR="${1:?usage: scripts/gpu_check.sh OUTDIR}"
mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
STEPS="${GPU_CHECK_STEPS:-tests sanitizer bench}"
export PYTHONUNBUFFERED=1
status=0

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  date -u
} > "$OUTDIR/info.txt" 2>&1

source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" > "$OUTDIR/setup.log" 2>&1 || {
  cat "$OUTDIR/setup.log"; echo "[gpu_check] setup failed"; exit 1; }
cd "$ROOT"
"$PY" -m fused_ops >> "$OUTDIR/info.txt" 2>&1
cat "$OUTDIR/info.txt"

step() { case " $STEPS " in *" $1 "*) return 0;; *) return 1;; esac; }

if step tests; then
  echo "[gpu_check] test suite"
  "$PY" -m pytest tests -q -p no:cacheprovider -rs > "$OUTDIR/tests.log" 2>&1 || status=1
  tail -n 5 "$OUTDIR/tests.log"
fi

if step bench; then
  echo "[gpu_check] benchmark"
  "$PY" scripts/bench.py --out "$OUTDIR" ${BENCH_ARGS:-} > "$OUTDIR/bench.log" 2>&1 || status=1
  grep -v "^\[" "$OUTDIR/bench.log" | tail -n 40
fi
if step sanitizer; then
  # No caching allocator, so an out-of-bounds access is not hidden inside a pooled block.
  for tool in memcheck racecheck initcheck synccheck; do
    echo "[gpu_check] compute-sanitizer --tool $tool" | tee -a "$OUTDIR/sanitizer.log"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$PY" -m pytest tests -q -p no:cacheprovider -x -k "cuda and not compile and not fresh_process and not crash and not export and not script and not trace and not opcheck" \
      >> "$OUTDIR/sanitizer.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|passed|failed" "$OUTDIR/sanitizer.log" | tail -n 2
  done
fi

echo "[gpu_check] done, status $status"
exit $status
