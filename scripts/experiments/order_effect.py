"""Does a kernel's time depend on whether it is timed first? Fused against torch.compile of the
composite over fresh inputs, bench.py's timing, the fused op first in even trials and second in odd
ones, with the SM clock, memory clock and power that nvidia-smi reports before each timing (Change 20
item 4: our norm forwards ran 3% slower timed first; Inductor's did not move).

    python scripts/experiments/order_effect.py [--ops rms_norm layer_norm] [--shapes 4096x16384 16384x8192] [--trials 6]
"""
import argparse
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench  # noqa: E402

import fused_ops  # noqa: E402,F401


def gpu_state():
    """SM MHz, memory MHz and watts now, or '' where nvidia-smi is missing."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", default=["rms_norm", "layer_norm"], choices=list(bench.NORMS))
    parser.add_argument("--shapes", nargs="+", default=["4096x16384", "16384x8192"])
    parser.add_argument("--trials", type=int, default=6)
    args = parser.parse_args()
    for op in args.ops:
        fused, composite, residual, bias = bench.NORMS[op]
        for shape in args.shapes:
            rows, hidden = (int(n) for n in shape.split("x"))
            torch._dynamo.reset()
            compiled = torch.compile(composite)
            times = {"fused": [], "compile": []}
            for trial in range(args.trials):
                inputs = [torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(1 + residual)]
                inputs += [torch.randn(hidden, device="cuda", dtype=torch.bfloat16) for _ in range(1 + bias)]
                order = [("fused", fused), ("compile", compiled)]
                if trial % 2:
                    order.reverse()
                line = []
                for name, function in order:
                    state = gpu_state()
                    times[name].append(bench.median_time_us(lambda f=function: f(*inputs), "cuda", rows * hidden, 50))
                    line.append(f"{name} {times[name][-1]:.2f} (before: {state})")
                print(f"{op} {shape} trial {trial}: " + ", ".join(line), flush=True)
            summary = "  ".join(f"{name} min/median/max {min(t):.2f}/{statistics.median(t):.2f}/{max(t):.2f}"
                                for name, t in times.items())
            print(f"{op} {shape}: {summary}", flush=True)


if __name__ == "__main__":
    main()
