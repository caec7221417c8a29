#!/usr/bin/env bash
# Set up (see scripts/setup.sh), then build a wheel of fused_ops into dist/ (or the directory given):
# for the torch installed (the wheel requires exactly that torch release) and the CUDA targets of
# TORCH_CUDA_ARCH_LIST. It reuses the set-up's compiled build: under a minute once that is done.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
out="$(mkdir -p "${1:-$ROOT/dist}" && cd "${1:-$ROOT/dist}" && pwd)"
"$PY" -m pip wheel --no-build-isolation --no-deps ${BUILD_CONFIG[@]+"${BUILD_CONFIG[@]}"} -w "$out" . \
  > "$ROOT/build/wheel.log" 2>&1 || { tail -n 40 "$ROOT/build/wheel.log"; exit 1; }
ls -1 "$out"/fused_ops-*.whl
