"""fuse() where a family's forwards take more than the Llama shape's arguments: the head + loss takes the stock
forward's own arguments (by name or by position) and hands the base model what the stock forward hands it, or
is left alone; scales around the head are proven, not assumed; the probe forward leaves no state behind."""
import copy

import pytest
import torch

import fused_ops

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402


def head_entry(model):
    (entry,) = [e for e in model.fused_ops_report.entries if e.kind == "lm_head_loss"]
    return entry


def assert_same_step(stock, fused, *args, **kwargs):
    """The same loss and every gradient, the fused head + loss having run as linear_cross_entropy."""
    outputs = []
    for model in (stock, fused):
        model.zero_grad(set_to_none=True)
        output = model(*args, **kwargs)
        output.loss.backward()
        outputs.append(output)
    want, got = outputs
    assert got.logits is None
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    hf_families.assert_gradients_match_stock(fused, stock, atol=1e-5, relative_atol=1e-5)
    calls = hf_families.fused_op_calls(lambda: fused(*args, **kwargs))
    assert calls.get("linear_cross_entropy_with_gradients") == 1, calls


def test_gemma4_head_takes_per_layer_inputs_and_positional_arguments():
    """Gemma 4's causal LM takes `per_layer_inputs` beyond the Llama shape's arguments: given with the
    embeddings or left to the base model, and with the arguments given by position, the stock loss and
    gradients."""
    stock = hf_families.build("gemma4_text")
    fused = fused_ops.fuse(copy.deepcopy(stock))
    assert head_entry(fused).swapped, fused.fused_ops_report
    ids = hf_families.batch(stock)
    labels = ids.masked_fill(torch.arange(ids.shape[1]) < 3, -100)
    assert_same_step(stock, fused, input_ids=ids, labels=labels)
    with torch.no_grad():  # embeddings given in place of the ids, with their per-layer inputs
        embeddings = stock.get_input_embeddings()(ids)
        per_layer_inputs = stock.model.get_per_layer_inputs(ids, None) * 1.5
    assert_same_step(stock, fused, inputs_embeds=embeddings, labels=labels, per_layer_inputs=per_layer_inputs)
    assert_same_step(stock, fused, ids, None, None, None, None, labels)


def test_gemma4_image_text_model_hands_its_base_model_the_labels():
    stock = hf_families.build("gemma4")
    fused = fused_ops.fuse(copy.deepcopy(stock))
    entry = head_entry(fused)
    assert entry.swapped and "labels_to_base=True" in entry.detail, fused.fused_ops_report
    ids = hf_families.batch(stock)
    assert_same_step(stock, fused, input_ids=ids, labels=ids)


class _OwnArgumentHead(transformers.LlamaForCausalLM):
    """A causal LM whose forward takes an argument of its own, keeps it from its base model and, as
    `_TemperatureHead`, divides the logits by it."""
    divides_the_logits = False

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, temperature=None, **kwargs):
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                             **kwargs)
        logits = self.lm_head(outputs.last_hidden_state)
        if temperature is not None and self.divides_the_logits:
            logits = logits / temperature
        loss = self.loss_function(logits, labels, self.config.vocab_size, **kwargs) if labels is not None else None
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=outputs.past_key_values)


class _TemperatureHead(_OwnArgumentHead):
    divides_the_logits = True


@pytest.mark.parametrize("model_class", [_TemperatureHead, _OwnArgumentHead])
def test_head_whose_own_arguments_do_more_than_reach_the_base_model_is_left_alone(model_class):
    """An argument the Llama shape does not have, used by the head's forward itself or kept from the
    base model: the probe gives it a marker value and the fused forward, which hands it on, is not proven."""
    torch.manual_seed(0)
    stock = model_class(hf_families.tiny_config("llama"))
    fused = fused_ops.fuse(copy.deepcopy(stock))
    entry = head_entry(fused)
    assert not entry.swapped and entry.detail.startswith("not proven"), fused.fused_ops_report
    ids = hf_families.batch(stock)
    extra = {"temperature": torch.tensor(0.5)}
    want, got = stock(input_ids=ids, labels=ids, **extra), fused(input_ids=ids, labels=ids, **extra)
    torch.testing.assert_close(got.loss, want.loss)


def test_falcon_h1_head_multiplier_is_a_proven_scale():
    """Falcon-H1 multiplies the logits by its base model's `lm_head_multiplier`: the fused loss takes it
    on the rows, as the probe proves against the multiplier the base model really has."""
    config = hf_families.tiny_config("falcon_h1")
    config.lm_head_multiplier = 0.375
    torch.manual_seed(0)
    stock = transformers.AutoModelForCausalLM.from_config(config)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    entry = head_entry(fused)
    assert entry.swapped and "logit_scale=0.375" in entry.detail, fused.fused_ops_report
    ids = hf_families.batch(stock)
    assert_same_step(stock, fused, input_ids=ids, labels=ids)


@pytest.mark.parametrize("model_type", ["granitemoe", "granitemoehybrid"])
def test_granite_moe_head_hands_its_base_model_what_the_stock_one_does(model_type):
    """Granite's MoE models scale the logits and do not hand the base model `output_router_logits` (their
    base models read it from the config): the fused head hands it nothing more, with the stock loss."""
    config = hf_families.tiny_config(model_type)
    config.logits_scaling = 4.0
    torch.manual_seed(0)
    stock = transformers.AutoModelForCausalLM.from_config(config)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    entry = head_entry(fused)
    assert entry.swapped and "router_to_base=False" in entry.detail and "logit_scale=0.25" in entry.detail, (
        fused.fused_ops_report)
    ids = hf_families.batch(stock)
    assert_same_step(stock, fused, input_ids=ids, labels=ids)
    assert fused(input_ids=ids, labels=ids).aux_loss is None


@pytest.mark.parametrize("model_type, variant", [("bloom", "cross_attentions=False"), ("mpt", "cross_attentions=False"),
                                                 ("falcon", "cross_attentions=False"),
                                                 ("codegen", "kwargs_to_base=False")])
def test_head_hands_on_and_returns_only_what_the_stock_one_does(model_type, variant):
    """Bloom's, MPT's and Falcon's output class has cross-attentions that their forward leaves empty;
    CodeGen's forward hands its base model none of its keyword arguments (`num_items_in_batch` only reaches
    the loss): both proven variants, with the stock loss, gradients and output fields."""
    stock = hf_families.build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    entry = head_entry(fused)
    assert entry.swapped and variant in entry.detail, fused.fused_ops_report
    ids = hf_families.batch(stock)
    assert_same_step(stock, fused, input_ids=ids, labels=ids, num_items_in_batch=13, output_hidden_states=True)
    want, got = (model(input_ids=ids, labels=ids, output_hidden_states=True) for model in (stock, fused))
    assert [key for key in got.keys() if key != "loss"] == [key for key in want.keys() if key not in ("loss", "logits")]


def test_the_probe_forward_leaves_the_model_as_it_was():
    """BigBird switches its block-sparse attention to full attention, for good, when called on a short
    sequence: fuse()'s probe forward must not leave the model switched."""
    stock = hf_families.build("big_bird")
    layers = stock.bert.encoder.layer
    attentions = [layer.attention.self for layer in layers]
    assert stock.bert.attention_type == "block_sparse"
    fused_ops.fuse(stock)
    assert stock.bert.attention_type == stock.config.attention_type == "block_sparse"
    assert all(layer.attention.self is attention for layer, attention in zip(layers, attentions))
    assert all(layer.attention.attention_type == "block_sparse" for layer in layers)


def test_head_keeps_the_stock_decorators():
    """The fused forward runs inside the stock forward's decorators: return_dict=False gives the stock
    tuple (loss first), and Mistral 3's config defaults (vision_feature_layer) reach its base model."""
    stock = hf_families.build("llama")
    fused = fused_ops.fuse(copy.deepcopy(stock))
    ids = hf_families.batch(stock)
    want, got = stock(input_ids=ids, labels=ids, return_dict=False), fused(input_ids=ids, labels=ids, return_dict=False)
    assert isinstance(got, tuple) and isinstance(want, tuple)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    stock = hf_families.build("mistral3")
    fused = fused_ops.fuse(copy.deepcopy(stock))
    assert head_entry(fused).swapped, fused.fused_ops_report
    assert_same_step(stock, fused, input_ids=ids, labels=ids)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"])
def test_image_text_model_trains_on_an_image_with_its_vision_tower_fused(model_type):
    """Qwen-VL models with an image (its patches, grid and placeholder tokens): the stock loss and every
    gradient, the vision tower's included, with the vision tower's norms (and Qwen2.5-VL's gated MLPs)
    run as fused ops beside the language model's."""
    stock = hf_families.build(model_type)
    config, vision = stock.config, stock.config.vision_config
    fused = fused_ops.fuse(copy.deepcopy(stock))
    generator = torch.Generator().manual_seed(0)
    grid = torch.tensor([[1, 4, 4]])  # one frame of 4 x 4 patches, merged 2 x 2 into 4 tokens
    image_tokens = int(grid.prod()) // vision.spatial_merge_size ** 2
    ids = torch.randint(0, 100, (1, 12), generator=generator)
    ids[0, 2] = config.vision_start_token_id
    ids[0, 3:3 + image_tokens] = config.image_token_id
    patches = torch.randn(int(grid.prod()), vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2,
                          generator=generator)
    inputs = dict(input_ids=ids, pixel_values=patches, image_grid_thw=grid,
                  mm_token_type_ids=(ids == config.image_token_id).long(),
                  labels=ids.masked_fill(ids == config.image_token_id, -100))
    assert_same_step(stock, fused, **inputs)
    assert any(parameter.grad is not None for parameter in stock.model.visual.parameters())
    vision_calls = hf_families.fused_op_calls(lambda: fused.model.visual(patches, grid_thw=grid))
    assert sum(vision_calls.get(op, 0) for op in ("rms_norm", "layer_norm")) > 0, vision_calls


def _one(self, a, b=2, *, c=3, **kwargs):
    pass


def _two(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
    pass


def _three(self, a, /, b=1, *rest, d, e=5):
    pass


def _four(self, x, y=0):
    pass


@pytest.mark.parametrize("function", [_one, _two, _three, _four])
@pytest.mark.parametrize("defaults", [True, False])
def test_call_signature_binds_as_inspect_does(function, defaults):
    """The fused forwards bind their arguments without inspect (which torch.compile cannot trace after a
    dict changed): the same names, values, order and **kwargs as inspect.Signature.bind, and TypeError for
    the calls it refuses."""
    import inspect

    from fused_ops.patching.swap import CallSignature

    signature = inspect.signature(function)
    calls = [((0,), {}), ((0, 1), {}), ((0, 1, 2), {}), ((0,), {"a": 1}), ((0, 1), {"b": 3}),
             ((0,), {"c": 9, "z": 1}), ((0, 1, 2, 3), {"d": 4}), ((0, 1), {"d": 4, "a": 7}),
             ((0,), {"labels": 5, "extra": 6}), ((0,), {"y": 1, "x": 2}), ((0, 1), {"a": 1}), ((0,), {"q": 1}),
             ((), {}), ((0, 1, 2, 3, 4, 5), {})]
    for args, kwargs in calls:
        try:
            bound = signature.bind(*args, **kwargs) if defaults else signature.bind_partial(*args, **kwargs)
        except TypeError:
            with pytest.raises(TypeError):
                CallSignature(signature).bind(args, kwargs, defaults)
            continue
        if defaults:
            bound.apply_defaults()
        want = dict(bound.arguments)
        want.pop("self", None)
        var_keyword = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
        want_more = want.pop(var_keyword, {}) if var_keyword else {}
        named, more = CallSignature(signature).bind(args, kwargs, defaults)
        assert list(named.items()) == list(want.items()) and more == want_more, (args, kwargs)


# A family of each shape the rules know, and Mistral 3 and LLaVA-NeXT, whose heads' decorators fill keyword
# arguments from the config before the fused forward binds them.
COMPILED_FAMILIES = ["llama", "gemma2", "phi3", "glm4", "cohere", "nemotron", "gpt2", "gptj", "mistral3",
                     "llava_next", "qwen2_5_vl", "gemma4_text", "falcon_h1"]


@pytest.mark.parametrize("model_type", COMPILED_FAMILIES)
def test_fused_model_compiles_whole_and_matches_the_stock_model(model_type):
    """torch.compile(fullgraph=True) of the fused model: one graph, the stock eager loss and gradients."""
    from test_fuse_families import assert_close_relative, stock_and_fused, training_step

    stock, fused = stock_and_fused(model_type)
    ids = hf_families.batch(stock)
    labels = ids.clone()
    labels[0, :3] = -100
    want_loss, want_grads = training_step(stock, ids, labels)
    torch._dynamo.reset()
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
    for _ in range(2):  # the second call runs the compiled graph again
        fused.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        loss = compiled(input_ids=ids, labels=labels).loss
        loss.backward()
        assert_close_relative(loss.detach(), want_loss, 1e-4, f"{model_type} loss")
        for name, parameter in fused.named_parameters():
            if want_grads[name] is None:
                assert parameter.grad is None, name
            else:
                assert_close_relative(parameter.grad, want_grads[name], 1e-3, f"{model_type} gradient of {name}")
