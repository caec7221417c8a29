"""A whole training step of a Llama-3.2-1B-shaped model (random init, nothing downloaded), stock and
fused, eager and compiled, and Liger-Kernel's patched model when liger-kernel is importable.

Hidden 2048, intermediate 8192, 16 layers, 32 heads, 8 KV heads, vocabulary 128256, tied embeddings,
bf16 parameters, AdamW, batch 8 x 2048 tokens (--batch, --sequence), SDPA attention. Each variant runs
in its own process (Liger patches transformers' classes for the whole process), reporting step time,
tokens/s, peak memory of the step, and the first step's extra time (compilation); then the one-token
decode step of the same model (static KV cache; the step, compiled for the compiled variants, replayed
as a CUDA graph). --profile adds each variant's kernels of one step by GPU time, summed by kind.
Results: OUT/model.json, a table on stdout, OUT/model.png, rows appended to --csv.

    python scripts/bench_model.py [--variants stock_eager stock_compile fused_eager fused_compile liger]
                                  [--layers 16] [--batch 8] [--sequence 2048] [--steps 6] [--out DIR]
                                  [--profile]
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import date

VARIANTS = ["stock_eager", "stock_compile", "fused_eager", "fused_compile", "liger"]


def build_model(args, variant):
    import torch
    import transformers
    if variant == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama()
    config = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=args.layers, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=True,
        rms_norm_eps=1e-5, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    if variant.startswith("fused"):
        import fused_ops
        fused_ops.fuse(model)
    return model


KERNEL_KINDS = [("attention", r"attention|sdpa|flash|fmha"), ("matrix products", r"gemm|nvjet|cutlass|xmma|cublas"),
                ("fused_ops kernels", r"fused_ops"), ("optimizer", r"multi_tensor_apply|adam"),
                ("torch.compile's kernels", r"^triton_")]


def kernel_time_by_kind(events):
    """GPU time of one step's kernels summed by kind (the first pattern that matches a kernel's name)."""
    import re
    import torch
    totals = {}
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = next((name for name, pattern in KERNEL_KINDS if re.search(pattern, event.name, re.IGNORECASE)),
                    "other")
        totals[kind] = totals.get(kind, 0.0) + event.device_time_total / 1e3
    lines = [f"{kind:<26} {ms:9.1f} ms" for kind, ms in sorted(totals.items(), key=lambda item: -item[1])]
    return "GPU time by kind of kernel\n" + "\n".join(lines + [f"{'all':<26} {sum(totals.values()):9.1f} ms"])


def train(args, variant):
    import torch
    model = build_model(args, variant)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    forward = torch.compile(model) if variant.endswith("compile") else model
    ids = torch.randint(0, 128256, (args.batch, args.sequence), device="cuda")

    def step():
        loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def timed_step():
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        return time.perf_counter() - start, loss

    first_step_s = None  # the very first step: compilation included
    if args.profile:  # one step under torch.profiler after two warm-up steps: where the time goes
        from torch.profiler import ProfilerActivity, profile
        first_step_s, _ = timed_step()
        timed_step()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            step()
            torch.cuda.synchronize()
        table = profiler.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
        with open(os.path.join(args.out, f"profile_{variant}.txt"), "w") as file:
            file.write(kernel_time_by_kind(profiler.events()) + "\n\n" + table)
    times = []
    for index in range(args.steps + 2):
        if index == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds, loss = timed_step()
        times.append(seconds)
    step_s = statistics.median(times[2:])
    first_step_s = times[0] if first_step_s is None else first_step_s
    return {"variant": variant, "step_ms": 1e3 * step_s, "tokens_per_s": args.batch * args.sequence / step_s,
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30, "first_step_extra_s": first_step_s - step_s,
            "loss": loss.item()}


def decode(args, variant):
    """One token into a static KV cache of 1024 positions after a 512-token prompt, replayed as a CUDA
    graph of the step, eager or compiled as the variant is (timed without a graph where the step
    cannot be captured)."""
    import torch
    import transformers
    model = build_model(args, variant).eval()
    step_model = torch.compile(model) if variant.endswith("compile") else model
    cache = transformers.StaticCache(config=model.config, max_cache_len=1024)
    prompt = torch.randint(0, 128256, (1, 512), device="cuda")
    token = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    position = torch.tensor([512], device="cuda")
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)

        def one_token():
            return step_model(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True).logits

        mode = "cuda_graph"
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    one_token()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                one_token()
            run = graph.replay
        except Exception:  # noqa: BLE001 - a step that cannot be captured is timed eagerly
            mode, run = "eager", one_token
        times = []
        for index in range(60):
            position.fill_(513 + index)
            torch.cuda.synchronize()
            start = time.perf_counter()
            run()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return {"decode_ms": 1e3 * statistics.median(times[10:]), "decode_mode": mode}


def child(args):
    result = train(args, args.child)
    import torch
    torch.cuda.empty_cache()
    try:
        result.update(decode(args, args.child))
    except Exception as error:  # noqa: BLE001 - reported in the table instead of the figure
        result["decode_error"] = f"{type(error).__name__}: {error}"[:300]
    print("RESULT " + json.dumps(result))


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in results if "tokens_per_s" in r]
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    names = [r["variant"] for r in rows]
    axes[0].barh(names, [r["tokens_per_s"] / 1e3 for r in rows])
    axes[0].set_xlabel("thousand tokens/s (higher is better)")
    axes[1].barh(names, [r["peak_gb"] for r in rows])
    axes[1].set_xlabel("peak memory of the step, GB (lower is better)")
    for axis in axes:
        axis.invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=70)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sequence", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--csv", default=None, help="CSV to append rows to (default OUT/model_results.csv)")
    parser.add_argument("--profile", action="store_true",
                        help="also write OUT/profile_VARIANT.txt: the kernels of one step by GPU time")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    import torch
    results = []
    for variant in args.variants:
        if variant == "liger":
            try:
                import liger_kernel  # noqa: F401
            except ImportError:
                print("liger-kernel is not importable: its row is left out")
                continue
        os.makedirs(args.out, exist_ok=True)
        command = [sys.executable, __file__, "--child", variant] + [
            f"--{name}={getattr(args, name)}" for name in ("layers", "batch", "sequence", "steps", "out")] + (
            ["--profile"] if args.profile else [])
        run = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        if run.returncode != 0 or not lines:
            results.append({"variant": variant, "error": (run.stderr or run.stdout)[-600:]})
        else:
            results.append(json.loads(lines[-1][len("RESULT "):]))
        print(json.dumps(results[-1]), flush=True)
    stock = {r["variant"]: r for r in results if "tokens_per_s" in r}
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.batch} x {args.sequence} tokens, "
          f"{args.layers} layers, bf16, AdamW")
    print(f"{'variant':<15} {'step ms':>8} {'tokens/s':>9} {'vs stock':>8} {'peak GB':>8} {'compile s':>9} {'decode ms':>9}")
    for r in results:
        if "tokens_per_s" not in r:
            print(f"{r['variant']:<15} failed: {r.get('error', '')[-300:]}")
            continue
        base = stock.get("stock_compile" if r["variant"].endswith("compile") else "stock_eager")
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        print(f"{r['variant']:<15} {r['step_ms']:8.1f} {r['tokens_per_s']:9.0f} {ratio:8.2f} {r['peak_gb']:8.1f} "
              f"{r['first_step_extra_s']:9.1f} {r.get('decode_ms', float('nan')):9.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "model.json"), "w") as file:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date.today().isoformat(),
                   "batch": args.batch, "sequence": args.sequence, "layers": args.layers, "results": results},
                  file, indent=1)
    plot(results, os.path.join(args.out, "model.png"))
    path = args.csv or os.path.join(args.out, "model_results.csv")
    new_file = not os.path.exists(path)
    with open(path, "a", newline="") as file:
        writer = csv.writer(file)
        if new_file:
            writer.writerow(["variant", "batch", "sequence", "layers", "step_ms", "tokens_per_s", "peak_gb",
                             "first_step_extra_s", "decode_ms", "gpu", "torch", "date"])
        for r in results:
            if "tokens_per_s" in r:
                writer.writerow([r["variant"], args.batch, args.sequence, args.layers, f"{r['step_ms']:.1f}",
                                 f"{r['tokens_per_s']:.0f}", f"{r['peak_gb']:.2f}", f"{r['first_step_extra_s']:.1f}",
                                 f"{r['decode_ms']:.3f}" if "decode_ms" in r else "", torch.cuda.get_device_name(),
                                 torch.__version__, date.today().isoformat()])


if __name__ == "__main__":
    main()
