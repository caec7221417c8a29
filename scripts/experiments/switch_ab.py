"""A/B of an experiment switch inside one process: an experiment branch reads an environment
variable per launch (getenv in the launcher), and this script alternates its values over the same
inputs, so both settings run on the same GPU state. It reports, per case and value, the minimum over
rounds of the summed kernel times (profiler; they repeat within about 0.02 µs) or of the CUDA-graph /
event time (`scripts/bench.py`'s timing). One script for the per-session A/B scripts of
docs/benchmarks.md Changes 8-13.

    python scripts/experiments/switch_ab.py FUSED_NORM_WEIGHTS_EARLY 0 1 --ops rms_norm add_rms_norm \
        --shapes 1x8192 16x8192 [--dtypes bfloat16 float16] [--steps forward forward+backward] \
        [--timing kernels graph] [--rounds 3] [--compile]

--ops names bench.py's relu_add, norms and activations (bias_gelu_none, silu_mul, ...); a shape is rows x H
(for the gated activations H is the output width, the input is twice as wide; relu_add takes rows * H
elements).
"""
import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench  # noqa: E402  (scripts/bench.py: the ops, composites and graph timing)
from decode_kernel_times import kernel_times  # noqa: E402


def make_case(op, rows, hidden, dtype):
    """(fused function, eager composite, their inputs) for one op and shape."""
    if op == "relu_add":  # rows x H elements, y the same shape (bench.py's relu_add)
        return bench.relu_add_fused, bench.relu_add_composite, [
            torch.randn(rows * hidden, device="cuda", dtype=dtype) for _ in range(2)]
    if op in bench.NORMS:
        fused, composite, residual, bias = bench.NORMS[op]
        inputs = [torch.randn(rows, hidden, device="cuda", dtype=dtype) for _ in range(1 + residual)]
        inputs += [torch.randn(hidden, device="cuda", dtype=dtype) for _ in range(1 + bias)]
        return fused, composite, inputs
    fused, composite, gated = bench.ACTIVATIONS[op]
    if gated:
        return fused, composite, [torch.randn(rows, 2 * hidden, device="cuda", dtype=dtype)]
    return fused, composite, [torch.randn(rows, hidden, device="cuda", dtype=dtype),
                              torch.randn(hidden, device="cuda", dtype=dtype)]


def steps_of(fused, inputs):
    outputs = bench.as_outputs(fused(*inputs))
    grads = [torch.randn_like(out) for out in outputs]
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    return {
        "forward": lambda: fused(*inputs),
        "forward+backward": lambda: torch.autograd.grad(bench.as_outputs(fused(*leaves)), leaves, grads),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variable", help="the environment variable the experiment reads per launch")
    parser.add_argument("values", nargs="+", help="its settings, the first being main's behaviour")
    parser.add_argument("--ops", nargs="+", required=True, choices=["relu_add", *bench.NORMS, *bench.ACTIVATIONS])
    parser.add_argument("--shapes", nargs="+", required=True, help="rows x H, e.g. 16x8192")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16"])
    parser.add_argument("--steps", nargs="+", default=["forward", "forward+backward"],
                        choices=["forward", "forward+backward"])
    parser.add_argument("--timing", nargs="+", default=["kernels"], choices=["kernels", "graph"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile of the composite in each round (column 'compile')")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("switch_ab.py needs a CUDA device")
    import fused_ops  # noqa: F401  (registers torch.ops.fused)

    previous = os.environ.get(args.variable)
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for shape in args.shapes:
            rows, hidden = (int(n) for n in shape.split("x"))
            for op in args.ops:
                fused, composite, inputs = make_case(op, rows, hidden, dtype)
                compiled_steps = {}
                if args.compile:
                    torch._dynamo.reset()
                    compiled_steps = steps_of(torch.compile(composite), inputs)
                values = list(args.values) + (["compile"] if args.compile else [])
                for step_name, step in steps_of(fused, inputs).items():
                    if step_name not in args.steps:
                        continue
                    best = collections.defaultdict(lambda: float("inf"))
                    kernels_seen = {}
                    for _ in range(args.rounds):
                        for value in values:
                            timed = compiled_steps[step_name] if value == "compile" else step
                            if value != "compile":
                                os.environ[args.variable] = value
                            if "kernels" in args.timing:
                                kernels = kernel_times(timed)
                                best[("kernels", value)] = min(best[("kernels", value)],
                                                               sum(us for _, us in kernels.values()))
                                kernels_seen[value] = kernels
                            if "graph" in args.timing:
                                best[("graph", value)] = min(best[("graph", value)],
                                                             bench.median_time_us(timed, "cuda", rows * hidden, 30))
                    for timing in args.timing:
                        results = "  ".join(f"{value}: {best[(timing, value)]:.2f}" for value in values)
                        print(f"{op} {dtype_name} {shape} {step_name} {timing} (us) {results}", flush=True)
                    for value, kernels in kernels_seen.items():
                        for name, (count, us) in sorted(kernels.items(), key=lambda item: -item[1][1]):
                            print(f"    {value}: {us:6.2f} us x{count:g} {name[:100]}")
    if previous is None:
        os.environ.pop(args.variable, None)
    else:
        os.environ[args.variable] = previous


if __name__ == "__main__":
    main()
