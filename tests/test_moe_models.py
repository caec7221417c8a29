"""Mixture-of-experts models with their experts fused: under torch.compile, with the router's auxiliary loss
and with shared experts beside the routed ones, a training step gives the stock loss and gradients and the
experts run as the experts ops."""
import copy
import warnings

import pytest
import torch

import fused_ops
from fused_ops.patching.families import EXPECTED_FUSIONS

pytest.importorskip("transformers")
import hf_families  # noqa: E402


def fuse(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fused_ops.fuse(model)


def assert_step_matches(stock, fused, ids, run=None):
    """`run` (default: the fused model) calls the fused model, a compiled wrapper of it, say."""
    for model in (stock, fused):
        model.zero_grad(set_to_none=True)
    want, got = stock(input_ids=ids, labels=ids), (fused if run is None else run)(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-4, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    hf_families.assert_gradients_match_stock(fused, stock, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("model_type", ["qwen3_moe", pytest.param("mixtral", marks=pytest.mark.slow)])
def test_compiled_step_matches_stock(model_type):
    """torch.compile of the fused model: the experts ops stay in the graph (no break at them)."""
    stock = hf_families.build(model_type)
    fused = fuse(copy.deepcopy(stock))
    ids = hf_families.batch(stock)
    compiled = torch.compile(fused)
    counts = torch._dynamo.utils.counters
    counts.clear()
    assert_step_matches(stock, fused, ids, run=compiled)
    breaks = {reason: n for reason, n in counts["graph_break"].items() if "moe" in str(reason).lower()}
    assert not breaks, breaks


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_router_auxiliary_loss_is_kept(model_type):
    """output_router_logits: the loss holds the router's load-balancing loss, as the stock model's does."""
    stock = hf_families.build(model_type)
    stock.config.output_router_logits = True
    stock.config.router_aux_loss_coef = 0.5
    fused = fuse(copy.deepcopy(stock))
    ids = hf_families.batch(stock)
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert calls.get("moe_expert_mlp", 0) == stock.config.num_hidden_layers, calls
    assert_step_matches(stock, fused, ids)
    assert fused(input_ids=ids, labels=ids).aux_loss is not None


@pytest.mark.parametrize("model_type", ["qwen3_next", "deepseek_v2"])
def test_shared_experts_beside_the_routed_ones(model_type):
    stock = hf_families.build(model_type)
    fused = fuse(copy.deepcopy(stock))
    ids = hf_families.batch(stock)
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert calls.get("moe_expert_mlp", 0) >= 1, calls
    assert_step_matches(stock, fused, ids)


MOE_FAMILIES = sorted(t for t, kinds in EXPECTED_FUSIONS.items() if "experts_gate" in kinds)


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def _distance(got, want):
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


@pytest.mark.cuda_only
@pytest.mark.parametrize("implementation", ["grouped_mm", "eager"])
@pytest.mark.parametrize("model_type", MOE_FAMILIES)
def test_bf16_step_on_cuda_is_as_close_to_float32_as_stock(model_type, implementation):
    """In bfloat16 on the GPU, the fused model's loss and every gradient are as close to the float32 stock
    model's as the bfloat16 stock model's are (norm-wise, within twice its distance plus one rounding), under
    transformers' grouped products and under its eager loop; the experts run as the experts ops."""
    reference = hf_families.build(model_type).to("cuda")
    reference.set_experts_implementation(implementation)
    stock = copy.deepcopy(reference).to(torch.bfloat16)
    fused = fuse(copy.deepcopy(stock))
    ids = hf_families.batch(reference).cuda()
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert calls.get("moe_expert_mlp", 0) >= 1, calls
    want_loss, want_grads = _step(reference, ids)
    stock_loss, stock_grads = _step(stock, ids)
    got_loss, got_grads = _step(fused, ids)
    rounding = 2.0 ** -8
    assert abs(got_loss - want_loss) <= 2 * abs(stock_loss - want_loss) + rounding * abs(want_loss)
    for name, want in want_grads.items():
        bound = 2 * _distance(stock_grads[name], want) + rounding
        assert _distance(got_grads[name], want) <= bound, name
