#!/usr/bin/env bash
# Set up (see scripts/setup.sh), then run relu_add in every mode and time it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec "$PY" scripts/demo.py "$@"
