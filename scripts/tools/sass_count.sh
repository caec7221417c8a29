#!/usr/bin/env bash
# SASS instructions (and MUFU ops) per kernel of a compiled object, demangled. Needs cuobjdump and
# nvdisasm; where the CUDA toolkit lacks them, they come as wheels:
#   python3 -m pip download --no-deps -d /tmp/cudatools nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
#   (cd /tmp/cudatools && for w in *.whl; do unzip -o -q "$w"; done)
#   PATH=$PATH:/tmp/cudatools/nvidia/cu13/bin scripts/tools/sass_count.sh \
#     build/<dir>/CMakeFiles/fused_ops.dir/ops/activations/cuda_bias_gelu.cu.o
# Static counts: both sides of a branch are counted, loops once.
set -euo pipefail
cuobjdump -sass "${1:?usage: sass_count.sh OBJECT}" | awk '
  /Function :/ { name = $3; next }
  /^ +\/\*[0-9a-f]+\*\// && !/NOP|BRA 0x/ { count[name]++; if ($2 ~ /MUFU/) mufu[name]++ }
  END { for (n in count) printf "%d %d %s\n", count[n], mufu[n] + 0, n }' |
  while read -r instructions mufu name; do
    printf "%6d instructions %4d MUFU  %s\n" "$instructions" "$mufu" "$(echo "$name" | c++filt | cut -c1-160)"
  done
