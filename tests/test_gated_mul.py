"""gated_mul(gate, up, activation) = act(gate) * up with gate and up two tensors, and gated_mul_linear
(its down projection as one autograd node): values and gradients against float64 on every dtype and
device, for separate tensors, the halves of one gate/up tensor and strided views; modes and bad inputs."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import fused_ops
from conftest import TOLERANCE, assert_bad_input_rejected, assert_close_to_reference, cuda_kernels_run_by
from op_specs import GATED_ACTIVATIONS, gated_mul_reference, random

ACTIVATIONS = list(GATED_ACTIVATIONS)
# Transcendental functions in float32 are within a few ulp, not correctly rounded.
SCALE = 4.0


@pytest.fixture(params=ACTIVATIONS)
def activation(request):
    return request.param


def reference64(gate, up, activation):
    return gated_mul_reference(gate.detach().double(), up.detach().double(), activation)


def assert_values_and_gradients(gate, up, activation, dtype):
    """gated_mul's result and its gradients for gate and up against the float64 composite."""
    gate, up = gate.requires_grad_(True), up.requires_grad_(True)
    out = fused_ops.gated_mul(gate, up, activation)
    assert out.shape == gate.shape and out.dtype == dtype and out.device == gate.device and out.is_contiguous()
    assert_close_to_reference(out, reference64(gate, up, activation), dtype, SCALE)
    grad_out = random(out.shape, dtype, gate.device)
    grads = torch.autograd.grad(out, (gate, up), grad_out)
    gate64, up64 = (t.detach().double().requires_grad_(True) for t in (gate, up))
    expected = torch.autograd.grad(gated_mul_reference(gate64, up64, activation), (gate64, up64), grad_out.double())
    for grad, want, tensor in zip(grads, expected, (gate, up)):
        assert grad.shape == tensor.shape and grad.dtype == dtype
        assert_close_to_reference(grad, want, dtype, SCALE)


def two_tensors(shape, dtype, device):
    return random(shape, dtype, device), random(shape, dtype, device)


def halves_of_one(shape, dtype, device):
    """gate, up = gate_up.chunk(2, -1): rows strided by 2d, last dim contiguous."""
    gate_up = random(tuple(shape[:-1]) + (2 * shape[-1],), dtype, device)
    return gate_up.chunk(2, -1)


@pytest.mark.parametrize("layout", [two_tensors, halves_of_one], ids=["separate", "halves"])
@pytest.mark.parametrize("shape", [(1,), (3,), (1023,), (4097,), (3, 5, 7), (64, 129), (16, 256)])
def test_values_and_gradients(layout, shape, activation, dtype, device):
    gate, up = layout(shape, dtype, device)
    assert_values_and_gradients(gate, up, activation, dtype)


# Decode-sized rows (the loop-free CUDA kernel, exact and part-empty blocks) and many rows.
@pytest.mark.parametrize("layout", [two_tensors, halves_of_one], ids=["separate", "halves"])
@pytest.mark.parametrize("shape", [(1, 8192), (2, 8200), (16, 8192), (4099, 136)])
def test_decode_and_many_rows(layout, shape, activation, device):
    gate, up = layout(shape, torch.bfloat16, device)
    assert_values_and_gradients(gate, up, activation, torch.bfloat16)


def test_zero_dim_and_empty(activation, dtype, device):
    for shape in [(), (0,), (0, 8), (4, 0), (2, 0, 3)]:
        gate, up = two_tensors(shape, dtype, device)
        assert_values_and_gradients(gate, up, activation, dtype)


def strided_pair(layout, dtype, device):
    base = random((40, 2 * 96), dtype, device)
    if layout == "transposed":  # column strides 40 and 1: one operand not vectorizable
        return random((96, 40), dtype, device).t(), random((40, 96), dtype, device)
    if layout == "both_transposed":
        return random((96, 40), dtype, device).t(), random((96, 40), dtype, device).t()
    if layout == "unaligned":  # the data pointers 2 bytes (or more) past 16-byte alignment
        flat = random((2 * 33 * 64 + 2,), dtype, device)
        return flat[1:1 + 33 * 64].view(33, 64), flat[2 + 33 * 64:].view(33, 64)
    if layout == "unaligned_halves":  # halves of rows of 2d + 1 elements
        return base[:, 1:1 + 2 * 48].chunk(2, -1)
    if layout == "halves_reversed":  # up before gate in memory
        up, gate = base.chunk(2, -1)
        return gate, up
    if layout == "stepped":  # every other element of the last dim
        return base[:, ::2], base[:, 1::2]
    if layout == "leading_dims":  # leading dims that do not collapse
        gate, up = base.view(8, 5, 192).chunk(2, -1)
        return gate[::2], up[1::2]
    raise AssertionError(layout)


@pytest.mark.parametrize("layout", ["transposed", "both_transposed", "unaligned", "unaligned_halves",
                                    "halves_reversed", "stepped", "leading_dims"])
def test_strided_and_unaligned_views(layout, activation, dtype, device):
    gate, up = strided_pair(layout, dtype, device)
    assert_values_and_gradients(gate, up, activation, dtype)


def test_inputs_are_not_modified(activation, device):
    gate, up = halves_of_one((5, 24), torch.float32, device)
    before = gate.clone(), up.clone()
    torch.autograd.grad(fused_ops.gated_mul(gate.requires_grad_(), up.requires_grad_(), activation),
                        (gate, up), torch.ones(5, 24, device=device))
    assert torch.equal(gate, before[0]) and torch.equal(up, before[1])


def test_nan_and_inf_follow_eager(activation, device):
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0, 30.0, -30.0])
    gate = specials.repeat_interleave(9).to(device)
    up = specials.repeat(9).to(device)
    out = fused_ops.gated_mul(gate, up, activation)
    # Eager on strided views, as test_activations compares silu_mul and gelu_mul: torch 2.11's vectorised
    # CPU GELU gives NaN at -inf where its element-wise path (and every CUDA path) gives 0.
    strided = torch.stack([gate, up], dim=-1)
    reference = gated_mul_reference(strided[..., 0], strided[..., 1], activation)
    torch.testing.assert_close(out, reference, equal_nan=True, rtol=1e-6, atol=1e-6)


def test_matches_silu_mul_and_gelu_mul_on_halves(device):
    """On the halves of one tensor gated_mul is silu_mul / gelu_mul, bit for bit (the same kernels)."""
    x = random((37, 2 * 200), torch.bfloat16, device)
    gate, up = x.chunk(2, -1)
    assert torch.equal(fused_ops.gated_mul(gate, up, "silu"), fused_ops.silu_mul(x))
    assert torch.equal(fused_ops.gated_mul(gate, up, "gelu"), fused_ops.gelu_mul(x, "none"))
    assert torch.equal(fused_ops.gated_mul(gate, up, "gelu_tanh"), fused_ops.gelu_mul(x, "tanh"))


def test_gradcheck_and_gradgradcheck(activation, device):
    gate, up = (torch.randn(3, 6, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2))
    function = lambda g, u: fused_ops.gated_mul(g, u, activation)  # noqa: E731
    assert torch.autograd.gradcheck(function, (gate, up))
    assert torch.autograd.gradgradcheck(function, (gate, up))
    grad = torch.randn(3, 6, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: torch.ops.fused.gated_mul_backward(*t, activation), (grad, gate, up))


# The schema, Meta and autograd registrations do not depend on the dtype (test_values_* cover the dtypes).
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(activation, device, requires_grad):
    gate, up = (t.requires_grad_(requires_grad) for t in halves_of_one((5, 24), torch.float32, device))
    opcheck(torch.ops.fused.gated_mul.default, (gate, up, activation))
    separate = [t.requires_grad_(requires_grad) for t in two_tensors((5, 24), torch.float32, device)]
    opcheck(torch.ops.fused.gated_mul.default, (*separate, activation))
    grad = random((5, 24), torch.float32, device).requires_grad_(requires_grad)
    opcheck(torch.ops.fused.gated_mul_backward.default, (grad, *separate, activation))


@pytest.mark.cuda_only
def test_halves_and_separate_tensors_run_the_vectorized_kernels(device):
    """Both layouts take the 16-byte path: the decode kernel for two rows, the looping kernel for many."""
    for layout in (two_tensors, halves_of_one):
        for shape, kernel in (((2, 8192), "rowwise_decode_kernel"), ((4096, 8192), "rowwise_vectorized_kernel")):
            gate, up = (t.requires_grad_(True) for t in layout(shape, torch.bfloat16, device))
            grad_out = random(shape, torch.bfloat16, device)
            kernels = cuda_kernels_run_by(lambda: torch.autograd.grad(fused_ops.gated_mul(gate, up), (gate, up), grad_out))
            assert len(kernels) == 2 and all(kernel in name for name in kernels), (layout.__name__, shape, kernels)


# ---- gated_mul_linear

# gate's shape, n, and whether gate and up are the halves of one tensor (else two tensors)
LINEAR_SHAPES = [([8], 3, False), ([1, 2], 1, True), ([5, 12], 7, False), ([5, 12], 7, True), ([2, 3, 64], 17, True),
                 ([0, 6], 4, False)]


def linear_inputs(gate_shape, n, dtype, device, bias=True, halves=False):
    generator = torch.Generator().manual_seed(sum(gate_shape) + n)
    d = gate_shape[-1]
    if halves:
        gate, up = torch.randn(gate_shape[:-1] + [2 * d], generator=generator).to(dtype=dtype, device=device).chunk(2, -1)
    else:
        gate, up = (torch.randn(gate_shape, generator=generator).to(dtype=dtype, device=device) for _ in range(2))
    weight = (torch.randn(n, d, generator=generator) / d ** 0.5).to(dtype=dtype, device=device)
    b = torch.randn(n, generator=generator).to(dtype=dtype, device=device) if bias else None
    return gate, up, weight, b


def linear_reference(gate, up, weight, bias, activation):
    return F.linear(gated_mul_reference(gate.double(), up.double(), activation), weight.double(),
                    None if bias is None else bias.double())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("gate_shape, n, halves", LINEAR_SHAPES,
                         ids=["x".join(map(str, shape)) + f"-{n}" + ("-halves" if halves else "") for shape, n, halves in LINEAR_SHAPES])
def test_linear_values_and_gradients(gate_shape, n, halves, bias, activation, dtype, device):
    gate, up, weight, b = linear_inputs(gate_shape, n, dtype, device, bias, halves)
    leaves = [t.requires_grad_() for t in (gate, up, weight, b) if t is not None]
    out = fused_ops.gated_mul_linear(gate, up, weight, b, activation)
    assert out.dtype == dtype and out.shape == torch.Size(gate_shape[:-1] + [n])
    doubles = [t.detach().double().requires_grad_() for t in leaves]
    want = linear_reference(*doubles[:3], doubles[3] if bias else None, activation)
    scale = TOLERANCE[dtype] * SCALE * max(1.0, gate_shape[-1] ** 0.5)
    torch.testing.assert_close(out.double(), want, rtol=scale, atol=scale)
    grad = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7)).to(device)
    got = torch.autograd.grad(out, leaves, grad.to(dtype))
    expected = torch.autograd.grad(want, doubles, grad)
    for g, e, leaf in zip(got, expected, leaves):
        assert g.dtype == dtype and g.shape == leaf.shape
        largest = max(1.0, e.abs().max().item()) if e.numel() else 1.0
        torch.testing.assert_close(g.double(), e, rtol=scale, atol=scale * largest * max(1.0, n ** 0.5))


@pytest.mark.parametrize("needs_grad", [(2,), (1,), (0, 3)], ids=["weight", "up", "gate_and_bias"])
def test_linear_partial_requires_grad(needs_grad, device):
    inputs = list(linear_inputs([4, 5], 6, torch.float64, device))
    leaves = [inputs[i].requires_grad_() for i in needs_grad]
    got = torch.autograd.grad(fused_ops.gated_mul_linear(*inputs, activation="gelu").sum(), leaves)
    want = torch.autograd.grad(linear_reference(*inputs, "gelu").sum(), leaves)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


def test_linear_autograd_saves_gate_up_and_weight_not_the_activation(device):
    gate, up, weight, b = linear_inputs([16, 32], 8, torch.float32, device)
    gate.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        fused_ops.gated_mul_linear(gate, up, weight, b)
    assert sorted(saved) == sorted([(16, 32), (16, 32), (8, 32)])  # gate, up, weight; no activation


def test_linear_gradcheck_and_gradgradcheck(activation, device):
    for bias in (True, False):
        gate, up, weight, b = linear_inputs([2, 3, 4], 5, torch.float64, device, bias)
        inputs = tuple(t.requires_grad_() for t in (gate, up, weight, b) if t is not None)
        function = lambda *t: fused_ops.gated_mul_linear(*t[:3], t[3] if bias else None, activation)  # noqa: E731
        assert torch.autograd.gradcheck(function, inputs)
        assert torch.autograd.gradgradcheck(function, inputs)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_linear_opcheck(device, requires_grad):
    gate, up, weight, b = (t.requires_grad_(requires_grad) for t in linear_inputs([3, 8], 5, torch.float32, device))
    opcheck(torch.ops.fused.gated_mul_linear.default, (gate, up, weight, b, "gelu"))
    opcheck(torch.ops.fused.gated_mul_linear.default, (gate, up, weight, None, "silu"))
    grad = torch.randn(3, 5, device=device).requires_grad_(requires_grad)
    opcheck(torch.ops.fused.gated_mul_linear_backward.default, (grad, gate, up, weight, "gelu_tanh", [True] * 4))
    opcheck(torch.ops.fused.gated_mul_linear_backward.default,
            (grad, gate, up, weight, "silu", [False, True, True, False]))


# ---- modes: TorchScript, torch.compile, torch.export

class GatedMLP(torch.nn.Module):
    """gate_proj and up_proj kept as two modules, then each op."""

    def __init__(self, hidden=16, intermediate=24, activation: str = "silu"):
        super().__init__()
        self.gate_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = torch.nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = torch.nn.Linear(intermediate, hidden)
        self.activation = activation

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        h = torch.ops.fused.gated_mul(gate, up, self.activation)
        return torch.ops.fused.gated_mul_linear(gate, up, self.down_proj.weight, self.down_proj.bias,
                                                self.activation) + h.sum(-1, keepdim=True)


def mlp_composite(model, x):
    gate, up = model.gate_proj(x), model.up_proj(x)
    h = gated_mul_reference(gate, up, model.activation)
    return model.down_proj(h) + h.sum(-1, keepdim=True)


def assert_model_matches_composite(model, run, x, parameters=True):
    """run(x) and its gradients for x (and the model's parameters, where run uses them) against the composite."""
    out = run(x)
    want = mlp_composite(model, x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    leaves = [x, *model.parameters()] if parameters else [x]
    for grad, expected in zip(torch.autograd.grad(out.sum(), leaves), torch.autograd.grad(want.sum(), leaves)):
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_save_load(device, kind, tmp_path):
    model = GatedMLP(activation="gelu_tanh").to(device)
    x = torch.randn(6, 16, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, (x,))
        scripted.save(str(tmp_path / "model.pt"))
        loaded = torch.jit.load(str(tmp_path / "model.pt"), map_location=device)
    assert_model_matches_composite(model, loaded, x.requires_grad_(True), parameters=False)  # loaded has its own


def test_compile_fullgraph_dynamic_forward_and_backward(device):
    torch._dynamo.reset()
    model = GatedMLP(activation="gelu_tanh").to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True,
                             backend="inductor" if device == "cuda" else "aot_eager")
    for rows in (6, 11):
        assert_model_matches_composite(model, compiled, torch.randn(rows, 16, device=device, requires_grad=True))


def test_export_keeps_one_node_each(device):
    model = GatedMLP(activation="gelu").to(device)
    x = torch.randn(6, 16, device=device)
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("rows")},))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.fused.gated_mul.default) == 1
    assert targets.count(torch.ops.fused.gated_mul_linear.default) == 1
    x2 = torch.randn(9, 16, device=device)
    torch.testing.assert_close(exported.module()(x2), mlp_composite(model, x2), rtol=1e-5, atol=1e-5)


# ---- bad inputs

def bad_gated_mul_inputs(device):
    """(call, message fragment) for each bad input gated_mul, gated_mul_linear and their backward ops reject."""
    def tensor(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device).to(dtype)
    op, backward = torch.ops.fused.gated_mul, torch.ops.fused.gated_mul_backward
    linear, linear_backward = torch.ops.fused.gated_mul_linear, torch.ops.fused.gated_mul_linear_backward
    cases = [
        (lambda: op(tensor(4, 8), tensor(4, 7)),
         "fused::gated_mul: expected up to have the shape of gate [4, 8], but got [4, 7]"),
        (lambda: op(tensor(4, 8), tensor(8)), "fused::gated_mul: expected up to have the shape of gate [4, 8], but got [8]"),
        (lambda: op(tensor(4, 8), tensor(4, 8, dtype=torch.float64)),
         "fused::gated_mul: expected up to have the same dtype as gate (Float), but got Double"),
        (lambda: op(tensor(4, 8, dtype=torch.int64), tensor(4, 8, dtype=torch.int64)),
         "fused::gated_mul: expected gate to be float64, float32, float16 or bfloat16, but got Long"),
        (lambda: op(tensor(4, 8), tensor(4, 8), "relu"),
         "fused::gated_mul: expected activation to be 'silu', 'gelu' or 'gelu_tanh', but got 'relu'"),
        (lambda: backward(tensor(4, 7), tensor(4, 8), tensor(4, 8)),
         "fused::gated_mul_backward: expected grad to have the shape of gate [4, 8], but got [4, 7]"),
        (lambda: linear(tensor(2, 4), tensor(2, 4), tensor(3, 5)),
         "fused::gated_mul_linear: expected weight of shape [n, gate.size(-1) = 4] (as nn.Linear stores it), "
         "but got shape [3, 5]"),
        (lambda: linear(tensor(2, 4), tensor(2, 5), tensor(3, 4)),
         "fused::gated_mul_linear: expected up to have the shape of gate [2, 4], but got [2, 5]"),
        (lambda: linear(tensor(2, 4), tensor(2, 4), tensor(3, 4), tensor(4)),
         "fused::gated_mul_linear: expected bias to be 1-D of size weight.size(0) = 3, but got shape [4]"),
        (lambda: linear(tensor(2, 4), tensor(2, 4), tensor(3, 4), None, "tanh"),
         "fused::gated_mul_linear: expected activation to be 'silu', 'gelu' or 'gelu_tanh', but got 'tanh'"),
        (lambda: linear_backward(tensor(2, 4), tensor(2, 4), tensor(2, 4), tensor(3, 4), "silu", [True] * 4),
         "fused::gated_mul_linear_backward: expected grad of shape [2, 3] (gate's leading dims, weight.size(0)), "
         "but got [2, 4]"),
    ]
    if device == "cuda":
        cases.append((lambda: op(tensor(4, 8), torch.randn(4, 8)),
                      "fused::gated_mul: expected up to be on the same device as gate (cuda:0), but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(12))
@pytest.mark.absent(lambda device, case: case >= len(bad_gated_mul_inputs(device)))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_gated_mul_inputs(device), case)


def test_bad_inputs_are_rejected_under_meta():
    """The Meta kernels check alike, so torch.compile and torch.export reject what eager rejects."""
    with pytest.raises(RuntimeError, match="fused::gated_mul: expected up to have the shape of gate"):
        torch.ops.fused.gated_mul(torch.empty(4, 8, device="meta"), torch.empty(4, 9, device="meta"))
