# Sourced by scripts/demo.sh and scripts/test.sh. Sets PY to a Python with torch, installs
# what is missing, and builds + installs fused_ops when its sources changed.
#   PYTHON=/path/to/python  use that interpreter (it must already have torch) instead of .venv
#   TORCH_CUDA_ARCH_LIST     GPU targets (default "9.0+PTX")
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
wanted = {"pytest": "pytest", "hypothesis": "hypothesis", "numpy": "numpy",
          "matplotlib": "matplotlib", "scikit_build_core": "scikit-build-core",
          "transformers": "transformers==5.17.0", "peft": "peft"}
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

# Rebuild only when the sources, the interpreter, torch or the build options changed.
source_hash=$(cd "$ROOT" && { find CMakeLists.txt pyproject.toml ops registration python runtime \
    -type f ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum;
  "$PY" -c "import sys, torch; print(sys.executable, torch.__version__)";
  echo "${TORCH_CUDA_ARCH_LIST:-} ${FUSED_OPS_CUDA:-} ${FUSED_OPS_SANITIZE:-}"; } | sha256sum | cut -c1-16)
stamp=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/fused_ops/.source-hash
if [ "$(cat "$stamp" 2>/dev/null)" != "$source_hash" ] || ! "$PY" -c "import fused_ops" 2>/dev/null; then
  echo "[setup] building and installing fused_ops (log: $ROOT/build/install.log)"
  mkdir -p "$ROOT/build"
  config=()
  [ -n "${FUSED_OPS_CUDA:-}" ] && config+=(-C "cmake.define.FUSED_OPS_CUDA=$FUSED_OPS_CUDA")
  [ -n "${FUSED_OPS_SANITIZE:-}" ] && config+=(-C "cmake.define.FUSED_OPS_SANITIZE=$FUSED_OPS_SANITIZE")
  if ! (cd "$ROOT" && "$PY" -m pip install --no-build-isolation --no-deps -v ${config[@]+"${config[@]}"} . \
        > "$ROOT/build/install.log" 2>&1); then
    tail -n 60 "$ROOT/build/install.log"
    echo "[setup] build failed; full log in $ROOT/build/install.log" >&2
    exit 1
  fi
  echo "$source_hash" > "$stamp"
fi
"$PY" -c "import fused_ops; print('[setup] fused_ops', fused_ops.__version__, 'CUDA kernels:', fused_ops.cuda_kernels_compiled())"
