"""Every op under threads, CUDA graphs, side streams, a second GPU and tensors of more than 2^31
elements. Ops come from op_specs.OPS, so a new op is covered by adding it there."""
import os
import threading

import pytest
import torch

from conftest import DEVICES, TOLERANCE
from op_specs import OPS, as_outputs

SPEC_IDS = [spec.name for spec in OPS]
# Rounds of every op per thread in test_eight_threads_call_every_op; compute-sanitizer runs take fewer.
THREAD_ROUNDS = int(os.environ.get("FUSED_OPS_THREAD_ROUNDS", "20"))


def default_options(spec):
    return {name: (values[0] if isinstance(values, tuple) else values[-1]) for name, values in spec.options.items()}


def random_inputs(spec, shape, dtype, device, generator=None):
    shapes = spec.input_shapes(shape)
    inputs = []
    for index, input_shape in enumerate(shapes):
        tensor = spec.special_input(index, shapes, dtype, device, generator)
        inputs.append(torch.randn(input_shape, generator=generator).to(dtype=dtype, device=device)
                      if tensor is None else tensor)
    return inputs


def as_float64(tensors):
    return [t.double() if t.is_floating_point() else t for t in tensors]


def with_grad(spec, inputs):
    """inputs, those that take gradients requiring grad; and those."""
    for index, tensor in enumerate(inputs):
        tensor.requires_grad_(spec.takes_grad(index))
    return inputs, [t for t in inputs if t.requires_grad]


def assert_matches_reference(spec, inputs, outs, options, dtype=torch.float32):
    inputs64 = as_float64(inputs)
    expected = as_outputs(spec.reference(*inputs64, **options))
    tolerance = TOLERANCE[dtype] * 4
    atol = tolerance * spec.value_scale(inputs64, **options)
    for out, want in zip(as_outputs(outs), expected, strict=True):
        torch.testing.assert_close(out.double().cpu(), want.cpu(), rtol=tolerance, atol=atol)


def output_sum(outs):
    return sum(out.sum() for out in as_outputs(outs))


@pytest.mark.parametrize("device", DEVICES)
def test_eight_threads_call_every_op(device):
    """8 Python threads call every op forward and backward at once; every result is checked."""
    failures = []
    start = threading.Barrier(8)

    def worker(index):
        try:
            generator = torch.Generator().manual_seed(index)
            start.wait()
            for _ in range(THREAD_ROUNDS):
                for spec in OPS:
                    options = default_options(spec)
                    inputs, leaves = with_grad(spec, random_inputs(spec, (33, 64), torch.float32, device, generator))
                    outs = spec.call(inputs, **options)
                    assert_matches_reference(spec, [t.detach() for t in inputs], outs, options)
                    grads = torch.autograd.grad(output_sum(outs), leaves)
                    inputs64 = [t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t
                                for t in inputs]
                    expected = torch.autograd.grad(output_sum(spec.reference(*inputs64, **options)),
                                                   [t for t in inputs64 if t.requires_grad])
                    for grad, want in zip(grads, expected):
                        torch.testing.assert_close(grad.double().cpu(), want.cpu(), rtol=1e-4, atol=1e-4)
        except Exception as error:  # noqa: BLE001 - reported below with the thread's index
            failures.append(f"thread {index}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


@pytest.mark.cuda_only
@pytest.mark.parametrize("spec", OPS, ids=SPEC_IDS)
def test_cuda_graph_replays_on_new_values(spec):
    options = default_options(spec)
    static, leaves = with_grad(spec, random_inputs(spec, (64, 256), torch.float32, "cuda"))
    grad_outs = [torch.randn(out.shape, device="cuda") for out in as_outputs(spec.call(static, **options))]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch.cuda.graphs asks
        for _ in range(2):
            torch.autograd.grad(as_outputs(spec.call(static, **options)), leaves, grad_outs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = spec.call(static, **options)
        static_grads = torch.autograd.grad(as_outputs(static_out), leaves, grad_outs)
    for _ in range(3):
        fresh = random_inputs(spec, (64, 256), torch.float32, "cuda")
        with torch.no_grad():
            for target, source in zip(static, fresh):
                target.copy_(source)
        graph.replay()
        assert_matches_reference(spec, fresh, static_out, options)
        inputs64, leaves64 = with_grad(spec, as_float64(fresh))
        expected = torch.autograd.grad(as_outputs(spec.reference(*inputs64, **options)), leaves64,
                                       [g.double() for g in grad_outs])
        for grad, want in zip(static_grads, expected):
            torch.testing.assert_close(grad.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda_only
@pytest.mark.parametrize("spec", OPS, ids=SPEC_IDS)
def test_side_stream(spec):
    options = default_options(spec)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        inputs = random_inputs(spec, (128, 512), torch.float32, "cuda")  # made on the side stream
        out = spec.call(inputs, **options)
    stream.synchronize()
    assert_matches_reference(spec, inputs, out, options)


CHAIN_STEPS = 5


def chain_inputs(spec, shape, options, device):
    """The first call's inputs, then each later call's own trailing inputs (y, bias, weight), and how
    many leading inputs the outputs replace. Every leaf is used once, so autograd adds no gradients
    up: under graph capture that addition would wait on the legacy default stream. Inputs that take
    gradients require grad."""
    first = random_inputs(spec, shape, torch.float32, device)
    leading = len(as_outputs(spec.call(first, **options)))
    later = [random_inputs(spec, shape, torch.float32, device)[leading:] for _ in range(CHAIN_STEPS - 1)]
    with_grad(spec, first)
    for inputs in later:
        for index, tensor in enumerate(inputs, start=leading):
            tensor.requires_grad_(spec.takes_grad(index))
    return [first, *later], leading


def chained_calls(spec, step_inputs, leading, options, call):
    """CHAIN_STEPS calls, each on the outputs of the one before with no other kernel between them:
    the outputs, viewed as rows of the first input's width, are the next call's x (and residual).
    The gated ops halve the rows at every step; outputs of their input's shape (norms, rotary) stay as they are."""
    current = list(step_inputs[0])
    for later in step_inputs[1:]:
        width = current[0].shape[-1]
        outs = as_outputs(call(*current, **options))
        current = [out if out.shape == before.shape else out.view(-1, width)
                   for out, before in zip(outs, current)] + list(later)
    return as_outputs(call(*current, **options))


def assert_chain_matches_reference(spec, step_inputs, leading, outs, grads, grad_outs, options):
    inputs64 = [[t.detach().double().cpu().requires_grad_(t.requires_grad) for t in inputs] for inputs in step_inputs]
    expected = chained_calls(spec, inputs64, leading, options, spec.reference)
    leaves64 = [t for inputs in inputs64 for t in inputs if t.requires_grad]
    expected_grads = torch.autograd.grad(expected, leaves64, [g.double().cpu() for g in grad_outs])
    pairs = [*zip(outs, expected, strict=True), *zip(grads, expected_grads, strict=True)]
    for actual, want in pairs:
        # relative to the largest value: the gated chains shrink theirs to about 1e-10
        torch.testing.assert_close(actual.double().cpu(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


# Ops whose outputs can be the next call's inputs (a loss cannot, nor a projection to another width).
CHAINED_SPECS = [spec for spec in OPS if spec.family not in ("cross_entropy", "down_projection")]


@pytest.mark.cuda_only
@pytest.mark.parametrize("spec", CHAINED_SPECS, ids=[spec.name for spec in CHAINED_SPECS])
@pytest.mark.parametrize("timing", ["eager", "graph"])
def test_back_to_back_dependent_calls(spec, timing):
    """Each kernel reads what the kernel just before it wrote and overwrites memory that kernel freed:
    on sm_90 the kernels launch as programmatic dependents (ops/common/cuda_launch.cuh), so a kernel
    that touched memory before its griddepcontrol.wait would read stale values here. A CUDA graph
    replays small calls back to back; eager, rows of 2048 keep the GPU's queue full."""
    options = default_options(spec)
    shape = (256, 512) if timing == "graph" else (1024, 2048)
    step_inputs, leading = chain_inputs(spec, shape, options, "cuda")
    leaves = [t for inputs in step_inputs for t in inputs if t.requires_grad]
    # Shapes only, without autograd: a graph made with autograd and kept alive would keep its leaves'
    # AccumulateGrad nodes on the default stream, and capturing any op's chain backward then fails.
    with torch.no_grad():
        probe = chained_calls(spec, step_inputs, leading, options, spec.fused)
    grad_outs = [torch.randn(out.shape).cuda() for out in probe]  # made by a copy: no CUDA RNG state

    def step():
        outs = chained_calls(spec, step_inputs, leading, options, spec.fused)
        return outs, torch.autograd.grad(outs, leaves, grad_outs)

    if timing == "eager":
        outs, grads = step()
        assert_chain_matches_reference(spec, step_inputs, leading, outs, grads, grad_outs, options)
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs, grads = step()
    for _ in range(2):
        with torch.no_grad():
            for leaf in leaves:
                leaf.copy_(torch.randn(leaf.shape))
        graph.replay()
        assert_chain_matches_reference(spec, step_inputs, leading, outs, grads, grad_outs, options)


@pytest.mark.cuda_only
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("spec", OPS, ids=SPEC_IDS)
def test_second_gpu(spec):
    options = default_options(spec)
    torch.cuda.set_device(0)  # the current device differs from the inputs' device
    inputs, leaves = with_grad(spec, random_inputs(spec, (64, 256), torch.float32, "cuda:1"))
    outs = spec.call(inputs, **options)
    assert all(out.device == torch.device("cuda:1") for out in as_outputs(outs))
    assert_matches_reference(spec, [t.detach() for t in inputs], outs, options)
    grads = torch.autograd.grad(output_sum(outs), leaves)
    assert all(grad.device == torch.device("cuda:1") for grad in grads)


HUGE_ROW = 8192
HUGE_ROWS = (1 << 31) // HUGE_ROW + 3  # output of more than 2^31 elements
LONG_ROW = 1 << 17  # norms: rows of 2^17 elements (the long-row kernels), T·H > 2^31
# Ops whose inputs are rows of the output's width; rotary_embedding's and linear_cross_entropy's own
# tests cover their heads and their chunks past 2^31 elements, and silu_mul_linear is silu_mul's
# kernels (covered here) and cuBLAS's products.
HUGE_CASES = [pytest.param(spec, (HUGE_ROWS, HUGE_ROW), id=f"{spec.name}-{HUGE_ROW}")
              for spec in OPS if spec.family not in ("rotary", "cross_entropy", "down_projection")] + [
    pytest.param(spec, ((1 << 31) // LONG_ROW + 3, LONG_ROW), id=f"{spec.name}-{LONG_ROW}")
    for spec in OPS if "norm" in spec.name]


def huge_memory_ok(bytes_needed):
    if not torch.cuda.is_available():
        return False
    free, _ = torch.cuda.mem_get_info()
    return free > bytes_needed


@pytest.mark.cuda_only
@pytest.mark.slow
@pytest.mark.parametrize("spec, shape", HUGE_CASES)
def test_more_than_2_to_the_31_elements(spec, shape):
    """Forward and backward on an output of more than 2^31 bf16 elements, checked on rows at both
    ends and on the rows around element 2^31."""
    rows, row = shape
    input_shapes = spec.input_shapes(shape)
    elements = sum(torch.Size(s).numel() for s in input_shapes)
    if not huge_memory_ok(2 * 3 * (elements + 2 * rows * row)):
        pytest.skip("needs about 3x the inputs and outputs in free GPU memory")
    options = default_options(spec)
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=generator).requires_grad_(True)
              for s in input_shapes]
    outs = as_outputs(spec.call(inputs, **options))
    grad_outs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator) for _ in outs]
    grads = torch.autograd.grad(outs, inputs, grad_outs)
    boundary_row = (1 << 31) // row
    for rows_checked in (slice(0, 2), slice(boundary_row - 1, boundary_row + 2), slice(rows - 2, rows)):
        def take(tensor):
            return tensor[rows_checked] if tensor.dim() == 2 and tensor.shape[0] == rows else tensor
        pieces64 = [take(t.detach()).double().requires_grad_(True) for t in inputs]
        expected = as_outputs(spec.reference(*pieces64, **options))
        tolerance = TOLERANCE[torch.bfloat16] * 4
        for out, want in zip(outs, expected, strict=True):
            torch.testing.assert_close(out[rows_checked].double(), want, rtol=tolerance, atol=tolerance)
        expected_grads = torch.autograd.grad(expected, pieces64, [take(g).double() for g in grad_outs])
        for grad, want, tensor in zip(grads, expected_grads, inputs):
            if tensor.dim() == 2:  # per-row gradients; reduced ones (bias, weight) span every row
                torch.testing.assert_close(grad[rows_checked].double(), want, rtol=tolerance, atol=tolerance)
    del inputs, outs, grads
    torch.cuda.empty_cache()
