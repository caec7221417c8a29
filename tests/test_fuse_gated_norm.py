"""fuse() on gated RMSNorms: the norm-then-gate form (Qwen3-Next, Qwen3.5, OLMo hybrid) runs as rms_norm +
gated_mul with the stock values and gradients in every dtype, mixed dtypes keep the stock forward, and the
gate-then-norm form (Mamba 2's) is left alone."""
import copy

import pytest
import torch

import fused_ops
from conftest import TOLERANCE

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402
from transformers.models.mamba2.modeling_mamba2 import MambaRMSNormGated  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, hidden_states, gate):
        return self.norm(hidden_states, gate)


def stock_and_fused(norm_class, size, device, dtype):
    torch.manual_seed(0)
    stock = Block(norm_class(size, eps=1e-6)).to(device, dtype)
    with torch.no_grad():
        stock.norm.weight.uniform_(0.5, 1.5)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    return stock, fused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_norm_then_gate_matches_the_stock_module(device, dtype):
    stock, fused = stock_and_fused(Qwen3NextRMSNormGated, 256, device, dtype)
    assert fused.fused_ops_report.counts() == {"gated_norm": 1}, fused.fused_ops_report
    x = (torch.randn(3, 5, 256, device=device) * 4).to(dtype).requires_grad_(True)
    gate = torch.randn(3, 5, 256, device=device).to(dtype).requires_grad_(True)
    grad_out = torch.randn(3, 5, 256, device=device).to(dtype)
    # The float64 composite of what the module computes: the reference both are held to.
    x64, gate64, weight64 = (t.detach().double().requires_grad_(True) for t in (x, gate, stock.norm.weight))
    want64 = weight64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.nn.functional.silu(gate64)
    want64_grads = torch.autograd.grad(want64, (x64, gate64, weight64), grad_out.double())
    results = {}
    for name, model in (("stock", stock), ("fused", fused)):
        out = model(x, gate)
        results[name] = (out, *torch.autograd.grad(out, (x, gate, model.norm.weight), grad_out))
    tolerance = TOLERANCE[dtype] * 4
    for got, stock_value, want in zip(results["fused"], results["stock"], (want64, *want64_grads)):
        assert got.dtype == stock_value.dtype
        scale = want.abs().max().item()
        stock_error = (stock_value.double() - want).abs().max().item()
        fused_error = (got.double() - want).abs().max().item()
        # No further than the stock module from the float64 result (a few ulp of the dtype either way).
        assert fused_error <= max(2 * stock_error, tolerance * scale), (fused_error, stock_error)


def test_mixed_dtypes_run_the_stock_forward():
    stock, fused = stock_and_fused(Qwen3NextRMSNormGated, 64, "cpu", torch.float32)
    x = torch.randn(4, 64)
    gate = torch.randn(4, 64).to(torch.bfloat16)
    assert torch.equal(fused(x, gate), stock(x, gate))
    assert hf_families.fused_op_calls(lambda: fused(x, gate)) == {}
    assert hf_families.fused_op_calls(lambda: fused(x, gate.float())) == {"rms_norm": 1, "gated_mul": 1}


def test_gate_then_norm_is_left_alone():
    _, fused = stock_and_fused(MambaRMSNormGated, 64, "cpu", torch.float32)
    (entry,) = fused.fused_ops_report.entries
    assert entry.kind == "gated_norm" and not entry.swapped and "not proven" in entry.detail, entry
