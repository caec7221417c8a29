"""Benchmark linear_log_probs, forward + backward, against TRL's chunked head, the eager code it replaces and
torch.compile of that code, in one run on one GPU (bf16, temperature 0.6).

The eager code is `log_softmax(softcap(linear(x, w) * logit_scale).float() / T).gather(...)` and the entropy
`-(softmax * log_softmax).sum(-1)`; the loss weighs each token's log-probability and entropy by random
signed per-token weights (advantages, KL and entropy coefficients come only after the forward). Both heads
get the rows with a target, as fused_ops.token_log_probs and TRL's add_fused_lm_head hand them; TRL's is
trl.kernels.chunked_logprob.ChunkedLogProbFunction with TRL's own chunk of classes (the variant is left out
where TRL is not installed). For each shape and variant: the median time (CUDA events), the peak memory
above the inputs and the gradients, the error of both results and of the gradients against a float64
reference computed chunk by chunk on the GPU (norm-wise, relative), and each gradient's distance from
torch.compile's (with --cross-entropy also linear_cross_entropy's weight gradient's distance from
torch.compile's). For the fused op, where the time goes: the products (cuBLAS), its own kernels, the other
kernels, and the gaps between kernels (profiler). Rows go to the CSV in scripts/bench.py's format;
everything to OUT/bench_log_probs.json.

    python scripts/bench_log_probs.py [--csv docs/results.csv] [--out DIR] [--shapes 0 1 2 3] [--repeats 5]
                                      [--cross-entropy]
"""
import argparse
import importlib.util
import json
import os
import sys
import time
from datetime import date

import torch
import torch.nn.functional as F

import fused_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import append_csv, copy_bandwidth_gbs, median_time_us, peak_memory_mb, source_commit  # noqa: E402

# (N, H, V, entropy, softcap): Qwen's vocabulary at two widths, Llama 3's without the entropy, Gemma 2's
# with its final-logit softcap.
SHAPES = [(16384, 4096, 151936, True, 0.0), (4096, 2048, 151936, True, 0.0), (8192, 4096, 128256, False, 0.0),
          (8192, 2304, 256000, True, 30.0)]
TEMPERATURE = 0.6
VARIANTS = ["fused", "trl", "compile", "eager"]
TRL_CHUNK_CLASSES = 32768  # trl.trainer.utils' _CHUNKED_LOGPROB_CHUNK_SIZE


def trl_chunked_head():
    """TRL's ChunkedLogProbFunction, or None where TRL is not installed."""
    if importlib.util.find_spec("trl") is None:
        return None
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction
    return ChunkedLogProbFunction


def kept_rows(function):
    """The head over the rows with a target only, zeros elsewhere (what both libraries' model helpers do)."""
    def head(x, weight, target, return_entropy, softcap):
        kept = target != -100
        log_probs, entropy = function(x[kept], weight, target[kept], return_entropy, softcap)
        scatter = lambda values: values.new_zeros(target.shape).masked_scatter(kept, values)  # noqa: E731
        return scatter(log_probs), scatter(entropy) if return_entropy else entropy
    return head


@kept_rows
def fused(x, weight, target, return_entropy, softcap):
    return torch.ops.fused.linear_log_probs(x, weight, target, None, TEMPERATURE, -100, return_entropy, 1.0, softcap)


@kept_rows
def trl(x, weight, target, return_entropy, softcap):
    outputs = ("log_probs", "entropy") if return_entropy else ("log_probs",)
    log_probs, entropy, *_ = trl_chunked_head().apply(x, weight, None, target, TEMPERATURE, TRL_CHUNK_CLASSES,
                                                      softcap or None, 1.0, outputs)
    return log_probs, entropy if return_entropy else log_probs.new_empty(0)


def composite(x, weight, target, return_entropy, softcap):
    """What an RL trainer writes: the whole logits, capped, upcast to float32, over the temperature."""
    logits = F.linear(x, weight)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    log_p = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
    ignored = target == -100
    log_probs = log_p.gather(-1, target.masked_fill(ignored, 0).unsqueeze(-1)).squeeze(-1).masked_fill(ignored, 0)
    if not return_entropy:
        return log_probs, log_p.new_empty(0)
    entropy = -(log_p.exp() * log_p).sum(-1).masked_fill(ignored, 0)
    return log_probs, entropy


def make_inputs(rows, hidden, classes, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, hidden, device="cuda", generator=generator).to(torch.bfloat16)
    weight = (torch.randn(classes, hidden, device="cuda", generator=generator) / hidden ** 0.5 * 2).to(torch.bfloat16)
    target = torch.randint(0, classes, (rows,), device="cuda", generator=generator)
    target[::16] = -100
    token_weights = [torch.randn(rows, device="cuda", generator=generator) for _ in range(2)]
    return x, weight, target, token_weights


def training_step(function, x, weight, target, token_weights, return_entropy, softcap, keep_results=False):
    """Forward and backward with per-token weights on both results; returns the gradients (and with
    keep_results, the results too)."""
    leaves = [x.detach().requires_grad_(True), weight.detach().requires_grad_(True)]
    log_probs, entropy = function(leaves[0], leaves[1], target, return_entropy, softcap)
    outputs, grads = ([log_probs, entropy], token_weights) if return_entropy else ([log_probs], token_weights[:1])
    gradients = torch.autograd.grad(outputs, leaves, grads)
    return (gradients, log_probs.detach(), entropy.detach()) if keep_results else gradients


def float64_reference(x, weight, target, token_weights, return_entropy, softcap, chunk=1024):
    """Both results and both gradients in float64, the logits chunk by chunk on the GPU."""
    x64, weight64 = x.double(), weight.double()
    log_probs = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    entropy = torch.zeros_like(log_probs)
    grad_x = torch.empty_like(x64)
    grad_weight = torch.zeros_like(weight64)
    for start in range(0, x.shape[0], chunk):
        rows = slice(start, start + chunk)
        capped = x64[rows] @ weight64.t()
        if softcap:
            capped = softcap * torch.tanh(capped / softcap)
        log_p = torch.log_softmax(capped / TEMPERATURE, dim=-1)
        p = log_p.exp()
        t = target[rows]
        ignored = t == -100
        safe = t.masked_fill(ignored, 0)
        row_entropy = -(p * log_p).sum(-1)
        log_probs[rows] = log_p.gather(-1, safe[:, None]).squeeze(-1).masked_fill(ignored, 0)
        entropy[rows] = row_entropy.masked_fill(ignored, 0)
        g1 = token_weights[0][rows].double().masked_fill(ignored, 0)
        g2 = token_weights[1][rows].double().masked_fill(ignored, 0) if return_entropy else torch.zeros_like(g1)
        # d/dz: g1 (onehot - p) - g2 p (log p + H); then d z / d (x w^T) = (1 - (c / softcap)^2) / T.
        gradient = -(g1[:, None] + g2[:, None] * (log_p + row_entropy[:, None])) * p
        del p, log_p
        gradient.scatter_add_(1, safe[:, None], g1[:, None])
        gradient /= TEMPERATURE
        if softcap:
            gradient *= 1 - (capped / softcap) ** 2
        del capped
        grad_x[rows] = gradient @ weight64
        grad_weight.addmm_(gradient.t(), x64[rows])
        del gradient
    return log_probs, entropy, grad_x, grad_weight


def relative(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def errors(function, x, weight, target, token_weights, return_entropy, softcap, reference):
    """Largest absolute error of each result; each gradient's error relative to the float64 one (norm-wise).
    Returns the gradients too, to compare with torch.compile's."""
    (grad_x, grad_weight), log_probs, entropy = training_step(function, x, weight, target, token_weights,
                                                              return_entropy, softcap, keep_results=True)
    found = {"log_probs_abs": (log_probs.double() - reference[0]).abs().max().item()}
    if return_entropy:
        found["entropy_abs"] = (entropy.double() - reference[1]).abs().max().item()
    found["grad_input_rel"] = relative(grad_x, reference[2])
    found["grad_weight_rel"] = relative(grad_weight, reference[3])
    return found, (grad_x, grad_weight)


def cross_entropy_weight_gradient_distance(x, weight, target, softcap):
    """linear_cross_entropy's weight gradient (mean loss) against torch.compile's of the eager loss over the
    same bf16 inputs (norm-wise, relative): the accuracy of its chunked weight-gradient sum."""
    def eager(x, weight, target):
        logits = F.linear(x, weight).float()
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        return F.cross_entropy(logits, target)
    compiled = torch.compile(eager)
    gradients = []
    for loss in (lambda w: fused_ops.linear_cross_entropy(x, w, target, softcap=softcap), lambda w: compiled(x, w, target)):
        leaf = weight.detach().requires_grad_(True)
        gradients.append(torch.autograd.grad(loss(leaf), leaf)[0])
        torch.cuda.empty_cache()
    return relative(*gradients)


def time_breakdown_ms(step):
    """One fused step's GPU time by kind of kernel, and the step's wall time on the GPU (CUDA events)."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
    kinds = {"products": 0.0, "row_kernels": 0.0, "other_kernels": 0.0}
    for event in profiler.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = event.name.lower()
        microseconds = event.time_range.elapsed_us()
        if "log_probs_rows" in name or "log_probs_gradient" in name:
            kinds["row_kernels"] += microseconds / 1e3
        elif any(key in name for key in ("gemm", "nvjet", "cutlass", "xmma", "sm90", "cublas")):
            kinds["products"] += microseconds / 1e3
        elif "memcpy" not in name and "memset" not in name:
            kinds["other_kernels"] += microseconds / 1e3
    wall = start.elapsed_time(end)
    kinds["gaps"] = max(0.0, wall - sum(kinds.values()))
    kinds["wall"] = wall
    return kinds


def run(args):
    assert torch.cuda.is_available(), "bench_log_probs.py needs a GPU"
    copy_gbs = copy_bandwidth_gbs("cuda")
    variants = [v for v in VARIANTS if v != "trl" or trl_chunked_head() is not None]
    rows = []
    started = time.time()
    for index in args.shapes:
        n, hidden, classes, return_entropy, softcap = SHAPES[index]
        x, weight, target, token_weights = make_inputs(n, hidden, classes)
        torch._dynamo.reset()
        functions = {"fused": fused, "trl": trl, "eager": composite, "compile": torch.compile(composite)}
        op = ("linear_log_probs" if return_entropy else "linear_log_probs_no_entropy") + (
            f"_softcap{softcap:g}" if softcap else "")
        # Elements a fused pass must move (input and weight read, twice with the backward's recompute, and
        # both gradients written); the products' time, not these bytes, bounds it.
        elements = 3 * (n * hidden + classes * hidden)
        row = {"op": op, "dtype": "bfloat16", "shape": [n, hidden, classes], "mode": "forward+backward",
               "numel": n * classes, "bytes": elements * 2, "errors": {}, "vs_compile": {}}
        reference = float64_reference(x, weight, target, token_weights, return_entropy, softcap)
        gradients = {}
        for variant in variants:
            function = functions[variant]
            step = lambda f=function: training_step(f, x, weight, target, token_weights, return_entropy,  # noqa: E731
                                                    softcap)
            try:
                row[f"{variant}_us"] = median_time_us(step, "cuda", n * classes, args.repeats)
                row[f"{variant}_gbs"] = row["bytes"] / row[f"{variant}_us"] / 1e3
                row[f"{variant}_peak_mb"] = peak_memory_mb(step)
                if variant != "eager":  # eager's values are compile's, rounded the same way
                    row["errors"][variant], gradients[variant] = errors(function, x, weight, target, token_weights,
                                                                        return_entropy, softcap, reference)
                if variant == "fused":
                    row["fused_breakdown_ms"] = time_breakdown_ms(step)
            except torch.OutOfMemoryError as error:
                print(f"{op} {variant}: out of memory ({error})", file=sys.stderr)
            torch.cuda.empty_cache()
        if args.cross_entropy:
            row["cross_entropy_grad_weight_vs_compile"] = cross_entropy_weight_gradient_distance(x, weight, target,
                                                                                                 softcap)
            torch.cuda.empty_cache()
        if "compile" in gradients:
            for variant in ("fused", "trl"):
                if variant in gradients:
                    row["vs_compile"][variant] = {
                        name: relative(got, want)
                        for name, got, want in zip(("grad_input", "grad_weight"), gradients[variant],
                                                   gradients["compile"])}
        del reference, x, weight, gradients
        torch.cuda.empty_cache()
        rows.append(row)
        print(f"{op} {n}x{hidden}x{classes} done at {time.time() - started:.0f}s", file=sys.stderr)
        print_row(row, variants)
        sys.stdout.flush()
    return {"date": date.today().isoformat(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "copy_gbs": copy_gbs, "rows": rows, "commit": source_commit(),
            "temperature": TEMPERATURE, "variants": variants}


def print_table(result):
    print(f"\n{result['device']}, torch {result['torch']}, {result['date']}, bf16, forward + backward, "
          f"temperature {result['temperature']}")
    for row in result["rows"]:
        print_row(row, result["variants"])


def print_row(row, variants):
    """One shape's times, memory, time breakdown and errors."""
    shape = "x".join(map(str, row["shape"]))
    times = ", ".join(f"{v} {row[f'{v}_us'] / 1e3:.1f} ms" for v in variants if f"{v}_us" in row)
    peaks = ", ".join(f"{v} {row[f'{v}_peak_mb']:.0f} MB" for v in variants if f"{v}_peak_mb" in row)
    print(f"{row['op']} {shape}: {times}; peak above inputs and gradients: {peaks}")
    for peer in ("trl", "compile"):
        if "fused_us" in row and f"{peer}_us" in row:
            print(f"  fused / {peer}: time {row['fused_us'] / row[f'{peer}_us']:.3f}x, "
                  f"memory {row['fused_peak_mb'] / max(row[f'{peer}_peak_mb'], 1e-9):.3f}x")
    if "fused_breakdown_ms" in row:
        kinds = row["fused_breakdown_ms"]
        print("  fused time: " + ", ".join(f"{k} {v:.1f} ms" for k, v in kinds.items()))
    for variant, found in row["errors"].items():
        print(f"  {variant} error vs float64: " + ", ".join(f"{k} {v:.2e}" for k, v in found.items()))
    for variant, found in row["vs_compile"].items():
        print(f"  {variant} gradients vs torch.compile's: " + ", ".join(f"{k} {v:.2e}" for k, v in found.items()))
    if "cross_entropy_grad_weight_vs_compile" in row:
        print(f"  linear_cross_entropy's weight gradient vs torch.compile's: "
              f"{row['cross_entropy_grad_weight_vs_compile']:.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=int, default=list(range(len(SHAPES))),
                        help="indices into SHAPES: " + ", ".join(f"{i}: {s}" for i, s in enumerate(SHAPES)))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cross-entropy", action="store_true",
                        help="also linear_cross_entropy's weight gradient against torch.compile's at each shape")
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--csv", default=None, help="CSV to append the rows to (default OUT/results.csv)")
    args = parser.parse_args()
    result = run(args)
    print_table(result)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_log_probs.json"), "w") as file:
        json.dump(result, file, indent=1)
    csv_path = args.csv or os.path.join(args.out, "results.csv")
    append_csv(result, csv_path, "fused")
    print(f"wrote {args.out}/bench_log_probs.json, rows appended to {csv_path}")


if __name__ == "__main__":
    main()
