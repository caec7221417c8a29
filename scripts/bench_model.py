"""A whole training step of a model shaped like a public checkpoint (random init, nothing downloaded),
stock and fused, eager and compiled, beside Liger-Kernel's patched model where liger-kernel is importable.

Families (--family, or several with --families / --family all), each with the checkpoint's per-layer
shapes and its own extras written out below, and fewer layers than the checkpoint (--layers overrides):

    llama3.2-1b     LlamaForCausalLM      4 of 16 layers   (default)
    qwen3-1.7b      Qwen3ForCausalLM      4 of 28 layers
    gemma3-1b       Gemma3ForCausalLM     6 of 26 layers   (five sliding-window layers and one global, as the checkpoint repeats them)
    phi3-mini       Phi3ForCausalLM       4 of 32 layers   (Phi-3-mini-4k)
    qwen3-30b-a3b   Qwen3MoeForCausalLM   4 of 48 layers   (128 experts, 8 a token, no router loss)
    gpt-oss-20b     GptOssForCausalLM     4 of 24 layers   (32 experts, 4 a token, the clamped SwiGLU)

bf16 parameters, AdamW (--optimizer: foreach, or fused as transformers' Trainer picks by default on
torch >= 2.8), batch 8 x 2048 tokens (--batch, --sequence), SDPA attention. Variants:
stock_eager, stock_compile, fused_eager, fused_compile (fused_ops.fuse), liger_eager, liger_compile
(Liger-Kernel's apply_liger_kernel_to_<family>() with its defaults, applied before the model is built).
Each variant runs in its own process (Liger patches transformers' classes for the whole process); one that
fails reports its error and the others still run. Reported: step time (median of --steps after two
warm-up steps), tokens/s, peak memory of the step, the first step's extra time (compilation), how long
fuse() took (fused variants, in the JSON and OUT/fuse_FAMILY.txt), and each
variant's tokens/s and peak memory relative to its family's stock_compile and to the faster Liger variant.
--decode adds the one-token decode step (static KV cache; the step, compiled for the compiled variants,
replayed as a CUDA graph); it is on by default for llama3.2-1b only. --profile adds each variant's
kernels of one step by GPU time, summed by kind. --smoke runs a tiny config of each family on the CPU
(its default layers, eager variants, two steps; Liger's model is only patched and built, its kernels need a GPU).
Results: OUT/model.json, a table on stdout and in OUT/model.md, OUT/model.png, rows appended to --csv as each variant finishes.

    python scripts/bench_model.py [--family llama3.2-1b | --families qwen3-1.7b gemma3-1b | --family all]
                                  [--variants ...] [--layers N] [--batch 8] [--sequence 2048] [--steps 6]
                                  [--decode | --no-decode] [--profile] [--smoke] [--out DIR] [--csv PATH]
"""
import argparse
import csv
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import date

VARIANTS = ["stock_eager", "stock_compile", "fused_eager", "fused_compile", "liger_eager", "liger_compile"]
LIGER_VARIANTS = ("liger_eager", "liger_compile")
# Fused, the experts keeping their gate/up product for the backward (fused_ops.experts.set_recompute): on request.
KEPT_GATE_UP_VARIANTS = ("fused_kept_gate_up_eager", "fused_kept_gate_up_compile")


def gemma3_layer_types(layers):
    """Gemma 3's pattern: five sliding-window layers, then one global layer, repeated."""
    return ["full_attention" if (index + 1) % 6 == 0 else "sliding_attention" for index in range(layers)]


# The checkpoints' config.json values; only the layer count differs (and head_dim where transformers'
# default would differ from the checkpoint's).
FAMILIES = {
    "llama3.2-1b": dict(  # meta-llama/Llama-3.2-1B
        model_class="LlamaForCausalLM", config_class="LlamaConfig", liger="apply_liger_kernel_to_llama",
        layers=4, checkpoint_layers=16,
        config=lambda layers: dict(
            hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
            vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
            hidden_act="silu", bos_token_id=128000, eos_token_id=128001,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=8192))),
    "qwen3-1.7b": dict(  # Qwen/Qwen3-1.7B
        model_class="Qwen3ForCausalLM", config_class="Qwen3Config", liger="apply_liger_kernel_to_qwen3",
        layers=4, checkpoint_layers=28,
        config=lambda layers: dict(
            hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
            hidden_act="silu", attention_bias=False, use_sliding_window=False, bos_token_id=151643,
            eos_token_id=151645, rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "gemma3-1b": dict(  # google/gemma-3-1b-pt: no logit soft-capping (QK norms instead), as its config says
        model_class="Gemma3ForCausalLM", config_class="Gemma3TextConfig", liger="apply_liger_kernel_to_gemma3_text",
        layers=6, checkpoint_layers=26,
        config=lambda layers: dict(
            hidden_size=1152, intermediate_size=6912, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
            vocab_size=262144, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
            hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, sliding_window=512,
            layer_types=gemma3_layer_types(layers), final_logit_softcapping=None, attn_logit_softcapping=None,
            attention_bias=False, pad_token_id=0, bos_token_id=2, eos_token_id=[1, 106],
            rope_parameters={"full_attention": dict(rope_type="default", rope_theta=1000000.0),
                             "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    "phi3-mini": dict(  # microsoft/Phi-3-mini-4k-instruct: head_dim 96 (hidden / heads), untied head
        model_class="Phi3ForCausalLM", config_class="Phi3Config", liger="apply_liger_kernel_to_phi3",
        layers=4, checkpoint_layers=32,
        config=lambda layers: dict(
            hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
            vocab_size=32064, max_position_embeddings=4096, original_max_position_embeddings=4096,
            rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu", sliding_window=2047,
            bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=1.0))),
    "qwen3-30b-a3b": dict(  # Qwen/Qwen3-30B-A3B: every layer a MoE layer; output_router_logits False as in
        # the checkpoint, so the loss has no router term (fuse() fuses the LM head + loss only then)
        model_class="Qwen3MoeForCausalLM", config_class="Qwen3MoeConfig", liger="apply_liger_kernel_to_qwen3_moe",
        layers=4, checkpoint_layers=48,
        config=lambda layers: dict(
            hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
            num_experts_per_tok=8, norm_topk_prob=True, output_router_logits=False, router_aux_loss_coef=0.001,
            decoder_sparse_step=1, mlp_only_layers=[], num_attention_heads=32, num_key_value_heads=4,
            head_dim=128, vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
            tie_word_embeddings=False, hidden_act="silu", attention_bias=False, use_sliding_window=False,
            bos_token_id=151643, eos_token_id=151645,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    "gpt-oss-20b": dict(  # openai/gpt-oss-20b: 32 experts of 2880, 4 a token, the clamped SwiGLU; sliding-window
        # layers of 128 tokens alternate with full ones; transformers' grouped_mm experts
        model_class="GptOssForCausalLM", config_class="GptOssConfig", liger="apply_liger_kernel_to_gpt_oss", layers=4,
        checkpoint_layers=24, attention="eager",  # its attention sinks: transformers has no SDPA path for them
        config=lambda layers: dict(
            hidden_size=2880, intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4,
            num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=201088, sliding_window=128,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
            max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True,
            output_router_logits=False, router_aux_loss_coef=0.9, pad_token_id=199999, eos_token_id=200002,
            rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
                                 truncate=False, original_max_position_embeddings=4096))),
}
# --smoke: the same families a few dozen units wide (their extras kept), on the CPU.
SMOKE_SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, head_dim=16, vocab_size=512,
                   moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, sliding_window=16)


def family_config(family, layers, smoke):
    import transformers
    spec = FAMILIES[family]
    values = dict(spec["config"](layers), num_hidden_layers=layers)
    if smoke:
        values.update({name: value for name, value in SMOKE_SIZES.items() if name in values})
        # keep each family's grouping of query heads onto KV heads (Gemma 3: one KV head; Phi-3: none)
        checkpoint = spec["config"](layers)
        values["num_key_value_heads"] = max(1, 4 * checkpoint["num_key_value_heads"] // checkpoint["num_attention_heads"])
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids the smoke vocabulary still holds
        if smoke and name in values:
            values[name] = 1
    return getattr(transformers, spec["config_class"])(**values, attn_implementation=spec.get("attention", "sdpa"))


def build_model(args, variant, device):
    import torch
    import transformers
    spec = FAMILIES[args.family]
    if variant in LIGER_VARIANTS:
        import liger_kernel.transformers
        getattr(liger_kernel.transformers, spec["liger"])()  # its defaults; before the model's classes are used
    config = family_config(args.family, args.layers, args.smoke)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, spec["model_class"])(config).to(torch.bfloat16)
    if variant.startswith("fused"):
        import fused_ops
        start = time.perf_counter()
        fused_ops.fuse(model)
        if variant in KEPT_GATE_UP_VARIANTS:
            fused_ops.experts.set_recompute(model, False)
        model.fuse_seconds = time.perf_counter() - start
        with open(os.path.join(args.out, f"fuse_{args.family}.txt"), "w") as file:
            file.write(f"{model.fused_ops_report}\nfuse() took {model.fuse_seconds:.1f} s\n")
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
        # The optimizer's step also appears as a GPU-side annotation spanning its kernels: not a kernel.
        if event.device_type != torch.autograd.DeviceType.CUDA or event.name.startswith("Optimizer."):
            continue
        kind = next((name for name, pattern in KERNEL_KINDS if re.search(pattern, event.name, re.IGNORECASE)),
                    "other")
        totals[kind] = totals.get(kind, 0.0) + event.device_time_total / 1e3
    lines = [f"{kind:<26} {ms:9.1f} ms" for kind, ms in sorted(totals.items(), key=lambda item: -item[1])]
    return "GPU time by kind of kernel\n" + "\n".join(lines + [f"{'all':<26} {sum(totals.values()):9.1f} ms"])


def train(args, variant):
    import torch
    device = "cpu" if args.smoke else "cuda"
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = build_model(args, variant, device)
    result = {"family": args.family, "layers": args.layers, "variant": variant}
    if hasattr(model, "fused_ops_report"):
        result["fused"] = dict(model.fused_ops_report.counts())
        result["fuse_s"] = model.fuse_seconds
    if args.smoke and variant in LIGER_VARIANTS:
        result["note"] = "patched and built; not run (Liger's kernels need a GPU)"
        return result
    model.train()
    fused_step = args.optimizer == "fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=not fused_step, fused=fused_step)
    forward = torch.compile(model) if variant.endswith("compile") else model
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.sequence), device=device)

    def step():
        loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def timed_step():
        synchronize()
        start = time.perf_counter()
        loss = step()
        synchronize()
        return time.perf_counter() - start, loss

    warm_up = 1 if args.smoke else 2
    first_step_s = None  # the very first step: compilation included
    if args.profile and not args.smoke:  # one step under torch.profiler after two warm-up steps
        from torch.profiler import ProfilerActivity, profile
        first_step_s, _ = timed_step()
        timed_step()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            step()
            torch.cuda.synchronize()
        table = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=100)
        with open(os.path.join(args.out, f"profile_{args.family}_{variant}.txt"), "w") as file:
            file.write(kernel_time_by_kind(profiler.events()) + "\n\n" + table)
    times = []
    for index in range(args.steps + warm_up):
        if index == warm_up and device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds, loss = timed_step()
        times.append(seconds)
    step_s = statistics.median(times[warm_up:])
    first_step_s = times[0] if first_step_s is None else first_step_s
    result.update(step_ms=1e3 * step_s, tokens_per_s=args.batch * args.sequence / step_s,
                  peak_gb=torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
                  first_step_extra_s=first_step_s - step_s, loss=loss.item())
    if hasattr(model.config, "num_experts"):
        result["experts_implementation"] = model.config._experts_implementation
    return result


def decode(args, variant):
    """One token into a static KV cache of 1024 positions after a 512-token prompt, replayed as a CUDA
    graph of the step, eager or compiled as the variant is (timed without a graph where the step
    cannot be captured)."""
    import torch
    import transformers
    model = build_model(args, variant, "cuda").eval()
    step_model = torch.compile(model) if variant.endswith("compile") else model
    cache = transformers.StaticCache(config=model.config, max_cache_len=1024)
    prompt = torch.randint(0, model.config.vocab_size, (1, 512), device="cuda")
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
    if args.decode and not args.smoke:
        import torch
        torch.cuda.empty_cache()
        try:
            result.update(decode(args, args.child))
        except Exception as error:  # noqa: BLE001 - reported in the table instead of the figure
            result["decode_error"] = f"{type(error).__name__}: {error}"[:300]
    print("RESULT " + json.dumps(result))


def add_relative(results):
    """Each measured variant's tokens/s and peak memory relative to its family's stock variant of the same
    mode, its stock_compile, and the faster of its Liger variants (named in `liger_reference`)."""
    measured = [r for r in results if "tokens_per_s" in r]
    for family in dict.fromkeys(r["family"] for r in measured):
        rows = {r["variant"]: r for r in measured if r["family"] == family}
        ligers = [rows[name] for name in LIGER_VARIANTS if name in rows]
        liger = max(ligers, key=lambda r: r["tokens_per_s"]) if ligers else None
        for r in rows.values():
            same_mode = rows.get("stock_compile" if r["variant"].endswith("compile") else "stock_eager")
            for key, base in (("vs_stock_same_mode", same_mode), ("vs_stock_compile", rows.get("stock_compile")),
                              ("vs_liger", liger)):
                if base:
                    r[f"tokens_{key}"] = r["tokens_per_s"] / base["tokens_per_s"]
                    if key != "vs_stock_same_mode" and r["peak_gb"] and base["peak_gb"]:
                        r[f"peak_{key}"] = r["peak_gb"] / base["peak_gb"]
            if liger:
                r["liger_reference"] = liger["variant"]


TABLE_COLUMNS = [  # (heading, key, format)
    ("family", "family", "{}"), ("layers", "layers", "{}"), ("variant", "variant", "{}"),
    ("step ms", "step_ms", "{:.1f}"), ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("vs stock (same mode)", "tokens_vs_stock_same_mode", "{:.2f}"),
    ("tokens/s vs stock_compile", "tokens_vs_stock_compile", "{:.2f}"),
    ("tokens/s vs Liger", "tokens_vs_liger", "{:.2f}"), ("peak GB", "peak_gb", "{:.1f}"),
    ("peak vs stock_compile", "peak_vs_stock_compile", "{:.2f}"), ("peak vs Liger", "peak_vs_liger", "{:.2f}"),
    ("compile s", "first_step_extra_s", "{:.1f}"), ("decode ms", "decode_ms", "{:.2f}"), ("run s", "run_s", "{:.0f}"),
]


def table_rows(results):
    rows = []
    for r in results:
        if "tokens_per_s" not in r:
            why = r.get("error") or r.get("note") or ""
            rows.append([r["family"], str(r["layers"]), r["variant"], ("failed: " if "error" in r else "") +
                         " ".join(why.split())[-200:]])
            continue
        rows.append([fmt.format(r[key]) if r.get(key) is not None else "" for _, key, fmt in TABLE_COLUMNS])
    return rows


def print_table(results, heading):
    rows = table_rows(results)
    headings = [name for name, _, _ in TABLE_COLUMNS]
    full = [row for row in rows if len(row) == len(headings)]
    widths = [max([len(headings[i])] + [len(row[i]) for row in full]) for i in range(len(headings))]
    print("\n" + heading)
    print("  ".join(name.rjust(width) for name, width in zip(headings, widths)))
    for row in rows:
        if len(row) == len(headings):
            print("  ".join(cell.rjust(width) for cell, width in zip(row, widths)))
        else:
            print("  ".join(cell.rjust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
    references = {r["family"]: r["liger_reference"] for r in results if "liger_reference" in r}
    if references:
        print("Liger = the faster Liger variant: " + ", ".join(f"{f} {v}" for f, v in references.items()))
    lines = [heading, "", "| " + " | ".join(headings) + " |", "|" + " --- |" * len(headings)]
    for row in rows:
        lines.append("| " + " | ".join(row + [""] * (len(headings) - len(row))) + " |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in results if "tokens_per_s" in r]
    if not rows:
        return
    figure, axes = plt.subplots(1, 2, figsize=(11, 1.0 + 0.3 * len(rows)))
    names = [f"{r['family']} ({r['layers']} layers) {r['variant']}" for r in rows]
    axes[0].barh(names, [r["tokens_per_s"] / 1e3 for r in rows])
    axes[0].set_xlabel("thousand tokens/s (higher is better)")
    axes[1].barh(names, [r["peak_gb"] or 0 for r in rows])
    axes[1].set_xlabel("peak memory of the step, GB (lower is better)")
    axes[1].set_yticks([])
    for axis in axes:
        axis.invert_yaxis()
    figure.tight_layout()
    figure.savefig(path, dpi=70)


CSV_FIELDS = ["family", "variant", "batch", "sequence", "layers", "step_ms", "tokens_per_s", "peak_gb",
              "first_step_extra_s", "decode_ms", "optimizer", "gpu", "torch", "date", "commit"]
# Rows written before the family column were all of this family.
FAMILY_OF_ROWS_WITHOUT_ONE = "llama3.2-1b"


def append_csv(path, rows):
    """Appends `rows` (dicts of CSV_FIELDS); a file with other columns is rewritten first with the union
    of both, its rows keeping their values (a missing family is the one family measured before)."""
    if os.path.exists(path) and os.path.getsize(path):
        with open(path, newline="") as file:
            reader = csv.DictReader(file)
            fields = list(reader.fieldnames or [])
            old_rows = list(reader)
        if fields != CSV_FIELDS:
            union = CSV_FIELDS + [name for name in fields if name not in CSV_FIELDS]
            for row in old_rows:
                row.setdefault("family", FAMILY_OF_ROWS_WITHOUT_ONE)
            with open(path, "w", newline="") as file:
                writer = csv.DictWriter(file, union, restval="")
                writer.writeheader()
                writer.writerows(old_rows)
            fields = union
    else:
        fields = CSV_FIELDS
        with open(path, "w", newline="") as file:
            csv.DictWriter(file, fields).writeheader()
    with open(path, "a", newline="") as file:
        csv.DictWriter(file, fields, restval="").writerows(rows)


def csv_rows(results, args, device, torch_version):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import source_commit

    rows = []
    for r in results:
        if "tokens_per_s" in r:
            rows.append(dict(family=r["family"], variant=r["variant"], batch=args.batch, sequence=args.sequence,
                             layers=r["layers"], step_ms=f"{r['step_ms']:.1f}", tokens_per_s=f"{r['tokens_per_s']:.0f}",
                             peak_gb=f"{r['peak_gb']:.2f}" if r["peak_gb"] is not None else "", first_step_extra_s=f"{r['first_step_extra_s']:.1f}",
                             decode_ms=f"{r['decode_ms']:.3f}" if "decode_ms" in r else "", optimizer=args.optimizer, gpu=device,
                             torch=torch_version, date=date.today().isoformat(), commit=source_commit()))
    return rows


def failure_summary(output):
    """A failed child's last exception line (what raised, and why) and the end of its output: a
    traceback's last 600 characters often hold only the frames and hints that follow the message."""
    raised = [line for line in output.splitlines() if re.match(r"^[\w.]+(Error|Exception|Unsupported|Failure)\b", line)]
    head = raised[-1][:400] + " ... " if raised else ""
    return head + output[-600:]


def run_variant(args, family, layers, variant, decode_on):
    command = [sys.executable, os.path.abspath(__file__), "--child", variant, "--family", family,
               f"--layers={layers}"] + [f"--{name}={getattr(args, name)}"
                                        for name in ("batch", "sequence", "steps", "out", "optimizer")]
    command += (["--profile"] if args.profile else []) + (["--smoke"] if args.smoke else []) + (
        ["--decode"] if decode_on else ["--no-decode"])
    start = time.perf_counter()
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired as expired:
        return {"family": family, "layers": layers, "variant": variant,
                "error": f"no result within --timeout {args.timeout} s; last output: "
                         f"{(expired.stderr or b'')[-300:]!r}", "run_s": time.perf_counter() - start}
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    if run.returncode != 0 or not lines:
        result = {"family": family, "layers": layers, "variant": variant,
                  "error": failure_summary(run.stderr or run.stdout)}
    else:
        result = json.loads(lines[-1][len("RESULT "):])
    result["run_s"] = time.perf_counter() - start
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default=None, choices=list(FAMILIES) + ["all"],
                        help="one family (default llama3.2-1b), or all of them")
    parser.add_argument("--families", nargs="+", default=None, choices=list(FAMILIES),
                        help="several families in one run and one table")
    parser.add_argument("--variants", nargs="+", default=None, choices=VARIANTS + list(KEPT_GATE_UP_VARIANTS),
                        help="default: the first six (--smoke: the eager ones); fused_kept_gate_up_*: fused with "
                        "the experts keeping their gate/up product")
    parser.add_argument("--layers", type=int, default=None, help="default: the family's (see above)")
    parser.add_argument("--batch", type=int, default=None, help="default 8 (--smoke: 2)")
    parser.add_argument("--sequence", type=int, default=None, help="default 2048 (--smoke: 64)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps, default 6 (--smoke: 1)")
    parser.add_argument("--decode", action=argparse.BooleanOptionalAction, default=None,
                        help="also time the one-token decode step (default: for llama3.2-1b only)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny config of each family (unless --family/--families) on the CPU, eager variants")
    parser.add_argument("--optimizer", choices=["foreach", "fused"], default="foreach",
                        help="AdamW's implementation (default foreach; fused is transformers' Trainer default)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds a variant may take before it is reported failed")
    parser.add_argument("--out", default="bench_out")
    parser.add_argument("--csv", default=None, help="CSV to append rows to (default OUT/model_results.csv)")
    parser.add_argument("--profile", action="store_true",
                        help="also write OUT/profile_FAMILY_VARIANT.txt: the kernels of one step by GPU time")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.family and args.families:
        parser.error("--family and --families: give one of them")
    smoke_defaults = dict(batch=2, sequence=64, steps=1) if args.smoke else dict(batch=8, sequence=2048, steps=6)
    for name, value in smoke_defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    os.makedirs(args.out, exist_ok=True)
    if args.child:
        args.layers = args.layers or FAMILIES[args.family]["layers"]
        return child(args)

    if args.families:
        families = args.families
    elif args.family == "all" or (args.smoke and not args.family):
        families = list(FAMILIES)
    else:
        families = [args.family or "llama3.2-1b"]
    variants = args.variants or [v for v in VARIANTS if not (args.smoke and v.endswith("compile"))]
    liger_found = importlib.util.find_spec("liger_kernel") is not None
    import torch
    device = "CPU (smoke)" if args.smoke else torch.cuda.get_device_name()
    csv_path = args.csv or os.path.join(args.out, "model_results.csv")
    results = []
    for family in families:
        layers = args.layers or FAMILIES[family]["layers"]
        decode_on = args.decode if args.decode is not None else family == "llama3.2-1b"
        for variant in variants:
            if variant in LIGER_VARIANTS and not liger_found:
                results.append({"family": family, "layers": layers, "variant": variant,
                                "error": "liger-kernel is not importable"})
            else:
                results.append(run_variant(args, family, layers, variant, decode_on))
            print(json.dumps(results[-1]), flush=True)
            # Each variant's row as it finishes: a run stopped part-way keeps the rows it has.
            append_csv(csv_path, csv_rows(results[-1:], args, device, torch.__version__))
    add_relative(results)
    heading = (f"{device}, torch {torch.__version__}, {args.batch} x {args.sequence} tokens, bf16, AdamW ({args.optimizer}); "
               f"layers of each family as listed")
    markdown = print_table(results, heading)
    with open(os.path.join(args.out, "model.md"), "w") as file:
        file.write(markdown)
    with open(os.path.join(args.out, "model.json"), "w") as file:
        json.dump({"device": device, "torch": torch.__version__, "date": date.today().isoformat(),
                   "batch": args.batch, "sequence": args.sequence, "families": families, "results": results},
                  file, indent=1)
    plot(results, os.path.join(args.out, "model.png"))
    failed = [f"{r['family']} {r['variant']}" for r in results if "error" in r]
    if failed:
        print("failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
