"""A short run of scripts/soak.py on the CPU: every op mixed over shapes, dtypes and options, sampled
checks against float64 and no memory growth (the GPU run, with two streams and CUDA graphs, is
`python scripts/soak.py` on a GPU machine)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_soak(*arguments):
    """Runs scripts/soak.py on the CPU; returns its JSON summary after asserting a clean exit."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "soak.py"), "--device", "cpu", *arguments],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:] + result.stdout[-500:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # test_seconds_end_the_calls_early runs the soak by default
def test_short_soak_on_the_cpu():
    summary = run_soak("--calls", "1200", "--check-every", "5")
    assert summary["calls"] == 1200 and summary["checks"] == 240 and summary["wrong"] == 0
    # the verdict's figure, the growth from call 600 to the end, is reported and within the CPU allowance
    assert summary["second_half_growth_bytes"] <= 64 * 2**20


@pytest.mark.slow
def test_soak_in_two_processes_sums_their_runs():
    summary = run_soak("--calls", "301", "--check-every", "10", "--processes", "2")
    # 151 and 150 calls, each checked at calls 0, 10, ...: 16 + 15 checks.
    assert summary["processes"] == 2 and summary["calls"] == 301 and summary["checks"] == 31
    assert summary["wrong"] == 0 and len(summary["memory_growth_bytes"]) == 2
    assert len(summary["second_half_growth_bytes"]) == 2


def test_seconds_end_the_calls_early():
    summary = run_soak("--calls", "10000000", "--check-every", "50", "--seconds", "3")
    assert 0 < summary["calls"] < 10000000 and summary["wrong"] == 0
    assert summary["checks"] == (summary["calls"] + 49) // 50
