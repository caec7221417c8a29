"""relu_add in eager, TorchScript, torch.compile and torch.export, each checked against the eager
composite, then timed against the eager composite and torch.compile of it on this device."""
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
    for name, run in modes.items():
        out = run()
        error = (out - expected).abs().max().item()
        torch.testing.assert_close(out, expected)
        print(f"  {name:<14} matches eager (max abs difference {error:.1e})")
    nodes = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    print(f"  torch.export graph: {nodes}")

    print(f"\ntime per call on {device} (median, microseconds; bias=0.5, float32 and bfloat16):")
    print(f"  {'shape':<14} {'dtype':<9} {'fused':>8} {'eager':>8} {'compile':>8}")
    shapes = [(16, 4096), (4096, 4096), (16384, 8192)] if device == "cuda" else [(16, 4096), (1024, 4096)]
    for shape in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.randn(shape, device=device, dtype=dtype)
            b = torch.randn(shape, device=device, dtype=dtype)
            torch._dynamo.reset()
            compiled = torch.compile(relu_add_composite)
            times = [median_time_us(lambda f=f: f(a, b), device, a.numel(), 20)
                     for f in (relu_add_fused, relu_add_composite, compiled)]
            print(f"  {str(tuple(shape)):<14} {str(dtype).replace('torch.', ''):<9} "
                  + " ".join(f"{t:8.1f}" for t in times))


if __name__ == "__main__":
    main()
