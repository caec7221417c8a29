"""A long mixed run of every op in the registry (tests/op_specs.py): forward and backward on random
shapes and dtypes, on two CUDA streams in turn, with a CUDA graph of one op captured and replayed
between the eager calls; every --check-every-th call is checked against float64. At the end the
allocator holds what it held after the warm-up (no growth), and no check failed.

    python scripts/soak.py [--calls 1000000] [--device cuda|cpu] [--check-every 97] [--seed 0] [--processes 1]
                           [--seconds S]

--processes N splits the calls over N processes at once (seeds seed, seed + 1, ...), each with its own
streams and graphs on the same device: one process issues its calls from one Python thread, so N of
them make 10^6 calls fit a shorter run. --seconds S ends each process's calls after S seconds (the summary
counts the calls made), so a run fits a time limit. Prints one JSON summary line (of all processes); exit code 1 when a
check failed or memory grew in any process.
"""
import argparse
import contextlib
import ctypes
import gc
import json
import os
import random
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from op_specs import OPS, as_outputs  # noqa: E402

import fused_ops  # noqa: E402,F401

TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
SHAPES = [(1, 8), (3, 64), (64, 256), (257, 1000), (16, 4096)]


def options_of(spec, rng):
    chosen = {}
    for name, values in spec.options.items():
        chosen[name] = rng.uniform(*values) if isinstance(values, tuple) else rng.choice(values)
    return chosen


def make_inputs(spec, shape, dtype, device, generator, device_generator=None):
    """Random inputs of `spec`; the float ones drawn on the device when `device_generator` is given (no
    copy from the host), the special ones (class targets) on the host."""
    shapes = spec.input_shapes(list(shape))
    inputs = []
    for index, input_shape in enumerate(shapes):
        tensor = spec.special_input(index, shapes, dtype, device, generator)
        if tensor is None and device_generator is not None:
            tensor = torch.randn(input_shape, generator=device_generator, device=device).to(dtype)
        elif tensor is None:
            tensor = torch.randn(input_shape, generator=generator).to(dtype=dtype, device=device)
        inputs.append(tensor.requires_grad_(spec.takes_grad(index)))
    return inputs


def call(spec, inputs, options):
    """Outputs and the gradients of their sum with respect to the inputs that take them."""
    outputs = as_outputs(spec.call(inputs, **options))
    leaves = [t for t in inputs if t.requires_grad]
    total = sum(out.float().sum() for out in outputs)
    grads = torch.autograd.grad(total, leaves, allow_unused=True) if leaves and total.requires_grad else ()
    return outputs, grads


def matches_reference(spec, inputs, options, outputs, grads, dtype):
    inputs64 = [t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t
                for t in inputs]
    expected = as_outputs(spec.reference(*inputs64, **options))
    tolerance = TOLERANCE[dtype] * spec.value_scale(inputs64, **options)
    for out, want in zip(outputs, expected):
        if not torch.allclose(out.detach().double().cpu(), want.detach().cpu(), rtol=TOLERANCE[dtype],
                              atol=tolerance, equal_nan=True):
            return False
    leaves64 = [t for t in inputs64 if t.requires_grad]
    if grads and leaves64:
        total = sum(want.sum() for want in expected)
        expected_grads = torch.autograd.grad(total, leaves64, allow_unused=True)
        scale = spec.gradient_scale(inputs64, **options) * tolerance * 8
        for grad, want in zip(grads, expected_grads):
            if grad is None or want is None:
                continue
            if not torch.allclose(grad.double().cpu(), want.cpu(), rtol=TOLERANCE[dtype] * 8, atol=scale,
                                  equal_nan=True):
                return False
    return True


def graph_of(spec, device, generator):
    """One op's forward + backward captured in a CUDA graph: (spec, graph, static inputs, options, outputs,
    gradients)."""
    options = {name: values[0] for name, values in spec.options.items()}
    static = make_inputs(spec, (64, 256), torch.float32, device, generator)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call(spec, static, options)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs, grads = call(spec, static, options)
    return spec, graph, static, options, outputs, grads


def refill(static, fresh):
    """Copies fresh inputs into a graph's static ones; no reference to them outlives the call, so the
    allocator's live bytes between calls are the run's own state."""
    with torch.no_grad():
        for target, source in zip(static, fresh):
            target.copy_(source)


def run_processes(args):
    """Runs the calls in args.processes child processes at once and sums their summaries."""
    script = os.path.abspath(__file__)
    start = time.time()
    children = []
    for rank in range(args.processes):
        calls = args.calls // args.processes + (rank < args.calls % args.processes)
        command = [sys.executable, script, "--calls", str(calls), "--device", args.device, "--check-every",
                   str(args.check_every), "--graph-every", str(args.graph_every), "--seed", str(args.seed + rank),
                   "--seconds", str(args.seconds)]
        children.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    summaries, failed = [], False
    for child in children:
        output, _ = child.communicate()
        failed = failed or child.returncode != 0
        lines = output.strip().splitlines()
        summaries.append(json.loads(lines[-1]) if lines else {})
    summary = {"device": args.device, "processes": args.processes}
    for key in ("calls", "checks", "wrong", "graph_replays"):
        summary[key] = sum(part.get(key, 0) for part in summaries)
    for key in ("memory_growth_bytes", "second_half_growth_bytes"):
        summary[key] = [part.get(key) for part in summaries]
    summary["seconds"] = round(time.time() - start, 1)
    print(json.dumps(summary))
    sys.exit(1 if failed else 0)


def return_freed_blocks_to_the_system():
    """glibc raises its mmap threshold each time a large block is freed, after which freed tensors stay
    in its heap and a CPU run's resident memory grows without a leak; fixed at its default (128 KB),
    every large block goes back to the system when freed, so resident memory follows what is live."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: its allocator keeps its own policy
    mmap_threshold_option = -3  # M_MMAP_THRESHOLD
    libc.mallopt(mmap_threshold_option, 128 * 1024)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=None, help="default 10^6 on CUDA, 20000 on CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--check-every", type=int, default=97)
    parser.add_argument("--graph-every", type=int, default=1000, help="CUDA: replay the captured graphs this often")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=0, help="stop each process's calls after this long (0: never)")
    args = parser.parse_args()
    device = args.device
    calls = args.calls or (10**6 if device == "cuda" else 20000)
    if args.processes > 1:
        args.calls = calls
        return run_processes(args)
    if device == "cpu":
        return_freed_blocks_to_the_system()
    rng = random.Random(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    device_generator = torch.Generator(device=device).manual_seed(args.seed) if device == "cuda" else None
    dtypes = [torch.float32, torch.bfloat16] + ([torch.float16] if device == "cuda" else [])
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()] if device == "cuda" else [None]
    graphs = [graph_of(spec, device, generator) for spec in OPS] if device == "cuda" else []

    def memory():
        gc.collect()
        if device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    checks = failures = replays = 0
    baseline = None
    start = time.time()
    made = 0
    inputs = outputs = grads = None
    middle = None
    for index in range(calls):
        if args.seconds and time.time() - start > args.seconds:
            break
        made += 1
        if index in (min(1000, calls // 10), calls // 2):
            inputs = outputs = grads = None  # the last call's tensors are not part of the allocator's state
            if baseline is None:
                baseline = memory()
            else:
                middle = memory()
        spec = rng.choice(OPS)
        dtype = rng.choice(dtypes)
        shape = rng.choice(SHAPES)
        options = options_of(spec, rng)
        stream = streams[index % len(streams)]
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            inputs = make_inputs(spec, shape, dtype, device, generator, device_generator)
            outputs, grads = call(spec, inputs, options)
            if index % args.check_every == 0:
                checks += 1
                if not matches_reference(spec, inputs, options, outputs, grads, dtype):
                    failures += 1
                    print(f"wrong answer: call {index}, {spec.name}, {dtype}, {shape}, {options}", file=sys.stderr)
        if graphs and index % args.graph_every == 0:
            spec_of_graph, graph, static, graph_options, graph_outputs, graph_grads = rng.choice(graphs)
            refill(static, make_inputs(spec_of_graph, (64, 256), torch.float32, device, generator, device_generator))
            graph.replay()
            replays += 1
            checks += 1
            if not matches_reference(spec_of_graph, static, graph_options, graph_outputs, graph_grads, torch.float32):
                failures += 1
                print(f"wrong answer: graph replay {replays}, {spec_of_graph.name}", file=sys.stderr)
    del inputs, outputs, grads
    end = memory()
    # A leak grows with the calls, so the verdict is the growth over the second half of the run: the
    # one-time allocations of an op's first calls (a stream's first library workspace) come before it.
    if baseline is None:
        growth = later_growth = 0
    else:
        growth = end - baseline
        later_growth = end - (baseline if middle is None else middle)
    # CPU: the process's resident memory may move by allocator pages; CUDA: the allocator's live bytes.
    allowed = 0 if device == "cuda" else 64 * 2**20
    summary = {"device": device, "calls": made, "checks": checks, "wrong": failures, "graph_replays": replays,
               "memory_growth_bytes": growth, "second_half_growth_bytes": later_growth,
               "seconds": round(time.time() - start, 1)}
    print(json.dumps(summary))
    sys.exit(1 if failures or later_growth > allowed else 0)


if __name__ == "__main__":
    main()
