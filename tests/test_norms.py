"""rms_norm, add_rms_norm, layer_norm and add_layer_norm on every dtype and device: values, mixed
precision, layouts, long rows, gradients, determinism and bad input (the modules: test_norm_modules.py)."""
import re

import pytest
import torch
from torch.library import opcheck

from conftest import assert_bad_input_rejected, assert_close_to_reference, cuda_kernels_run_by, library_runs_sm90_code
from op_specs import NORM_CASES, random


SPECS = NORM_CASES
# A reduction over the row, then one rounding: a few ulp of the dtype.
SCALE = 4.0


@pytest.fixture(params=list(SPECS))
def spec(request):
    return SPECS[request.param]


def weight_form_on_the_cpu(spec, device, **_):
    """On the CPU one loop serves every shape, so the weight forms' cases (offset, weight None) run the
    many-shape tests on CUDA only, where shapes pick kernels; test_norm_weight_forms.py covers the CPU."""
    return device == "cpu" and SPECS[spec].weight_form != "weight"


def assert_outputs_close(spec, outs, inputs, dtype, scale=SCALE):
    expected = spec.reference(*inputs)
    assert len(outs) == len(expected)
    for out, want in zip(outs, expected):
        assert out.dtype == inputs[0].dtype and out.shape == inputs[0].shape and out.is_contiguous()
        assert_close_to_reference(out, want, dtype, scale)
    if spec.residual:  # residual_out is exactly what eager stores for x + residual
        assert torch.equal(outs[1], inputs[0] + inputs[1])


@pytest.mark.parametrize("shape", [(1,), (3,), (1023,), (4097,), (3, 5, 7), (64, 129), (16, 256), (2, 8192),
                                   (1100, 2048), (1200, 4096), (200, 8192), (1030, 6144)])
@pytest.mark.absent.with_args(weight_form_on_the_cpu)
def test_values(spec, device, dtype, shape):
    """The last three reach the CUDA forward's one-, two- and four-pack blocks of many rows (1024+
    rows: blocks of 256; 129-1023 rows: blocks of up to 512); decode-sized shapes use two packs only
    with a residual."""
    inputs = spec.inputs(shape, dtype, device)
    assert_outputs_close(spec, spec.fused(*inputs), inputs, dtype)


@pytest.mark.parametrize("shape", [(1024, 16376), (1100, 16384)])
@pytest.mark.cuda_only
def test_values_of_many_rows_of_2048_packs(spec, device, dtype, shape):
    """On CUDA, 16-bit rows of 2047 and 2048 packs take four packs per thread in blocks of 512; bf16
    without a residual, a kernel held to three blocks per SM (2047: the last pack of the last thread empty)."""
    inputs = spec.inputs(shape, dtype, device)
    assert_outputs_close(spec, spec.fused(*inputs), inputs, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(5, 24), (7, 33), (3, 8192)])
def test_float32_weight_with_16_bit_x(spec, device, dtype, shape):
    """Mixed precision (as apex): float32 weight and bias, 16-bit x; the result keeps x's dtype."""
    inputs = spec.inputs(shape, dtype, device, weight_dtype=torch.float32)
    outs = spec.fused(*inputs)
    assert_outputs_close(spec, outs, inputs, dtype)
    leaves = [t.requires_grad_(True) for t in inputs]
    grads = torch.autograd.grad(spec.fused(*leaves), leaves, [random(shape, dtype, device) for _ in outs])
    for grad, tensor in zip(grads, leaves):
        assert grad.dtype == tensor.dtype and grad.shape == tensor.shape


@pytest.mark.parametrize("hidden", [20000, 32768, 65536 + 8, 1 << 17])
def test_long_rows(spec, device, hidden):
    """Rows longer than a block keeps in registers (the long-row kernels on CUDA), aligned or not."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    inputs = [t.requires_grad_(True) for t in spec.inputs((3, hidden), dtype, device)]
    outs = spec.fused(*inputs)
    assert_outputs_close(spec, [o.detach() for o in outs], [t.detach() for t in inputs], dtype)
    grad_outs = [random((3, hidden), dtype, device) for _ in outs]
    grads = torch.autograd.grad(outs, inputs, grad_outs)
    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    expected = torch.autograd.grad(spec.reference(*inputs64), inputs64, [g.double() for g in grad_outs])
    for grad, want in zip(grads, expected):
        assert_close_to_reference(grad, want, dtype, SCALE * 4)


def test_empty_rows_and_columns(spec, device, dtype):
    for shape in [(0, 8), (4, 0), (2, 0, 3)]:
        inputs = [t.requires_grad_(True) for t in spec.inputs(shape, dtype, device)]
        outs = spec.fused(*inputs)
        assert all(out.shape == shape for out in outs)
        grads = torch.autograd.grad([o.sum() for o in outs], inputs)
        for grad, tensor in zip(grads, inputs):
            assert grad.shape == tensor.shape
            if tensor.dim() == 1:  # sums over no rows
                assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("layout", ["transposed", "row_stride", "unaligned", "leading_dims", "strided_weight"])
def test_strided_inputs(spec, device, dtype, layout):
    def view(base):
        if layout == "transposed":
            return base.t()  # [96, 40]: column stride 40
        if layout == "row_stride":
            return base[:, :64]
        if layout == "unaligned":
            return base.view(-1)[1:1 + 33 * 64].view(33, 64)
        if layout == "leading_dims":
            return base.view(8, 5, 96)[::2, :, 16:80]
        return base
    inputs = spec.inputs((40, 96), dtype, device)
    x = view(random((40, 96), dtype, device))
    tensors = [x] + ([view(random((40, 96), dtype, device))] if spec.residual else [])
    hidden = x.shape[-1]
    for parameter in inputs[1 + spec.residual:]:
        values = random((2 * hidden,), parameter.dtype, device)
        tensors.append(values[::2] if layout == "strided_weight" else values[:hidden].contiguous())
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    outs = spec.fused(*leaves)
    assert_outputs_close(spec, [o.detach() for o in outs], tensors, dtype)
    grad_outs = [random(x.shape, dtype, device) for _ in outs]
    grads = torch.autograd.grad(outs, leaves, grad_outs)
    inputs64 = [t.double().requires_grad_(True) for t in tensors]
    expected = torch.autograd.grad(spec.reference(*inputs64), inputs64, [g.double() for g in grad_outs])
    for grad, want, leaf in zip(grads, expected, leaves):
        rows = x.numel() // hidden
        assert_close_to_reference(grad, want, dtype, SCALE * (rows ** 0.5 if leaf.dim() == 1 else 2))


def test_nan_and_inf_follow_eager(spec, device):
    """A NaN or Inf poisons its own row (as in eager), never another row."""
    shape = (4, 16)
    inputs = spec.inputs(shape, torch.float32, device)
    inputs[0][1, 3] = float("nan")
    inputs[0][2, 5] = float("inf")
    outs = spec.fused(*inputs)
    expected = spec.reference(*inputs)
    for out, want in zip(outs, expected):
        torch.testing.assert_close(out.double(), want, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(outs[0][[0, 3]]).all() and not torch.isfinite(outs[0][1]).all()


@pytest.mark.parametrize("shape", [(2, 8192), (1200, 4096), (200, 8192)])
@pytest.mark.absent(lambda spec, **_: not SPECS[spec].residual or SPECS[spec].weight_form != "weight")
def test_residual_out_is_the_eager_sum_at_every_magnitude(spec, device, dtype, shape):
    """residual_out equals eager's x + residual bit for bit, subnormals to overflow included; the
    shapes reach the CUDA forward's one-, two- and four-pack kernels."""
    low, high = {torch.float16: (-26, 16), torch.bfloat16: (-135, 128)}.get(dtype, (-60, 60))
    generator = torch.Generator().manual_seed(0)

    def spread():
        exponents = torch.randint(low, high, shape, generator=generator).double()
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * 2 ** exponents).to(dtype).to(device)

    x, residual = spread(), spread()
    _, _, weight, bias = spec.split(spec.inputs(shape, dtype, device))
    outs = spec.fused(*[t for t in (x, residual, weight, bias) if t is not None])
    torch.testing.assert_close(outs[1], x + residual, rtol=0, atol=0, equal_nan=True)  # inf - inf: NaN


def check_gradients(spec, inputs, dtype, device, used):
    """Gradients of the chosen outputs for every input against float64; weight and bias gradients
    (sums over the rows) get a tolerance that grows with the row count."""
    shape = inputs[0].shape
    outs = spec.fused(*inputs)
    chosen = {"both": [0, 1][:len(outs)], "out": [0], "residual_out": [1]}[used]
    grad_outs = [random(shape, dtype, device) for _ in chosen]
    grads = torch.autograd.grad([outs[i] for i in chosen], inputs, grad_outs, allow_unused=True)
    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    reference = spec.reference(*inputs64)
    expected = torch.autograd.grad([reference[i] for i in chosen], inputs64, [g.double() for g in grad_outs],
                                   allow_unused=True)
    rows = inputs[0].numel() // shape[-1]
    for index, (grad, want, tensor) in enumerate(zip(grads, expected, inputs)):
        is_parameter = index > spec.residual  # weight, bias
        if want is None or (used == "residual_out" and is_parameter):
            assert grad is None or torch.count_nonzero(grad) == 0  # weight and bias do not reach h
            continue
        assert grad.shape == tensor.shape and grad.dtype == tensor.dtype
        assert_close_to_reference(grad, want, dtype, SCALE * (rows ** 0.5 if is_parameter else 2))


def absent_gradient_case(spec, dtype, used, weight_dtype=None, **_):
    """Combinations that do not exist: one-output ops have no choice of outputs, float32 weights go
    with 16-bit x only."""
    return (not SPECS[spec].residual and used != "both") or (
        weight_dtype is not None and dtype not in (torch.float16, torch.bfloat16))


def check_gradients_of_random_inputs(spec, shape, dtype, device, used, weight_dtype=None):
    """check_gradients on random inputs of `shape`."""
    inputs = [t.requires_grad_(True) for t in spec.inputs(shape, dtype, device, weight_dtype=weight_dtype)]
    check_gradients(spec, inputs, dtype, device, used)


@pytest.mark.parametrize("shape", [(33, 17), (2, 3, 64), (129,), (300, 1024)])
@pytest.mark.parametrize("used", ["both", "out", "residual_out"])
@pytest.mark.absent.with_args(absent_gradient_case)
def test_gradients(spec, device, dtype, shape, used):
    check_gradients_of_random_inputs(spec, shape, dtype, device, used)


@pytest.mark.parametrize("shape", [(600, 8192), (300, 16384), (600, 4096), (600, 3000)])
@pytest.mark.parametrize("used", ["both", "out"])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32], ids=["weight_like_x", "float32_weight"])
@pytest.mark.absent.with_args(absent_gradient_case)
@pytest.mark.cuda_only
def test_gradients_of_many_long_rows(spec, device, dtype, shape, used, weight_dtype):
    """More rows than resident blocks, of over 256 16-byte packs (two or four per thread, 3000
    leaving some threads' last pack empty): on CUDA the backward copies each block's next row into
    shared memory while it works on the current one (cp.async), with and without a grad_residual
    to stage, and with float32 weights for 16-bit x."""
    check_gradients_of_random_inputs(spec, shape, dtype, device, used, weight_dtype)


@pytest.mark.cuda_only
@pytest.mark.absent(lambda spec, **_: SPECS[spec].layer)
def test_many_long_rows_run_the_staged_backward(spec, device):
    """The RMSNorms' backward of 600 bf16 rows of 8192 runs the staged kernel, with a grad_residual too:
    its 48 KiB of slots beside the kernel's static arrays once failed the shared-memory opt-in, and the
    plain kernel ran instead, correct and 9% slower. (Whether the LayerNorms' column sums in shared
    memory leave room for the slots at full occupancy depends on the GPU.)"""
    shared_per_sm = getattr(torch.cuda.get_device_properties(device), "shared_memory_per_multiprocessor", None)
    if shared_per_sm is not None and shared_per_sm < 2 * 52 * 1024:
        pytest.skip("two staged blocks per SM need about 100 KiB of shared memory (H100/H200: 228 KiB)")
    inputs = [t.requires_grad_(True) for t in spec.inputs((600, 8192), torch.bfloat16, device)]

    def step():
        outputs = spec.fused(*inputs)
        torch.autograd.backward(outputs, [torch.randn_like(out) for out in outputs])

    kernels = cuda_kernels_run_by(step)
    # Template arguments: ..., kWidth, kPacks, kSharedSums, kStaged, kRowStatistics.
    staged = re.compile(r"norm_backward_cached_kernel<.*, (true|false), true, false>")
    assert any(staged.search(name) for name in kernels), kernels


@pytest.mark.parametrize("shape", [(300, 128), (4, 64, 16, 64), (257, 256), (1000, 24), (129, 96)])
@pytest.mark.parametrize("used", ["both", "out"])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32], ids=["weight_like_x", "float32_weight"])
@pytest.mark.absent.with_args(absent_gradient_case)
@pytest.mark.cuda_only
def test_values_and_gradients_of_many_short_rows(spec, device, dtype, shape, used, weight_dtype):
    """More than decode's 128 rows of up to 32 16-byte packs, as the per-head norms of queries and keys
    (64 to 256 columns): on CUDA a group of 8, 16 or 32 lanes per row, many rows per block, the
    group's last lanes idle where a row has fewer packs (24 and 96 columns, and float64's wider rows);
    forward values and every gradient against float64, mixed precision too."""
    inputs = spec.inputs(shape, dtype, device, weight_dtype=weight_dtype)
    assert_outputs_close(spec, spec.fused(*inputs), inputs, dtype)
    check_gradients_of_random_inputs(spec, shape, dtype, device, used, weight_dtype)


@pytest.mark.cuda_only
def test_many_short_rows_run_the_short_row_kernels(spec, device):
    """4096 bf16 rows of 128 (16 packs) run the short-row kernels forward and backward, with the weight
    gradients' partial rows summed by columns; 128 rows (decode) and rows of 33 packs do not."""
    def kernels_of(shape):
        inputs = [t.requires_grad_(True) for t in spec.inputs(shape, torch.bfloat16, device)]

        def step():
            outputs = spec.fused(*inputs)
            torch.autograd.backward(outputs, [torch.randn_like(out) for out in outputs])
        return cuda_kernels_run_by(step)

    kernels = kernels_of((4096, 128))
    assert any("norm_forward_short_rows_kernel" in name for name in kernels), kernels
    assert any("norm_backward_short_rows_kernel" in name for name in kernels), kernels
    assert any("column_sum_kernel" in name for name in kernels), kernels
    for shape in [(128, 128), (4096, 264)]:
        assert not any("short_rows" in name for name in kernels_of(shape)), shape


@pytest.mark.parametrize("shape", [(1, 8192), (5, 4096), (16, 2048), (16, 8192), (7, 3000), (128, 16384),
                                   (1, 12296), (1, 3000), (1, 2048), (3, 1032), (8, 8192), (4, 16384),
                                   (5, 7000)])
@pytest.mark.parametrize("used", ["both", "out"])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32], ids=["weight_like_x", "float32_weight"])
@pytest.mark.absent.with_args(absent_gradient_case)
@pytest.mark.absent.with_args(weight_form_on_the_cpu)
def test_gradients_of_decode_rows(spec, device, dtype, shape, used, weight_dtype):
    """Decode: 1 to 128 rows of 1032 to 16384 elements, the rows a serving step normalises (on CUDA
    from Hopper, one row spread over a cluster of 2 to 8 blocks with one or two packs per thread,
    last blocks part empty at 3000, 7000 and 12296; up to 32 rows of 4096 to 8192 and 16 of 16384 as
    one cluster per row, forward and backward; elsewhere the wide decode blocks, and backward blocks of
    up to 512 threads with one or two packs each; from 2 rows the weight gradients summed by columns
    from each row's mean and rstd), mixed precision too."""
    check_gradients_of_random_inputs(spec, shape, dtype, device, used, weight_dtype)


@pytest.mark.cuda_only
def test_one_row_runs_on_a_cluster(spec, device):
    """From Hopper, the backward of one bf16 row of 8192 runs on a cluster of SMs, and so does the
    forward (RMSNorm or LayerNorm): the decode path is taken, not silently replaced by the one-block
    kernels it measured faster than. A build without sm_90 code (TORCH_CUDA_ARCH_LIST=8.0+PTX) must
    take those kernels instead: its PTX, JIT-compiled on Hopper, cannot launch clusters."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: CUDA from Hopper")
    inputs = [t.requires_grad_(True) for t in spec.inputs((1, 8192), torch.bfloat16, device)]

    def step():
        outputs = spec.fused(*inputs)
        torch.autograd.backward(outputs[0], torch.randn_like(outputs[0]))

    kernels = cuda_kernels_run_by(step)
    clusters = library_runs_sm90_code()  # a build without sm_90 code must not launch clusters
    assert any("norm_backward_cluster_kernel" in name for name in kernels) == clusters, kernels
    forward = "layer_norm_forward_cluster_kernel" if spec.layer else "rms_norm_forward_cluster_kernel"
    assert any(forward in name for name in kernels) == clusters, kernels


@pytest.mark.parametrize("shape", [(8, 8192), (32, 8192), (33, 8192), (16, 16384), (17, 16384), (16, 4096),
                                   (1, 4096), (4, 2048)])
@pytest.mark.cuda_only
def test_forward_rows_on_clusters(spec, device, shape):
    """From Hopper, the forward of a few rows runs one cluster per row: up to 32 rows of four to eight
    blocks of one pack per thread (4096 and 8192), up to 16 of two packs (16384); the LayerNorm without
    a residual only on full clusters of eight blocks (8192 and 16384). Rows of two blocks (2048) and
    more rows stay in one block per row."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: CUDA from Hopper")
    inputs = spec.inputs(shape, torch.bfloat16, device)
    kernels = cuda_kernels_run_by(lambda: spec.fused(*inputs))
    rows, hidden = shape
    expected = hidden >= 4096 and rows <= (32 if hidden <= 8192 else 16)
    if spec.layer and not spec.residual:
        expected = expected and hidden >= 8192
    expected = expected and library_runs_sm90_code()
    forward = "layer_norm_forward_cluster_kernel" if spec.layer else "rms_norm_forward_cluster_kernel"
    assert any(forward in name for name in kernels) == expected, kernels


@pytest.mark.parametrize("shape", [(2, 8192), (32, 8192), (33, 8192), (16, 16384), (17, 16384), (16, 4096),
                                   (1, 2048), (4, 2048)])
@pytest.mark.cuda_only
def test_backward_rows_on_clusters(spec, device, shape):
    """From Hopper, the backward of a few rows runs one cluster per row under the forwards' rule (up to
    32 rows of 4096 and 8192, 16 of 16384, one row of 2048), and from 2 rows the weight gradients are
    then summed by columns (weight_grad_kernel) from the rows' statistics."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters: CUDA from Hopper")
    inputs = [t.requires_grad_(True) for t in spec.inputs(shape, torch.bfloat16, device)]
    outputs = spec.fused(*inputs)
    grad = torch.randn_like(outputs[0])
    kernels = cuda_kernels_run_by(lambda: torch.autograd.grad(outputs[0], inputs, grad, retain_graph=True))
    rows, hidden = shape
    expected = (rows == 1 or (hidden >= 4096 and rows <= (32 if hidden <= 8192 else 16))) and library_runs_sm90_code()
    assert any("norm_backward_cluster_kernel" in name for name in kernels) == expected, kernels
    assert any("weight_grad_kernel" in name for name in kernels) == (rows > 1), kernels


@pytest.mark.parametrize("rows_kind", ["mean_far_from_zero", "one_massive_channel"])
@pytest.mark.parametrize("shape", [(4, 8192), (300, 1024), (3, 4097), (2, 16384)])
def test_rows_far_from_centred(spec, device, dtype, shape, rows_kind):
    """Rows whose mean is 1000 standard deviations from zero, and rows with one channel at 1000 (the
    "massive activations" of large language models): output and x-gradient against float64. The
    statistics must not come from differences of large sums: that cancellation would miss by the
    row's spread (1e4 tolerances and more); float rounding of values near 1000 costs up to ~50."""
    inputs = spec.inputs(shape, dtype, device)
    x = inputs[0].float()
    if rows_kind == "mean_far_from_zero":
        x = x + 1000
    else:
        x[..., 0] = 1000
    inputs[0] = x.to(dtype)
    if spec.residual:  # zero: the float64 reference adds unrounded, and near 1000 a 16-bit h rounds by up to 4
        inputs[1] = torch.zeros_like(inputs[1])
    inputs = [t.requires_grad_(True) for t in inputs]
    outs = spec.fused(*inputs)
    grad_out = random(shape, dtype, device)
    (grad_x,) = torch.autograd.grad(outs[0], inputs[0], grad_out)
    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    reference = spec.reference(*inputs64)
    (expected_grad_x,) = torch.autograd.grad(reference[0], inputs64[0], grad_out.double())
    assert_close_to_reference(outs[0], reference[0], dtype, 200)
    assert_close_to_reference(grad_x, expected_grad_x, dtype, 200)


def test_gradcheck_and_gradgradcheck(spec, device):
    inputs = [t.requires_grad_(True) for t in spec.inputs((3, 6), torch.float64, device)]
    assert torch.autograd.gradcheck(lambda *t: spec.fused(*t), inputs)
    assert torch.autograd.gradgradcheck(lambda *t: spec.fused(*t), inputs)


@pytest.mark.parametrize("with_grad_residual", [False, True])
def test_backward_ops_gradcheck(device, with_grad_residual):
    def tensor(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=device, requires_grad=True)
    grad, x, weight, grad_residual = tensor(4, 10), tensor(4, 10), tensor(10), tensor(4, 10)
    extra = (grad_residual,) if with_grad_residual else ()
    assert torch.autograd.gradcheck(
        lambda g, a, w, *r: torch.ops.fused.rms_norm_backward(g, a, w, 1e-6, *r), (grad, x, weight, *extra))
    assert torch.autograd.gradcheck(
        lambda g, a, w, *r: torch.ops.fused.layer_norm_backward(g, a, w, 1e-5, *r), (grad, x, weight, *extra))


# Every dtype through the schema and Meta checks; the autograd and AOT-dispatch checks, which do not
# depend on the dtype, with one 32-bit and one 16-bit type.
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.absent(lambda dtype, requires_grad, **_: requires_grad and dtype not in (torch.float32, torch.bfloat16))
def test_opcheck(spec, device, dtype, requires_grad):
    inputs = [t.requires_grad_(requires_grad) for t in spec.inputs((5, 24), dtype, device)]
    opcheck(spec.op, spec.op_arguments(inputs))
    x, residual, weight, _ = spec.split([t.detach() for t in inputs])
    h = x + residual if spec.residual else x
    backward = torch.ops.fused.layer_norm_backward.default if spec.layer else torch.ops.fused.rms_norm_backward.default
    grad = random((5, 24), dtype, device)
    grad_residual = random((5, 24), dtype, device) if spec.residual else None
    arguments = [t.requires_grad_(requires_grad) if t is not None else None for t in (grad, h, weight)]
    opcheck(backward, (*arguments, spec.eps, grad_residual, spec.offset))


@pytest.mark.parametrize("rows", [1000, 20000])
@pytest.mark.absent(lambda spec, **_: not (SPECS[spec].weight or SPECS[spec].bias))
def test_weight_gradient_is_deterministic(spec, device, rows):
    """Weight and bias gradients are bit-identical run to run (no atomics in the sums)."""
    inputs = [t.requires_grad_(True) for t in spec.inputs((rows, 256), torch.bfloat16, device)]
    grad_outs = [random((rows, 256), torch.bfloat16, device) for _ in spec.fused(*inputs)]
    parameters = [t for t in inputs if t.dim() == 1]
    first = torch.autograd.grad(spec.fused(*inputs), parameters, grad_outs)
    for _ in range(3):
        again = torch.autograd.grad(spec.fused(*inputs), parameters, grad_outs)
        for a, b in zip(first, again):
            assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# Bad input.

def bad_weight_form_inputs(f32, bf16):
    """(call, message fragment) for each bad weight offset or weight None, tensors from f32 and bf16."""
    return [
        (lambda: torch.ops.fused.rms_norm(f32(4, 8), None, 1e-6, 1.0),
         "fused::rms_norm: expected offset 0.0 when weight is None (offset is added to the weight), but got "
         "offset 1"),
        (lambda: torch.ops.fused.layer_norm_backward(f32(4, 8), f32(4, 8), None, 1e-5, None, -0.5),
         "fused::layer_norm_backward: expected offset 0.0 when weight is None (offset is added to the weight), "
         "but got offset -0.5"),
        (lambda: torch.ops.fused.add_layer_norm(bf16(4, 8), bf16(4, 8), None, f32(8)),
         "fused::add_layer_norm: expected bias to have x's dtype (BFloat16) when weight is None (the unit weight "
         "the op uses has x's dtype), but got Float"),
        (lambda: torch.ops.fused.add_rms_norm(f32(4, 8), f32(4, 8), f32(9), 1e-6, 1.0),
         "fused::add_rms_norm: expected weight to be 1-D of size x.size(-1) = 8, but got shape [9]"),
    ]


def bad_norm_inputs(device):
    """(call, message fragment) for each bad input the norm ops reject."""
    f32 = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    bf16 = lambda *shape: torch.randn(*shape, device=device, dtype=torch.bfloat16)  # noqa: E731
    cases = [
        (lambda: torch.ops.fused.rms_norm(f32(4, 8), f32(7)),
         "fused::rms_norm: expected weight to be 1-D of size x.size(-1) = 8, but got shape [7]"),
        (lambda: torch.ops.fused.rms_norm(f32(4, 8), f32(8).double()),
         "fused::rms_norm: expected weight to have x's dtype (Float) or float32 for float16/bfloat16 x, but got Double"),
        (lambda: torch.ops.fused.rms_norm(bf16(4, 8), f32(8).half()),
         "fused::rms_norm: expected weight to have x's dtype (BFloat16) or float32 for float16/bfloat16 x, but got Half"),
        (lambda: torch.ops.fused.rms_norm(f32(4, 8), f32(8), -1e-6),
         "fused::rms_norm: expected eps >= 0, but got -1e-06"),
        (lambda: torch.ops.fused.rms_norm(torch.tensor(1.0, device=device), f32(1)),
         "fused::rms_norm: expected x to have at least one dim (normalised over the last), but got a 0-d tensor"),
        (lambda: torch.ops.fused.rms_norm(torch.ones(4, 8, dtype=torch.int32, device=device), f32(8)),
         "fused::rms_norm: expected x to be float64, float32, float16 or bfloat16, but got Int"),
        (lambda: torch.ops.fused.add_rms_norm(f32(4, 8), f32(4, 7), f32(8)),
         "fused::add_rms_norm: expected residual to have the shape of x [4, 8], but got [4, 7]"),
        (lambda: torch.ops.fused.add_rms_norm(f32(4, 8), f32(8), f32(8)),
         "fused::add_rms_norm: expected residual to have the shape of x [4, 8], but got [8]"),
        (lambda: torch.ops.fused.add_rms_norm(bf16(4, 8), f32(4, 8), f32(8)),
         "fused::add_rms_norm: expected residual to have the same dtype as x (BFloat16), but got Float"),
        (lambda: torch.ops.fused.layer_norm(f32(4, 8), f32(8), f32(9)),
         "fused::layer_norm: expected bias to be 1-D of size x.size(-1) = 8, but got shape [9]"),
        (lambda: torch.ops.fused.add_layer_norm(bf16(4, 8), bf16(4, 8), f32(8), bf16(8)),
         "fused::add_layer_norm: expected bias to have the same dtype as weight (Float), but got BFloat16"),
        (lambda: torch.ops.fused.add_layer_norm(f32(4, 8), f32(4, 8), f32(8), f32(8), float("nan")),
         "fused::add_layer_norm: expected eps >= 0, but got nan"),
        (lambda: torch.ops.fused.rms_norm_backward(f32(4, 7), f32(4, 8), f32(8), 1e-6),
         "fused::rms_norm_backward: expected grad to have the shape of x [4, 8], but got [4, 7]"),
        (lambda: torch.ops.fused.layer_norm_backward(f32(4, 8), f32(4, 8), f32(8), 1e-5, f32(4, 8).double()),
         "fused::layer_norm_backward: expected grad_residual to have the same dtype as x (Float), but got Double"),
    ] + bad_weight_form_inputs(f32, bf16)
    if device == "cuda":
        cases.append((lambda: torch.ops.fused.rms_norm(f32(4, 8), torch.randn(8)),
                      "fused::rms_norm: expected weight to be on the same device as x (cuda:0), but got cpu"))
        cases.append((lambda: torch.ops.fused.add_layer_norm(f32(4, 8), torch.randn(4, 8), f32(8), f32(8)),
                      "fused::add_layer_norm: expected residual to be on the same device as x (cuda:0), but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(20))
@pytest.mark.absent(lambda device, case: case >= len(bad_norm_inputs(device)))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_norm_inputs(device), case)
