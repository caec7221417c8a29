"""A/B in one process: relu_add's forward + backward saving x (the autograd of before the mask ops:
relu_add, then relu_add_backward(grad, x)) against saving one bit per element (relu_add_with_mask,
then relu_add_backward_masked; what fused::relu_add's autograd does now), with torch.compile of the
eager composite in the same rounds. Times are scripts/bench.py's (CUDA graphs up to its graph size,
events above), minimum over rounds.

    python scripts/experiments/relu_add_mask_ab.py [--log2-sizes 12 16 20 24 26 28] [--rounds 3]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench  # noqa: E402

import fused_ops  # noqa: E402,F401


class SavesX(torch.autograd.Function):
    """relu_add's autograd as it was: x saved, relu_add_backward(grad, x)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x)
        return torch.ops.fused.relu_add(x, y, 0.0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.ops.fused.relu_add_backward(grad, x), grad


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2-sizes", nargs="+", type=int, default=[12, 16, 20, 24, 26, 28])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    compiled = torch.compile(bench.relu_add_composite)
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for log2 in args.log2_sizes:
            numel = 1 << log2
            x, y = (torch.randn(numel, device="cuda", dtype=dtype) for _ in range(2))
            grad = torch.randn(numel, device="cuda", dtype=dtype)
            leaves = [t.detach().requires_grad_(True) for t in (x, y)]
            cases = {
                "forward relu_add": lambda: torch.ops.fused.relu_add(x, y, 0.0),
                "forward relu_add_with_mask": lambda: torch.ops.fused.relu_add_with_mask(x, y, 0.0),
                "forward torch.compile": lambda: compiled(x, y),
                "fwd+bwd saving x": lambda: torch.autograd.grad(SavesX.apply(*leaves), leaves, grad),
                "fwd+bwd saving bits": lambda: torch.autograd.grad(
                    torch.ops.fused.relu_add(*leaves, 0.0), leaves, grad),
                "fwd+bwd torch.compile": lambda: torch.autograd.grad(compiled(*leaves), leaves, grad),
            }
            best = {name: float("inf") for name in cases}
            repeats = 50 if numel <= bench.GRAPH_MAX_ELEMENTS else 20
            for _ in range(args.rounds):
                for name, run in cases.items():
                    best[name] = min(best[name], bench.median_time_us(run, "cuda", numel, repeats))
            print(f"relu_add {dtype_name} 2^{log2} (us) " + "  ".join(f"{name}: {t:.2f}" for name, t in best.items()),
                  flush=True)


if __name__ == "__main__":
    main()
