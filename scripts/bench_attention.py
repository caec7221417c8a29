"""Benchmark attention_with_sinks, forward + backward, against gpt-oss's eager attention with sinks as
transformers runs it (the materialised mask, eager and under torch.compile) in one run on one GPU (bf16).

gpt-oss-20b's layer by default: 2 x 2048 tokens, 64 query heads and 8 key/value heads of 64, the full layer
(window 0) and the sliding one (window 128). The loss weighs the output by a random tensor; gradients reach the
queries, keys, values and sinks. For each variant and window: the median time (CUDA events), the peak memory
above the inputs and gradients, the memory its autograd graph keeps for the backward, and the output's and the
gradients' distance from a float32 run of the eager attention (norm-wise, relative). Rows go to the CSV in
scripts/bench.py's format; everything to OUT/bench_attention.json.

    python scripts/bench_attention.py [--csv docs/results.csv] [--out DIR] [--batch 2] [--sequence 2048]
"""
import argparse
import json
import os
import sys

import torch

import fused_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (copy_bandwidth_gbs, median_time_us, peak_memory_mb, relative_error,  # noqa: E402
                   saved_activation_mb, write_variant_result)

VARIANTS = ["fused", "eager", "compile"]  # eager / compile: transformers' gpt-oss eager attention


class Sinks(torch.nn.Module):
    """What transformers' gpt-oss eager attention reads of its module."""

    def __init__(self, sinks, groups):
        super().__init__()
        self.sinks, self.num_key_value_groups, self.training = sinks, groups, True


def eager_mask(window, length, dtype):
    """The additive mask transformers hands the eager attention: causal, or the `window` latest keys."""
    rows = torch.arange(length, device="cuda")[:, None]
    keys = torch.arange(length, device="cuda")[None, :]
    allowed = (keys <= rows) & ((keys > rows - window) if window else True)
    return torch.zeros(length, length, device="cuda", dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--sequence", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--key-heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--windows", type=int, nargs="+", default=[0, 128])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    dtype, generator = torch.bfloat16, torch.Generator().manual_seed(0)
    shape = (args.batch, args.sequence)
    query = torch.randn(*shape, args.heads, args.head_size, generator=generator).to("cuda", dtype)
    key = torch.randn(*shape, args.key_heads, args.head_size, generator=generator).to("cuda", dtype)
    value = torch.randn(*shape, args.key_heads, args.head_size, generator=generator).to("cuda", dtype)
    sinks = torch.randn(args.heads, generator=generator).to("cuda", dtype)
    leaves = [t.requires_grad_(True) for t in (query, key, value, sinks)]
    grad = torch.randn(*shape, args.heads, args.head_size, generator=generator).to("cuda", dtype)
    scale = args.head_size ** -0.5
    groups = args.heads // args.key_heads
    copy_gbs = copy_bandwidth_gbs("cuda")
    rows, results = [], {}
    for window in args.windows:
        mask = eager_mask(window, args.sequence, dtype)

        def stock(query, key, value, sinks, mask=mask):
            return eager_attention_forward(Sinks(sinks, groups), query.transpose(1, 2), key.transpose(1, 2),
                                           value.transpose(1, 2), mask, scale)[0]

        def fused(query, key, value, sinks, window=window):
            return fused_ops.attention_with_sinks(query, key, value, sinks, scale, window)
        forwards = {"fused": fused, "eager": stock, "compile": torch.compile(stock)}

        def backward_of(forward, inputs=leaves):
            def step():
                return torch.autograd.grad(forward(*inputs), inputs, grad)
            return step
        reference_inputs = [t.detach().float().requires_grad_(True) for t in leaves]
        reference_out = stock(*reference_inputs)
        reference = torch.autograd.grad(reference_out, reference_inputs, grad.float())
        row = {"op": "attention_with_sinks", "shape": [args.batch, args.sequence, args.heads, args.key_heads,
                                                       args.head_size, window],
               "dtype": "bfloat16", "mode": "forward+backward"}
        flops = 4 * args.batch * args.heads * args.sequence * min(args.sequence, window or args.sequence) * \
            args.head_size * 3.5 / 2  # causal half; the backward does 2.5 times the forward's products
        for variant in VARIANTS:
            step = backward_of(forwards[variant])
            step()
            torch.cuda.synchronize()
            us = median_time_us(step, "cuda", query.numel(), args.repeats)
            row[f"{variant}_us"], row[f"{variant}_gbs"] = us, 0.0
            row[f"{variant}_peak_mb"] = peak_memory_mb(step)
            saved = saved_activation_mb(lambda: forwards[variant](*leaves), leaves)
            with torch.no_grad():
                out = forwards[variant](*leaves)
            gradients = step()
            results[f"{variant}_window{window}"] = {
                "ms": us / 1e3, "tflops": flops / us / 1e6, "peak_mb": row[f"{variant}_peak_mb"], "saved_mb": saved,
                "output_error_vs_float32": relative_error(out, reference_out),
                "gradient_errors_vs_float32": [relative_error(g, r) for g, r in zip(gradients, reference)]}
            print(variant, window, json.dumps(results[f"{variant}_window{window}"]), flush=True)
        rows.append(row)
    summary = {f"window{w}": {"speedup_vs_eager": results[f"eager_window{w}"]["ms"] / results[f"fused_window{w}"]["ms"],
                              "speedup_vs_compile": results[f"compile_window{w}"]["ms"] /
                              results[f"fused_window{w}"]["ms"]} for w in args.windows}
    write_variant_result("bench_attention", rows, results, summary, copy_gbs, args.out, args.csv)


if __name__ == "__main__":
    main()
