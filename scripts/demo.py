"""relu_add in eager, TorchScript, torch.compile and torch.export, each checked against the eager PyTorch
composite it replaces, then timed against that composite and torch.compile of it on this device. Warnings
raised while it runs are collected and printed once after the tables, not inside them."""
import warnings

import torch

import fused_ops
from bench import median_time_us, relu_add_composite, relu_add_fused


class ResidualBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.relu_add = fused_ops.nn.ReLUAdd(bias=0.5)

    def forward(self, x, y):
        return self.relu_add(x, y)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"fused_ops {fused_ops.__version__}, torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""))
    x = torch.randn(64, 1024, device=device)
    y = torch.randn(1024, device=device)
    expected = relu_add_composite(x, y)
    model = ResidualBlock()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript is deprecated upstream from torch 2.11
        scripted = torch.jit.script(model)
    exported = torch.export.export(model, (x, y))
    modes = {
        "eager": lambda: fused_ops.relu_add(x, y, bias=0.5),
        "TorchScript": lambda: scripted(x, y),
        "torch.compile": lambda: torch.compile(model, fullgraph=True, dynamic=True)(x, y),
        "torch.export": lambda: exported.module()(x, y),
    }
    print(f"  relu_add on [64, 1024] float32 against relu(x) + y + 0.5 in plain PyTorch, on {device}:")
    for name, run in modes.items():
        out = run()
        error = (out - expected).abs().max().item()
        torch.testing.assert_close(out, expected)
        print(f"  {name:<14} the fused op gives the composite's values (max abs difference {error:.1e})")
    nodes = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    print(f"  torch.export graph: {nodes}")

    shapes = [(16, 4096), (4096, 4096), (16384, 8192)] if device == "cuda" else [(16, 4096), (1024, 4096)]
    rows = []  # timed first, printed after: what torch logs while compiling stays out of the table
    for shape in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(shape, device=device, dtype=dtype)
            b = torch.randn(shape, device=device, dtype=dtype)
            torch._dynamo.reset()
            compiled = torch.compile(relu_add_composite)
            for f in (relu_add_fused, relu_add_composite, compiled):  # compiled and warm before any timing
                for _ in range(3):
                    f(a, b)
            times = [median_time_us(lambda f=f: f(a, b), device, a.numel(), 20 if device == "cuda" else 50)
                     for f in (relu_add_fused, relu_add_composite, compiled)]
            rows.append(f"  {str(tuple(shape)):<14} {str(dtype).replace('torch.', ''):<9} "
                        + " ".join(f"{t:8.1f}" for t in times))
    print(f"\ntime per call on {device} (median, microseconds; bias=0.5): the fused op, the eager composite, "
          "and torch.compile of the composite")
    print(f"  {'shape':<14} {'dtype':<9} {'fused':>8} {'eager':>8} {'compile':>8}")
    print("\n".join(rows))
    if device == "cpu":
        print("  On a CPU these timings are indicative only: the CPU kernels are reference kernels, and a shared or\n"
              "  busy machine moves them by far more than their differences. The CUDA kernels are the product.")


if __name__ == "__main__":
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main()
    notes = sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught})
    if notes:
        print("\nwarnings raised along the way (library and torch):")
        for note in notes:
            print(f"  {note}")
