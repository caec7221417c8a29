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


@pytest.mark.parametrize("model_type, recompute", [("qwen3_moe", True), ("qwen3_moe", False),
                                                   pytest.param("mixtral", True, marks=pytest.mark.slow)])
def test_compiled_step_matches_stock(model_type, recompute):
    """torch.compile of the fused model: the experts ops stay in the graph (no break at them), recomputing
    the gate/up product in the backward or keeping it."""
    stock = hf_families.build(model_type)
    fused = fuse(copy.deepcopy(stock))
    fused_ops.experts.set_recompute(fused, recompute)
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


@pytest.mark.parametrize("model_type", [
    t if t in ("qwen3_moe", "gpt_oss") else pytest.param(t, marks=pytest.mark.slow) for t in MOE_FAMILIES])
def test_experts_keeping_the_gate_up_product_give_the_stock_step(model_type):
    """fused_ops.experts.set_recompute(model, False): every experts module's backward takes the forward's
    gate/up product (one [pairs, 2I] tensor kept a layer) with the stock loss and gradients."""
    stock = hf_families.build(model_type)
    fused = fuse(copy.deepcopy(stock))
    modules = [m for m in fused.modules() if type(m).__dict__.get("_fused_ops_kind") == "experts_gate"]
    assert fused_ops.experts.set_recompute(fused, False) == len(modules) >= 1
    ids = hf_families.batch(stock)
    kept = []

    def pack(tensor):
        kept.append(tuple(tensor.shape))
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fused(input_ids=ids, labels=ids)
    widths = {m.gate_up_proj.shape[2 if getattr(m, "is_transposed", False) else 1] for m in modules}
    products = [shape for shape in kept if len(shape) == 2 and shape[1] in widths and
                shape[0] == ids.numel() * stock.config.get_text_config().num_experts_per_tok]
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert len(products) == calls.get("moe_expert_mlp_keeping_gate_up", 0) >= 1, (kept, calls)
    assert_step_matches(stock, fused, ids)


def _step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def _distance(got, want):
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _route_as(model, routes, flipped=None):
    """Forward pre-hooks on every experts module (the modules transformers' experts interface calls with the
    routed expert ids): an empty `routes` records each call's ids in order, a full one replaces them with
    the recorded ones, so that a bfloat16 model routes every token as the float32 one did (a near tie of two
    experts' scores can otherwise pick a different expert, a difference of whole tokens, not of rounding).
    Each model keeps its own routing weights; the MoE blocks whose own choice differed go to `flipped`
    (or in another order: their router's gradient went to other experts' scores). Returns the hooks' handles."""
    replaying = bool(routes)
    calls = iter(list(routes))

    def hook(module, args, kwargs):
        positions = [i for i, a in enumerate(args) if torch.is_tensor(a) and not a.is_floating_point()]
        keys = [k for k, v in kwargs.items() if torch.is_tensor(v) and not v.is_floating_point()]
        where = ("args", positions[0]) if positions else ("kwargs", keys[0])
        current = args[where[1]] if where[0] == "args" else kwargs[where[1]]
        if not replaying:
            routes.append(current.detach().clone())
            return None
        ids = next(calls)
        assert ids.shape == current.shape
        if flipped is not None and not torch.equal(ids, current):
            flipped.add(names[module])
        if where[0] == "args":
            args = args[:where[1]] + (ids,) + args[where[1] + 1:]
        else:
            kwargs = {**kwargs, where[1]: ids}
        return args, kwargs

    names = {m: name.rsplit(".", 1)[0] for name, m in model.named_modules() if name.endswith(".experts")}
    assert names, "no experts module"
    return [m.register_forward_pre_hook(hook, with_kwargs=True) for m in names]


@pytest.mark.cuda_only
@pytest.mark.parametrize("implementation", ["grouped_mm", "eager"])
@pytest.mark.parametrize("model_type", MOE_FAMILIES)
def test_bf16_step_on_cuda_is_as_close_to_float32_as_stock(model_type, implementation):
    """In bfloat16 on the GPU, the fused model's loss and every gradient are as close to the float32 stock
    model's as the bfloat16 stock model's are (norm-wise, within twice its distance plus one rounding), under
    transformers' grouped products and under its eager loop, every model routing each token as the float32
    one does; the experts run as the experts ops."""
    reference = hf_families.build(model_type).to("cuda")
    reference.set_experts_implementation(implementation)
    stock = copy.deepcopy(reference).to(torch.bfloat16)
    fused = fuse(copy.deepcopy(stock))
    ids = hf_families.batch(reference).cuda()
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert calls.get("moe_expert_mlp", 0) >= 1, calls
    routes, flipped = [], set()
    steps = []
    for model in (reference, stock, fused):  # the first records the routing, the others replay it
        handles = _route_as(model, routes, flipped)
        steps.append(_step(model, ids))
        for handle in handles:
            handle.remove()
    (want_loss, want_grads), (stock_loss, stock_grads), (got_loss, got_grads) = steps
    # A router whose own choice differed in either bfloat16 model: its gradient is not compared.
    routers = tuple(f"{block}.{name}." for block in flipped for name in ("gate", "router"))
    rounding = 2.0 ** -8
    assert abs(got_loss - want_loss) <= 2 * abs(stock_loss - want_loss) + rounding * abs(want_loss)
    for name, want in want_grads.items():
        if name.startswith(routers):
            continue
        bound = 2 * _distance(stock_grads[name], want) + rounding
        assert _distance(got_grads[name], want) <= bound, name


@pytest.mark.parametrize("model_type", ["gpt_oss", "qwen3_moe"])
def test_bf16_router_gradient_through_the_experts_is_as_close_as_grouped_mm(device, model_type):
    """The gradient a router's scores get through the experts (the routing weights' dots, then the softmax's
    backward, which cancels their common part) in bfloat16: as close to float64 as through transformers'
    grouped products in bfloat16, on random hidden states, scores and output gradients of several seeds, both
    against the modeling code's own expert loop in float64."""
    from transformers.integrations.moe import grouped_mm_experts_forward

    from fused_ops import experts as fused_experts_module

    model = hf_families.build(model_type)
    experts64 = model.model.layers[0].mlp.experts.double().to(device)
    experts_count, top_k = experts64.gate_up_proj.shape[0], model.config.num_experts_per_tok
    implementations = {
        "fused": lambda ex, h, i, w: fused_experts_module.fused_experts(ex, h, i, w,
                                                                        fused_experts_module.proven_gate(ex)),
        "grouped_mm": grouped_mm_experts_forward,
        # The modeling code's own per-expert loop, under transformers' implementation switch.
        "eager": type(experts64).forward.__wrapped__,
    }
    for seed in range(4):
        generator = torch.Generator().manual_seed(seed)
        hidden = torch.randn(256, model.config.hidden_size, generator=generator, dtype=torch.float64).to(device)
        scores = torch.randn(256, experts_count, generator=generator, dtype=torch.float64).to(device)
        index = scores.topk(top_k, dim=-1).indices
        grad = torch.randn(hidden.shape, generator=generator, dtype=torch.float64).to(device)

        def score_gradient(dtype, implementation):
            experts = copy.deepcopy(experts64).to(dtype)
            leaf = scores.to(dtype).detach().requires_grad_(True)
            weights = torch.softmax(leaf.gather(1, index).float(), dim=-1).to(dtype)
            out = implementations[implementation](experts, hidden.to(dtype), index, weights)
            (out.double() * grad).sum().backward()
            return leaf.grad.double()

        exact = score_gradient(torch.float64, "eager")
        stock = _distance(score_gradient(torch.bfloat16, "grouped_mm"), exact)
        fused = _distance(score_gradient(torch.bfloat16, "fused"), exact)
        assert fused <= 1.25 * stock + 2.0 ** -9, (seed, fused, stock)
