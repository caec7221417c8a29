"""The probe behind fuse(): a mixture of experts is proven on a stand-in with as few experts as its routing
needs and a gated MLP at a narrow width (the real modules untouched, a wrong replacement still refused, the
whole module probed where its forward cannot run the stand-in), and large tensors are compared a chunk at a
time with the same verdicts as whole."""
import copy

import pytest
import torch

import fused_ops
from fused_ops.patching import probe
from fused_ops.patching.swap import fused_class

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402

EXPERTS = 32


def many_experts_model(model_type):
    """A tiny model of `model_type` with 32 experts, 2 of them a token."""
    config = hf_families.tiny_config(model_type)
    for name in ("num_experts", "num_local_experts"):
        if hasattr(config, name):
            setattr(config, name, EXPERTS)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).train()


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_experts_are_proven_on_top_k_plus_one_and_the_model_keeps_all(model_type, monkeypatch):
    stock = many_experts_model(model_type)
    fused = copy.deepcopy(stock)
    before = {name: (parameter, parameter.shape) for name, parameter in fused.named_parameters()}
    drawn = []
    original = probe._random_like
    monkeypatch.setattr(probe, "_random_like",
                        lambda name, parameter, dtype: drawn.append((name, parameter.shape)) or
                        original(name, parameter, dtype))
    fused_ops.fuse(fused)
    counts = fused.fused_ops_report.counts()
    assert counts["experts_gate"] == counts["residual_norm"] == stock.config.num_hidden_layers, fused.fused_ops_report
    # Every expert-indexed parameter the probes drew (experts' products, routers' rows) holds 3 experts.
    expert_rows = [shape[0] for name, shape in drawn if "experts" in name or name.endswith("gate.weight")]
    assert expert_rows and set(expert_rows) == {3}, drawn
    # The model itself: the same parameter objects and shapes, every router and experts module with 32.
    assert {name: (p, p.shape) for name, p in fused.named_parameters()} == before
    assert {m.num_experts for m in fused.modules() if isinstance(getattr(m, "num_experts", None), int)} == {EXPERTS}
    ids = hf_families.batch(stock)
    want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    for (name, ours), theirs in zip(fused.named_parameters(), stock.parameters(), strict=True):
        largest = theirs.grad.abs().max().item()
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5 * max(largest, 1.0), msg=name)


def experts_call(experts, tokens=12, top_k=2):
    generator = torch.Generator().manual_seed(5)
    hidden = torch.randn(tokens, experts.gate_up_proj.shape[-1], generator=generator)
    index = torch.randint(0, experts.num_experts, (tokens, top_k), generator=generator)
    weights = torch.rand(tokens, top_k, generator=generator).softmax(-1)
    return probe.Inputs(lambda dtype, device: (probe.converted((hidden, index, weights), dtype, device), {}))


def test_stand_in_cuts_only_the_experts_and_takes_their_indices_modulo():
    experts = many_experts_model("qwen3_moe").model.layers[0].mlp.experts
    inputs = experts_call(experts)
    subject, subject_inputs = probe.stand_in(experts, inputs)
    assert subject is not experts and subject.num_experts == 3 and experts.num_experts == EXPERTS
    assert subject.gate_up_proj.shape[0] == subject.down_proj.shape[0] == 3
    assert experts.gate_up_proj.shape[0] == EXPERTS
    torch.testing.assert_close(subject.gate_up_proj, experts.gate_up_proj[:3], rtol=0, atol=0)
    (hidden, index, weights), _ = subject_inputs.make(torch.float64, torch.device("cpu"))
    (_, real_index, real_weights), _ = inputs.make(torch.float64, torch.device("cpu"))
    assert hidden.dtype == weights.dtype == torch.float64
    assert torch.equal(index, real_index % 3) and torch.equal(weights, real_weights)

    layer = many_experts_model("qwen3_moe").model.layers[0]
    subject, same_inputs = probe.stand_in(layer, inputs)
    assert same_inputs is inputs  # a layer's call is not the experts' routing: its integers stay
    assert subject.self_attn is layer.self_attn and subject.input_layernorm is layer.input_layernorm
    assert subject.mlp is not layer.mlp and subject.mlp.gate.weight.shape[0] == subject.mlp.experts.num_experts == 3
    assert layer.mlp.gate.weight.shape[0] == layer.mlp.gate.num_experts == EXPERTS

    few = hf_families.build("qwen3_moe").model.layers[0].mlp.experts  # 4 experts
    assert probe.stand_in(few, experts_call(few, top_k=2))[0].num_experts == 3
    inputs = experts_call(few, top_k=3)  # 3 a token: no fewer than 4 will do
    assert probe.stand_in(few, inputs) == (few, inputs)


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_a_wrong_experts_gate_is_refused_on_the_stand_in(activation):
    from fused_ops.patching.rules.experts_gate import ExpertsGateRule
    experts = many_experts_model("qwen3_moe").model.layers[0].mlp.experts
    inputs = experts_call(experts)
    options = {dict(variant)["activation"]: variant for variant in ExpertsGateRule().variants(experts, None)
               if "interleaved" not in dict(variant)}
    probe.verify(experts, fused_class(type(experts), "experts_gate", options["silu"]), inputs)
    with pytest.raises(probe.Mismatch):
        probe.verify(experts, fused_class(type(experts), "experts_gate", options[activation]), inputs)


def test_chunked_comparison_gives_the_whole_comparison_verdict(monkeypatch):
    monkeypatch.setattr(probe, "_COMPARE_CHUNK", 7)
    generator = torch.Generator().manual_seed(2)
    want = torch.randn(5, 9, generator=generator, dtype=torch.float64)
    want[4, 8] = 4.0  # the largest value, in the last chunk: the scale of every chunk's tolerance
    within = want + 1e-5 * 4.0 * torch.rand(5, 9, generator=generator, dtype=torch.float64)
    probe._compare_values(want, within, "x", 2e-5)
    outside = want.clone()
    outside[0, 1] += 3e-3
    with pytest.raises(probe.Mismatch, match=r"x differs by up to 0.003 \(largest value 4\)"):
        probe._compare_values(want, outside, "x", 2e-5)
    probe._compare_values(torch.empty(0, 3), torch.empty(0, 3), "x", 2e-5)
    nan_want, nan_got = want.clone(), within.clone()
    nan_want[2, 2] = nan_got[2, 2] = float("nan")
    probe._compare_values(nan_want, nan_got, "x", 2e-5)
    nan_got[3, 3] = float("nan")
    with pytest.raises(probe.Mismatch, match="differs by up to inf"):
        probe._compare_values(nan_want, nan_got, "x", 2e-5)


class SplitByWidth(torch.nn.Module):
    """A gated MLP whose forward splits gate and up by its stored width: a narrower stand-in cannot run it."""

    def __init__(self):
        super().__init__()
        self.width = 96
        self.gate_up_proj = torch.nn.Linear(16, 192, bias=False)
        self.down_proj = torch.nn.Linear(96, 16, bias=False)

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        return self.down_proj(torch.nn.functional.silu(gate_up[..., :self.width]) * gate_up[..., self.width:])


def test_gated_mlps_are_proven_at_a_narrow_width_and_a_wrong_one_is_refused():
    from fused_ops.patching.rules.gated_mlp import GatedMLPRule
    rule = GatedMLPRule()
    llama = hf_families.build("llama").model.layers[0]
    phi3 = hf_families.build("phi3").model.layers[0].mlp
    width = probe._MLP_WIDTH
    subject, _ = probe.stand_in(llama, None)
    assert subject.self_attn is llama.self_attn and subject.mlp is not llama.mlp
    mlp, narrow = llama.mlp, subject.mlp
    assert narrow.gate_proj.weight.shape == narrow.up_proj.weight.shape == (width, 64)
    assert narrow.down_proj.weight.shape == (64, width) and mlp.down_proj.weight.shape == (64, 96)
    torch.testing.assert_close(narrow.down_proj.weight, mlp.down_proj.weight[:, :width], rtol=0, atol=0)
    subject, _ = probe.stand_in(phi3, None)
    rows = torch.cat([phi3.gate_up_proj.weight[:width], phi3.gate_up_proj.weight[96:96 + width]])
    torch.testing.assert_close(subject.gate_up_proj.weight, rows, rtol=0, atol=0)
    assert phi3.gate_up_proj.weight.shape == (192, 64)
    for module in (mlp, phi3):
        (right, *wrong) = rule.variants(module, None)
        probe.verify(module, fused_class(type(module), "gated_mlp", right), rule.inputs(module, None))
        for options in wrong:
            with pytest.raises(probe.Mismatch):
                probe.verify(module, fused_class(type(module), "gated_mlp", options), rule.inputs(module, None))


def test_a_stand_in_the_forward_cannot_run_leaves_the_proof_to_the_whole_module():
    from fused_ops.patching.rules.gated_mlp import GatedMLPRule
    rule = GatedMLPRule()
    module = SplitByWidth()
    assert probe.stand_in(module, None)[0] is not module
    silu, gelu_tanh, _ = rule.variants(module, None)
    probe.verify(module, fused_class(SplitByWidth, "gated_mlp", silu), rule.inputs(module, None))
    with pytest.raises(probe.Mismatch):
        probe.verify(module, fused_class(SplitByWidth, "gated_mlp", gelu_tanh), rule.inputs(module, None))


class ClampedGateMLP(torch.nn.Module):
    """Llama's gated MLP with gate and up clamped at 10, as DeepSeek-V4's experts clamp at swiglu_limit."""

    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(64, 96, bias=False)
        self.up_proj = torch.nn.Linear(64, 96, bias=False)
        self.down_proj = torch.nn.Linear(96, 64, bias=False)

    def forward(self, x):
        gate, up = self.gate_proj(x).clamp(max=10.0), self.up_proj(x).clamp(min=-10.0, max=10.0)
        return self.down_proj(torch.nn.functional.silu(gate) * up)


def test_a_clamp_unit_scale_values_never_reach_is_refused_at_large_inputs():
    from fused_ops.patching.rules.gated_mlp import GatedMLPRule
    rule = GatedMLPRule()
    assert rule.large_inputs
    clamped, llama = ClampedGateMLP(), hf_families.build("llama").model.layers[0].mlp
    silu = rule.variants(clamped, None)[0]
    assert dict(silu)["activation"] == "silu"
    # At unit scale the clamp is invisible: only the second, larger proof tells the two apart.
    probe.verify(clamped, fused_class(ClampedGateMLP, "gated_mlp", silu), rule.inputs(clamped, None))
    with pytest.raises(probe.Mismatch, match="with inputs 1000 times larger"):
        probe.verify(clamped, fused_class(ClampedGateMLP, "gated_mlp", silu), rule.inputs(clamped, None),
                     large_inputs=True)
    llama_silu = rule.variants(llama, None)[0]
    probe.verify(llama, fused_class(type(llama), "gated_mlp", llama_silu), rule.inputs(llama, None), large_inputs=True)


@pytest.mark.parametrize("model_type", ["deepseek_v4", "hy_v4"])
def test_experts_whose_gate_clamps_are_left_alone_and_the_model_stays_exact(model_type):
    """Their experts clamp gate and up at swiglu_limit (10): with the experts' weights 200 times larger the
    clamp acts, and the fused model still computes the stock logits."""
    stock = hf_families.build(model_type).eval()
    fused = fused_ops.fuse(copy.deepcopy(stock))
    report = fused.fused_ops_report
    assert "experts_gate" not in report.counts() and "norm" in report.counts(), report
    ids = hf_families.batch(stock)
    with torch.no_grad():
        for model in (stock, fused):
            for name, parameter in model.named_parameters():
                if name.endswith("experts.gate_up_proj"):
                    parameter.mul_(200)
        want, got = stock(input_ids=ids).logits, fused(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("second", ["function", "partial", "tensor"])
def test_identical_modules_share_a_proof_only_with_the_same_attributes(second):
    """Layers of one configuration are proven once; an attribute that is no plain value (a function, a
    partial function, a tensor) makes another configuration. The second MLP's activation differs from the
    first's only in such an attribute: it is proven on its own and left alone."""
    import functools

    class FunctionMLP(torch.nn.Module):
        def __init__(self, mlp, activation, scale):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
            self.activation, self.scale = activation, scale

        def forward(self, x):
            return self.down_proj(self.activation(self.gate_proj(x) * self.scale) * self.up_proj(x))

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=101))
    silu = torch.nn.functional.silu
    first, other = {"function": ((silu, None), (torch.tanh, None)),
                    "partial": ((functools.partial(torch.nn.functional.gelu, approximate="tanh"), None),
                                (functools.partial(torch.nn.functional.gelu, approximate="none"), None)),
                    "tensor": ((silu, torch.tensor(1.0)), (silu, torch.tensor(2.0)))}[second]
    layers = model.model.layers
    layers[0].mlp = FunctionMLP(layers[0].mlp, first[0], first[1] if first[1] is not None else 1.0)
    layers[1].mlp = FunctionMLP(layers[1].mlp, other[0], other[1] if other[1] is not None else 1.0)
    stock = copy.deepcopy(model)
    fused_ops.fuse(model)
    verdicts = [entry.detail.split(",")[0] if entry.swapped else None
                for entry in model.fused_ops_report.entries if entry.kind == "gated_mlp"]
    want = {"function": ["activation=silu", None], "partial": ["activation=gelu_tanh", "activation=gelu"],
            "tensor": ["activation=silu", None]}[second]
    assert verdicts == want
    ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, stock(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
