#!/usr/bin/env bash
# Set up (see scripts/setup.sh) and run the whole test suite in FUSED_OPS_TEST_WORKERS processes
# (default 2; 0 runs it in this one). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec "$PY" -m pytest tests -q -p no:cacheprovider -n "${FUSED_OPS_TEST_WORKERS:-2}" "$@"
