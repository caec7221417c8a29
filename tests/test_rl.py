"""fused_ops.rl: token_log_probs on every causal-LM and image-text family transformers ships (the stock
logits' log-probabilities, entropy and every gradient, or a refusal that says why), its arguments, PEFT, and
the refusals of heads it cannot prove. Under FSDP2 and DDP: tests/test_distributed.py."""
import copy
import warnings

import pytest
import torch

import fused_ops
from fused_ops import rl

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402

MODEL_TYPES = hf_families.causal_lm_model_types() + hf_families.image_text_model_types()
PARAMETERS = [pytest.param(t, marks=pytest.mark.slow) if t in hf_families.SLOW else t for t in MODEL_TYPES]
TEMPERATURE = 0.7
# Families whose head token_log_probs refuses, with the words its reason holds: heads that are not an
# nn.Linear or whose output is more than a scaled and capped product.
REFUSED = {"prophetnet": "rows of shape",  # its n-gram streams hand the head 4-D rows
           "florence2": "no logits of every position"}  # an encoder-decoder: token ids alone feed the encoder
# Families whose stock forward raises given an attention mask over text alone (their rope index reads a
# vision token id the tiny text config lacks): called without one.
NO_MASK = {"qwen2_5_omni_thinker", "qwen3_omni_moe_thinker"}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def stock_log_probs(model, ids, mask, temperature=TEMPERATURE):
    """What an RL trainer writes: the model's logits over the temperature, log_softmax at the next token."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float() / temperature
    log_p = torch.log_softmax(logits, -1)
    kept = mask[:, 1:] if mask is not None else torch.ones_like(ids[:, 1:])
    return (log_p.gather(-1, ids[:, 1:, None]).squeeze(-1) * kept, -(log_p.exp() * log_p).sum(-1) * kept)


def inputs(model, padded=True):
    ids = hf_families.batch(model)
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :3] = 0  # left padding
    weights = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(2))
    return ids, mask, weights


def assert_matches_stock(model, stock, padded=True, **kwargs):
    ids, mask, weights = inputs(model, padded)
    torch.manual_seed(5)  # the same dropout masks in both models
    mask_or_none = mask if padded else None
    log_probs, entropy = rl.token_log_probs(model, ids, mask_or_none, temperature=TEMPERATURE, return_entropy=True,
                                            **kwargs)
    torch.manual_seed(5)
    want_log_probs, want_entropy = stock_log_probs(stock, ids, mask_or_none)
    assert log_probs.shape == want_log_probs.shape and log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs, want_log_probs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(entropy, want_entropy, rtol=1e-4, atol=1e-4)
    (weights * (log_probs - 0.1 * entropy)).sum().backward()
    (weights * (want_log_probs - 0.1 * want_entropy)).sum().backward()
    hf_families.assert_gradients_match_stock(model, stock, relative_atol=1e-4)


@pytest.mark.parametrize("model_type", PARAMETERS)
def test_every_family_matches_its_logits_or_is_refused_with_the_reason(model_type):
    reason = hf_families.why_not_testable(model_type)
    if reason is not None:
        pytest.skip(f"a tiny {model_type} does not build or run: {reason}")
    model = hf_families.build(model_type).eval()  # no dropout (BigBird's random blocks too): one function
    stock = copy.deepcopy(model)
    try:
        rl.head_form(model)
    except rl.HeadNotProven as refusal:
        assert model_type in REFUSED, f"{model_type} refused: {refusal}"
        assert REFUSED[model_type] in str(refusal), str(refusal)
        with pytest.raises(rl.HeadNotProven, match=REFUSED[model_type]):
            rl.token_log_probs(model, *inputs(model)[:2])
        return
    assert model_type not in REFUSED, f"{model_type} is proven now"
    assert_matches_stock(model, stock, padded=model_type not in NO_MASK)


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "granite", "cohere", "qwen3_moe"])
def test_a_fused_model_matches_the_stock_one(model_type):
    """fuse() first (norms, MLPs, rotary fused; its head + loss rule leaves calls without labels stock)."""
    model = hf_families.build(model_type)
    stock = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused_ops.fuse(model)
    assert_matches_stock(model, stock)


def test_scale_and_softcap_come_from_the_model():
    """Gemma 2's final-logit softcap and Granite's 1 / logits_scaling: a head taken as a plain product is
    wrong there, which the helper is not."""
    forms = {}
    for model_type in ("gemma2", "granite", "cohere", "llama"):
        model = hf_families.build(model_type)
        form = rl.head_form(model)
        forms[model_type] = (form.logit_scale, form.softcap)
    config = {t: hf_families.tiny_config(t) for t in ("gemma2", "granite", "cohere")}
    assert forms["gemma2"] == (1.0, config["gemma2"].final_logit_softcapping)
    assert forms["granite"] == (1.0 / config["granite"].logits_scaling, 0.0)
    assert forms["cohere"] == (config["cohere"].logit_scale, 0.0)
    assert forms["llama"] == (1.0, 0.0)


def test_labels_and_logits_to_keep():
    """labels in place of the ids (-100: 0), and the last logits_to_keep tokens only, as TRL scores the
    completion."""
    model = hf_families.build("qwen3").eval()
    ids, mask, _ = inputs(model)
    labels = ids.masked_fill(torch.arange(ids.shape[1]) < 6, -100)
    with torch.no_grad():
        everything = rl.token_log_probs(model, ids, mask)
        with_labels = rl.token_log_probs(model, ids, mask, labels=labels)
        completion = rl.token_log_probs(model, ids, mask, logits_to_keep=4)
    assert completion.shape == (ids.shape[0], 4)
    torch.testing.assert_close(completion, everything[:, -4:])
    torch.testing.assert_close(with_labels[:, 5:], everything[:, 5:])
    assert torch.count_nonzero(with_labels[:, :5]) == 0


def test_a_peft_model_trains_its_adapters():
    peft = pytest.importorskip("peft")
    model = hf_families.build("llama")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False)
    policy = peft.get_peft_model(model, config)
    stock = copy.deepcopy(policy)
    assert_matches_stock(policy, stock)
    assert any(p.grad is not None and "lora_" in name for name, p in policy.named_parameters())


def test_a_lora_head_is_refused():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(hf_families.build("llama"), peft.LoraConfig(r=4, target_modules=["lm_head"]))
    with pytest.raises(rl.HeadNotProven, match="not a plain nn.Linear"):
        rl.token_log_probs(model, *inputs(model)[:2])


def test_a_hook_on_the_head_is_refused():
    model = hf_families.build("llama")
    model.lm_head.register_forward_hook(lambda module, args, output: output * 2)
    with pytest.raises(rl.HeadNotProven, match="its head has hooks"):
        rl.token_log_probs(model, *inputs(model)[:2])


def test_a_head_computing_more_than_a_scaled_product_is_refused():
    """A subclass that adds a constant to the logits after the head: no scale and cap give its outputs."""
    class Shifted(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            output = super().forward(*args, **kwargs)
            output.logits = output.logits + torch.arange(output.logits.shape[-1], dtype=output.logits.dtype) * 0.01
            return output
    model = Shifted(hf_families.tiny_config("llama"))
    with pytest.raises(rl.HeadNotProven, match="its logits are not its head's product"):
        rl.token_log_probs(model, *inputs(model)[:2])


def test_the_proof_follows_a_changed_config():
    """A proof holds for the scale and softcap the model names when it was made: a changed config is
    proven again."""
    model = hf_families.build("gemma2")
    first = rl.head_form(model)
    model.config.final_logit_softcapping = 7.0
    assert rl.head_form(model).softcap == 7.0 != first.softcap
    stock = copy.deepcopy(model)
    assert_matches_stock(model, stock)


def test_a_compiled_model_compiles_once_for_the_head():
    """The head's stand-in is one module kept per head: a compiled model compiles for it once, not at each
    call, and gives the stock values."""
    from torch._dynamo.testing import CompileCounterWithBackend
    model = hf_families.build("qwen3").eval()
    stock = copy.deepcopy(model)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter)
    torch._dynamo.reset()
    ids, mask, _ = inputs(model)
    first = rl.token_log_probs(compiled, ids, mask, temperature=TEMPERATURE)
    frames = counter.frame_count
    for seed in (3, 4):
        other = torch.randint(0, 100, ids.shape, generator=torch.Generator().manual_seed(seed))
        got = rl.token_log_probs(compiled, other, mask, temperature=TEMPERATURE)
        with torch.no_grad():
            want, _ = stock_log_probs(stock, other, mask)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert counter.frame_count == frames, (frames, counter.frame_count)
    with torch.no_grad():
        torch.testing.assert_close(first, stock_log_probs(stock, ids, mask)[0], rtol=1e-4, atol=1e-4)
