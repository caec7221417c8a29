"""What fuse() checks at each call, not only when it runs: hooks (module-level and global, registered before or
after fuse(), on a part the fused code computes without calling it), torch.func transforms and forward-mode AD,
an experts implementation switched after fuse(), and edits made to the model after fuse(). Each case matches the
stock model (loss, logits, every gradient, and what each hook saw), by the fused code or by the stock forward
that the call falls back to."""
import copy
import warnings

import pytest
import torch
from torch.func import functional_call

import fused_ops
from fused_ops.patching.families import EXPECTED_FUSIONS

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402
from hf_families import assert_gradients_match_stock, fused_op_calls  # noqa: E402
from test_fuse_consumers import stock_and_fused  # noqa: E402

# One layer's part of each kind that the fused code replaces or runs beside, in a two-layer Llama: the keys
# the fused rotation takes, and the attention (by its output projection for a full backward hook, which sees
# no gradient of an input given by keyword, as the attention's are).
TARGETS = {"head": "lm_head", "mlp": "model.layers.1.mlp.down_proj", "activation": "model.layers.1.mlp.act_fn",
           "norm": "model.layers.1.post_attention_layernorm", "rotary": "model.layers.1.self_attn.k_proj",
           "attention": "model.layers.1.self_attn"}
BACKWARD_TARGETS = dict(TARGETS, attention="model.layers.1.self_attn.o_proj")
HOOK_KINDS = ("forward", "forward_pre", "backward", "backward_pre")


def _first_tensor(value):
    return value if torch.is_tensor(value) else next((v for v in value if torch.is_tensor(v)), None)


def _scaled(value, factor):
    """`value` (a tensor, or a tuple whose tensors are scaled) times `factor`."""
    if torch.is_tensor(value):
        return value * factor
    return type(value)(v * factor if torch.is_tensor(v) else v for v in value)


def _register(module, kind, seen, name):
    """A hook of `kind` that records what it sees and changes it, so that a skipped hook shows in the numbers."""
    def note(tensor):
        if tensor is not None:
            seen.append((name, kind, float(tensor.detach().double().sum())))
    if kind == "forward":
        return module.register_forward_hook(lambda m, args, out: (note(_first_tensor(out)), _scaled(out, 1.5))[1])
    if kind == "forward_pre":
        def pre(m, args, kwargs):
            if args:
                note(args[0])
                return (args[0] * 0.5, *args[1:]), kwargs
            note(kwargs["hidden_states"])
            return args, dict(kwargs, hidden_states=kwargs["hidden_states"] * 0.5)
        return module.register_forward_pre_hook(pre, with_kwargs=True)
    if kind == "backward":
        return module.register_full_backward_hook(
            lambda m, grad_in, grad_out: (note(_first_tensor(grad_in)), _scaled(grad_in, 10.0))[1])
    return module.register_full_backward_pre_hook(
        lambda m, grad_out: (note(_first_tensor(grad_out)), _scaled(grad_out, 3.0))[1])


def _register_global(kind, seen, model_of):
    """A global module hook of `kind` that records each call: the module's path in its model, and a tensor's sum."""
    def note(module, value):
        tensor = _first_tensor(value) if value is not None else None
        name = model_of(module)
        if name is not None:
            seen.append((name, kind, None if tensor is None else float(tensor.detach().double().sum())))
    hooks = torch.nn.modules.module
    if kind == "forward":
        return hooks.register_module_forward_hook(lambda m, args, out: note(m, out))
    if kind == "forward_pre":
        return hooks.register_module_forward_pre_hook(lambda m, args: note(m, args))
    if kind == "backward":
        return hooks.register_module_full_backward_hook(lambda m, grad_in, grad_out: note(m, grad_in))
    return hooks.register_module_full_backward_pre_hook(lambda m, grad_out: note(m, grad_out))


def _step(model, ids):
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits
    model.train()
    return loss.detach(), logits


def _assert_same_records(got, want):
    assert [(name, kind) for name, kind, _ in got] == [(name, kind) for name, kind, _ in want]
    for (_, _, g), (_, _, w) in zip(got, want):
        assert (g is None) == (w is None) and (g is None or g == pytest.approx(w, rel=1e-4, abs=1e-4))


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("kind", HOOK_KINDS)
@pytest.mark.parametrize("target", [*TARGETS, "global"])
def test_every_hook_fires_as_in_the_stock_model(target, kind, when):
    """The same loss, logits and gradients, and each hook called as often, in the same order, on the same
    tensors, as in the stock model."""
    stock, fused = stock_and_fused("llama")
    if when == "before":
        fused = copy.deepcopy(stock)
    ids = hf_families.batch(stock)
    records, steps = [], []
    for model in (stock, fused):  # each model's step with its own hook alone (a global one sees both)
        seen = []
        records.append(seen)
        if target == "global":
            names = {id(module): name for name, module in model.named_modules()}
            handle = _register_global(kind, seen, lambda m, names=names: names.get(id(m)))
        else:
            path = (BACKWARD_TARGETS if kind == "backward" else TARGETS)[target]
            handle = _register(model.get_submodule(path), kind, seen, target)
        if model is fused and when == "before":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fused_ops.fuse(fused)
            seen.clear()
        try:
            steps.append(_step(model, ids))
        finally:
            handle.remove()
    want_step, got_step = steps
    torch.testing.assert_close(got_step[0], want_step[0], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got_step[1], want_step[1], rtol=1e-4, atol=1e-5)
    assert_gradients_match_stock(fused, stock, rtol=1e-3, atol=1e-6)
    assert records[0], "the hook never fired in the stock model"
    _assert_same_records(records[1], records[0])


def test_a_hook_on_one_layer_leaves_the_other_layers_fused():
    """The check is per module: a hook on layer 1's activation sends layer 1's MLP to its stock forward, and
    layer 0's MLP still runs as one op."""
    stock, fused = stock_and_fused("llama")
    seen = []
    _register(fused.model.layers[1].mlp.act_fn, "forward", seen, "activation")
    ids = hf_families.batch(stock)
    calls = fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert calls.get("gated_mul_linear") == 1 and len(seen) == 1, calls


def _loss_of(model):
    def loss(parameters, ids):
        return functional_call(model, parameters, (), {"input_ids": ids, "labels": ids}).loss
    return loss


def test_torch_func_transforms_through_a_fused_model_match_stock():
    stock, fused = stock_and_fused("llama")
    ids = hf_families.batch(stock)[:, :6]
    parameters = {name: p.detach() for name, p in stock.named_parameters()}
    # Reverse mode: grad, vjp, and per-sample gradients (vmap of grad), as differentially private training takes.
    for transform in (torch.func.grad, lambda f: (lambda p, i: torch.func.vjp(lambda q: f(q, i), p)[1](
            torch.tensor(1.0))[0])):
        want, got = transform(_loss_of(stock))(parameters, ids), transform(_loss_of(fused))(parameters, ids)
        for name in parameters:
            torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-6, msg=name)

    def one_sample(model):
        loss = _loss_of(model)
        return lambda p, i: loss(p, i[None])
    want = torch.func.vmap(torch.func.grad(one_sample(stock)), in_dims=(None, 0))(parameters, ids)
    got = torch.func.vmap(torch.func.grad(one_sample(fused)), in_dims=(None, 0))(parameters, ids)
    for name in parameters:
        torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-6, msg=name)
    # Forward mode: the tangent of the logits along a direction of the embeddings, never a silent zero (on
    # eager attention: SDPA's CPU kernel has no forward-mode rule).
    for model in (stock, fused):
        model.eval()
        model.set_attn_implementation("eager")
    embeddings = stock.get_input_embeddings()(ids).detach()
    direction = torch.randn(embeddings.shape, generator=torch.Generator().manual_seed(0))

    def logits_of(model):
        return lambda e: model(inputs_embeds=e, use_cache=False).logits
    _, want = torch.func.jvp(logits_of(stock), (embeddings,), (direction,))
    _, got = torch.func.jvp(logits_of(fused), (embeddings,), (direction,))
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(embeddings, direction)
        got = torch.autograd.forward_ad.unpack_dual(fused(inputs_embeds=dual, use_cache=False).logits).tangent
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _op_cases():
    from op_specs import OPS
    return [(spec, label, options) for spec in OPS for label, options in spec.variants()]


@pytest.mark.parametrize("spec, label, options", _op_cases(), ids=[label for _, label, _ in _op_cases()])
def test_torch_func_transforms_through_each_op_match_its_reference(spec, label, options):
    """jvp (and forward-mode AD), vjp, grad, vmap and vmap of grad (per-sample gradients) through the op
    give what they give through the eager composite it replaces, in float64."""
    from test_reliability import random_inputs
    from op_specs import as_outputs
    options = {name: (sum(value) / 2 if isinstance(value, tuple) else value) for name, value in options.items()}
    options.update({name: sum(values) / 2 for name, values in spec.options.items() if isinstance(values, tuple)})
    inputs = random_inputs(spec, [3, 4, 6], torch.float64, "cpu", torch.Generator().manual_seed(0))
    moving = [i for i, t in enumerate(inputs) if t.is_floating_point() and spec.takes_grad(i)]

    def as_function(implementation):
        def function(*tensors):
            arguments = list(inputs)
            for index, tensor in zip(moving, tensors):
                arguments[index] = tensor
            return as_outputs(implementation(*arguments, **options))
        return function
    fused, reference = as_function(spec.fused), as_function(spec.reference)
    primals = tuple(inputs[i] for i in moving)
    generator = torch.Generator().manual_seed(1)
    tangents = tuple(torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in primals)
    for name, transform in {
            "jvp": lambda f: torch.func.jvp(f, primals, tangents),
            "vjp": lambda f: (lambda out, pull: (out, pull(tuple(torch.ones_like(o) for o in out))))(
                *torch.func.vjp(f, *primals)),
            "grad": lambda f: torch.func.grad(lambda *t: sum(o.sum() for o in f(*t)), argnums=tuple(
                range(len(primals))))(*primals),
            "vmap": lambda f: torch.func.vmap(lambda p: f(p, *primals[1:]))(torch.stack([primals[0]] * 2) * 1.5),
            "vmap of grad": lambda f: torch.func.vmap(torch.func.grad(lambda p: sum(o.sum() for o in f(p, *primals[1:]))))(
                torch.stack([primals[0], primals[0] * 0.5])),
    }.items():
        torch.testing.assert_close(transform(fused), transform(reference), rtol=1e-7, atol=1e-9, msg=name)
    with torch.autograd.forward_ad.dual_level():
        duals = [torch.autograd.forward_ad.make_dual(p, t) for p, t in zip(primals, tangents)]
        got = [torch.autograd.forward_ad.unpack_dual(o).tangent for o in fused(*duals)]
    want = torch.func.jvp(reference, primals, tangents)[1]
    torch.testing.assert_close(tuple(got), tuple(want), rtol=1e-7, atol=1e-9)


def test_gradient_ops_under_a_transform_are_right_or_an_error_that_names_them():
    """A gradient op with a differentiable composition (the norms', the activations') runs it under a transform;
    relu_add's, whose node saves a bit mask, says so and names itself."""
    generator = torch.Generator().manual_seed(0)
    x, grad, tangent = (torch.randn(3, 8, dtype=torch.float64, generator=generator) for _ in range(3))
    weight = torch.rand(8, dtype=torch.float64, generator=generator)

    def backward(g):  # linear in the incoming gradient: its jvp along a tangent is its value at the tangent
        return torch.ops.fused.rms_norm_backward(g, x, weight, 1e-6)[0]
    torch.testing.assert_close(torch.func.jvp(backward, (grad,), (tangent,))[1], backward(tangent))
    torch.testing.assert_close(torch.func.grad(lambda g: (backward(g) * tangent).sum())(grad),
                               torch.func.vjp(backward, grad)[1](tangent)[0])
    with pytest.raises(RuntimeError, match=r"fused::relu_add_backward: forward-mode AD"):
        torch.func.jvp(lambda g: torch.ops.fused.relu_add_backward(g, x), (grad,), (tangent,))
    with pytest.raises(RuntimeError, match=r"fused::relu_add_backward: torch.func transforms"):
        torch.func.grad(lambda g: torch.ops.fused.relu_add_backward(g, x).sum())(grad)


def _build(model_type, **config_changes):
    """hf_families.build with config values changed first (another activation, say)."""
    model_class = hf_families.model_class_of(model_type)
    config = hf_families.tiny_config(model_type)
    text_config = config.get_text_config()
    for name, value in config_changes.items():
        setattr(text_config, name, value)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class.from_config(config)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.copy_(torch.rand(parameter.shape, generator=generator) * 0.5 + 0.25)
    return model.train()


MOE_FAMILIES = sorted(t for t, kinds in EXPECTED_FUSIONS.items() if "experts_gate" in kinds)
# Gates of other activations than SiLU: a proof on the eager loop (which never calls the gate) took them for SiLU.
OTHER_ACTIVATIONS = [("mixtral", "gelu"), ("qwen3_moe", "gelu_pytorch_tanh")]


@pytest.mark.parametrize("model_type, hidden_act", [(t, None) for t in MOE_FAMILIES] + OTHER_ACTIVATIONS)
def test_experts_implementation_switched_after_fuse(model_type, hidden_act):
    """Fused while its experts run the eager loop, then switched to grouped and batched products: the stock
    loss and gradients under each, the experts running as the experts ops (each implementation proven) wherever
    they are swapped."""
    stock = _build(model_type, **({"hidden_act": hidden_act} if hidden_act else {}))
    stock.set_experts_implementation("eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fused_ops.fuse(copy.deepcopy(stock))
    gates = [e for e in fused.fused_ops_report.entries if e.kind == "experts_gate"]
    assert gates and all(e.swapped for e in gates), fused.fused_ops_report
    ids = hf_families.batch(stock)
    for implementation in ("eager", "grouped_mm", "batched_mm"):
        for model in (stock, fused):
            model.set_experts_implementation(implementation)
            model.zero_grad(set_to_none=True)
        want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-4, atol=1e-6, msg=implementation)
        want.loss.backward()
        got.loss.backward()
        assert_gradients_match_stock(fused, stock, rtol=1e-3, atol=1e-6)
        calls = fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
        swapped = sum(e.swapped for e in gates)
        assert calls.get("moe_expert_mlp", 0) == swapped, (implementation, calls)


def _assert_same(stock, fused, ids):
    for model in (stock, fused):
        model.zero_grad(set_to_none=True)
    want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-4, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    assert_gradients_match_stock(fused, stock, rtol=1e-3, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(fused.eval()(input_ids=ids).logits, stock.eval()(input_ids=ids).logits,
                                   rtol=1e-4, atol=1e-5)
    stock.train()
    fused.train()


def _edit(model, edit):
    torch.manual_seed(7)
    edit(model)


EDITS = {
    "bias on a scaled head": ("cohere", lambda m: setattr(m.lm_head, "bias", torch.nn.Parameter(
        torch.randn(m.lm_head.out_features)))),
    "head replaced": ("llama", lambda m: setattr(m, "lm_head", torch.nn.Sequential(copy.deepcopy(m.lm_head)))),
    "activation replaced": ("llama", lambda m: setattr(m.model.layers[1].mlp, "act_fn", torch.nn.GELU())),
    "norm replaced": ("llama", lambda m: setattr(m.model.layers[1], "post_attention_layernorm",
                                                 torch.nn.LayerNorm(m.config.hidden_size))),
    "attention replaced": ("llama", lambda m: setattr(m.model.layers[1], "self_attn",
                                                      copy.deepcopy(m.model.layers[0].self_attn))),
    "norm epsilon": ("llama", lambda m: setattr(m.model.layers[0].input_layernorm, "variance_epsilon", 0.3)),
    "softcap in the config": ("gemma2", lambda m: setattr(m.config, "final_logit_softcapping", 2.0)),
    "residual multiplier": ("granite", lambda m: [setattr(layer, "residual_multiplier", 0.5)
                                                  for layer in m.model.layers]),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_edits_after_fuse_are_noticed_at_call_time(edit):
    model_type, change = EDITS[edit]
    stock, fused = stock_and_fused(model_type)
    for model in (stock, fused):
        _edit(model, change)
    _assert_same(stock, fused, hf_families.batch(stock))
