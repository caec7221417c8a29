"""Where a decode-sized call's time goes: the GPU kernels of one forward or forward+backward step,
fused op against torch.compile of the composite, with each kernel's duration (torch.profiler,
CUPTI), next to the CUDA-graph time `scripts/bench.py` reports for the same step. relu_add runs
on float32 4096, 16384 and 65536 elements (issue 2's CUDA-graph target), the others on bf16 rows
of 8192 (`--rows`; 16384 works too, timed without graphs).

The graph time minus the sum of kernel durations is what launches and gaps cost; a kernel that
takes microseconds on 8192 elements is latency-bound inside (serial reductions, few warps).

    python scripts/experiments/decode_kernel_times.py [--ops relu_add bias_gelu_tanh norms ...] [--rows 1 16]
"""
import argparse
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench  # noqa: E402  (scripts/bench.py: the same workloads and graph timing)

CALLS = 20


def kernel_times(step):
    """{kernel name: (launches per call, µs per call)} over CALLS profiled calls of step()."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(CALLS):
            step()
        torch.cuda.synchronize()
    launches = collections.Counter()
    durations = collections.Counter()
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in event.name.lower():
            launches[event.name] += 1
            durations[event.name] += event.device_time_total if hasattr(event, "device_time_total") \
                else event.cuda_time_total
    return {name: (launches[name] / CALLS, durations[name] / CALLS) for name in launches}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", default=["relu_add", *bench.ACTIVATIONS, "norms"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--variants", nargs="+", default=["fused", "compile"], choices=["fused", "compile"],
                        help="fused alone to compare two settings of the library quickly")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_kernel_times.py needs a CUDA device")
    relu_add_sizes = [1 << 12, 1 << 14, 1 << 16] if "relu_add" in args.ops else []
    relu_add_cases = list(bench.workloads("cuda", [torch.float32], relu_add_sizes, ["relu_add"]))
    row_cases = [case for case in bench.workloads("cuda", [torch.bfloat16], [], args.ops)
                 if case[0] != "relu_add" and case[1] == torch.bfloat16 and case[2][0] in args.rows]
    for op, dtype, shape, numel, make_inputs, fused, composite, *_ in relu_add_cases + row_cases:
        inputs = make_inputs()
        grads = [torch.randn(out.shape, device="cuda", dtype=dtype) for out in bench.as_outputs(fused(*inputs))]
        torch._dynamo.reset()
        for variant in args.variants:
            function = fused if variant == "fused" else torch.compile(composite)
            leaves = [t.detach().requires_grad_(True) for t in inputs]
            steps = {
                "forward": lambda f=function: f(*inputs),
                "forward+backward": lambda f=function, leaves=leaves: torch.autograd.grad(
                    bench.as_outputs(f(*leaves)), leaves, grads),
            }
            for mode, step in steps.items():
                graph_us = bench.median_time_us(step, "cuda", numel, 20)
                kernels = kernel_times(step)
                total = sum(us for _, us in kernels.values())
                print(f"{op} {'x'.join(map(str, shape))} {mode} {variant}: graph {graph_us:.1f} us, "
                      f"{sum(n for n, _ in kernels.values()):.0f} kernels, {total:.1f} us in kernels")
                for name, (count, us) in sorted(kernels.items(), key=lambda item: -item[1][1]):
                    print(f"    {us:6.2f} us  x{count:g}  {name[:110]}")


if __name__ == "__main__":
    main()
