"""The norm modules (fused_ops.nn.RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm): drop-ins for torch's, on
every device, and a block of them in TorchScript, torch.compile(fullgraph=True, dynamic=True) and
torch.export."""
import warnings

import pytest
import torch
import torch.nn.functional as F

import fused_ops
from conftest import assert_same_gradients


@pytest.mark.parametrize("affine", [True, False])
def test_modules_are_drop_in_for_torch(device, affine):
    x = torch.randn(6, 5, 32, device=device)
    pairs = [
        (fused_ops.nn.RMSNorm(32, elementwise_affine=affine), torch.nn.RMSNorm(32, elementwise_affine=affine)),
        (fused_ops.nn.RMSNorm([32], eps=1e-3, elementwise_affine=affine),
         torch.nn.RMSNorm([32], eps=1e-3, elementwise_affine=affine)),
        (fused_ops.nn.LayerNorm(32, elementwise_affine=affine), torch.nn.LayerNorm(32, elementwise_affine=affine)),
        (fused_ops.nn.LayerNorm(32, bias=False), torch.nn.LayerNorm(32, bias=False)),
    ]
    for fused, eager in pairs:
        eager = eager.to(device)
        with torch.no_grad():
            for parameter in eager.parameters():
                parameter.normal_()
        fused = fused.to(device)
        fused.load_state_dict(eager.state_dict())  # same parameter names
        torch.testing.assert_close(fused(x), eager(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 0.1, 0.01])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_rms_norm_default_eps_is_torchs(device, dtype, scale):
    """eps=None adds what torch.nn.RMSNorm(eps=None) adds on the same device and torch: at small
    activations the epsilon decides the output, so a different one is far off, not an ulp off."""
    x = (torch.randn(64, 256, device=device) * scale).to(dtype)
    residual = (torch.randn(64, 256, device=device) * scale).to(dtype)
    eager = torch.nn.RMSNorm(256, eps=None, device=device, dtype=dtype)
    with torch.no_grad():
        eager.weight.normal_()
    fused = fused_ops.nn.RMSNorm(256, eps=None, device=device, dtype=dtype)
    fused.load_state_dict(eager.state_dict())
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(fused(x), eager(x), rtol=tolerance, atol=tolerance)
    add_fused = fused_ops.nn.AddRMSNorm(256, eps=None, device=device, dtype=dtype)
    add_fused.load_state_dict(eager.state_dict())
    out, h = add_fused(x, residual)
    torch.testing.assert_close(out, eager(x + residual), rtol=tolerance, atol=tolerance)


def test_residual_modules(device):
    x, residual = torch.randn(6, 32, device=device), torch.randn(6, 32, device=device)
    rms = fused_ops.nn.AddRMSNorm(32, eps=1e-6).to(device)
    out, h = rms(x, residual)
    torch.testing.assert_close(h, x + residual)
    torch.testing.assert_close(out, F.rms_norm(x + residual, (32,), rms.weight, 1e-6), rtol=1e-5, atol=1e-5)
    layer = fused_ops.nn.AddLayerNorm(32).to(device)
    out, h = layer(x, residual)
    torch.testing.assert_close(out, F.layer_norm(x + residual, (32,), layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_modules_reject_more_than_the_last_dim():
    with pytest.raises(ValueError, match="normalises over the last dim only"):
        fused_ops.nn.RMSNorm([4, 32])
    with pytest.raises(ValueError, match="normalises over the last dim only"):
        fused_ops.nn.LayerNorm((4, 32))


class TransformerBlockNorms(torch.nn.Module):
    """Every norm module in one model, for the mode tests; with `weight_forms` each weight form: Gemma's
    (1 + weight) RMSNorm, weightless norms, Nemotron's LayerNorm1P."""

    def __init__(self, features=32, weight_forms=False):
        super().__init__()
        if weight_forms:
            self.rms = fused_ops.nn.RMSNorm(features, eps=1e-6, offset=1.0)
            self.add_rms = fused_ops.nn.AddRMSNorm(features, eps=1e-6, elementwise_affine=False)
            self.layer = fused_ops.nn.LayerNorm(features, elementwise_affine=False)
            self.add_layer = fused_ops.nn.AddLayerNorm(features, offset=1.0)
        else:
            self.rms = fused_ops.nn.RMSNorm(features)
            self.add_rms = fused_ops.nn.AddRMSNorm(features)
            self.layer = fused_ops.nn.LayerNorm(features)
            self.add_layer = fused_ops.nn.AddLayerNorm(features)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.normal_(0, 0.5 if weight_forms else 1.0)

    def forward(self, x, residual):
        out, h = self.add_rms(x, residual)
        out2, h2 = self.add_layer(self.rms(out), h)
        return self.layer(out2) + h2


def block_composite(model, x, residual):
    def weight(module):
        return None if module.weight is None else module.offset + module.weight
    h = x + residual
    out = F.rms_norm(h, (32,), weight(model.add_rms), model.add_rms.eps)
    out = F.rms_norm(out, (32,), weight(model.rms), model.rms.eps)
    h2 = out + h
    out2 = F.layer_norm(h2, (32,), weight(model.add_layer), model.add_layer.bias)
    return F.layer_norm(out2, (32,), weight(model.layer), model.layer.bias) + h2


@pytest.mark.parametrize("weight_forms", [False, True])
@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_save_load(device, kind, weight_forms, tmp_path):
    model = TransformerBlockNorms(weight_forms=weight_forms).to(device)
    x, residual = torch.randn(6, 32, device=device), torch.randn(6, 32, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(model) if kind == "script" else torch.jit.trace(model, (x, residual))
        scripted.save(str(tmp_path / "model.pt"))
        loaded = torch.jit.load(str(tmp_path / "model.pt"), map_location=device)
    x.requires_grad_(True)
    residual.requires_grad_(True)
    out = loaded(x, residual)
    expected = block_composite(model, x, residual)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert_same_gradients(out, expected, (x, residual), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("weight_forms", [False, True])
def test_compile_fullgraph_dynamic_forward_and_backward(device, weight_forms):
    torch._dynamo.reset()
    model = TransformerBlockNorms(weight_forms=weight_forms).to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        x = torch.randn(rows, 32, device=device, requires_grad=True)
        residual = torch.randn(rows, 32, device=device, requires_grad=True)
        out = compiled(x, residual)
        expected = block_composite(model, x, residual)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        leaves = (x, residual, *model.parameters())
        assert_same_gradients(out, expected, leaves, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("weight_forms", [False, True])
def test_export_keeps_one_node_each(device, weight_forms):
    model = TransformerBlockNorms(weight_forms=weight_forms).to(device)
    x, residual = torch.randn(6, 32, device=device), torch.randn(6, 32, device=device)
    rows = torch.export.Dim("rows")
    exported = torch.export.export(model, (x, residual), dynamic_shapes=({0: rows}, {0: rows}))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    for op in (torch.ops.fused.rms_norm.default, torch.ops.fused.add_rms_norm.default,
               torch.ops.fused.layer_norm.default, torch.ops.fused.add_layer_norm.default):
        assert targets.count(op) == 1
    x2, residual2 = torch.randn(9, 32, device=device), torch.randn(9, 32, device=device)
    torch.testing.assert_close(exported.module()(x2, residual2), block_composite(model, x2, residual2),
                               rtol=1e-4, atol=1e-4)
