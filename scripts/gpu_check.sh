#!/usr/bin/env bash
# GPU check: build against the installed torch, benchmark, run the whole test suite on CUDA, and
# run compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over the CUDA tests; logs,
# JSON and plot go to OUTDIR.
#   PYTHON=python3 scripts/gpu_check.sh OUTDIR
#   GPU_CHECK_STEPS="bench tests sanitizer" selects steps; BENCH_ARGS is passed to bench.py;
#   SANITIZER_TOOLS="memcheck racecheck initcheck synccheck" selects tools; SANITIZER_WORKERS=N
#   runs each tool's tests in N pytest-xdist workers. The tools run at once, spread round-robin over
#   the visible GPUs (SANITIZER_GPUS="0 1" chooses them; indices as nvidia-smi numbers them).
#   SANITIZER_TEST_TIMEOUT (seconds, default 400) fails a test that runs longer under a tool;
#   SANITIZER_TESTS="tests/test_rotary.py ..." runs the tools over those files only.
#   SANITIZER_RESUME=DIR runs each tool over the selected tests its logs in DIR (sanitizer_TOOL*.log of
#   earlier runs, finished or cut short) have no result for: a pass longer than one sitting goes on where
#   the last one stopped, with no shard count to guess; it runs those tests SANITIZER_CHUNK (default 300 per
#   worker) at a time, each chunk a fresh process under the tool, logs sanitizer_TOOL_resumed-N_part-K.log.
#   SANITIZER_SHARD=k/n runs the k-th of n equal parts of the sanitizer selection (logs
#   sanitizer_TOOL_k-of-n.log; every step ends with scripts/sanitizer_table.py's tool x op table of all
#   the logs in OUTDIR, sanitizer_table.md), TEST_SHARD=k/n the
#   k-th of n parts of the test suite (TEST_WORKERS pytest-xdist workers, default 8): a run longer than
#   one sitting splits into n runs.
#   The test step includes the slow tests (FUSED_OPS_SLOW=1: huge tensors, long determinism runs).
#   The soak step (not in the default steps) runs scripts/soak.py: SOAK_CALLS calls (default 10^6) over
#   SOAK_PROCESSES processes at once (default 8; SOAK_SECONDS ends them early), its JSON summary in
#   OUTDIR/soak.log. Beside the
#   sanitizer step it shares the GPU and the cores: GPU_CHECK_STEPS="soak sanitizer" starts it first
#   and waits for it at the end.
set -uo pipefail
OUTDIR="${1:?usage: scripts/gpu_check.sh OUTDIR}"
mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
STEPS="${GPU_CHECK_STEPS:-bench tests sanitizer}"
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

# First, on an idle GPU.
if step bench; then
  echo "[gpu_check] benchmark"
  "$PY" scripts/bench.py --out "$OUTDIR" ${BENCH_ARGS:-} > "$OUTDIR/bench.log" 2>&1 || status=1
  grep -v "^\[" "$OUTDIR/bench.log" | tail -n 70
fi

if step tests; then
  echo "[gpu_check] test suite"
  parallel=()
  "$PY" -c "import xdist" 2>/dev/null && parallel=(-n "${TEST_WORKERS:-8}")
  FUSED_OPS_HYPOTHESIS_EXAMPLES="${FUSED_OPS_HYPOTHESIS_EXAMPLES:-1000}" FUSED_OPS_SLOW=1 \
    FUSED_OPS_TEST_SHARD="${TEST_SHARD:-}" "$PY" -m pytest tests -q -p no:cacheprovider -rs ${parallel[@]+"${parallel[@]}"} > "$OUTDIR/tests.log" 2>&1 || status=1
  grep -E "passed|failed|SKIPPED|FAILED|Error" "$OUTDIR/tests.log" | tail -n 15
fi

if step soak; then
  echo "[gpu_check] soak: ${SOAK_CALLS:-1000000} calls over ${SOAK_PROCESSES:-8} processes"
  OMP_NUM_THREADS=1 "$PY" scripts/soak.py --calls "${SOAK_CALLS:-1000000}" --processes "${SOAK_PROCESSES:-8}" \
    --seconds "${SOAK_SECONDS:-0}" > "$OUTDIR/soak.log" 2>&1 &
  soak_job=$!
fi

if step sanitizer; then
  # The CUDA tests that run kernels in this process (subprocess, compile and deploy tests are left
  # out). No caching allocator, so an out-of-bounds access is not hidden inside a pooled block.
  selection="(cuda or side_stream) and not compile and not fresh_process and not crash and not export and not script"
  selection="$selection and not trace and not opcheck and not fused_run and not cmake"
  # The more-than-2^31-element and 20000-row determinism runs take minutes to hours under the tools:
  # their kernels run here on smaller shapes (the 64-bit offsets of every kernel; the decode kernel's
  # fallback on two rows 2^31 elements apart; the 1000-row determinism runs). CUDA graph capture cannot
  # run without the caching allocator (cudaMalloc is illegal while capturing), so graphs are covered by
  # the test step only; a failed capture also leaves the CUDA generator mid-capture, failing every later
  # test of that worker that draws random numbers.
  selection="$selection and not more_than_2_to_the_31 and not (deterministic and 20000) and not cuda_graph"
  selection="$selection and not graph"
  # SANITIZER_WORKERS pytest-xdist workers per tool (compute-sanitizer follows them): about 4 per
  # tool with two tools on 16 cores; many more workers per tool stall the tools.
  # The files whose tests are the longest under the tools (hypothesis examples, many long norm
  # rows) go first, and idle workers steal queued tests (--dist worksteal): with the default
  # scheduling a test that stalls one worker holds the tests queued behind it. -v names each
  # finished test and --durations the
  # slowest; --timeout turns a stalled test into a failure with every thread's stack.
  test_files=(tests/test_properties.py tests/test_reliability.py tests/test_norms.py)
  for file in tests/test_*.py; do
    case " ${test_files[*]} " in *" $file "*) ;; *) test_files+=("$file");; esac
  done
  # SANITIZER_TESTS="tests/test_rotary.py ..." narrows the run to some files (a kernel that changed).
  [ -n "${SANITIZER_TESTS:-}" ] && test_files=(${SANITIZER_TESTS})
  workers=()
  [ -n "${SANITIZER_WORKERS:-}" ] && "$PY" -c "import xdist" 2>/dev/null && workers=(-n "$SANITIZER_WORKERS" --dist worksteal)
  timeout=()
  "$PY" -c "import pytest_timeout" 2>/dev/null && timeout=(--timeout "${SANITIZER_TEST_TIMEOUT:-400}")
  tools="${SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}"
  visible="${CUDA_VISIBLE_DEVICES:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)}"
  gpus=(${SANITIZER_GPUS:-${visible//,/ }})
  [ ${#gpus[@]} -gt 0 ] || gpus=(0)
  shard_suffix=""
  [ -n "${SANITIZER_SHARD:-}" ] && shard_suffix="_${SANITIZER_SHARD/\//-of-}"
  tool_index=0
  tool_jobs=()
  for tool in $tools; do
    gpu="${gpus[$((tool_index % ${#gpus[@]}))]}"
    tool_index=$((tool_index + 1))
    # memcheck, racecheck and synccheck instrument only this library's kernels (racecheck flags
    # aten's own reduce kernels, and skipping them makes the runs several times faster).
    # initcheck must see every kernel: writes by uninstrumented aten kernels are not tracked, so
    # with the filter it reports their outputs as uninitialized (tens of thousands of false reports
    # on one test, none without the filter).
    filter=(--kernel-name kns=fused_ops)
    [ "$tool" = initcheck ] && filter=()
    # racecheck (CUDA 13.0) hangs when 8 host threads launch at once (test_eight_threads_call_every_op)
    # after "Internal Sanitizer Error: Detected a failure to track a kernel launch". racecheck looks
    # for shared-memory hazards inside a block, which host threads do not change, and the
    # single-threaded tests launch the same kernels.
    # racecheck also ends the whole-model tests under bfloat16 autocast (the Llama-family steps and
    # GPT-2/BERT) and the smallest 16-bit loss tests with its own "Internal Sanitizer Error: failed to
    # handle a hardware exception", in one process as in workers, whichever one family of this
    # library's kernels it instruments, so not in a kernel it checks; memcheck runs them clean, and the
    # other 16-bit loss and op tests run the same kernels under racecheck.
    tool_selection="$selection"
    [ "$tool" = racecheck ] && tool_selection="$selection and not eight_threads and not (test_fuse.py and (autocast or gpt2_and_bert)) and not (test_linear_cross_entropy.py and 2x3-16-40 and (float16 or bfloat16))"
    # initcheck does not see the writes of cuBLAS's 16-bit products (a bare float16 torch.mm over 8
    # columns and a copy of its result give 100 reports in aten's copy kernel; over 7 columns, none), so
    # it reports every kernel that reads them: the whole-model tests of tests/test_fuse.py flood it in
    # aten's copy and cat kernels until the run stalls, and the 16-bit loss tests in the loss's row
    # kernel and in cuBLAS's next product, both reading the chunk's logits. The op tests run the kernels
    # those models call, and the float32/64 loss tests the same row kernel.
    [ "$tool" = initcheck ] && tool_selection="$selection and not test_fuse.py and not (test_linear_cross_entropy.py and (bfloat16 or float16))"
    tests=("${test_files[@]}")
    chunk=${#tests[@]}
    part_suffix=""
    log="$OUTDIR/sanitizer_$tool$shard_suffix.log"
    run_shard="${SANITIZER_SHARD:-}"
    if [ -n "${SANITIZER_RESUME:-}" ]; then
      # Only the selected tests that the tool's logs in SANITIZER_RESUME have no result for.
      earlier=("$SANITIZER_RESUME"/sanitizer_"$tool"*.log)
      [ -e "${earlier[0]}" ] || earlier=()
      # One collection per distinct selection of files, tests and shard (racecheck's tests differ).
      collected="$OUTDIR/selected_$(echo "$tool_selection ${test_files[*]} ${SANITIZER_SHARD:-}" | cksum | cut -d" " -f1).txt"
      [ -s "$collected" ] || FUSED_OPS_HYPOTHESIS_EXAMPLES=50 FUSED_OPS_TEST_SHARD="${SANITIZER_SHARD:-}" "$PY" -m pytest \
        "${test_files[@]}" --collect-only -q -p no:cacheprovider -k "$tool_selection" 2>/dev/null | grep "^tests/" > "$collected" || true
      cp "$collected" "$OUTDIR/selected_$tool.txt"
      if [ ${#earlier[@]} -gt 0 ]; then
        "$PY" scripts/sanitizer_table.py "${earlier[@]}" --finished "$tool" > "$OUTDIR/finished_$tool.txt"
      else
        : > "$OUTDIR/finished_$tool.txt"
      fi
      mapfile -t tests < <(grep -vxFf "$OUTDIR/finished_$tool.txt" "$OUTDIR/selected_$tool.txt")
      echo "[gpu_check] $tool: ${#tests[@]} of $(wc -l < "$OUTDIR/selected_$tool.txt") selected tests left"
      [ ${#tests[@]} -gt 0 ] || continue
      log="$OUTDIR/sanitizer_$tool${shard_suffix}_resumed-${#earlier[@]}.log"
      part_suffix="_part-"
      run_shard=""  # the ids left are already the shard's
      # The ids go SANITIZER_CHUNK at a time (default 300 per worker), each chunk a fresh process under
      # the tool: a long run's workers grow by tens of GB of device memory under the tools until tests
      # fail for want of it, and a chunk that ends prints its failures before a later one is cut. Each
      # chunk pays its workers' start under the tool (minutes with several workers), so it is no smaller.
      chunk="${SANITIZER_CHUNK:-$((300 * ${SANITIZER_WORKERS:-1}))}"
    fi
    (
      part=0
      for ((first = 0; first < ${#tests[@]}; first += chunk)); do
        part=$((part + 1))
        part_log="${log%.log}${part_suffix:+$part_suffix$part}.log"
        CUDA_VISIBLE_DEVICES="$gpu" PYTORCH_NO_CUDA_MEMORY_CACHING=1 FUSED_OPS_HYPOTHESIS_EXAMPLES=50 \
        FUSED_OPS_TEST_SHARD="$run_shard" compute-sanitizer --tool "$tool" --error-exitcode 3 \
          ${filter[@]+"${filter[@]}"} "$PY" -m pytest "${tests[@]:first:chunk}" -v --durations=20 \
          -p no:cacheprovider ${workers[@]+"${workers[@]}"} ${timeout[@]+"${timeout[@]}"} -k "$tool_selection" \
          > "$part_log" 2>&1 || failed=1
      done
      exit ${failed:-0}
    ) &
    tool_jobs+=($!)
  done
  for job in "${tool_jobs[@]}"; do wait "$job" || status=1; done
  for log in "$OUTDIR"/sanitizer_*.log; do
    [ -e "$log" ] || continue
    echo "[gpu_check] $(basename "$log" .log): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1); $(grep -E "passed|failed" "$log" | tail -n 1)"
  done
  # The tool x op table over every log in OUTDIR and SANITIZER_RESUME (the shards and cut runs of earlier
  # calls included); a report counts against the test that was running, exact for serial runs (no
  # SANITIZER_WORKERS).
  all_logs=()
  for log in "$OUTDIR"/sanitizer_*.log; do [ -e "$log" ] && all_logs+=("$log"); done
  if [ -n "${SANITIZER_RESUME:-}" ] && [ "$(cd "$SANITIZER_RESUME" && pwd)" != "$OUTDIR" ]; then
    for log in "$SANITIZER_RESUME"/sanitizer_*.log; do [ -e "$log" ] && all_logs+=("$log"); done
  fi
  "$PY" scripts/sanitizer_table.py "${all_logs[@]}" --markdown "$OUTDIR/sanitizer_table.md" || status=1
fi
if step soak; then
  wait "$soak_job" || status=1
  echo "[gpu_check] soak: $(tail -n 1 "$OUTDIR/soak.log")"
fi
echo "[gpu_check] done, status $status"
exit $status
