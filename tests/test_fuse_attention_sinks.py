"""fuse() on gpt-oss's eager attention with sinks: the plain causal case (full and sliding layers, the sequence
within and past the window) runs attention_with_sinks once per layer with the stock loss and gradients; a padding
mask, recorded attention weights, attention dropout, a decoding cache and a compiled model keep what stock
computes; an attention no base model hands the markers goes back to its class."""
import copy

import pytest
import torch

import fused_ops
import hf_families
from fused_ops import fuse


def gpt_oss(window=16):
    model = hf_families.build("gpt_oss")
    model.config.sliding_window = window
    for layer in model.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = window
    return model


def fused_and_stock(window=16):
    stock = gpt_oss(window)
    return fuse(copy.deepcopy(stock)), stock


def assert_step_matches_stock(fused_call, fused, stock, **batch):
    """`fused_call(**batch)` (the fused model, or a compiled one) against the stock model: loss and gradients."""
    got, want = fused_call(**batch), stock(**batch)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    got.loss.backward()
    want.loss.backward()
    hf_families.assert_gradients_match_stock(fused, stock)


def test_the_report():
    fused, _ = fused_and_stock()
    entries = {entry.path: entry for entry in fused.fused_ops_report.entries
               if entry.kind in ("attention_sinks", "causal_mask")}
    attentions = [entry for entry in entries.values() if entry.kind == "attention_sinks"]
    assert len(attentions) == len(fused.model.layers) and all(entry.swapped for entry in attentions)
    assert entries["model"].swapped and "eager_markers=True" in entries["model"].detail


@pytest.mark.parametrize("window", [16, 4])  # the 10-token batch within the window, and past it
def test_training_step_matches_stock(window):
    fused, stock = fused_and_stock(window)
    ids = hf_families.batch(stock)
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    assert calls.get("attention_with_sinks") == len(fused.model.layers), calls
    assert_step_matches_stock(fused, fused, stock, input_ids=ids, labels=ids)


def test_a_mask_of_ones_runs_the_fused_attention():
    """A data collator's mask of ones (no padding) is the plain causal case: the fused attention runs, with the
    stock loss and gradients."""
    fused, stock = fused_and_stock(4)
    ids = hf_families.batch(stock)
    mask = torch.ones_like(ids)
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, attention_mask=mask, labels=ids))
    assert calls.get("attention_with_sinks") == len(fused.model.layers), calls
    assert_step_matches_stock(fused, fused, stock, input_ids=ids, attention_mask=mask, labels=ids)


def test_padding_mask_keeps_the_stock_attention():
    fused, stock = fused_and_stock(4)
    ids = hf_families.batch(stock)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, attention_mask=mask))
    assert "attention_with_sinks" not in calls, calls
    with torch.no_grad():
        got, want = fused(input_ids=ids, attention_mask=mask), stock(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(got.logits[:, 3:], want.logits[:, 3:], rtol=1e-5, atol=1e-5)


def test_recorded_attention_weights_are_the_stock_ones():
    fused, stock = fused_and_stock(4)
    ids = hf_families.batch(stock)
    with torch.no_grad():
        got, want = fused(input_ids=ids, output_attentions=True), stock(input_ids=ids, output_attentions=True)
    assert len(got.attentions) == len(want.attentions) == len(fused.model.layers)
    for a, b in zip(got.attentions, want.attentions):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_attention_dropout_runs_the_materialised_mask():
    """In training with attention dropout the attention is the stock one, given the mask the marker stands for:
    the same random dropout draws give the same loss."""
    fused, stock = fused_and_stock(4)
    for model in (fused, stock):
        model.config.attention_dropout = 0.5
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.5
    ids = hf_families.batch(stock)
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids))
    assert "attention_with_sinks" not in calls, calls
    torch.manual_seed(3)
    got = fused(input_ids=ids, labels=ids).loss
    torch.manual_seed(3)
    want = stock(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_generation_with_a_cache_matches_stock():
    fused, stock = fused_and_stock(4)
    fused.eval(), stock.eval()
    ids = hf_families.batch(stock)[:1, :6]
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(fused.generate(ids, **settings), stock.generate(ids, **settings))


def test_compiled_fullgraph_step_matches_stock():
    fused, stock = fused_and_stock(4)
    ids = hf_families.batch(stock)
    torch._dynamo.reset()
    assert_step_matches_stock(torch.compile(fused, fullgraph=True), fused, stock, input_ids=ids, labels=ids)


def test_causal_mask_off_leaves_the_attention_alone():
    fused = fuse(gpt_oss(), causal_mask=False)
    assert not any(entry.kind == "attention_sinks" for entry in fused.fused_ops_report.entries)
    assert not any("sink_attention" in dict(getattr(type(layer.self_attn), "_fused_ops_options", ()))
                   for layer in fused.model.layers)


def test_an_attention_no_base_model_hands_markers_goes_back(monkeypatch):
    from fused_ops.patching.rules import LeftAlone
    from fused_ops.patching.rules.causal_mask import CausalMaskRule

    def left_alone(self, module, context):
        raise LeftAlone("left alone for this test")
    monkeypatch.setattr(CausalMaskRule, "variants", left_alone)
    fused = fuse(gpt_oss())
    entries = [entry for entry in fused.fused_ops_report.entries if entry.kind == "attention_sinks"]
    assert entries and all(not entry.swapped and "no swapped base model hands it" in entry.detail
                           for entry in entries)
    assert not any("sink_attention" in dict(getattr(type(layer.self_attn), "_fused_ops_options", ()))
                   for layer in fused.model.layers)
    ids = hf_families.batch(fused)
    assert "attention_with_sinks" not in hf_families.fused_op_calls(lambda: fused(input_ids=ids))


def test_a_backward_wrong_only_in_the_models_own_dtype_is_not_proven(monkeypatch):
    """The proof compares gradients in the model's own dtype and device too (on a GPU, the flash kernels that the
    float64 probe on the CPU never runs): a backward that goes wrong in float32 alone leaves the attention alone."""
    from fused_ops.patching.rules import attention_sinks

    class WrongInFloat32:
        @staticmethod
        def attention_with_sinks(query, *args):
            out = fused_ops.attention_with_sinks(query, *args)
            return out + (out - out.detach()) * 0.5 if query.dtype == torch.float32 else out
    monkeypatch.setattr(attention_sinks, "_ops", WrongInFloat32)
    fused = fuse(gpt_oss())
    entries = [entry for entry in fused.fused_ops_report.entries if entry.kind == "attention_sinks"]
    assert entries and all(not entry.swapped and "torch.float32 gradient" in entry.detail for entry in entries), \
        [entry.detail for entry in entries]


def test_a_bfloat16_model_gets_the_fused_attention():
    """In bfloat16 rounding flips a router's choice of experts wherever the attention's values change, so the
    causal markers are proven with the attention in its reference form: the masks they stand for, exactly."""
    from transformers import GptOssConfig, GptOssForCausalLM
    config = GptOssConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=1,
                          head_dim=16, vocab_size=512, num_hidden_layers=4, num_local_experts=32, num_experts_per_tok=4,
                          sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2,
                          attention_bias=True, attn_implementation="eager")
    torch.manual_seed(0)
    model = fuse(GptOssForCausalLM(config).to(torch.bfloat16))
    entries = {entry.kind: entry for entry in model.fused_ops_report.entries
               if entry.kind in ("attention_sinks", "causal_mask")}
    assert entries["attention_sinks"].swapped and "eager_markers=True" in entries["causal_mask"].detail, entries
    ids = hf_families.batch(model)
    assert hf_families.fused_op_calls(lambda: model(input_ids=ids)).get("attention_with_sinks") == len(
        model.model.layers)
