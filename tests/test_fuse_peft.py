"""fuse() with PEFT LoRA adapters, applied before or after it: training gives the loss and the gradient
of every adapter that the same adapters give on the unfused model, and every adapter trains."""
import copy
import warnings

import pytest
import torch

import fused_ops

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
import hf_families  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread each op (more only add their start-up, and stall on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FAMILIES = ["llama", "qwen3", "gemma3_text", "mixtral", "qwen3_moe"]


def with_lora(model, seed=3):
    torch.manual_seed(seed)  # init_lora_weights=False: random A and B, so the adapters change the output
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False)
    return peft.get_peft_model(model, config)


def fuse(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fused_ops.fuse(model)


def step(model, ids):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def assert_trains_like(got_model, want_model, ids):
    want_loss, want_grads = step(want_model, ids)
    got_loss, got_grads = step(got_model, ids)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    assert set(got_grads) == set(want_grads) and any("lora_" in n for n in want_grads)
    for name, want in want_grads.items():
        assert got_grads[name] is not None and got_grads[name].abs().sum() > 0, f"{name} gets no gradient"
        torch.testing.assert_close(got_grads[name], want, rtol=1e-4, atol=1e-4 * want.abs().max().item(), msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_before_fuse(family):
    reference = with_lora(hf_families.build(family))
    model = fuse(copy.deepcopy(reference))
    assert model.fused_ops_report.swapped, model.fused_ops_report
    assert_trains_like(model, reference, hf_families.batch(reference))


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_after_fuse(family):
    reference = with_lora(hf_families.build(family))
    fused = fuse(hf_families.build(family))
    model = with_lora(fused)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert_trains_like(model, reference, hf_families.batch(reference))


def test_optimizer_made_before_fuse_trains_every_parameter():
    model = hf_families.build("llama")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fuse(model)
    ids = hf_families.batch(model)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == [], f"not trained after fuse(): {unchanged}"


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_lora_on_every_linear_and_the_routers_parameters_before_fuse(family):
    """target_modules="all-linear" also adapts a mixture of experts' router weight through a
    parametrization that exists only while the router runs (peft's ParamWrapper): the probes' calls of
    the model, with their stand-in parameters, leave it in place."""
    torch.manual_seed(3)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    reference = peft.get_peft_model(hf_families.build(family), config)
    assert any(type(m).__name__ == "ParamWrapper" for m in reference.modules())
    model = fuse(copy.deepcopy(reference))
    assert model.fused_ops_report.swapped, model.fused_ops_report
    assert_trains_like(model, reference, hf_families.batch(reference))
