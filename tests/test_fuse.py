"""fused_ops.fuse on tiny random-init Hugging Face models (Llama, Mistral, Qwen2, Qwen3, GPT-2, BERT) and
on torch's own norms: what it swaps, the same loss, logits and gradients as the stock model eagerly and
compiled, generation with a KV cache, and an unchanged state dict."""
import collections
import copy
import io
import logging
import subprocess
import sys

import pytest
import torch

import fused_ops
from fused_ops.patching.swap import fused_class, fused_kind

transformers = pytest.importorskip("transformers")
from hf_families import Logits, assert_gradients_match_stock  # noqa: E402

SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=101, max_position_embeddings=64)
FAMILIES = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**SIZES, sliding_window=None)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SIZES)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SIZES, head_dim=16)),
}
# Modules of each kind a 2-layer model has: RMSNorms (two per layer and the final one, plus q_norm and
# k_norm per Qwen3 layer), MLPs, attentions, decoder layers, the causal LM, the base model.
EXPECTED = {"norm": 5, "gated_mlp": 2, "rotary": 2, "residual_norm": 2, "lm_head_loss": 1, "causal_mask": 1}


def stock_and_fused(family, device):
    torch.manual_seed(0)
    stock = FAMILIES[family]().to(device)
    with torch.no_grad():  # norms of ones would hide a weight that is not applied
        for name, parameter in stock.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return stock, fused_ops.fuse(copy.deepcopy(stock))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_swaps_each_kind_and_logs_it(family, caplog):
    with caplog.at_level(logging.INFO, logger="fused_ops"):
        _, fused = stock_and_fused(family, "cpu")
    counts = fused.fused_ops_report.counts()
    assert counts == dict(EXPECTED, norm=EXPECTED["norm"] + (4 if family == "qwen3" else 0)), fused.fused_ops_report
    kinds = collections.Counter(fused_kind(m) for m in fused.modules() if fused_kind(m))
    assert kinds == counts
    lines = [r.getMessage() for r in caplog.records if r.name == "fused_ops"]
    assert len(lines) == len(EXPECTED) and all(line.startswith("fused_ops.fuse: ") for line in lines)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_same_loss_logits_and_gradients(family, device):
    stock, fused = stock_and_fused(family, device)
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12), device=device)
    labels = ids.clone()
    labels[0, :3] = -100
    want, got = stock(input_ids=ids, labels=labels), fused(input_ids=ids, labels=labels)
    assert got.logits is None  # the loss comes from linear_cross_entropy, without the logits
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-5)
    want.loss.backward()
    got.loss.backward()
    assert_gradients_match_stock(fused, stock)
    with torch.no_grad():
        torch.testing.assert_close(fused(input_ids=ids).logits, stock(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_autocast_training_step_of_float32_parameters(family, device):
    """Mixed precision as usually trained: float32 parameters under torch.autocast(bfloat16). The fused
    model takes the products in autocast's dtype as nn.Linear does, and adds the attention's bfloat16
    output to the float32 residual stream as the stock layer does."""
    stock, fused = stock_and_fused(family, device)
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.loss, want.loss, rtol=2e-3, atol=2e-3)
    want.loss.backward()
    got.loss.backward()
    assert_gradients_match_stock(fused, stock, rtol=0, atol=0, relative_atol=4e-2, dtype=torch.float32)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_plain_causal_attention_needs_no_mask_while_tracing(family, monkeypatch):
    """While torch.compile traces, transformers materialises the causal mask; the fused base model
    leaves the plain causal case to SDPA's is_causal, and keeps the mask where padding, positions
    (packed sequences) or a filled cache make it more than causal."""
    stock, fused = stock_and_fused(family, "cpu")
    monkeypatch.setattr(transformers.masking_utils, "is_tracing", lambda *args, **kwargs: True)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is None, is_causal))
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12))
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, :4] = 0
    for kwargs, plain in ((dict(labels=ids), True), (dict(labels=ids, use_cache=False), True),
                          (dict(attention_mask=padding), False), (dict(position_ids=torch.arange(12)[None]), False)):
        results = {}
        for name, model in (("stock", stock), ("fused", fused)):
            calls.clear()
            with torch.no_grad():
                results[name] = model(input_ids=ids, **kwargs)
            expected = (True, True) if name == "fused" and plain else (False, False)
            assert calls == [expected] * SIZES["num_hidden_layers"], (name, kwargs)
        if "labels" in kwargs:
            torch.testing.assert_close(results["fused"].loss, results["stock"].loss, rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(results["fused"].logits, results["stock"].logits, rtol=1e-5, atol=1e-5)


def test_compiled_graph_of_the_fused_model_leaves_the_causal_mask_to_sdpa():
    """Under a real torch.compile trace (not only transformers' tracing check forced on), the fused
    model's graph calls SDPA without a mask and with is_causal, where the stock model's builds one."""
    stock, fused = stock_and_fused("llama", "cpu")
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12))
    for name, model in (("stock", stock), ("fused", fused)):
        calls = []

        def recording_backend(graph_module, example_inputs):
            for node in graph_module.graph.nodes:
                if node.target is torch.nn.functional.scaled_dot_product_attention:
                    mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
                    calls.append((mask is None, node.kwargs.get("is_causal", False)))
            return graph_module.forward
        torch._dynamo.reset()
        loss = torch.compile(model, backend=recording_backend)(input_ids=ids, labels=ids, use_cache=False).loss
        torch.testing.assert_close(loss, stock(input_ids=ids, labels=ids, use_cache=False).loss, rtol=1e-5, atol=1e-5)
        expected = (True, True) if name == "fused" else (False, False)
        assert calls == [expected] * SIZES["num_hidden_layers"], name
    torch._dynamo.reset()


def test_exported_fused_model_keeps_the_causal_mask():
    """torch.export keeps transformers' mask (an exported program serves whatever it is given later),
    though torch 2.11's is_exporting() also answers True under torch.compile."""
    stock, fused = stock_and_fused("llama", "cpu")
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12))

    exported = torch.export.export(Logits(fused), (ids,))
    masks = [len(node.args) > 3 and node.args[3] is not None for node in exported.graph.nodes
             if node.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert masks == [True] * SIZES["num_hidden_layers"]
    torch.testing.assert_close(exported.module()(ids), Logits(stock)(ids), rtol=1e-5, atol=1e-5)


def test_compiled_fused_model_matches_stock(device):
    stock, fused = stock_and_fused("llama", device)
    compiled = torch.compile(fused, backend="inductor" if device == "cuda" else "aot_eager")
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12), device=device)
    for _ in range(2):  # the second call runs the compiled graph with its gradients
        for model in (stock, fused):
            model.zero_grad()
        want, got = stock(input_ids=ids, labels=ids), compiled(input_ids=ids, labels=ids)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-5)
        want.loss.backward()
        got.loss.backward()
        assert_gradients_match_stock(fused, stock)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_generate_with_a_kv_cache(family, device):
    stock, fused = stock_and_fused(family, device)
    prompt = torch.randint(0, SIZES["vocab_size"], (2, 5), device=device)
    settings = dict(max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(fused.generate(prompt, **settings), stock.generate(prompt, **settings))


def test_state_dict_is_unchanged_and_checkpoints_load_both_ways(tmp_path):
    stock, fused = stock_and_fused("llama", "cpu")
    want, got = stock.state_dict(), fused.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].shape == value.shape and torch.equal(got[key], value), key
    other = FAMILIES["llama"]()  # fresh random weights, loaded into the fused model
    fused.load_state_dict(other.state_dict())
    for key, value in other.state_dict().items():
        assert torch.equal(fused.state_dict()[key], value), key
    fused.save_pretrained(tmp_path)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    for key, value in reloaded.state_dict().items():
        assert torch.equal(fused.state_dict()[key], value), key


def test_torch_norms_and_options():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.RMSNorm(16, eps=1e-5), torch.nn.LayerNorm(16),
                                torch.nn.LayerNorm(16, bias=False))
    with torch.no_grad():
        for norm in model[1:]:
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 16)
    want = model(x)
    fused_ops.fuse(model)
    assert [fused_kind(m) for m in model[1:]] == ["norm"] * 3
    assert [type(m).__bases__[0] for m in model[1:]] == [torch.nn.RMSNorm, torch.nn.LayerNorm, torch.nn.LayerNorm]
    torch.testing.assert_close(model(x), want)
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "2.weight", "2.bias", "3.weight"]
    kept = fused_ops.fuse(FAMILIES["llama"](), mlp=False, rope=False, cross_entropy=False)
    assert type(kept.model.layers[0].mlp).__name__ == "LlamaMLP"
    assert type(kept.model.layers[0].self_attn).__name__ == "LlamaAttention"


def test_nothing_to_fuse_warns_and_returns_the_model():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with pytest.warns(UserWarning, match="nothing to fuse in Sequential"):
        assert fused_ops.fuse(model) is model


class OffsetRMSNorm(torch.nn.Module):
    """An RMSNorm by name and by its parts whose weight is applied as (1 + weight)."""

    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(size))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * (1 + self.weight)


class DoubledWeightRMSNorm(OffsetRMSNorm):
    """An RMSNorm by name and parts whose weight is applied twice over: no fused op computes it."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * (2 * self.weight)


class WeightlessLayerNorm(torch.nn.Module):
    """OLMo's LayerNorm: no parameters, its epsilon in the forward's code."""

    def __init__(self, size):
        super().__init__()
        self.normalized_shape = (size,)

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, self.normalized_shape, None, None, eps=1e-5)


class LayerNormByAnotherName(torch.nn.Module):
    """Called RMSNorm, computes a LayerNorm without bias: the probe, not the name, decides."""

    def __init__(self, size):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = 1e-5

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.weight, None, self.eps)


def test_norms_are_proven_by_what_they_compute_not_their_names():
    model = torch.nn.Sequential(DoubledWeightRMSNorm(8), LayerNormByAnotherName(8), torch.nn.RMSNorm(8, eps=1e-6),
                                OffsetRMSNorm(8), WeightlessLayerNorm(8), torch.nn.LayerNorm(8, elementwise_affine=False))
    with torch.no_grad():
        for norm in (model[0], model[3]):
            norm.weight.normal_()
    x = torch.randn(3, 8)
    want = model(x)
    fused_ops.fuse(model)
    report = model.fused_ops_report
    assert fused_kind(model[0]) is None and type(model[0]) is DoubledWeightRMSNorm
    assert [e.detail for e in report.entries if e.path == "0"][0].startswith("not proven")
    options = [dict(type(norm)._fused_ops_options) for norm in list(model)[1:]]
    assert [(o["function"], o["offset"]) for o in options] == [
        ("layer_norm", 0.0), ("rms_norm", 0.0), ("rms_norm", 1.0), ("layer_norm", 0.0), ("layer_norm", 0.0)]
    assert options[3]["eps"] == 1e-5
    torch.testing.assert_close(model(x), want)


def test_report_type_errors_and_fusing_twice(capsys):
    with pytest.raises(TypeError, match="expected a torch.nn.Module, got str"):
        fused_ops.fuse("llama")
    model = fused_ops.fuse(FAMILIES["llama"](), verbose=True)
    table = capsys.readouterr().out
    assert "fused_ops.fuse(LlamaForCausalLM, llama)" in table and "gated_mlp" in table and "swapped" in table
    assert isinstance(model.fused_ops_report, fused_ops.FusionReport)
    with pytest.warns(UserWarning, match="already fused"):
        assert fused_ops.fuse(model) is model


def create_causal_mask(config, mask_kind):  # a create_causal_mask whose arguments fuse does not know
    return None


class BaseModelOfAnotherVersion(torch.nn.Module):
    def forward(self, x):
        return x + (create_causal_mask(None, "causal") or 0)


def test_causal_mask_of_unknown_arguments_is_left_alone_and_reported():
    model = torch.nn.Sequential(BaseModelOfAnotherVersion(), torch.nn.RMSNorm(8, eps=1e-6))
    fused_ops.fuse(model)
    assert type(model[0]) is BaseModelOfAnotherVersion
    [entry] = [e for e in model.fused_ops_report.entries if e.kind == "causal_mask"]
    assert not entry.swapped and "arguments" in entry.detail


def test_gpt2_and_bert_bias_gelu(device):
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=50,
                                                                n_positions=32)).to(device).eval()
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=64, vocab_size=50)).to(device).eval()
    ids = torch.randint(0, 50, (2, 9), device=device)
    for model, output in ((gpt2, lambda out: out.logits), (bert, lambda out: out.last_hidden_state)):
        with torch.no_grad():
            want = output(model(input_ids=ids))
            with torch.autocast(device, dtype=torch.bfloat16):  # float32 parameters, bfloat16 products
                want_autocast = output(model(input_ids=ids)).float()
            fused_ops.fuse(model, norms=False)
            assert sum(getattr(type(m), "_fused_ops_kind", None) == "bias_gelu" for m in model.modules()) == 2
            torch.testing.assert_close(output(model(input_ids=ids)), want, rtol=1e-5, atol=1e-5)
            with torch.autocast(device, dtype=torch.bfloat16):
                got_autocast = output(model(input_ids=ids)).float()
            torch.testing.assert_close(got_autocast, want_autocast, rtol=3e-2, atol=3e-2 * want_autocast.abs().max().item())


def test_import_does_not_import_transformers():
    code = "import sys, fused_ops; assert 'transformers' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gradient_checkpointing_and_compile_before_fuse():
    """Gradient checkpointing on the fused model, and fuse() given a model torch.compile wrapped first:
    the stock loss and gradients."""
    stock, _ = stock_and_fused("llama", "cpu")
    ids = torch.randint(0, SIZES["vocab_size"], (2, 12))
    want = stock(input_ids=ids, labels=ids).loss
    want.backward()
    checkpointed = copy.deepcopy(stock)
    checkpointed.gradient_checkpointing_enable()
    compiled = torch.compile(copy.deepcopy(stock), backend="aot_eager")
    for model in (fused_ops.fuse(checkpointed), fused_ops.fuse(compiled)):
        model.zero_grad(set_to_none=True)
        got = model(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        got.backward()
        assert_gradients_match_stock(getattr(model, "_orig_mod", model), stock)
    assert compiled.fused_ops_report.counts()["gated_mlp"] == 2
    torch._dynamo.reset()


def test_constants_around_the_layer_and_head_are_proven_not_assumed():
    """Granite with a residual multiplier and a logits scaling of a real checkpoint: the head's scale and
    the layer's multiplier are variants the probe proves (the Llama-shaped residual + norm forward without
    the multiplier is refused). Gemma 2's final-logit softcap goes to the op. The stock loss and
    gradients."""
    import hf_families
    config = hf_families.tiny_config("granite")
    config.logits_scaling, config.residual_multiplier, config.embedding_multiplier = 8.0, 0.22, 12.0
    torch.manual_seed(0)
    granite = transformers.AutoModelForCausalLM.from_config(config)
    reports = {}
    for name, stock in (("granite", granite), ("gemma2", hf_families.build("gemma2"))):
        fused = fused_ops.fuse(copy.deepcopy(stock))
        reports[name] = fused.fused_ops_report
        entries = {e.kind: e for e in fused.fused_ops_report.entries}
        assert entries["lm_head_loss"].swapped, fused.fused_ops_report
        ids = hf_families.batch(stock)
        want, got = stock(input_ids=ids, labels=ids).loss, fused(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        want.backward()
        got.backward()
        assert_gradients_match_stock(fused, stock)
    granite_entries = reports["granite"].entries
    assert any(e.kind == "lm_head_loss" and "logit_scale=0.125" in e.detail for e in granite_entries)
    layers = [e for e in granite_entries if e.kind == "residual_norm"]
    assert layers and all(e.swapped and "residual_multiplier=0.22, scaled=True" in e.detail for e in layers)
    assert any(e.kind == "lm_head_loss" and "softcap=30.0" in e.detail for e in reports["gemma2"].entries)


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_moe_head_adds_the_router_loss_to_the_fused_loss(model_type):
    """The MoE head + loss runs as linear_cross_entropy with and without the router's auxiliary loss; asked
    for it (in the call or the config), the fused loss adds it as the stock forward does: the same loss,
    aux_loss, router logits and gradients."""
    import hf_families
    stock = hf_families.build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    assert fused.fused_ops_report.counts()["lm_head_loss"] == 1
    ids = hf_families.batch(stock)
    for kwargs, in_config in (({}, False), ({"output_router_logits": True}, False), ({}, True)):
        stock.config.output_router_logits = fused.config.output_router_logits = in_config
        outputs = []
        for model in (stock, fused):
            model.zero_grad(set_to_none=True)
            output = model(input_ids=ids, labels=ids, **kwargs)
            output.loss.backward()
            outputs.append(output)
        want, got = outputs
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        assert (got.aux_loss is None) == (want.aux_loss is None) == (not kwargs and not in_config)
        if want.aux_loss is not None:
            torch.testing.assert_close(got.aux_loss, want.aux_loss, rtol=1e-5, atol=1e-6)
            assert len(got.router_logits) == len(want.router_logits) == stock.config.num_hidden_layers
        assert_gradients_match_stock(fused, stock)
        calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids, **kwargs))
        assert calls.get("linear_cross_entropy_with_gradients") == 1, calls
    stock.config.output_router_logits = fused.config.output_router_logits = False


def test_gemma3_image_text_model_fuses_its_head_and_loss_with_images():
    """Gemma 3's image-text model (its checkpoints' class): with images, token types and labels, the head
    + loss runs as linear_cross_entropy and the vision tower's norms as layer_norm, with the stock loss
    and every gradient, the vision tower's included."""
    import hf_families
    stock = hf_families.build("gemma3")
    fused = fused_ops.fuse(copy.deepcopy(stock))
    head = [e for e in fused.fused_ops_report.entries if e.kind == "lm_head_loss"]
    assert len(head) == 1 and head[0].swapped and "labels_to_base=True" in head[0].detail, fused.fused_ops_report
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, stock.config.text_config.vocab_size, (2, 12), generator=generator)
    ids[:, 2:2 + stock.config.mm_tokens_per_image] = stock.config.image_token_id
    token_type_ids = (ids == stock.config.image_token_id).long()
    pixel_values = torch.randn(2, 3, 32, 32, generator=generator)
    labels = ids.masked_fill(token_type_ids == 1, -100)
    inputs = dict(input_ids=ids, pixel_values=pixel_values, token_type_ids=token_type_ids, labels=labels)
    want, got = stock(**inputs), fused(**inputs)
    assert got.logits is None and got.image_hidden_states is not None
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.image_hidden_states, want.image_hidden_states)
    want.loss.backward()
    got.loss.backward()
    assert stock.model.vision_tower.embeddings.patch_embedding.weight.grad is not None
    assert_gradients_match_stock(fused, stock, atol=1e-5, relative_atol=1e-5)  # the vision head's: none in both
    calls = hf_families.fused_op_calls(lambda: fused(**inputs))
    assert calls.get("linear_cross_entropy_with_gradients") == 1 and calls.get("layer_norm", 0) > 0, calls


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm", "eager"])
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_experts_run_as_the_experts_ops(model_type, implementation):
    """The routed experts run as moe_permute + moe_expert_mlp + moe_unpermute, once per MoE layer, under each
    experts implementation (each proven on its own), with the stock loss and gradients; gpt-oss's clamped gate
    (interleaved, with its alpha and limit) too, computed inside the experts ops."""
    import hf_families
    stock = hf_families.build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    for model in (stock, fused):
        model.set_experts_implementation(implementation)
    gates = [e for e in fused.fused_ops_report.entries if e.kind == "experts_gate"]
    assert len(gates) == stock.config.num_hidden_layers, fused.fused_ops_report
    ids = hf_families.batch(stock)
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    implementations = "('eager', 'grouped_mm', 'batched_mm')"
    gate = "activation=swiglu_oai, interleaved=True, alpha=1.702, limit=7.0" if model_type == "gpt_oss" else \
        "activation=silu"
    assert all(e.swapped and e.detail == f"{gate}, implementations={implementations}" for e in gates), \
        fused.fused_ops_report
    for op in ("moe_permute", "moe_expert_mlp", "moe_unpermute"):
        assert calls.get(op, 0) == len(gates), calls
    want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    assert_gradients_match_stock(fused, stock)


def test_experts_between_transformers_products_when_the_implementation_is_not_proven():
    """An experts implementation fuse() did not prove (chosen after fuse()) runs the stock forward, whose
    grouped products call the fused gate."""
    import hf_families
    stock = hf_families.build("qwen3_moe")
    fused = fused_ops.fuse(copy.deepcopy(stock))
    for layer in fused.model.layers:
        experts = layer.mlp.experts
        options = dict(type(experts)._fused_ops_options)
        options["implementations"] = ("eager",)
        experts.__class__ = fused_class(type(experts).__bases__[0], "experts_gate", tuple(options.items()))
    for model in (stock, fused):
        model.set_experts_implementation("grouped_mm")
    ids = hf_families.batch(stock)
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert "moe_expert_mlp" not in calls and calls.get("gated_mul", 0) == len(fused.model.layers), calls
    want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)


def test_fused_ops_is_an_experts_implementation_to_choose():
    """`fused_ops.experts.register()` makes "fused_ops" an experts implementation of transformers, chosen with
    set_experts_implementation: the stock loss and gradients, the experts ops running (gpt-oss's clamped gate
    too); experts whose gate it cannot prove (a ReLU gate) run transformers' grouped products instead."""
    import hf_families
    fused_ops.experts.register()
    for model_type, relu in (("qwen3_moe", False), ("gpt_oss", False), ("qwen3_moe", True)):
        stock = hf_families.build(model_type)
        if relu:
            for layer in stock.model.layers:
                layer.mlp.experts.act_fn = torch.nn.ReLU()
        chosen = copy.deepcopy(stock)
        chosen.set_experts_implementation("fused_ops")
        ids = hf_families.batch(stock)
        calls = hf_families.fused_op_calls(lambda: chosen(input_ids=ids, labels=ids))
        assert (calls.get("moe_expert_mlp", 0) == stock.config.num_hidden_layers) == (not relu), calls
        want, got = stock(input_ids=ids, labels=ids), chosen(input_ids=ids, labels=ids)
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        want.loss.backward()
        got.loss.backward()
        assert_gradients_match_stock(chosen, stock)


@pytest.mark.parametrize("model_type, layout", [("llama", "rotate_half"), ("cohere", "interleaved"),
                                                ("glm4", "interleaved_half_table"),
                                                ("gpt_oss", "rotate_half_half_table"),
                                                ("gemma4_text", "rotate_half"),
                                                ("llama4_text", "complex_heads_third"),
                                                ("deepseek_v2", "complex_heads_second"),
                                                ("deepseek_v3", "rotate_half")])
def test_rotary_layout_is_the_one_the_probe_proves(model_type, layout):
    """Each family's rotary tables and pairs (GLM-4's half tables repeated per pair over a partial rotary
    dim, gpt-oss's half tables, Gemma 4's one tensor a call, Llama 4's and DeepSeek-V2's complex factors
    over heads in dim 2 or 1, DeepSeek-V3's pairs laid out as halves by the function its config picks) are
    recognised as such, and the fused attention gives the stock values."""
    import hf_families
    stock = hf_families.build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    rotary = [e for e in fused.fused_ops_report.entries if e.kind == "rotary"]
    assert rotary and all(e.swapped and f"layout={layout}," in e.detail for e in rotary), fused.fused_ops_report
    ids = hf_families.batch(stock)
    want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    assert_gradients_match_stock(fused, stock)


@pytest.mark.parametrize("rotary_dim", [16, 8], ids=["whole_head", "partial"])
def test_gptj_rotary_mlp_and_head_fuse(rotary_dim):
    """GPT-J's rotary function rotates one [B, S, H, D] tensor a call by tables of one value a pair, over a
    part of the head or all of it; its MLP is fc_in, tanh-GELU, fc_out; its head hands the base model none
    of its keyword arguments. All three fused, with the stock loss and gradients."""
    config = transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=4, rotary_dim=rotary_dim, vocab_size=101,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    stock = transformers.GPTJForCausalLM(config)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    counts = fused.fused_ops_report.counts()
    assert counts == {"norm": 3, "bias_gelu": 2, "rotary": 2, "lm_head_loss": 1, "causal_mask": 1}, fused.fused_ops_report
    ids = torch.randint(0, 101, (2, 12))
    want, got = stock(input_ids=ids, labels=ids), fused(input_ids=ids, labels=ids, num_items_in_batch=17)
    torch.testing.assert_close(got.loss * 17 / 22, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    (got.loss * 17 / 22).backward()
    assert_gradients_match_stock(fused, stock)


@pytest.mark.parametrize("model_type, layer", [("gemma2", "four_norm"), ("glm4", "glm4"), ("phi3", "phi3"),
                                               ("nemotron", "llama"), ("gpt_oss", "llama"), ("qwen3_vl", "llama"),
                                               ("glm4v", "glm4")])
def test_residual_norm_of_each_layer_shape(model_type, layer):
    """The residual add + the norm after it in Gemma 2's and GLM-4's four-norm layers, Phi-3's layer with
    dropouts (here 0.2: the same masks in training), Nemotron's LayerNorm1P layer, gpt-oss's layer whose
    experts return a tuple, and Qwen3-VL's and GLM-4V's layers, whose forwards take their arguments in
    another order: the stock loss and gradients in training."""
    import hf_families
    config = hf_families.tiny_config(model_type)
    if model_type == "phi3":
        config.resid_pdrop = 0.2
    torch.manual_seed(0)
    stock = hf_families.model_class_of(model_type).from_config(config).train()
    fused = fused_ops.fuse(copy.deepcopy(stock))
    layers = [e for e in fused.fused_ops_report.entries if e.kind == "residual_norm"]
    assert layers and all(e.swapped and f"layer={layer}," in e.detail for e in layers), fused.fused_ops_report
    assert not any("scaled=True" in e.detail for e in layers)
    ids = hf_families.batch(stock)
    losses = []
    for model in (stock, fused):
        torch.manual_seed(3)
        losses.append(model(input_ids=ids, labels=ids).loss)
        losses[-1].backward()
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert_gradients_match_stock(fused, stock)


def test_fuse_leaves_the_random_generators_where_they_were(device):
    """The probes draw random numbers (a stand-in head's initialisation, for one); the caller's generators,
    which seed their data and dropout, do not move."""
    model = FAMILIES["llama"]().to(device)

    def draws():
        return [torch.rand(4), torch.rand(4, device=device)]
    torch.manual_seed(7)
    want = draws()
    torch.manual_seed(7)
    fused_ops.fuse(model)
    assert model.fused_ops_report.counts() == EXPECTED
    for got, expected in zip(draws(), want):
        assert torch.equal(got, expected)


def test_fuse_inside_an_autocast_region_fuses_what_it_fuses_outside(device):
    """The probes run in float64 outside the caller's autocast region (in it, the stock products would
    run in bfloat16 and every proof of a product would fail), and the region is on again afterwards."""
    model = FAMILIES["llama"]().to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        fused_ops.fuse(model)
        assert torch.is_autocast_enabled(device)
    assert model.fused_ops_report.counts() == EXPECTED


def test_fuse_under_a_default_device_fuses_what_it_fuses_without_one(device):
    """Models built under `with torch.device(...)` are often fused there too: the probes make their tensors
    on the CPU whatever the default device is (meta stands for one whose tensors the probes cannot use)."""
    model = FAMILIES["llama"]().to(device)
    for default in (device, "meta"):
        fused = copy.deepcopy(model)
        with torch.device(default):
            fused_ops.fuse(fused)
        assert fused.fused_ops_report.counts() == EXPECTED, default
