"""Norm backward variants on the GPU (experiment record, see docs/benchmarks.md).

Needs a build whose norm backward reads FUSED_OPS_NORM_BACKWARD="threads,shared sums,hoisted
loads,blocks per SM" (the knob lived only in the experiment build). For each variant: checks
the gradients against float64 on a small case, then times forward+backward (CUDA events, median)
of rms_norm, add_rms_norm and add_layer_norm in bf16.

    python scripts/experiments/norm_backward_variants.py VARIANT [VARIANT ...]
"""
import os
import subprocess
import sys

SHAPES = [(16384, 8192), (4096, 16384), (4096, 4096)]

CHILD = r'''
import statistics, sys, torch, fused_ops
torch.manual_seed(0)
ops = {
    "rms_norm": (lambda x, r, w, b: (torch.ops.fused.rms_norm(x, w, 1e-6),), False),
    "add_rms_norm": (lambda x, r, w, b: torch.ops.fused.add_rms_norm(x, r, w, 1e-6), True),
    "add_layer_norm": (lambda x, r, w, b: torch.ops.fused.add_layer_norm(x, r, w, b, 1e-5), True),
}
def reference(name, x, r, w, b):
    h = x + r if name.startswith("add") else x
    if "layer" in name:
        out = torch.nn.functional.layer_norm(h, h.shape[-1:], w, b, 1e-5)
    else:
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return (out, h) if name.startswith("add") else (out,)
for name, (op, residual) in ops.items():
    tensors = [torch.randn(300, 1024, device="cuda"), torch.randn(300, 1024, device="cuda"),
               1 + 0.5 * torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")]
    leaves = [t.clone().requires_grad_(True) for t in tensors]
    outs = op(*leaves)
    grads = [torch.randn_like(o) for o in outs]
    got = torch.autograd.grad(outs, leaves, grads, allow_unused=True)
    leaves64 = [t.double().requires_grad_(True) for t in tensors]
    want = torch.autograd.grad(reference(name, *leaves64), leaves64, [g.double() for g in grads], allow_unused=True)
    for a, b in zip(got, want):
        if b is not None:
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-3)
for rows, hidden in SHAPES:
    for name, (op, residual) in ops.items():
        tensors = [torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        tensors += [torch.randn(hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        leaves = [t.requires_grad_(True) for t in tensors]
        grads = [torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        def step():
            outs = op(*leaves)
            torch.autograd.grad(outs, [l for l in leaves], grads[:len(outs)], allow_unused=True)
        for _ in range(3):
            step()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / 5)
        print(f"{name} {rows}x{hidden} {statistics.median(times):.1f}")
'''


def main():
    for variant in sys.argv[1:]:
        env = dict(os.environ, FUSED_OPS_NORM_BACKWARD=variant)
        result = subprocess.run([sys.executable, "-c", "SHAPES = " + repr(SHAPES) + "\n" + CHILD],
                                env=env, capture_output=True, text=True)
        lines = result.stdout.strip().splitlines() if result.returncode == 0 else [
            "FAILED: " + result.stderr.strip().splitlines()[-1]]
        for line in lines:
            print(f"{variant:<12} fwd+bwd us: {line}", flush=True)


if __name__ == "__main__":
    main()
