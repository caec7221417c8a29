"""Benchmark the experts' ops (moe_permute + moe_expert_mlp + moe_unpermute), forward + backward, against
transformers' grouped_mm experts implementation (eager and under torch.compile) and Liger-Kernel's fused MoE
(`LigerFusedMoEFunction`, what its LigerExperts runs; left out where liger-kernel is not importable) in one
run on one GPU (bf16); the experts ops both recomputing the gate/up product in the backward (the default) and
keeping it (`recompute=False`, variant fused_kept_gate_up).

A layer of Qwen3-30B-A3B by default: 8192 tokens, top-8 of 128 experts, H 2048, I 768, SiLU gate, router
weights from a softmax over random logits. The loss weighs the output by a random tensor; gradients reach the
hidden states, the routing weights and both weight tensors. For each variant: the median time (CUDA events),
the peak memory above the inputs and the gradients, the activation memory its autograd graph keeps for the
backward (saved tensors other than the inputs and weights, each storage once), and the output's and the
gradients' distance from the grouped_mm path (norm-wise, relative). Rows go to the CSV in scripts/bench.py's
format; everything to OUT/bench_moe.json.

    python scripts/bench_moe.py [--csv docs/results.csv] [--out DIR] [--tokens 8192] [--repeats 10]
"""
import argparse
import importlib.util
import json
import os
import sys

import torch

import fused_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import (copy_bandwidth_gbs, median_time_us, peak_memory_mb, relative_error,  # noqa: E402
                   saved_activation_mb, write_variant_result)

# eager / compile: transformers' grouped_mm implementation; fused_kept_gate_up: recompute=False.
VARIANTS = ["fused", "fused_kept_gate_up", "eager", "compile", "liger"]


class Experts(torch.nn.Module):
    """The attributes transformers' experts implementations read (a Qwen3-MoE experts module's)."""

    def __init__(self, experts, hidden, intermediate, dtype, generator):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(
            (torch.randn(experts, 2 * intermediate, hidden, generator=generator) / hidden ** 0.5).to("cuda", dtype))
        self.down_proj = torch.nn.Parameter(
            (torch.randn(experts, hidden, intermediate, generator=generator) / intermediate ** 0.5).to("cuda", dtype))
        self.num_experts, self.act_fn = experts, torch.nn.SiLU()
        self.has_gate, self.has_bias, self.is_transposed, self.is_concatenated = True, False, False, True

    def _apply_gate(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    from transformers.integrations.moe import grouped_mm_experts_forward

    dtype, generator = torch.bfloat16, torch.Generator().manual_seed(0)
    module = Experts(args.experts, args.hidden, args.intermediate, dtype, generator)
    x = torch.randn(args.tokens, args.hidden, generator=generator).to("cuda", dtype).requires_grad_(True)
    logits = torch.randn(args.tokens, args.experts, generator=generator).to("cuda")
    top_values, index = torch.topk(logits.softmax(-1), args.top_k, dim=-1)
    weights = (top_values / top_values.sum(-1, keepdim=True)).to(dtype).requires_grad_(True)
    grad = torch.randn(args.tokens, args.hidden, generator=generator).to("cuda", dtype)
    leaves = [x, weights, module.gate_up_proj, module.down_proj]

    def stock(x, index, weights):
        return grouped_mm_experts_forward(module, x, index, weights)

    def fused(x, index, weights):
        return fused_ops.moe_experts(x, index, weights, module.gate_up_proj, module.down_proj)

    def fused_kept_gate_up(x, index, weights):
        return fused_ops.moe_experts(x, index, weights, module.gate_up_proj, module.down_proj, recompute=False)
    forwards = {"fused": fused, "fused_kept_gate_up": fused_kept_gate_up, "eager": stock,
                "compile": torch.compile(stock)}
    if importlib.util.find_spec("liger_kernel") is not None:
        from liger_kernel.ops import LigerFusedMoEFunction

        def liger(x, index, weights):
            return LigerFusedMoEFunction.apply(x, module.gate_up_proj, module.down_proj, index.to(torch.int32), weights)
        forwards["liger"] = liger

    def backward_of(forward):
        def step():
            out = forward(x, index, weights)
            return torch.autograd.grad(out, leaves, grad)
        return step

    reference = backward_of(stock)()
    reference_out = stock(x, index, weights).detach()
    copy_gbs = copy_bandwidth_gbs("cuda")
    pairs = args.tokens * args.top_k
    flops = 6 * pairs * args.hidden * 3 * args.intermediate  # three products forward, twice that backward
    row = {"op": "moe_experts", "shape": [args.tokens, args.hidden, args.intermediate, args.experts, args.top_k],
           "dtype": "bfloat16", "mode": "forward+backward"}
    results = {}
    for variant in [v for v in VARIANTS if v in forwards]:
        step = backward_of(forwards[variant])
        step()
        torch.cuda.synchronize()
        us = median_time_us(step, "cuda", pairs * args.hidden, args.repeats)
        row[f"{variant}_us"] = us
        row[f"{variant}_gbs"] = 0.0
        row[f"{variant}_peak_mb"] = peak_memory_mb(step)
        saved = saved_activation_mb(lambda: forwards[variant](x, index, weights), leaves)
        with torch.no_grad():
            out = forwards[variant](x, index, weights)
        gradients = step()
        results[variant] = {
            "ms": us / 1e3, "tflops": flops / us / 1e6, "peak_mb": row[f"{variant}_peak_mb"], "saved_mb": saved,
            "output_error_vs_grouped_mm": relative_error(out, reference_out),
            "gradient_errors_vs_grouped_mm": [relative_error(g, r) for g, r in zip(gradients, reference)]}
        print(variant, json.dumps(results[variant]), flush=True)
    base = results["eager"]
    summary = {"speedup_vs_grouped_mm": base["ms"] / results["fused"]["ms"],
               **({"speedup_vs_liger": results["liger"]["ms"] / results["fused"]["ms"]} if "liger" in results else {}),
               "speedup_vs_compiled_grouped_mm": results["compile"]["ms"] / results["fused"]["ms"],
               "kept_gate_up_speedup_vs_compiled_grouped_mm":
                   results["compile"]["ms"] / results["fused_kept_gate_up"]["ms"],
               "kept_gate_up_saved_vs_grouped_mm": results["fused_kept_gate_up"]["saved_mb"] / max(base["saved_mb"], 1e-9),
               "saved_vs_grouped_mm": results["fused"]["saved_mb"] / max(base["saved_mb"], 1e-9),
               "peak_vs_grouped_mm": results["fused"]["peak_mb"] / max(base["peak_mb"], 1e-9)}
    write_variant_result("bench_moe", [row], results, summary, copy_gbs, args.out, args.csv)


if __name__ == "__main__":
    main()
