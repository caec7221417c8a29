"""Benchmark fused ops against the eager composite and torch.compile of it, in one run.

Effective bandwidth = the bytes an op must move (each input read once, each output written
once) over its median time, compared with the device's copy bandwidth measured in the same
run. CUDA: CUDA events, CUDA graphs for small sizes, medians. Also runs on CPU (smaller sizes).

Each workload is timed in --rounds rounds (default 2 on CUDA), the variants' order rotated from
one round to the next, and each figure is the lowest of its rounds' medians: the variant timed first
after new inputs runs up to 3% slower than in second place, and a fixed order would give that
handicap to one variant on every row.

The ops and their eager composites come from the test registry (tests/op_specs.py). Results go to
OUT/bench.json, a plot OUT/bench.png, and one row per op, shape, dtype, mode and variant appended to
the CSV (--csv, default OUT/results.csv; docs/results.csv holds the published rows).

    python scripts/bench.py [--headline] [--dtypes float32 bfloat16] [--min-log2 12] [--max-log2 28]
                            [--norm-shapes 262144x128 ...] [--rounds 2] [--out DIR] [--csv FILE] [--fused-label NAME]
    python scripts/bench.py --plot-published docs/results.csv docs/model_results.csv docs/performance.png
"""
import argparse
import csv
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from math import nan

import torch

import fused_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from op_specs import as_outputs  # noqa: E402

from bench_workloads import DEFAULT_OPS, relu_add_composite, relu_add_fused, workloads  # noqa: E402

GRAPH_MAX_ELEMENTS = 1 << 24


class Progress:
    def __init__(self, total):
        self.total, self.done, self.start = total, 0, time.time()

    def step(self, label):
        self.done += 1
        width = 30
        filled = int(width * self.done / self.total)
        elapsed = time.time() - self.start
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"{elapsed:5.0f}s {label:<48}")
        sys.stderr.flush()
        if self.done == self.total:
            sys.stderr.write("\n")


def median_time_us(run, device, numel, repeats):
    """Median microseconds of one `run()`; small CUDA sizes replay a captured graph."""
    if device == "cpu":
        run()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            times.append((time.perf_counter() - start) * 1e6)
        return statistics.median(times)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    # Large sizes: several calls between two events, so Python's launch time hides behind the GPU.
    calls_per_replay = 5
    single = run
    run = lambda: [single() for _ in range(5)]  # noqa: E731
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    single()
    end.record()
    end.synchronize()
    if start.elapsed_time(end) > 5.0:  # milliseconds: one call already hides the launches; time fewer
        calls_per_replay, run = 1, single
        repeats = max(3, min(repeats, int(1000.0 / start.elapsed_time(end))))
    elif numel <= GRAPH_MAX_ELEMENTS:
        run = single
        try:
            calls_per_replay = 20
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls_per_replay):
                    run()
            run = graph.replay
            run()
        except Exception as error:  # noqa: BLE001 - some composites cannot be captured
            print(f"\n(no CUDA graph: {type(error).__name__}: {error})", file=sys.stderr)
            calls_per_replay = 1
            run = single
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # An untimed run first: the GPU is still busy with it when `start` is recorded, so the timed
        # span holds no wait for the host to launch the first call (a graph replay from Python, or a
        # step's first kernels).
        run()
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls_per_replay)
    return statistics.median(times)


def peak_memory_mb(step):
    """MB the GPU allocator holds at the peak of one `step()` above what it held before (the inputs) and
    what the step returns (outputs, or the gradients): temporaries and what autograd saves."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in as_outputs(result) if isinstance(t, torch.Tensor)}
    del result
    return (peak - before - sum(storages.values())) / 2**20


def saved_activation_mb(step, excluded):
    """MB of the distinct storages autograd saves during `step()`, other than those of `excluded` tensors."""
    skip = {t.untyped_storage().data_ptr() for t in excluded}
    seen = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = step()
    del result
    return sum(seen.values()) / 2**20


def relative_error(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def write_variant_result(name, rows, variants, summary, copy_gbs, out, csv_path):
    """An op's variant benchmark (scripts/bench_moe.py, bench_attention.py): the summary printed, everything to
    OUT/NAME.json, and the rows to the CSV (`csv_path`, where given) in this script's format."""
    print(json.dumps(summary), flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": date.today().isoformat(),
              "commit": source_commit(), "copy_gbs": copy_gbs, "rows": rows, "variants": variants, "summary": summary}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as file:
        json.dump(result, file, indent=1)
    if csv_path:
        append_csv(result, csv_path, "fused")


def copy_bandwidth_gbs(device, numel=None, repeats=None):
    numel = numel or ((1 << 29) if device == "cuda" else (1 << 25))  # 1 GiB of float16 on the GPU
    source = torch.randn(numel, device=device).half()
    target = torch.empty_like(source)
    us = median_time_us(lambda: target.copy_(source), device, numel, repeats or (30 if device == "cuda" else 5))
    return 2 * source.numel() * source.element_size() / us / 1e3


# After each workload a shorter copy is timed again (`copy_gbs_near` on its rows). A device that
# slows down mid-run (another job on a shared host) then shows instead of passing as a slow kernel.
# Rows below DISTURBED_FRACTION of the run's copy bandwidth are flagged in the table and the JSON.
DISTURBED_FRACTION = 0.8


def copy_check_gbs(device):
    if device == "cuda":
        return copy_bandwidth_gbs(device, numel=1 << 27, repeats=10)  # 256 MiB, well past the L2
    return copy_bandwidth_gbs(device, numel=1 << 22, repeats=3)


def python_call_overhead_us(device, repeats=2000):
    """Wall time of one eager call from Python on 4096 float32 elements, back to back."""
    x, y = torch.randn(4096, device=device), torch.randn(4096, device=device)
    torch._dynamo.reset()
    compiled = torch.compile(relu_add_composite)
    results = {}
    aten_add = torch.ops.aten.add.Tensor
    for name, function in [("fused", relu_add_fused), ("fused_ops.relu_add", lambda a, b: fused_ops.relu_add(a, b, 0.5)),
                           ("eager", relu_add_composite), ("compile", compiled),
                           # the floor of any op called through torch.ops from Python:
                           ("one aten op via torch.ops", lambda a, b: aten_add(a, b))]:
        for _ in range(50):
            function(x, y)
        samples = []
        for _ in range(5):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                function(x, y)
            if device == "cuda":
                torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) * 1e6 / repeats)
        results[name] = statistics.median(samples)
    return results


def run(args):
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    max_log2 = args.max_log2 if args.max_log2 else (28 if device == "cuda" else 22)
    sizes = sorted({1 << k for k in range(args.min_log2, max_log2 + 1, 2)} |
                   ({1 << 27} if max_log2 >= 27 else set()))
    dtypes = [getattr(torch, name) for name in args.dtypes]
    repeats = args.repeats or (50 if device == "cuda" else 5)
    rounds = args.rounds or (2 if device == "cuda" else 1)
    gpu = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"

    copy_gbs = copy_bandwidth_gbs(device)
    rows = []
    variants = args.variants
    planned = list(workloads(device, dtypes, sizes, args.ops, headline=args.headline, norm_shapes=args.norm_shapes))
    progress = Progress(sum(2 * (len(variants) + len(work.peers)) * rounds for work in planned))
    for work in planned:
        inputs = work.make_inputs()
        dtype, numel = work.dtype, work.numel
        grads = [torch.randn(out.shape, device=device, dtype=dtype) for out in as_outputs(work.fused(*inputs))]
        torch._dynamo.reset()
        functions = {"fused": work.fused, "eager": work.composite, "compile": torch.compile(work.composite),
                     **work.peers}
        workload_variants = variants + [peer for peer in work.peers if peer not in variants]
        workload_rows = []
        for mode, elements in (("forward", work.forward_elements), ("forward+backward", work.training_elements)):
            row = {"op": work.op, "dtype": str(dtype).replace("torch.", ""), "numel": numel,
                   "shape": list(work.shape), "mode": mode, "bytes": elements * inputs[0].element_size()}
            steps = {}
            for variant in workload_variants:
                function = functions[variant]
                if mode == "forward":
                    steps[variant] = lambda f=function: f(*inputs)  # noqa: E731
                else:
                    leaves = [t.detach().requires_grad_(work.takes_grad(i)) for i, t in enumerate(inputs)]
                    steps[variant] = lambda f=function, leaves=leaves: torch.autograd.grad(  # noqa: E731
                        as_outputs(f(*leaves)), [t for t in leaves if t.requires_grad], grads)
            best = {variant: float("inf") for variant in workload_variants}
            for round_index in range(rounds):
                shift = round_index % len(workload_variants)
                for variant in workload_variants[shift:] + workload_variants[:shift]:
                    best[variant] = min(best[variant], median_time_us(steps[variant], device, numel, repeats))
                    progress.step(f"{work.op} {row['dtype']} {'x'.join(map(str, work.shape))} {mode} {variant}")
            for variant in workload_variants:
                row[f"{variant}_us"] = best[variant]
                row[f"{variant}_gbs"] = row["bytes"] / best[variant] / 1e3
                if device == "cuda":
                    row[f"{variant}_peak_mb"] = peak_memory_mb(steps[variant])
            workload_rows.append(row)
        if work.errors is not None and device == "cuda":
            workload_rows[-1]["errors"] = work.errors(inputs)
        del inputs, grads
        near = copy_check_gbs(device)
        for row in workload_rows:
            row["copy_gbs_near"] = near
            row["disturbed"] = near < DISTURBED_FRACTION * copy_gbs
        rows.extend(workload_rows)
    overhead = python_call_overhead_us(device) if len(variants) == 3 else {}
    return {
        "date": date.today().isoformat(), "device": gpu, "torch": torch.__version__,
        "cuda": torch.version.cuda, "copy_gbs": copy_gbs, "python_call_us": overhead, "rows": rows,
        "commit": source_commit(),
    }


def source_commit():
    """The commit benchmarked: FUSED_OPS_COMMIT, else git's HEAD (with '+' when the tree has changes)."""
    if os.environ.get("FUSED_OPS_COMMIT"):
        return os.environ["FUSED_OPS_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


CSV_COLUMNS = ["op", "shape", "dtype", "mode", "variant", "us", "gbs", "percent_of_copy", "gpu", "torch", "date",
               "commit", "peak_mb"]


def append_csv(result, path, fused_label):
    """One row per op, shape, dtype, mode and variant; the header is written when the file is new."""
    new_file = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as file:
        writer = csv.writer(file)
        if new_file:
            writer.writerow(CSV_COLUMNS)
        for row in result["rows"]:
            for variant in ("fused", "fused_kept_gate_up", "eager", "compile", "liger", "trl"):
                if f"{variant}_us" not in row:
                    continue
                writer.writerow([row["op"], "x".join(map(str, row["shape"])), row["dtype"], row["mode"],
                                 fused_label if variant == "fused" else variant, f"{row[f'{variant}_us']:.2f}",
                                 f"{row[f'{variant}_gbs']:.0f}",
                                 f"{100 * row[f'{variant}_gbs'] / result['copy_gbs']:.1f}", result["device"],
                                 result["torch"], result["date"], result["commit"],
                                 f"{row[f'{variant}_peak_mb']:.1f}" if f"{variant}_peak_mb" in row else ""])


def print_table(result):
    print(f"\n{result['device']}, torch {result['torch']}, {result['date']}; "
          f"copy bandwidth {result['copy_gbs']:.0f} GB/s (read + write)")
    header = (f"{'op':<16} {'dtype':<8} {'shape':>11} {'mode':<16} {'fused us':>9} {'eager us':>9} {'compile us':>10} "
              f"{'liger us':>9} {'fused GB/s':>10} {'% copy':>6} {'peak MB fused/compile/liger':>27}")
    print(header)
    print("-" * len(header))
    for row in result["rows"]:
        shape = "x".join(map(str, row["shape"])) if row["op"] != "relu_add" else "2^" + str(row["numel"].bit_length() - 1)
        peaks = "/".join(f"{row[f'{v}_peak_mb']:.0f}" if f"{v}_peak_mb" in row else "-"
                         for v in ("fused", "compile", "liger"))
        print(f"{row['op']:<16} {row['dtype']:<8} {shape:>11} {row['mode']:<16} "
              f"{row['fused_us']:9.1f} {row.get('eager_us', nan):9.1f} {row.get('compile_us', nan):10.1f} "
              f"{row.get('liger_us', nan):9.1f} {row['fused_gbs']:10.0f} {100 * row['fused_gbs'] / result['copy_gbs']:6.1f} "
              f"{peaks:>27}" +
              (f"  DISTURBED: copy {row['copy_gbs_near']:.0f} GB/s next to this row" if row.get("disturbed") else "") +
              ("  errors vs float64: " + ", ".join(f"{k} {v:.1e}" for k, v in row["errors"].items())
               if "errors" in row else ""))
    disturbed = sum(bool(row.get("disturbed")) for row in result["rows"])
    if disturbed:
        print(f"WARNING: {disturbed} rows were timed while the device copied below "
              f"{100 * DISTURBED_FRACTION:.0f}% of the run's copy bandwidth; time them again on a quiet machine")
    calls = result["python_call_us"]
    print("one eager call from Python, 4096 float32 (us): " +
          ", ".join(f"{name} {us:.2f}" for name, us in calls.items()))


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = {}
    for r in result["rows"]:
        key = (r["op"], r["dtype"], r["mode"])
        counts[key] = counts.get(key, 0) + 1
    groups = sorted(key for key, count in counts.items() if count >= 3)  # size sweeps only
    if not groups:
        return plot_relative_times(result, path)
    columns = 4
    lines = (len(groups) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(5 * columns, 4 * lines), squeeze=False)
    for axis in axes.flat[len(groups):]:
        axis.set_visible(False)
    for axis, (op, dtype, mode) in zip(axes.flat, groups):
        rows = [r for r in result["rows"] if (r["op"], r["dtype"], r["mode"]) == (op, dtype, mode)]
        for variant in ("fused", "eager", "compile"):
            if f"{variant}_gbs" not in rows[0]:
                continue
            axis.plot([r["numel"] for r in rows], [r[f"{variant}_gbs"] for r in rows], marker="o", label=variant)
        axis.axhline(result["copy_gbs"], color="gray", linestyle="--", label="copy")
        axis.set_xscale("log", base=2)
        axis.set_title(f"{op} {dtype} {mode}")
        axis.set_xlabel("elements")
        axis.set_ylabel("effective GB/s")
        axis.legend()
    figure.suptitle(f"{result['device']}, torch {result['torch']}, {result['date']}")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    return True


def plot_relative_times(result, path):
    """Without a size sweep (--headline): each row's time relative to torch.compile's, fused and eager."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "compile_us" in r and "eager_us" in r]
    if not rows:
        return False
    labels = [f"{r['op']} {r['dtype']} {'x'.join(map(str, r['shape']))} {r['mode']}" for r in rows]
    figure, axis = plt.subplots(figsize=(8, 0.25 * len(rows) + 1.2))
    positions = range(len(rows))
    for offset, variant in ((-0.2, "fused"), (0.2, "eager")):
        ratios = [r[f"{variant}_us"] / r["compile_us"] for r in rows]
        axis.barh([p + offset for p in positions], [ratio - 1 for ratio in ratios], left=1, height=0.4, label=variant)
    axis.axvline(1.0, color="gray", linestyle="--", label="torch.compile")
    axis.set_xscale("log", base=2)
    axis.set_yticks(list(positions), labels, fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("time relative to torch.compile (lower is faster)")
    axis.legend(loc="lower right")
    axis.set_title(f"{result['device']}, torch {result['torch']}, {result['date']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=60)
    return True


# The published plot's panels: families of ops, then the whole model (docs/model_results.csv).
PUBLISHED_PANELS = [
    ("Elementwise", ["relu_add"]),
    ("Activations", ["bias_gelu_none", "bias_gelu_tanh", "silu_mul", "gelu_mul_tanh"]),
    ("Norms", ["rms_norm", "add_rms_norm", "layer_norm", "add_layer_norm"]),
    ("Rotary embedding (RoPE)", ["rotary_embedding"]),
    ("LM head + loss", ["linear_cross_entropy"]),
]
VARIANT_COLORS = {"fused": "tab:blue", "eager": "tab:orange", "liger": "tab:green", "compile": "gray"}


def latest_rows(path, key_fields):
    """The CSV's rows, the last one of each key (the newest run) kept."""
    with open(path, newline="") as file:
        return list({tuple(row.get(field) for field in key_fields): row for row in csv.DictReader(file)}.values())


def plot_published(results_csv, model_csv, path):
    """docs/performance.png: per family, each workload's fused, eager (and Liger) time relative to
    torch.compile's; then the model's training tokens/s and peak memory, from the CSVs' newest rows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = latest_rows(results_csv, ("op", "shape", "dtype", "mode", "variant"))
    times = {}
    for row in rows:
        times.setdefault((row["op"], row["shape"], row["dtype"], row["mode"]), {})[row["variant"]] = float(row["us"])
    panels = []
    for title, ops in PUBLISHED_PANELS:
        workloads = [(key, value) for key, value in times.items()
                     if key[0] in ops and "compile" in value and "fused" in value]
        workloads.sort(key=lambda item: (ops.index(item[0][0]), item[0][2], item[0][1], item[0][3]))
        panels.append((title, workloads))
    # The model panel: the Llama-3.2-1B-shaped rows (rows from before the family column are Llama's).
    models = [row for row in latest_rows(model_csv, ("family", "layers", "variant"))
              if row.get("family", "llama3.2-1b") in ("llama3.2-1b", None, "") and row["layers"] == "16"]
    heights = [max(2, len(workloads)) * 0.36 + 1.1 for _, workloads in panels] + [len(models) * 0.36 + 1.1]
    plt.rcParams.update({"font.size": 11})
    figure, axes = plt.subplots(len(heights), 1, figsize=(14, sum(heights)), dpi=100,
                                gridspec_kw={"height_ratios": heights})
    for axis, (title, workloads) in zip(axes, panels):
        labels, ratios = [], []
        for position, ((op, shape, dtype, mode), measured) in enumerate(workloads):
            labels.append(f"{op}  {shape.replace('x', '×')}  {dtype}  {mode}")
            present = [variant for variant in ("fused", "eager", "liger") if variant in measured]
            for offset, variant in enumerate(present):
                ratio = measured[variant] / measured["compile"]
                ratios.append(ratio)
                bar_position = position + (offset - (len(present) - 1) / 2) * 0.27
                # Bars grow from torch.compile's 1: left is faster, right slower.
                axis.barh(bar_position, ratio - 1, left=1, height=0.27, color=VARIANT_COLORS[variant],
                          label=variant if position == 0 else None)
                if variant == "fused":  # its figure beside the bar's end
                    axis.text(ratio / 1.03 if ratio < 1 else ratio * 1.03, bar_position,
                              f"{ratio:.2f}× ({format_us(measured['fused'])})", va="center", fontsize=9,
                              ha="right" if ratio < 1 else "left")
        axis.axvline(1.0, color=VARIANT_COLORS["compile"], linestyle="--", label="torch.compile")
        axis.set_xscale("log", base=2)
        axis.set_xlim(min(ratios + [1]) / 2.6, max(ratios + [1]) * 2.2)
        axis.set_yticks(range(len(labels)), labels, fontsize=10)
        axis.invert_yaxis()
        axis.set_title(title, loc="left", fontweight="bold")
        axis.set_xlabel("time relative to torch.compile (log scale; left of the dashed line is faster)")
        axis.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, fontsize=9, frameon=False)
    axis = axes[-1]
    baseline = next((float(row["tokens_per_s"]) for row in models if row["variant"] == "stock_compile"), None)
    for position, row in enumerate(models):
        speed = float(row["tokens_per_s"]) / baseline if baseline else float(row["tokens_per_s"])
        axis.barh(position, speed, height=0.6,
                  color=VARIANT_COLORS["fused"] if row["variant"].startswith("fused") else
                  VARIANT_COLORS["liger"] if row["variant"].startswith("liger") else VARIANT_COLORS["eager"])
        axis.text(speed * 1.01, position, f"{speed:.2f}×, {int(float(row['tokens_per_s']))} tokens/s, "
                  f"peak {float(row['peak_gb']):.1f} GB", va="center", fontsize=9)
    axis.axvline(1.0, color=VARIANT_COLORS["compile"], linestyle="--")
    axis.set_yticks(range(len(models)), [row["variant"].replace("_", ", ") for row in models], fontsize=10)
    axis.invert_yaxis()
    axis.set_xlim(0, max(1.0, *(float(row["tokens_per_s"]) / (baseline or 1) for row in models)) * 1.45)
    first = models[0] if models else {}
    axis.set_title(f"Whole model: Llama-3.2-1B-shaped training step\n({first.get('batch')} × {first.get('sequence')} "
                   f"tokens, {first.get('layers')} layers, bf16, AdamW)", loc="left", fontweight="bold")
    axis.set_xlabel("training tokens/s relative to the stock model under torch.compile (higher is faster)")
    gpus = sorted({f"{row['gpu']}, torch {row['torch']}" for row in rows + models})
    figure.suptitle(f"fused_ops on {'; '.join(gpus)} (bf16 unless noted; newest rows of docs/results.csv and "
                    "docs/model_results.csv)", fontsize=12)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.5 / sum(heights)))
    figure.savefig(path)
    return True


def format_us(us):
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.3g} µs"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", nargs="+", default=DEFAULT_OPS,
                        help="relu_add, activation labels (bias_gelu_tanh, silu_mul, ...), norm labels "
                             "(rms_norm, add_rms_norm, add_layer_norm, layer_norm) or 'norms', rotary_embedding")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        help="the norms run in bfloat16, and also in float16 when it is named")
    parser.add_argument("--min-log2", type=int, default=12)
    parser.add_argument("--max-log2", type=int, default=None, help="default 28 on CUDA, 22 on CPU")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per workload, the variants' order rotated each round (default 2 on CUDA, 1 on CPU)")
    parser.add_argument("--cpu", action="store_true", help="benchmark the CPU even when a GPU is present")
    parser.add_argument("--out", default="bench_out", help="folder for bench.json and bench.png")
    parser.add_argument("--csv", default=None, help="CSV to append the rows to (default OUT/results.csv)")
    parser.add_argument("--headline", action="store_true", help="only the headline shapes (docs/ops.md's performance table)")
    parser.add_argument("--norm-shapes", nargs="+", default=None, metavar="ROWSxH",
                        type=lambda text: tuple(int(part) for part in text.split("x")),
                        help="the norms' shapes instead of the defaults, e.g. 262144x128 16384x2048")
    parser.add_argument("--fused-label", default="fused",
                        help="the variant name of the fused rows in the CSV (e.g. 'before' for a baseline build)")
    parser.add_argument("--variants", nargs="+", default=["fused", "eager", "compile"],
                        choices=["fused", "eager", "compile"],
                        help="what to time (fused alone to compare two builds of the library)")
    parser.add_argument("--plot-published", nargs=3, metavar=("RESULTS_CSV", "MODEL_CSV", "PNG"),
                        help="only draw the published plot from the CSVs (docs/results.csv docs/model_results.csv "
                             "docs/performance.png), timing nothing")
    args = parser.parse_args()
    if args.plot_published:
        plot_published(*args.plot_published)
        print(f"wrote {args.plot_published[2]}")
        return
    result = run(args)
    print_table(result)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as file:
        json.dump(result, file, indent=1)
    plotted = plot(result, os.path.join(args.out, "bench.png"))
    csv_path = args.csv or os.path.join(args.out, "results.csv")
    append_csv(result, csv_path, args.fused_label)
    print(f"wrote {args.out}/bench.json, rows appended to {csv_path}" +
          (f", and {args.out}/bench.png" if plotted else " (nothing to plot)"))


if __name__ == "__main__":
    main()
