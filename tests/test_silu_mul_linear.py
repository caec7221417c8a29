"""silu_mul_linear: F.linear(silu_mul(x), weight, bias) as one autograd node that saves x, not the
activation. Values and gradients against float64, every dtype and device, and every mode."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import fused_ops
from conftest import TOLERANCE

SHAPES = [([8], 3), ([1, 2], 1), ([5, 12], 7), ([2, 3, 64], 17), ([0, 6], 4)]  # x's shape, n


def make_inputs(x_shape, n, dtype, device, bias=True):
    generator = torch.Generator().manual_seed(sum(x_shape) + n)
    d = x_shape[-1] // 2
    x = torch.randn(x_shape, generator=generator).to(dtype=dtype, device=device)
    weight = (torch.randn(n, d, generator=generator) / d ** 0.5).to(dtype=dtype, device=device)
    b = torch.randn(n, generator=generator).to(dtype=dtype, device=device) if bias else None
    return x, weight, b


def reference(x, weight, bias):
    gate, up = x.double().chunk(2, -1)
    return F.linear(F.silu(gate) * up, weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("x_shape, n", SHAPES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, list) else str(v))
def test_values_and_gradients(x_shape, n, bias, dtype, device):
    x, weight, b = make_inputs(x_shape, n, dtype, device, bias)
    leaves = [t.requires_grad_() for t in (x, weight, b) if t is not None]
    out = fused_ops.silu_mul_linear(x, weight, b)
    assert out.dtype == dtype and out.shape == torch.Size(x_shape[:-1] + [n])
    doubles = [t.detach().double().requires_grad_() for t in leaves]
    want = reference(*doubles, *([] if bias else [None]))
    scale = TOLERANCE[dtype] * max(1.0, x_shape[-1] ** 0.5)
    torch.testing.assert_close(out.double(), want, rtol=scale, atol=scale)
    grad = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7)).to(device)
    got = torch.autograd.grad(out, leaves, grad.to(dtype))
    expected = torch.autograd.grad(want, doubles, grad)
    for g, e in zip(got, expected):
        assert g.dtype == dtype
        largest = max(1.0, e.abs().max().item()) if e.numel() else 1.0
        torch.testing.assert_close(g.double(), e, rtol=scale, atol=scale * largest * max(1.0, n ** 0.5))


def test_partial_requires_grad(device):
    x, weight, b = make_inputs([4, 10], 6, torch.float64, device)
    weight.requires_grad_()
    out = fused_ops.silu_mul_linear(x, weight, b)
    (grad_weight,) = torch.autograd.grad(out.sum(), [weight])
    torch.testing.assert_close(grad_weight, torch.autograd.grad(reference(x, weight, b).sum(), [weight])[0])
    assert x.grad is None


def test_autograd_saves_x_and_weight_not_the_activation(device):
    x, weight, b = make_inputs([16, 64], 8, torch.float32, device)
    x.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        fused_ops.silu_mul_linear(x, weight, b)
    assert sorted(saved) == sorted([(16, 64), (8, 32)])  # no [16, 32] activation


def test_gradcheck_and_gradgradcheck(device):
    for bias in (True, False):
        x, weight, b = make_inputs([2, 3, 8], 5, torch.float64, device, bias)
        inputs = tuple(t.requires_grad_() for t in (x, weight, b) if t is not None)
        assert torch.autograd.gradcheck(fused_ops.silu_mul_linear, inputs)
        assert torch.autograd.gradgradcheck(fused_ops.silu_mul_linear, inputs)


def test_opcheck(device):
    x, weight, b = make_inputs([3, 8], 5, torch.float32, device)
    opcheck(torch.ops.fused.silu_mul_linear.default, (x.requires_grad_(), weight.requires_grad_(), b))
    opcheck(torch.ops.fused.silu_mul_linear.default, (x, weight, None))
    grad = torch.randn(3, 5, device=device)
    opcheck(torch.ops.fused.silu_mul_linear_backward.default, (grad, x.detach(), weight.detach(), [True, True, False]))


class DownProjection(torch.nn.Module):
    def forward(self, x, weight, bias):
        return torch.ops.fused.silu_mul_linear(x, weight, bias)


def test_compile_fullgraph_dynamic_and_export(device):
    compiled = torch.compile(fused_ops.silu_mul_linear, fullgraph=True, dynamic=True,
                             backend="inductor" if device == "cuda" else "aot_eager")
    for rows in (3, 9):
        x, weight, b = make_inputs([rows, 16], 4, torch.float32, device)
        leaves = [t.requires_grad_() for t in (x, weight, b)]
        out = compiled(*leaves)
        torch.testing.assert_close(out.double(), reference(x, weight, b), rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(out.sum(), leaves)
        want = torch.autograd.grad(reference(*leaves).sum(), leaves)
        for g, e in zip(grads, want):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    x, weight, b = make_inputs([3, 16], 4, torch.float32, device)
    exported = torch.export.export(DownProjection(), (x, weight, b))
    torch.testing.assert_close(exported.module()(x, weight, b), fused_ops.silu_mul_linear(x, weight, b))


def test_torchscript_save_load(device, tmp_path):
    scripted = torch.jit.script(DownProjection())
    scripted.save(str(tmp_path / "down.pt"))
    loaded = torch.jit.load(str(tmp_path / "down.pt"))
    x, weight, b = make_inputs([3, 16], 4, torch.float32, device)
    torch.testing.assert_close(loaded(x, weight, b), fused_ops.silu_mul_linear(x, weight, b))


def bad_silu_mul_linear_inputs(device):
    """(call, the error message's start) for every bad input of silu_mul_linear and its backward."""
    def tensor(*shape, dtype=torch.float32):
        return torch.randn(*shape, dtype=dtype, device=device)
    op, backward = torch.ops.fused.silu_mul_linear, torch.ops.fused.silu_mul_linear_backward
    return [
        (lambda: op(tensor(2, 7), tensor(3, 3)),
         "fused::silu_mul_linear: expected the last dim of x to be even (x is [..., 2d]: gate, then up), but got shape [2, 7]"),
        (lambda: op(tensor(2, 8), tensor(3, 5)),
         "fused::silu_mul_linear: expected weight of shape [n, x.size(-1) / 2 = 4] (as nn.Linear stores it), but got shape [3, 5]"),
        (lambda: op(tensor(2, 8), tensor(3, 4, dtype=torch.float64)),
         "fused::silu_mul_linear: expected weight to have the same dtype as x (Float), but got Double"),
        (lambda: op(tensor(2, 8), tensor(3, 4), tensor(4)),
         "fused::silu_mul_linear: expected bias to be 1-D of size weight.size(0) = 3, but got shape [4]"),
        (lambda: backward(tensor(2, 4), tensor(2, 8), tensor(3, 4), [True, True, True]),
         "fused::silu_mul_linear_backward: expected grad of shape [2, 3] (x's leading dims, weight.size(0)), but got [2, 4]"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_bad_inputs(case, device):
    call, message = bad_silu_mul_linear_inputs(device)[case]
    with pytest.raises(RuntimeError) as error:
        call()
    assert str(error.value).startswith(message)


def test_fused_mlp_saves_gate_and_up_not_the_activation():
    """fuse() gives a Llama MLP gated_mul_linear: what autograd holds of the [..., d] tensors is gate and
    up, where the stock MLP also holds the activation and the product."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=50)
    torch.manual_seed(0)
    stock = transformers.models.llama.modeling_llama.LlamaMLP(config)
    fused = fused_ops.fuse(torch.nn.Sequential(copy.deepcopy(stock))).get_submodule("0")
    x = torch.randn(3, 5, 32, requires_grad=True)
    held = {}
    for name, module in (("stock", stock), ("fused", fused)):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            out = module(x)
        held[name] = saved.count(3 * 5 * 48)  # tensors of the activation's size (weights are 32 x 48)
        torch.testing.assert_close(out, stock(x), rtol=1e-5, atol=1e-6)
    assert held == {"stock": 4, "fused": 2}
