"""bias_gelu, silu_mul and gelu_mul on every dtype and device: values, layouts, gradients, modes, errors."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import fused_ops
from conftest import assert_bad_input_rejected, assert_close_to_reference, assert_same_gradients, cuda_kernels_run_by
from op_specs import ACTIVATION_CASES, random


SPECS = ACTIVATION_CASES
# Transcendental functions in float32 are within a few ulp, not correctly rounded.
SCALE = 4.0


@pytest.fixture(params=list(SPECS))
def spec(request):
    return SPECS[request.param]


def reference64(spec, inputs):
    return spec.reference(*[t.double() for t in inputs])


@pytest.mark.parametrize("shape", [(1,), (3,), (1023,), (4097,), (3, 5, 7), (64, 129), (16, 256)])
def test_values(spec, device, dtype, shape):
    inputs = spec.inputs(shape, dtype, device)
    out = spec.fused(*inputs)
    assert out.shape == shape and out.dtype == dtype and out.device == inputs[0].device
    assert_close_to_reference(out, reference64(spec, inputs), dtype, SCALE)


@pytest.mark.parametrize("shape", [(2001, 1024), (4099, 136)])
def test_values_on_many_rows(spec, device, dtype, shape):
    """Enough rows for the CUDA grid whose threads take groups of rows in turn (two groups each for the
    erf GELU with 16-bit results), with odd row counts so that a thread's last group is cut short."""
    inputs = spec.inputs(shape, dtype, device)
    assert_close_to_reference(spec.fused(*inputs), reference64(spec, inputs), dtype, SCALE)


def test_empty_rows_and_columns(spec, device, dtype):
    for shape in [(0, 8), (4, 0), (2, 0, 3)]:
        inputs = [t.requires_grad_(True) for t in spec.inputs(shape, dtype, device)]
        out = spec.fused(*inputs)
        assert out.shape == shape
        grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
        for grad, tensor in zip(grads, inputs):
            assert grad.shape == tensor.shape
            if grad.dim() == 1 and not spec.gated:  # a bias summed over no rows
                assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("layout", ["transposed", "row_stride", "unaligned", "leading_dims", "strided_bias"])
def test_strided_inputs(spec, device, dtype, layout):
    base = random((40, 96), dtype, device)
    if layout == "transposed":
        x = base.t()  # [96, 40]: column stride 40
    elif layout == "row_stride":
        x = base[:, :64]  # rows of 96 elements, 64 used
    elif layout == "unaligned":
        x = base.view(-1)[1:1 + 33 * 64].view(33, 64)
    elif layout == "leading_dims":
        x = base.view(8, 5, 96)[::2, :, 16:80]  # leading dims do not collapse
    else:
        x = base
    if spec.gated:
        inputs = (x,)
    else:
        bias = random((2 * x.shape[-1],), dtype, device)[::2] if layout == "strided_bias" \
            else random(x.shape[-1:], dtype, device)
        inputs = (x, bias)
    inputs = [t.requires_grad_(True) for t in inputs]
    out = spec.fused(*inputs)
    assert out.is_contiguous()
    assert_close_to_reference(out, reference64(spec, inputs), dtype, SCALE)
    grad_out = random(out.shape, dtype, device)
    grads = torch.autograd.grad(out, inputs, grad_out)
    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    expected = torch.autograd.grad(reference64(spec, inputs64), inputs64, grad_out.double())
    for grad, want in zip(grads, expected):
        assert_close_to_reference(grad, want, dtype, SCALE * (4 if grad.dim() == 1 and not spec.gated else 1))


def test_nan_and_inf_follow_eager(spec, device):
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 30.0, -30.0])
    grid = torch.stack([specials.repeat_interleave(9), specials.repeat(9)], dim=-1).to(device)  # [81, 2]
    inputs = (grid.reshape(-1, 2),) if spec.gated else (grid[:, 0:1].contiguous(), grid[:1, 1].contiguous())
    out = spec.fused(*inputs)
    eager = spec.reference(*inputs)
    torch.testing.assert_close(out, eager, equal_nan=True, rtol=1e-6, atol=1e-6)


# (1025, 40): many rows per block of the fused bias-gradient sums, and an odd last row pair.
# On CUDA, bias_gelu's bias gradient: (2, 64) one thread per column over both rows, (2, 3, 64) and
# (40, 520) the few-rows kernel (one and several column groups), (1025, 40) partial rows + column sums.
@pytest.mark.parametrize("shape", [(33, 17), (2, 64), (2, 3, 64), (40, 520), (129,), (1025, 40)])
def test_gradients(spec, device, dtype, shape):
    inputs = [t.requires_grad_(True) for t in spec.inputs(shape, dtype, device)]
    assert_gradients_match_reference(spec, inputs, random(shape, dtype, device))


def assert_gradients_match_reference(spec, inputs, grad_out):
    grads = torch.autograd.grad(spec.fused(*inputs), inputs, grad_out)
    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    expected = torch.autograd.grad(spec.reference(*inputs64), inputs64, grad_out.double())
    for grad, want, tensor in zip(grads, expected, inputs):
        assert grad.shape == tensor.shape and grad.dtype == tensor.dtype
        # the bias gradient is a sum over rows, rounded once to the input dtype
        assert_close_to_reference(grad, want, tensor.dtype,
                                  SCALE * (4 if grad.dim() == 1 and not spec.gated else 1))


# On CUDA, decode-sized grids give each thread 1, 2, 4 or 8 elements (an H200: up to 8448, 16896 and
# 33792 elements, then 8) with no loops; here a block at the end of each row is part empty, except in
# (1, 8192), (16, 8192) and (4, 4096), whose blocks cover the rows exactly (the kernel without bounds checks).
@pytest.mark.parametrize("shape", [(1, 8200), (2, 4104), (2, 8200), (4, 8200), (8, 8200), (3, 5, 1032),
                                   (1, 8192), (16, 8192), (4, 4096)])
def test_values_and_gradients_on_decode_rows(spec, device, dtype, shape):
    inputs = [t.requires_grad_(True) for t in spec.inputs(shape, dtype, device)]
    assert_close_to_reference(spec.fused(*inputs), reference64(spec, inputs), dtype, SCALE)
    assert_gradients_match_reference(spec, inputs, random(shape, dtype, device))


@pytest.mark.cuda_only
def test_decode_rows_run_the_decode_kernel(spec, device):
    """Forward and backward of two rows of 8192 run the loop-free decode kernel and nothing else."""
    inputs = [t.requires_grad_(True) for t in spec.inputs((2, 8192), torch.bfloat16, device)]
    grad_out = random((2, 8192), torch.bfloat16, device)
    kernels = cuda_kernels_run_by(lambda: torch.autograd.grad(spec.fused(*inputs), inputs, grad_out))
    assert len(kernels) == 2 and all("rowwise_decode_kernel" in name for name in kernels), kernels


@pytest.mark.cuda_only
def test_decode_rows_over_2_to_the_31_elements_apart(spec, device):
    """Two rows 2^31 elements apart overflow the decode kernel's 32-bit offsets: the looping kernel
    with 64-bit offsets takes them, and the values and gradients stay right."""
    row_stride = 2**31
    width = 2 * 1024 if spec.gated else 1024
    if torch.cuda.mem_get_info(device)[0] < 3 * row_stride * 2:
        pytest.skip("needs about 12 GiB of free GPU memory")
    storage = torch.empty(row_stride + width, dtype=torch.bfloat16, device=device)
    x = storage.as_strided((2, width), (row_stride, 1))
    x.copy_(random((2, width), torch.bfloat16, device))
    inputs = [x] if spec.gated else [x, random((width,), torch.bfloat16, device)]
    inputs = [t.requires_grad_(True) for t in inputs]
    out = spec.fused(*inputs)
    assert_close_to_reference(out, reference64(spec, inputs), torch.bfloat16, SCALE)
    grad_out = random(out.shape, torch.bfloat16, device)
    assert_gradients_match_reference(spec, inputs, grad_out)
    kernels = cuda_kernels_run_by(lambda: torch.autograd.grad(spec.fused(*inputs), inputs, grad_out))
    assert len(kernels) == 2 and all("rowwise_vectorized_kernel" in name for name in kernels), kernels


def test_gradcheck_and_gradgradcheck(spec, device):
    inputs = [t.requires_grad_(True) for t in spec.inputs((3, 6), torch.float64, device)]
    assert torch.autograd.gradcheck(spec.fused, inputs)
    assert torch.autograd.gradgradcheck(spec.fused, inputs)


def test_backward_op_gradcheck(device):
    x = torch.randn(4, 10, dtype=torch.float64, device=device, requires_grad=True)
    bias = torch.randn(10, dtype=torch.float64, device=device, requires_grad=True)
    grad = torch.randn(4, 10, dtype=torch.float64, device=device, requires_grad=True)
    half_grad = torch.randn(4, 5, dtype=torch.float64, device=device, requires_grad=True)
    for approximate in ("none", "tanh"):
        assert torch.autograd.gradcheck(
            lambda g, a, b: torch.ops.fused.bias_gelu_backward(g, a, b, approximate), (grad, x, bias))
        assert torch.autograd.gradcheck(
            lambda g, a: torch.ops.fused.gelu_mul_backward(g, a, approximate), (half_grad, x))
    assert torch.autograd.gradcheck(torch.ops.fused.silu_mul_backward, (half_grad, x))


# Every dtype through the schema and Meta checks; the autograd and AOT-dispatch checks, which do not
# depend on the dtype, with one 32-bit and one 16-bit type.
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.absent(lambda dtype, requires_grad, **_: requires_grad and dtype not in (torch.float32, torch.bfloat16))
def test_opcheck(spec, device, dtype, requires_grad):
    inputs = [t.requires_grad_(requires_grad) for t in spec.inputs((5, 24), dtype, device)]
    opcheck(spec.op, (*inputs, *spec.extra))
    grad = random((5, 24), dtype, device).requires_grad_(requires_grad)
    if spec.gated:
        backward = torch.ops.fused.silu_mul_backward.default if not spec.extra else torch.ops.fused.gelu_mul_backward.default
    else:
        backward = torch.ops.fused.bias_gelu_backward.default
    opcheck(backward, (grad, *[t.detach().requires_grad_(requires_grad) for t in inputs], *spec.extra))


# On CUDA each row count takes another bias-sum path: one thread per column, the few-rows lanes
# kernel, partial rows + column sums.
@pytest.mark.parametrize("rows", [2, 40, 512])
def test_bias_gradient_is_deterministic(device, rows):
    x = torch.randn(rows, 96, device=device, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(96, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(rows, 96, device=device, dtype=torch.bfloat16)
    first = torch.autograd.grad(fused_ops.bias_gelu(x, bias, "tanh"), bias, grad)[0]
    for _ in range(3):
        again = torch.autograd.grad(fused_ops.bias_gelu(x, bias, "tanh"), bias, grad)[0]
        assert torch.equal(first, again)


class MLPActivations(torch.nn.Module):
    """Every activation module in one model, for the mode tests."""

    def __init__(self, features=32):
        super().__init__()
        self.bias_gelu = fused_ops.nn.BiasGELU(features, approximate="tanh")
        torch.nn.init.normal_(self.bias_gelu.bias)
        self.silu_mul = fused_ops.nn.SiLUMul()
        self.gelu_mul = fused_ops.nn.GELUMul()

    def forward(self, x):
        h = self.bias_gelu(x)
        return self.silu_mul(h) + self.gelu_mul(h)


def mlp_composite(model, x):
    h = F.gelu(x + model.bias_gelu.bias, approximate="tanh")
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up + F.gelu(gate) * up


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_save_load(device, kind, tmp_path):
    model = MLPActivations().to(device)
    x = torch.randn(6, 32, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, (x,))
        scripted.save(str(tmp_path / "model.pt"))
        loaded = torch.jit.load(str(tmp_path / "model.pt"), map_location=device)
    x.requires_grad_(True)
    out = loaded(x)
    torch.testing.assert_close(out, mlp_composite(model, x), rtol=1e-5, atol=1e-5)
    assert_same_gradients(out, mlp_composite(model, x), (x,), rtol=1e-5, atol=1e-5)


def test_compile_fullgraph_dynamic_forward_and_backward(device):
    torch._dynamo.reset()
    model = MLPActivations().to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        x = torch.randn(rows, 32, device=device, requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, mlp_composite(model, x), rtol=1e-5, atol=1e-5)
        assert_same_gradients(out, mlp_composite(model, x), (x, model.bias_gelu.bias), rtol=1e-4, atol=1e-4)


def test_export_keeps_one_node_each(device):
    model = MLPActivations().to(device)
    x = torch.randn(6, 32, device=device)
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("rows")},))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    for op in (torch.ops.fused.bias_gelu.default, torch.ops.fused.silu_mul.default, torch.ops.fused.gelu_mul.default):
        assert targets.count(op) == 1
    x2 = torch.randn(9, 32, device=device)
    torch.testing.assert_close(exported.module()(x2), mlp_composite(model, x2), rtol=1e-5, atol=1e-5)


def bad_activation_inputs(device):
    """(call, message fragment) for each bad input the activation ops reject."""
    f32 = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    cases = [
        (lambda: torch.ops.fused.bias_gelu(f32(4, 8), f32(7)),
         "fused::bias_gelu: expected bias to be 1-D of size x.size(-1) = 8, but got shape [7]"),
        (lambda: torch.ops.fused.bias_gelu(f32(4, 8), f32(1, 8)), "expected bias to be 1-D of size x.size(-1) = 8"),
        (lambda: torch.ops.fused.bias_gelu(f32(4, 8), f32(8).double()),
         "fused::bias_gelu: expected bias to have the same dtype as x (Float), but got Double"),
        (lambda: torch.ops.fused.bias_gelu(f32(4, 8), f32(8), "fast"),
         "fused::bias_gelu: expected approximate to be 'none' or 'tanh', but got 'fast'"),
        (lambda: torch.ops.fused.bias_gelu(torch.tensor(1.0, device=device), f32(1)),
         "fused::bias_gelu: expected x to have at least one dim"),
        (lambda: torch.ops.fused.silu_mul(f32(4, 7)),
         "fused::silu_mul: expected the last dim of x to be even (x is [..., 2d]: gate, then up), but got shape [4, 7]"),
        (lambda: torch.ops.fused.silu_mul(torch.ones(4, 8, dtype=torch.int64, device=device)),
         "fused::silu_mul: expected x to be float64, float32, float16 or bfloat16, but got Long"),
        (lambda: torch.ops.fused.gelu_mul(f32(3, 5)), "fused::gelu_mul: expected the last dim of x to be even"),
        (lambda: torch.ops.fused.gelu_mul(f32(3, 4), "exact"),
         "fused::gelu_mul: expected approximate to be 'none' or 'tanh', but got 'exact'"),
        (lambda: torch.ops.fused.silu_mul_backward(f32(3, 4), f32(3, 4)),
         "fused::silu_mul_backward: expected grad of shape [3, 2], but got [3, 4]"),
        (lambda: torch.ops.fused.bias_gelu_backward(f32(3, 5), f32(3, 4), f32(4)),
         "fused::bias_gelu_backward: expected grad to have the shape of x [3, 4], but got [3, 5]"),
    ]
    if device == "cuda":
        cases.append((lambda: torch.ops.fused.bias_gelu(f32(4, 8), torch.randn(8)),
                      "fused::bias_gelu: expected bias to be on the same device as x (cuda:0), but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(12))
@pytest.mark.absent(lambda device, case: case >= len(bad_activation_inputs(device)))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_activation_inputs(device), case)


def test_modules_reject_bad_approximate():
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        fused_ops.nn.BiasGELU(8, approximate="fast")
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        fused_ops.nn.GELUMul(approximate="exact")
