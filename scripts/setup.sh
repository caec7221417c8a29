# Sourced by scripts/demo.sh and scripts/test.sh. Sets PY to a Python with torch, installs
# what is missing, and builds + installs fused_ops when its sources changed.
#   PYTHON=/path/to/python  use that interpreter (it must already have torch) instead of .venv
#   TORCH_CUDA_ARCH_LIST     GPU targets (default: this machine's GPUs plus PTX, or "9.0+PTX" without one)
#   FUSED_OPS_CUDA=OFF       build without CUDA kernels
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_REQUIREMENT="${TORCH_REQUIREMENT:-torch==2.14.1}"

if [ -n "${PYTHON:-}" ] && "$PYTHON" -c "import torch" 2>/dev/null; then
  PY="$PYTHON"
else
  if [ ! -x "$ROOT/.venv/bin/python" ]; then
    echo "[setup] creating $ROOT/.venv"
    python3 -m venv "$ROOT/.venv"
  fi
  PY="$ROOT/.venv/bin/python"
fi

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing $TORCH_REQUIREMENT (a few minutes the first time)"
  "$PY" -m pip install -q "$TORCH_REQUIREMENT"
fi

missing=$("$PY" - <<'PYEOF'
import importlib.util, shutil
wanted = {"pytest": "pytest", "xdist": "pytest-xdist", "hypothesis": "hypothesis", "numpy": "numpy",
          "matplotlib": "matplotlib", "scikit_build_core": "scikit-build-core",
          "transformers": "transformers==5.17.0", "peft": "peft", "accelerate": "accelerate"}
missing = [pip for module, pip in wanted.items() if importlib.util.find_spec(module) is None]
if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
    missing.append("ninja")
print(" ".join(missing))
PYEOF
)
if ! command -v cmake >/dev/null 2>&1; then missing="$missing cmake"; fi
if [ -n "${missing// /}" ]; then
  echo "[setup] installing $missing"
  "$PY" -m pip install -q $missing
fi
# TRL, for the trainer tests: where it cannot be installed (a machine without a package index) they skip.
if ! "$PY" -c "import trl" 2>/dev/null; then
  echo "[setup] installing trl==1.16.0"
  "$PY" -m pip install -q "trl==1.16.0" || echo "[setup] trl could not be installed; its tests are skipped"
fi

# The build options, as pip passes them to CMake (scripts/build_wheel.sh builds with the same).
BUILD_CONFIG=()
[ -n "${FUSED_OPS_CUDA:-}" ] && BUILD_CONFIG+=(-C "cmake.define.FUSED_OPS_CUDA=$FUSED_OPS_CUDA")
[ -n "${FUSED_OPS_SANITIZE:-}" ] && BUILD_CONFIG+=(-C "cmake.define.FUSED_OPS_SANITIZE=$FUSED_OPS_SANITIZE")

# Rebuild only when the sources, the interpreter, torch or the build options changed.
source_hash=$(cd "$ROOT" && { find CMakeLists.txt pyproject.toml build_hooks ops registration python runtime \
    -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum;
  "$PY" -c "import sys, torch; print(sys.executable, torch.__version__)";
  echo "${TORCH_CUDA_ARCH_LIST:-} ${FUSED_OPS_CUDA:-} ${FUSED_OPS_SANITIZE:-}"; } | sha256sum | cut -c1-16)
stamp=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/fused_ops/.source-hash
if [ "$(cat "$stamp" 2>/dev/null)" != "$source_hash" ] || ! "$PY" -c "import fused_ops" 2>/dev/null; then
  log="$ROOT/build/install.log"
  echo "[setup] building and installing fused_ops; full log: $log (with CUDA the first build takes"
  echo "[setup] about 15 minutes on a few cores; later builds recompile only what changed)"
  mkdir -p "$ROOT/build"
  started=$SECONDS
  (cd "$ROOT" && "$PY" -m pip install --no-build-isolation --no-deps -v ${BUILD_CONFIG[@]+"${BUILD_CONFIG[@]}"} . \
      > "$log" 2>&1) &
  build_pid=$!
  # One line per stage and per compile step (ninja's [n/N]), with the seconds since the start.
  tail -n +1 -f --pid="$build_pid" "$log" 2>/dev/null | sed -u -n -E \
      -e 's#^ *Preparing metadata.*started$#configuring#p' \
      -e 's#^ *-- fused_ops: (.*)#\1#p' \
      -e 's#^ *\[([0-9]+/[0-9]+)\] Building (CXX|CUDA) object CMakeFiles/[^/]+\.dir/(.*)\.o$#[\1] compiling \3#p' \
      -e 's#^ *\[([0-9]+/[0-9]+)\] Linking .* ([^ ]+)$#[\1] linking \2#p' \
      -e 's#^ *Building wheel .*finished.*#installing#p' |
    while IFS= read -r step; do printf '[setup] %4ds  %s\n' $((SECONDS - started)) "$step"; done || true
  if ! wait "$build_pid"; then
    tail -n 60 "$log"
    echo "[setup] build failed after $((SECONDS - started)) s; full log in $log" >&2
    exit 1
  fi
  echo "[setup] built and installed in $((SECONDS - started)) s"
  echo "$source_hash" > "$stamp"
fi
"$PY" -c "import fused_ops; print('[setup] fused_ops', fused_ops.__version__, 'CUDA kernels:', fused_ops.cuda_kernels_compiled())"
