#!/usr/bin/env bash
# The CPU test suite against a build of the library with AddressSanitizer and
# UndefinedBehaviorSanitizer (CMake option FUSED_OPS_SANITIZE, CPU kernels only). The sanitized
# package goes to build/sanitized-site and shadows the normal install through PYTHONPATH.
# Extra arguments go to pytest. Not part of scripts/test.sh (CI): it rebuilds the library.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
SITE="$ROOT/build/sanitized-site"
echo "[sanitize] building fused_ops with -fsanitize=address,undefined (log: build/sanitized.log)"
rm -rf "$SITE" "$ROOT/build/sanitized"  # a fresh configure: no cache from another build
if ! "$PY" -m pip install --no-build-isolation --no-deps --target "$SITE" \
    -C cmake.define.FUSED_OPS_SANITIZE=ON -C cmake.define.FUSED_OPS_CUDA=OFF \
    -C build-dir=build/sanitized . > build/sanitized.log 2>&1; then
  tail -n 40 build/sanitized.log; exit 1
fi
# The ASan runtime first; libstdc++ with it, so ASan's __cxa_throw interceptor finds the real one
# (Python itself does not link libstdc++, and every C++ exception would abort otherwise).
export LD_PRELOAD="$(${CXX:-g++} -print-file-name=libasan.so) $(${CXX:-g++} -print-file-name=libstdc++.so.6)"
# Python and torch keep allocations alive at exit by design: leak reports would be noise.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:print_summary=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Triton's native library aborts at import under a preloaded ASan runtime, before any fused_ops
# code runs; a stand-in package makes `import triton` fail cleanly, and torch then runs without it
# (the CPU paths of torch.compile and opcheck do not need it).
SHIMS="$ROOT/build/sanitized-shims"
mkdir -p "$SHIMS/triton"
echo 'raise ImportError("triton is disabled in the sanitized test run")' > "$SHIMS/triton/__init__.py"
export PYTHONPATH="$SITE:$SHIMS${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import fused_ops, sys; assert fused_ops.library_path().startswith('$SITE'), fused_ops.library_path(); print('[sanitize] using', fused_ops.library_path())"
# Left out: building runtime/example, whose CMake configure runs nvcc's cicc, which crashes with
# the ASan runtime preloaded into it.
exec "$PY" -m pytest tests -q -p no:cacheprovider -k "(cpu or not cuda) and not cmake_example" "$@"
