"""A short run of scripts/soak.py on the CPU: every op mixed over shapes, dtypes and options, sampled
checks against float64 and no memory growth (the GPU run, with two streams and CUDA graphs, is
`python scripts/soak.py` on a GPU machine)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_short_soak_on_the_cpu():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "soak.py"), "--device", "cpu",
                             "--calls", "1200", "--check-every", "5"], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-500:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["calls"] == 1200 and summary["checks"] == 240 and summary["wrong"] == 0
