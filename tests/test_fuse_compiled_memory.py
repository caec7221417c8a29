"""Under torch.compile the fused decoder layer recomputes its two norms' outputs in the backward instead of
saving them for the projections after them: two fewer hidden-size tensors a layer, the same loss and the
same gradients to the bit. Eager mode, gradient checkpointing and torch.export keep the plain call."""
import copy

import pytest
import torch

import fused_ops
from fused_ops.patching.rules import residual_norm
from fused_ops.patching.swap import fused_kind

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """One thread per op: the experts' backward adds in a different order from run to run on more, and
    this file compares gradients to the bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# A family of each layer shape the residual + norm rule knows, with RMSNorm, LayerNorm1P and MoE MLPs.
FAMILIES = ["llama", "qwen3", "gemma3_text", "phi3", "glm4", "mixtral", "nemotron"]


def build(model_type):
    model = hf_families.build(model_type)
    if hasattr(model.config, "num_local_experts"):
        # transformers' grouped-product fallback has a backward torch.compile cannot trace on the CPU.
        for module in model.modules():
            if hasattr(module, "config"):
                module.config._experts_implementation = "batched_mm"
    return model


def saved_bytes_and_step(model, step, ids):
    """(bytes of the distinct non-parameter storages the forward saves for the backward, loss, gradients)."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = step(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return sum(saved.values()), loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def compiled_step(model, ids):
    torch._dynamo.reset()
    return saved_bytes_and_step(model, torch.compile(model, backend="aot_eager", fullgraph=True), ids)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_compiled_layer_recomputes_its_norms_instead_of_saving_them(model_type, monkeypatch):
    stock = build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    layers = [m for m in fused.modules() if fused_kind(m) == "residual_norm"]
    assert layers, f"{model_type}: no fused decoder layer"
    ids = hf_families.batch(stock)
    hidden_bytes = ids.numel() * fused.config.get_text_config().hidden_size * 4

    recomputed, loss, gradients = compiled_step(fused, ids)
    # The same compiled model with the regions as plain calls: what the layer saved before.
    monkeypatch.setattr(residual_norm, "checkpoint", lambda function, *args, **kwargs: function(*args))
    kept, kept_loss, kept_gradients = compiled_step(fused, ids)
    monkeypatch.undo()
    _, eager_loss, eager_gradients = saved_bytes_and_step(fused, fused, ids)

    assert kept - recomputed == 2 * hidden_bytes * len(layers), (model_type, kept, recomputed, hidden_bytes)
    for got_loss, got_gradients in ((loss, gradients), (eager_loss, eager_gradients)):
        assert torch.equal(got_loss, kept_loss), model_type
        for name, want in kept_gradients.items():
            got = got_gradients[name]
            assert (got is None) == (want is None) and (got is None or torch.equal(got, want)), f"{model_type} {name}"
    torch._dynamo.reset()


def test_gradient_checkpointing_and_export_keep_the_plain_call():
    """A checkpointed layer saves no norm output to drop, and an exported program has no backward: neither
    traces a region, and both compute the stock values."""
    stock = hf_families.build("llama")
    fused = fused_ops.fuse(copy.deepcopy(stock))
    ids = hf_families.batch(stock)
    regions = []
    real_checkpoint = residual_norm.checkpoint

    def counting_checkpoint(function, *args, **kwargs):
        regions.append(function)
        return real_checkpoint(function, *args, **kwargs)
    residual_norm.checkpoint = counting_checkpoint
    try:
        _, want_loss, want_gradients = saved_bytes_and_step(stock, stock, ids)
        _, loss, gradients = compiled_step(fused, ids)
        assert len(regions) == 2 * stock.config.num_hidden_layers
        regions.clear()

        checkpointed = copy.deepcopy(fused)
        checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        checkpointed.train()
        _, checkpointed_loss, checkpointed_gradients = compiled_step(checkpointed, ids)
        assert regions == []
        torch.testing.assert_close(checkpointed_loss, want_loss, rtol=1e-5, atol=1e-6)
        for name, want in want_gradients.items():
            torch.testing.assert_close(checkpointed_gradients[name], want, rtol=1e-4, atol=1e-5, msg=name)

        exported = torch.export.export(hf_families.Logits(fused), (ids,))
        torch.testing.assert_close(exported.module()(ids), hf_families.Logits(stock)(ids), rtol=1e-5, atol=1e-5)
        assert regions == []
    finally:
        residual_norm.checkpoint = real_checkpoint
        torch._dynamo.reset()


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", pytest.param("phi3", marks=pytest.mark.slow)])
def test_dynamic_shapes_compile_with_the_regions_and_match_the_stock_model(model_type):
    """torch.compile(dynamic=True): every size and float symbolic, three sequence lengths through one graph;
    the regions trace (their floats are read outside them) and give the stock eager loss and gradients."""
    from test_fuse_families import assert_close_relative
    stock = build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    torch._dynamo.reset()
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True, dynamic=True)
    for length in (10, 13, 7):
        ids = torch.randint(0, 100, (2, length), generator=torch.Generator().manual_seed(length))
        _, want_loss, want_gradients = saved_bytes_and_step(stock, stock, ids)
        _, loss, gradients = saved_bytes_and_step(fused, compiled, ids)
        assert_close_relative(loss, want_loss, 1e-5, f"{model_type} loss at {length} tokens")
        for name, want in want_gradients.items():
            assert_close_relative(gradients[name], want, 1e-4, f"{model_type} gradient of {name} at {length} tokens")
    torch._dynamo.reset()
