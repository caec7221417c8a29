"""Sliding-window attention past its window: the banded SDPA calls against the masked one, and fuse() on
every family whose base model hands its sliding-window layers the marker, with a window shorter than the
batch (the family test's batch fits the tiny configs' window, where no layer takes the marker)."""
import copy
import io
import warnings

import pytest
import torch

import fused_ops
from fused_ops.patching.rules.sliding_window import (SlidingWindowCausal, banded_attention, flash_takes_window,
                                                      flash_window_attention, has_sliding_window, sliding_window_mask,
                                                      values_of_their_own)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402
from test_fuse_families import assert_close_relative, training_step  # noqa: E402


class Heads(torch.nn.Module):
    """What transformers' SDPA function reads of an attention module."""

    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def masked_reference(query, key, value, window):
    """The attention of the marker's pattern with the mask materialised, in float64."""
    groups = query.shape[1] // key.shape[1]
    key, value = (t.double().repeat_interleave(groups, 1) for t in (key, value))
    mask = sliding_window_mask(window, query.shape[2], key.shape[2], query.device)
    return torch.nn.functional.scaled_dot_product_attention(query.double(), key, value, attn_mask=mask).transpose(1, 2)


# (sequence, window, heads, key-value heads): windows below, at and above the sequence, remainders that leave
# the last block part-filled, a single query past the window (Phi-3-mini at 2048 tokens), one KV head.
SHAPES = [(12, 3, 4, 2), (13, 4, 4, 4), (9, 8, 2, 1), (10, 10, 2, 2), (7, 16, 4, 2), (17, 5, 4, 1), (11, 2, 2, 2),
          (20, 6, 6, 3)]


@pytest.mark.parametrize("length,window,heads,kv_heads", SHAPES)
def test_banded_attention_matches_the_masked_attention_with_gradients(length, window, heads, kv_heads):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as attention
    generator = torch.Generator().manual_seed(length * 100 + window)
    query, key, value = (torch.randn(2, h, length, 8, generator=generator, dtype=torch.float64, requires_grad=True)
                         for h in (heads, kv_heads, kv_heads))
    got, _ = banded_attention(attention, Heads(heads // kv_heads), query, key, value, window, scaling=8 ** -0.5)
    want = masked_reference(query, key, value, window)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    cotangent = torch.randn(want.shape, generator=generator, dtype=torch.float64)
    got_grads = torch.autograd.grad(got, (query, key, value), cotangent)
    want_grads = torch.autograd.grad(want, (query, key, value), cotangent)
    for name, g, w in zip("qkv", got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12, msg=f"gradient of {name}")


def heads_of(projection, start, heads, dim=8):
    """(batch, heads, length, dim) states sliced from a projection's rows, as transformers' attentions take them."""
    return projection[..., start:start + heads * dim].unflatten(-1, (heads, dim)).transpose(1, 2)


def test_values_sliced_from_a_projection_shared_with_rotated_queries_and_keys_are_copied():
    generator = torch.Generator().manual_seed(3)
    qkv = torch.randn(2, 7, (4 + 2 + 2) * 8, generator=generator, requires_grad=True)
    query, key = (heads_of(qkv, 0, 4) * 1, heads_of(qkv, 32, 2) * 1)  # a rotary embedding's outputs
    value = heads_of(qkv, 48, 2)
    own = values_of_their_own(query, key, value)
    assert torch.equal(own, value) and own.untyped_storage().nbytes() == value.numel() * value.element_size()
    cotangent = torch.randn(own.shape, generator=generator)
    assert torch.equal(torch.autograd.grad(own, qkv, cotangent)[0], torch.autograd.grad(value, qkv, cotangent)[0])
    with torch.no_grad():  # no backward to keep anything for: no copy
        assert values_of_their_own(query, key, value) is value
    # values of their own already, or queries and keys that are slices of the same rows: nothing to free
    separate = torch.randn(2, 7, 2 * 8, generator=generator)
    for args in ((query, key, heads_of(separate, 0, 2)), (query, key, heads_of(separate, 0, 2).contiguous()),
                 (heads_of(qkv, 0, 4), heads_of(qkv, 32, 2), value)):
        assert values_of_their_own(*args) is args[2]


@pytest.mark.parametrize("length,window", [(7, 8), (7, 3)])
def test_banded_attention_hands_its_calls_values_copied_out_of_a_shared_projection(length, window):
    """Each call the banded attention makes takes values that hold no part of the shared projection: what an
    attention saves for its backward keeps its storage alive."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    qkv = torch.randn(2, length, (4 + 2 + 2) * 8, requires_grad=True)
    query, key, value = heads_of(qkv, 0, 4) * 1, heads_of(qkv, 32, 2) * 1, heads_of(qkv, 48, 2)
    given = []

    def attention(module, query, key, value, mask, **kwargs):
        given.append(value.untyped_storage().data_ptr())
        return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
    got, _ = banded_attention(attention, Heads(2), query, key, value, window, scaling=8 ** -0.5)
    torch.testing.assert_close(got, masked_reference(query, key, value, window).float())
    assert given and qkv.untyped_storage().data_ptr() not in given


def assert_no_projection_output_is_kept(model, ids, projection_name):
    """No output of the layers' `projection_name` (Phi-3's `qkv_proj`) outlives the training forward: its
    queries and keys are rotated copies, its values copied out, so nothing the backward keeps holds it."""
    outputs = []
    def keep_weak_reference(module, args, output):
        outputs.append(StorageWeakRef(output.untyped_storage()))
    hooks = [module.register_forward_hook(keep_weak_reference)
             for name, module in model.named_modules() if name.endswith(projection_name)]
    model.train()
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss  # a cache would hold copies of the values
    for hook in hooks:
        hook.remove()
    assert outputs and all(output.expired() for output in outputs)
    loss.backward()


class FlashCalls(TorchDispatchMode):
    """The window each call of torch's flash kernel was given."""

    def __init__(self):
        super().__init__()
        self.windows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._flash_attention_forward.default:
            self.windows.append(kwargs.get("window_size_left"))
        return func(*args, **kwargs)


def largest_error(got, want):
    return (got.double() - want).abs().max().item()


# (batch, heads, kv heads, length, head dim, window): Phi-3-mini's single query past its window, Gemma 3's
# 256-wide heads with one KV head, a window far shorter than the sequence, a window of one token.
FLASH_SHAPES = [(2, 4, 4, 130, 96, 129), (2, 4, 1, 300, 256, 64), (1, 8, 2, 257, 64, 16), (2, 2, 2, 64, 128, 1)]


@pytest.mark.cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch,heads,kv_heads,length,head_dim,window", FLASH_SHAPES)
def test_flash_window_attention_is_as_close_to_float64_as_the_masked_sdpa_call(batch, heads, kv_heads, length,
                                                                                head_dim, window, dtype):
    """On the GPU the banded attention is one flash call with a window: its output and gradients are as near
    the float64 masked reference as transformers' own masked call in the same precision."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as attention
    if not flash_takes_window(torch.cuda.current_device(), head_dim):
        pytest.skip("this GPU's flash kernel takes no window for these heads")
    generator = torch.Generator("cuda").manual_seed(length + window)
    query, key, value = (torch.randn(batch, h, length, head_dim, generator=generator, device="cuda",
                                     dtype=dtype).requires_grad_() for h in (heads, kv_heads, kv_heads))
    module, scaling = Heads(heads // kv_heads), head_dim ** -0.5
    with FlashCalls() as calls:
        got, _ = banded_attention(attention, module, query, key, value, window, scaling=scaling)
    assert calls.windows == [window - 1]
    mask = sliding_window_mask(window, length, length, "cuda").expand(batch, 1, length, length)
    stock, _ = attention(module, query, key, value, mask, scaling=scaling)
    want = masked_reference(query, key, value, window)
    cotangent = torch.randn(want.shape, generator=generator, device="cuda", dtype=torch.float64)
    got_grads = torch.autograd.grad(got, (query, key, value), cotangent.to(dtype))
    stock_grads = torch.autograd.grad(stock, (query, key, value), cotangent.to(dtype))
    want_grads = torch.autograd.grad(want, (query, key, value), cotangent)
    floor = 4e-3 if dtype == torch.float16 else 3e-2
    assert largest_error(got, want) <= 2 * largest_error(stock, want) + floor
    for name, g, s, w in zip("qkv", got_grads, stock_grads, want_grads):
        assert largest_error(g, w) <= 2 * largest_error(s, w) + floor * w.abs().max().item(), f"gradient of {name}"


def test_this_torch_flash_ops_take_the_window_arguments_forward_and_backward():
    """The flash path calls torch's private flash ops by their window arguments: on this torch, with fake
    CUDA tensors (no GPU needed), the forward takes them and returns (batch, length, heads, dim), and the
    backward op takes them too, with the gradients of GQA's fewer key-value heads shaped as their inputs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        query, key, value = (torch.empty(2, h, 64, 96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                             for h in (4, 2, 2))
        output = flash_window_attention(query, key, value, 16, None)
        assert output.shape == (2, 64, 4, 96) and output.stride()[-1] == 1
        assert type(output.grad_fn).__name__ == "FlashAttentionBackward0"
        grads = torch.ops.aten._flash_attention_backward(
            torch.empty_like(output), query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), output,
            torch.empty(2, 4, 64, device="cuda"), None, None, 64, 64, 0.0, True,
            torch.empty(2, dtype=torch.int64, device="cuda"), torch.empty(0, device="cuda"), scale=None,
            window_size_left=15, window_size_right=0)
        assert [g.shape for g in grads] == [(2, 64, 4, 96), (2, 64, 2, 96), (2, 64, 2, 96)]


@pytest.mark.cuda_only
def test_flash_switched_off_in_sdpa_keeps_the_banded_calls():
    """A user who turns SDPA's flash backend off (to debug, or for another kernel's numerics) gets the banded
    SDPA calls on the backends left on, not the flash kernel through the back door."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as attention
    if not flash_takes_window(torch.cuda.current_device(), 64):
        pytest.skip("this GPU's flash kernel takes no window for these heads")
    query, key, value = (torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with FlashCalls() as calls, sdpa_kernel([SDPBackend.MATH]):
        got, _ = banded_attention(attention, Heads(1), query, key, value, 8)
    assert calls.windows == []
    want = masked_reference(query, key, value, 8)
    assert largest_error(got, want) <= 3e-2


# The families whose tiny model gets the marker (the causal mask's sliding_window variant) from fuse().
SLIDING_WINDOW_FAMILIES = ["mistral", "ministral", "ministral3", "mixtral", "phi3", "phimoe", "qwen3_moe", "starcoder2",
                           "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "vaultgemma",
                           "cohere2", "cohere2_moe", "exaone4", "exaone_moe", "olmo3", "minimax", "afmoe", "cwm",
                           "inkling_text", "modernbert-decoder", "mistral3", "muse_glimmer", "phi4_multimodal",
                           "aya_vision", "cohere2_vision", "idefics2"]
SHORT_WINDOW = 3


def with_short_window(model_type):
    reason = hf_families.why_not_testable(model_type)
    if reason is not None:
        pytest.skip(f"a tiny {model_type} does not build or run: {reason}")
    stock = hf_families.build(model_type)
    configs = {id(c): c for m in stock.modules() if (c := getattr(m, "config", None)) is not None}
    for config in configs.values():
        if isinstance(getattr(config, "sliding_window", None), int):
            config.sliding_window = SHORT_WINDOW
    fused = copy.deepcopy(stock)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused_ops.fuse(fused)
    return stock, fused


@pytest.mark.parametrize("model_type", SLIDING_WINDOW_FAMILIES)
def test_family_past_its_window_computes_what_the_stock_model_does(model_type):
    stock, fused = with_short_window(model_type)
    report = fused.fused_ops_report
    masks = [e for e in report.entries if e.kind == "causal_mask" and e.swapped]
    assert masks and all("sliding_window=True" in e.detail for e in masks), str(report)
    assert report.counts().get("sliding_window_attention", 0) > 0, str(report)
    ids = hf_families.batch(stock)
    assert ids.shape[1] > SHORT_WINDOW + 3
    labels = ids.clone()
    labels[0, :3] = -100
    want_loss, want_grads = training_step(stock, ids, labels)
    got_loss, got_grads = training_step(fused, ids, labels)
    assert_close_relative(got_loss, want_loss, 1e-4, f"{model_type} loss\n{report}")
    for name, want in want_grads.items():
        if want is not None:
            assert_close_relative(got_grads[name], want, 1e-3, f"{model_type} gradient of {name}\n{report}")
    stock.eval(), fused.eval()
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    with torch.no_grad():
        want = stock(input_ids=ids).logits
        for model in (fused, torch.load(buffer, weights_only=False), copy.deepcopy(fused)):
            assert_close_relative(model(input_ids=ids).logits, want, 1e-4, f"{model_type} eval logits")


@pytest.mark.parametrize("model_type", [pytest.param("phi3", marks=pytest.mark.slow), "gemma3_text"])
def test_compiled_family_past_its_window_traces_one_graph_and_matches_stock(model_type):
    stock, fused = with_short_window(model_type)
    ids = hf_families.batch(stock)
    stock.train(), fused.train()
    torch._dynamo.reset()
    compiled = torch.compile(fused, fullgraph=True)
    want_loss, want_grads = training_step(stock, ids, ids)
    got_loss, _ = training_step(compiled, ids, ids)
    got_grads = {name: p.grad for name, p in fused.named_parameters()}
    assert_close_relative(got_loss, want_loss, 1e-4, f"{model_type} compiled loss")
    for name, want in want_grads.items():
        if want is not None:
            assert_close_relative(got_grads[name], want, 1e-3, f"{model_type} compiled gradient of {name}")


def test_generation_from_a_prompt_past_the_window_is_the_stock_one():
    stock, fused = with_short_window("mistral")
    stock.eval(), fused.eval()
    ids = hf_families.batch(stock)
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(fused.generate(ids, **settings), stock.generate(ids, **settings))


def test_an_attention_put_back_to_stock_after_fuse_raises_instead_of_ignoring_the_window():
    """The marker is no tensor: a stock attention handed it fails loudly, never attends past the window."""
    stock, fused = with_short_window("phi3")
    layer = fused.model.layers[0]
    layer.self_attn = copy.deepcopy(stock.model.layers[0].self_attn)
    with pytest.raises((TypeError, AttributeError)):
        fused(input_ids=hf_families.batch(stock))


def test_a_dropout_in_training_runs_the_masked_attention():
    """With attention dropout, the banded calls would draw other dropout masks: the band-aware attention
    materialises the mask and runs the stock call, so training matches the stock model's masks."""
    reason = hf_families.why_not_testable("mistral")
    if reason is not None:
        pytest.skip(reason)
    stock = hf_families.build("mistral")
    stock.config.sliding_window, stock.config.attention_dropout = SHORT_WINDOW, 0.25
    for layer in stock.model.layers:
        layer.self_attn.attention_dropout = 0.25
    fused = copy.deepcopy(stock)
    fused_ops.fuse(fused)
    assert "sliding_window=True" in fused.fused_ops_report.details()
    ids = hf_families.batch(stock)
    stock.train(), fused.train()
    want_loss, _ = training_step(stock, ids, ids)
    got_loss, _ = training_step(fused, ids, ids)
    assert_close_relative(got_loss, want_loss, 1e-5, "loss with attention dropout")


def test_the_marker_is_made_only_past_the_window():
    stock, fused = with_short_window("phi3")
    base = fused.model
    seen = []
    hook = base.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True)
    with torch.no_grad():
        fused(input_ids=torch.zeros(1, SHORT_WINDOW, dtype=torch.long))
        fused(input_ids=torch.zeros(1, SHORT_WINDOW + 1, dtype=torch.long))
        fused(input_ids=torch.zeros(1, SHORT_WINDOW + 1, dtype=torch.long),
              attention_mask=torch.ones(1, SHORT_WINDOW + 1, dtype=torch.long))
    hook.remove()
    assert seen[0] is None
    assert seen[1] == SlidingWindowCausal(SHORT_WINDOW)
    assert torch.is_tensor(seen[2]), "a padding mask given: transformers' own mask"


def test_a_torchscript_trace_keeps_transformers_mask(monkeypatch):
    """A trace keeps the shapes of the one call it records: the banded calls would bake in its length."""
    stock, fused = with_short_window("phi3")
    seen = []
    fused.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True)
    monkeypatch.setattr(torch.jit, "is_tracing", lambda: True)
    with torch.no_grad():
        fused(input_ids=torch.zeros(1, SHORT_WINDOW + 2, dtype=torch.long))
    assert torch.is_tensor(seen[0])


def test_attention_no_base_model_hands_the_marker_goes_back_and_says_so():
    """Gemma 3's image-text model makes its masks itself (its images attend both ways): its language
    model's causal mask is left as is, so band-aware attention there would take nothing."""
    reason = hf_families.why_not_testable("gemma3")
    if reason is not None:
        pytest.skip(reason)
    model = hf_families.build("gemma3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused_ops.fuse(model)
    entries = [e for e in model.fused_ops_report.entries if e.kind == "sliding_window_attention"]
    assert entries and not any(e.swapped for e in entries)
    assert all("no swapped base model hands it" in e.detail for e in entries)
    for entry in entries:
        options = getattr(type(model.get_submodule(entry.path)), "_fused_ops_options", ())
        assert all(name != "band_aware" for name, _ in options), entry.path


def relative_error(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


@pytest.mark.cuda_only
@pytest.mark.parametrize("model_type", ["phi3", "gemma3_text", "mistral"])
def test_half_precision_family_on_cuda_runs_its_window_in_the_flash_kernel(model_type):
    """A bf16 model on the GPU past its window: each sliding-window layer is one flash call with the window,
    its loss and gradients are as near the float32 stock model's as the bf16 stock model's are, and
    torch.compile traces it in one graph."""
    stock, fused = with_short_window(model_type)
    reference = stock.to("cuda")
    stock, fused = copy.deepcopy(reference).to(torch.bfloat16), fused.to("cuda", torch.bfloat16)
    ids = hf_families.batch(stock).to("cuda")
    if not flash_takes_window(torch.cuda.current_device(), reference.model.layers[0].self_attn.head_dim):
        pytest.skip("this GPU's flash kernel takes no window for these heads")
    want_loss, want_grads = training_step(reference, ids, ids)
    stock_loss, stock_grads = training_step(stock, ids, ids)
    with FlashCalls() as calls:
        got_loss, got_grads = training_step(fused, ids, ids)
    layers = [layer for layer in fused.model.layers if has_sliding_window(layer.self_attn)]
    assert calls.windows == [SHORT_WINDOW - 1] * len(layers) and layers
    assert relative_error(got_loss, want_loss) <= 2 * relative_error(stock_loss, want_loss) + 2e-3
    for name, want in want_grads.items():
        if want is not None:
            assert (relative_error(got_grads[name], want) <= 2 * relative_error(stock_grads[name], want) + 2e-2), name
    torch._dynamo.reset()
    compiled_loss, _ = training_step(torch.compile(fused, fullgraph=True), ids, ids)
    assert relative_error(compiled_loss, got_loss) <= 2e-2


def phi3_with_its_key_value_heads():
    """A fused tiny Phi-3 with Phi-3-mini's grouping (as many key-value heads as query heads, so nothing repeats,
    and copies, the values) and a window shorter than the batch."""
    reason = hf_families.why_not_testable("phi3")
    if reason is not None:
        pytest.skip(reason)
    config = hf_families.build("phi3").config
    config.num_key_value_heads, config.sliding_window = config.num_attention_heads, SHORT_WINDOW
    torch.manual_seed(0)
    fused = transformers.Phi3ForCausalLM(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused_ops.fuse(fused)
    return fused


def test_phi3_past_its_window_keeps_no_qkv_projection_output_for_the_backward():
    """The banded calls: SDPA's backward would keep the first window's value slice and the whole qkv output."""
    fused = phi3_with_its_key_value_heads()
    assert_no_projection_output_is_kept(fused, hf_families.batch(fused), "qkv_proj")


@pytest.mark.cuda_only
def test_half_precision_phi3_on_cuda_keeps_no_qkv_projection_output_for_the_backward():
    """One flash call with the window: its backward would keep the value slice and the whole qkv output."""
    fused = phi3_with_its_key_value_heads().to("cuda", torch.bfloat16)
    if not flash_takes_window(torch.cuda.current_device(), fused.model.layers[0].self_attn.head_dim):
        pytest.skip("this GPU's flash kernel takes no window for these heads")
    with FlashCalls() as calls:
        assert_no_projection_output_is_kept(fused, hf_families.batch(fused).to("cuda"), "qkv_proj")
    assert calls.windows == [SHORT_WINDOW - 1] * len(fused.model.layers)
