"""fuse() on every causal-LM and image-text family transformers ships that builds from a tiny config, fused or
not: the stock loss and every gradient in training, the stock logits and hidden states in eval mode, the same
Parameter objects and state-dict keys, and a model that pickles and deep-copies. The test of "never wrong" is the
families nobody wrote a rule for."""
import copy
import io
import warnings

import pytest
import torch

import fused_ops
from fused_ops.patching.families import EXPECTED_FUSIONS

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread each op (more only add their start-up, and stall on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

MODEL_TYPES = hf_families.causal_lm_model_types() + hf_families.image_text_model_types()
PARAMETERS = [pytest.param(t, marks=pytest.mark.slow) if t in hf_families.SLOW else t for t in MODEL_TYPES]


def stock_and_fused(model_type, device="cpu"):
    reason = hf_families.why_not_testable(model_type)
    if reason is not None:
        pytest.skip(f"a tiny {model_type} does not build or run: {reason}")
    stock = hf_families.build(model_type).to(device)
    fused = copy.deepcopy(stock)
    before = list(fused.named_parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused_ops.fuse(fused)
    after = list(fused.named_parameters())
    assert [name for name, _ in after] == [name for name, _ in before]
    assert all(a is b for (_, a), (_, b) in zip(after, before)), "the same Parameter objects"
    assert list(fused.state_dict()) == list(stock.state_dict())
    return stock, fused


def training_step(model, ids, labels):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the same dropout masks in both models
    output = model(input_ids=ids, labels=labels)
    output.loss.backward()
    return output.loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def assert_close_relative(got, want, rtol, what):
    assert got is not None and want is not None, what
    scale = want.abs().max().item() if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale + 1e-7, msg=what)


def assert_training_step_matches(stock, fused, model_type, device="cpu"):
    report = fused.fused_ops_report
    ids = hf_families.batch(stock).to(device)
    labels = ids.clone()
    labels[0, :3] = -100
    want_loss, want_grads = training_step(stock, ids, labels)
    got_loss, got_grads = training_step(fused, ids, labels)
    assert_close_relative(got_loss, want_loss, 1e-4, f"{model_type} loss\n{report}")
    assert set(got_grads) == set(want_grads)
    for name, want in want_grads.items():
        if want is None:
            assert got_grads[name] is None, name
        else:
            assert_close_relative(got_grads[name], want, 1e-3, f"{model_type} gradient of {name}\n{report}")
    return ids, labels


@pytest.mark.parametrize("model_type", PARAMETERS)
def test_fused_family_computes_what_the_stock_model_does_and_pickles(model_type):
    stock, fused = stock_and_fused(model_type)
    report = fused.fused_ops_report
    ids, labels = assert_training_step_matches(stock, fused, model_type)
    stock.eval(), fused.eval()
    with torch.no_grad():
        want, got = stock(input_ids=ids, labels=labels), fused(input_ids=ids, labels=labels)
    assert got.logits is not None, "eval mode returns the logits with the loss"
    assert_close_relative(got.logits, want.logits, 1e-4, f"{model_type} eval logits\n{report}")
    assert_close_relative(got.loss, want.loss, 1e-4, f"{model_type} eval loss")
    expected = EXPECTED_FUSIONS.get(model_type, set())
    assert expected <= set(report.counts()), f"{model_type}: expected {sorted(expected)}\n{report}"
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert [type(m) for m in loaded.modules()] == [type(m) for m in fused.modules()]
    with torch.no_grad():
        for other in (loaded, copy.deepcopy(fused)):
            assert torch.equal(other.eval()(input_ids=ids).logits, fused(input_ids=ids).logits)
    # transformers records hidden states by the model's class: the fused classes record them too. (Its
    # recording hooks are local functions: neither model pickles after this.)
    with torch.no_grad():
        want, got = (model(input_ids=ids, output_hidden_states=True) for model in (stock, fused))
    got_states, want_states = (getattr(output, "hidden_states", None) for output in (got, want))  # seq2seq: none
    assert (got_states is None) == (want_states is None)
    for layer, (got_hidden, want_hidden) in enumerate(zip(got_states or (), want_states or ())):
        assert_close_relative(got_hidden, want_hidden, 1e-4, f"{model_type} hidden states {layer}")


def test_enough_families_are_tested():
    testable = [t for t in MODEL_TYPES if hf_families.why_not_testable(t) is None]
    assert len(testable) >= 40, f"only {len(testable)} families build from a tiny config"


# Parts a family may keep as they are: Nemotron's MLP is relu², not gated.
MAY_STAY = {"nemotron": {"gated_mlp"}}


def assert_every_part_runs_as_fused_ops(stock, fused, model_type, ids):
    want = hf_families.stock_part_calls(stock, lambda: stock(input_ids=ids, labels=ids))
    got = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    for part, ops in hf_families.FUSED_OPS_OF_PART.items():
        if part in MAY_STAY.get(model_type, ()):
            continue
        fused_calls = sum(got.get(op, 0) for op in ops)
        if part == "gated_mlp":
            fused_calls -= want["gated_norm"]  # each gated norm gates with one gated_mul
        assert fused_calls == want[part], (f"{model_type}: {part}: {fused_calls} fused calls for the stock "
                                           f"model's {want[part]}; fused ops {got}\n{fused.fused_ops_report}")
    assert want["norm"] and want["rotary"] or model_type == "nemotron", want


@pytest.mark.parametrize("model_type", hf_families.FULLY_FUSED)
def test_every_part_of_the_family_runs_as_fused_ops(model_type):
    """One training forward: each norm, gated MLP and rotary embedding the stock model runs, and its
    head + loss, is one torch.ops.fused call in the fused model."""
    stock, fused = stock_and_fused(model_type)
    assert_every_part_runs_as_fused_ops(stock, fused, model_type, hf_families.batch(stock))


@pytest.mark.cuda_only
@pytest.mark.parametrize("model_type", hf_families.FULLY_FUSED)
def test_fused_family_on_cuda_runs_every_part_fused_and_matches_stock(model_type):
    """fuse() on a model already on the GPU: its probes pass with the CUDA kernels, every part runs as
    fused ops, and a training step gives the stock loss and gradients."""
    stock, fused = stock_and_fused(model_type, "cuda")
    ids, _ = assert_training_step_matches(stock, fused, model_type, "cuda")
    assert_every_part_runs_as_fused_ops(stock, fused, model_type, ids)
