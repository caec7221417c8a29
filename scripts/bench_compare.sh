#!/usr/bin/env bash
# Times the fused ops of two builds in one run: BASE_SOURCE (another checkout of fused_ops, e.g.
# `git archive <rev> | tar -x -C DIR`) fused only, then this checkout against eager and
# torch.compile. A kernel change is measured against its baseline on the same GPU, in one run.
#   PYTHON=python3 scripts/bench_compare.sh BASE_SOURCE OUTDIR [bench.py arguments]
set -euo pipefail
BASE_SOURCE="$(cd "${1:?usage: scripts/bench_compare.sh BASE_SOURCE OUTDIR [bench args]}" && pwd)"
OUTDIR="${2:?usage: scripts/bench_compare.sh BASE_SOURCE OUTDIR [bench args]}"
shift 2
mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
export PYTHONUNBUFFERED=1
BASE_SITE="$OUTDIR/.base-site"
# Both builds at once (each uses every core; the linker and the slowest file dominate).
(cd "$BASE_SOURCE" && "${PYTHON:-python3}" -m pip install --no-build-isolation --no-deps --target "$BASE_SITE" . \
  > "$OUTDIR/base_build.log" 2>&1) &
base_build=$!
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" > "$OUTDIR/setup.log" 2>&1 || { tail -n 40 "$OUTDIR/setup.log"; exit 1; }
wait "$base_build" || { tail -n 40 "$OUTDIR/base_build.log"; exit 1; }
cd "$ROOT"
echo "[bench_compare] baseline ($BASE_SOURCE), fused only"
PYTHONPATH="$BASE_SITE" "$PY" scripts/bench.py --variants fused --fused-label before --out "$OUTDIR/base" \
  --csv "$OUTDIR/results.csv" "$@" > "$OUTDIR/base.log" 2>&1
grep -v "^\[" "$OUTDIR/base.log" | tail -n 40
echo "[bench_compare] this checkout"
"$PY" scripts/bench.py --out "$OUTDIR/new" --csv "$OUTDIR/results.csv" "$@" > "$OUTDIR/new.log" 2>&1
grep -v "^\[" "$OUTDIR/new.log" | tail -n 40
rm -rf "$BASE_SITE"
# What remains: base.log, new.log, the two bench.json, the new plot and results.csv (rows of both builds:
# the baseline's fused rows as variant 'before').
rm -f "$OUTDIR/base/bench.png" "$OUTDIR/base_build.log" "$OUTDIR/setup.log"
