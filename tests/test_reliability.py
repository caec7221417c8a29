"""Every op under threads, CUDA graphs, side streams, a second GPU and tensors of more than 2^31
elements. Ops come from op_specs.OPS, so a new op is covered by adding it there."""
import threading

import pytest
import torch

from conftest import DEVICES, TOLERANCE
from op_specs import OPS

SPEC_IDS = [spec.name for spec in OPS]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def default_options(spec):
    return {name: (values[0] if isinstance(values, tuple) else values[-1]) for name, values in spec.options.items()}


def random_inputs(spec, shape, dtype, device, generator=None):
    return [torch.randn(s, generator=generator).to(dtype=dtype, device=device) for s in spec.input_shapes(shape)]


def assert_matches_reference(spec, inputs, out, options, dtype=torch.float32):
    expected = spec.reference(*[t.double() for t in inputs], **options)
    tolerance = TOLERANCE[dtype] * 4
    torch.testing.assert_close(out.double().cpu(), expected.cpu(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("device", DEVICES)
def test_eight_threads_call_every_op(device):
    """8 Python threads call every op forward and backward at once; every result is checked."""
    failures = []
    start = threading.Barrier(8)

    def worker(index):
        try:
            generator = torch.Generator().manual_seed(index)
            start.wait()
            for _ in range(20):
                for spec in OPS:
                    options = default_options(spec)
                    inputs = [t.requires_grad_(True) for t in random_inputs(spec, (33, 64), torch.float32, device, generator)]
                    out = spec.call(inputs, **options)
                    assert_matches_reference(spec, [t.detach() for t in inputs], out.detach(), options)
                    grads = torch.autograd.grad(out.sum(), inputs)
                    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
                    expected = torch.autograd.grad(spec.reference(*inputs64, **options).sum(), inputs64)
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


@needs_cuda
@pytest.mark.parametrize("spec", OPS, ids=SPEC_IDS)
def test_cuda_graph_replays_on_new_values(spec):
    options = default_options(spec)
    static = [t.requires_grad_(True) for t in random_inputs(spec, (64, 256), torch.float32, "cuda")]
    grad_out = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch.cuda.graphs asks
        for _ in range(2):
            torch.autograd.grad(spec.call(static, **options), static, grad_out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = spec.call(static, **options)
        static_grads = torch.autograd.grad(static_out, static, grad_out)
    for _ in range(3):
        fresh = random_inputs(spec, (64, 256), torch.float32, "cuda")
        with torch.no_grad():
            for target, source in zip(static, fresh):
                target.copy_(source)
        graph.replay()
        assert_matches_reference(spec, fresh, static_out, options)
        inputs64 = [t.double().requires_grad_(True) for t in fresh]
        expected = torch.autograd.grad(spec.reference(*inputs64, **options), inputs64, grad_out.double())
        for grad, want in zip(static_grads, expected):
            torch.testing.assert_close(grad.double(), want, rtol=1e-5, atol=1e-5)


@needs_cuda
@pytest.mark.parametrize("spec", OPS, ids=SPEC_IDS)
def test_side_stream(spec):
    options = default_options(spec)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        inputs = random_inputs(spec, (128, 512), torch.float32, "cuda")  # made on the side stream
        out = spec.call(inputs, **options)
    stream.synchronize()
    assert_matches_reference(spec, inputs, out, options)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("spec", OPS, ids=SPEC_IDS)
def test_second_gpu(spec):
    options = default_options(spec)
    torch.cuda.set_device(0)  # the current device differs from the inputs' device
    inputs = [t.requires_grad_(True) for t in random_inputs(spec, (64, 256), torch.float32, "cuda:1")]
    out = spec.call(inputs, **options)
    assert out.device == torch.device("cuda:1")
    assert_matches_reference(spec, [t.detach() for t in inputs], out.detach(), options)
    grads = torch.autograd.grad(out.sum(), inputs)
    assert all(grad.device == torch.device("cuda:1") for grad in grads)


HUGE_ROW = 8192
HUGE_ROWS = (1 << 31) // HUGE_ROW + 3  # output of more than 2^31 elements


def huge_memory_ok(bytes_needed):
    if not torch.cuda.is_available():
        return False
    free, _ = torch.cuda.mem_get_info()
    return free > bytes_needed


@needs_cuda
@pytest.mark.parametrize("spec", OPS, ids=SPEC_IDS)
def test_more_than_2_to_the_31_elements(spec):
    """Forward and backward on an output of more than 2^31 bf16 elements, checked on rows at both
    ends and on the rows around element 2^31."""
    shape = (HUGE_ROWS, HUGE_ROW)
    input_shapes = spec.input_shapes(shape)
    elements = sum(torch.Size(s).numel() for s in input_shapes)
    if not huge_memory_ok(2 * 3 * (elements + 2 * HUGE_ROWS * HUGE_ROW)):
        pytest.skip("needs about 3x the inputs and outputs in free GPU memory")
    options = default_options(spec)
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=generator).requires_grad_(True)
              for s in input_shapes]
    out = spec.call(inputs, **options)
    grad_out = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    grads = torch.autograd.grad(out, inputs, grad_out)
    boundary_row = (1 << 31) // HUGE_ROW
    for rows in (slice(0, 2), slice(boundary_row - 1, boundary_row + 2), slice(HUGE_ROWS - 2, HUGE_ROWS)):
        def take(tensor, full_rows):
            return tensor[rows] if tensor.dim() == 2 and tensor.shape[0] == full_rows else tensor
        piece = [take(t.detach(), HUGE_ROWS).float() for t in inputs]
        pieces64 = [p.double().requires_grad_(True) for p in piece]
        expected = spec.reference(*pieces64, **options)
        tolerance = TOLERANCE[torch.bfloat16] * 4
        torch.testing.assert_close(out[rows].double(), expected, rtol=tolerance, atol=tolerance)
        expected_grads = torch.autograd.grad(expected, pieces64, grad_out[rows].double())
        for grad, want, tensor in zip(grads, expected_grads, inputs):
            if tensor.dim() == 2:  # per-row gradients; reduced ones (bias) span every row
                torch.testing.assert_close(grad[rows].double(), want, rtol=tolerance, atol=tolerance)
    del inputs, out, grads
    torch.cuda.empty_cache()
