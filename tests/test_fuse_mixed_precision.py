"""fuse() where a call's dtypes are not its module's parameters' dtype. A fused norm runs its op on an input of
its parameters' dtype, and with float32 parameters on a 16-bit input only where the probe proved that its own
forward keeps the input's dtype there (Gemma's, gpt-oss's; Llama's promotes to float32); otherwise its own
forward runs, as Mamba's last norm does on the float32 residual stream of a 16-bit model. A fused rotary
embedding runs its op under autocast where the probe proved the attention under autocast, and the stock
function on heads of two dtypes."""
import copy

import pytest
import torch

import fused_ops
from fused_ops.patching.swap import fused_kind

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Two roundings of each dtype, relative to the largest value.
ROUNDING = {torch.float32: 1e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def final_norms(model_type):
    stock = hf_families.build(model_type)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    return stock.model.norm, fused.model.norm


@pytest.mark.parametrize("model_type, keeps_input_dtype", [("llama", False), ("gemma", True), ("gpt_oss", True)])
@pytest.mark.parametrize("weight_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("x_dtype", DTYPES, ids=str)
def test_fused_norm_on_each_pair_of_dtypes_computes_what_its_own_forward_does(model_type, keeps_input_dtype,
                                                                               x_dtype, weight_dtype, device):
    stock, fused = final_norms(model_type)
    assert fused_kind(fused) == "norm"
    stock.to(device, weight_dtype), fused.to(device, weight_dtype)
    generator = torch.Generator().manual_seed(3)
    x64 = torch.randn(3, 5, stock.weight.shape[0], generator=generator, dtype=torch.float64) * 2 + 0.3
    x = x64.to(device, x_dtype)
    got = []
    with torch.no_grad():
        want = stock(x)
        calls = hf_families.fused_op_calls(lambda: got.append(fused(x)))
    got = got[0]
    runs_its_op = x_dtype == weight_dtype or (keeps_input_dtype and weight_dtype == torch.float32)
    assert bool(calls) == runs_its_op, calls
    assert got.dtype == want.dtype
    if not runs_its_op:
        assert torch.equal(got, want)
        return
    options = dict(type(fused)._fused_ops_options)
    rows = x.double().cpu()
    normalised = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + options["eps"])
    reference = normalised * (options["offset"] + stock.weight.detach().double().cpu())
    tolerance = ROUNDING[got.dtype] + ROUNDING[weight_dtype]
    scale = reference.abs().max().item()
    torch.testing.assert_close(got.double().cpu(), reference, rtol=0, atol=tolerance * scale)
    torch.testing.assert_close(want.double().cpu(), reference, rtol=0, atol=tolerance * scale)


def training_step(model, ids, autocast=False):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the same dropout masks in every model
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return [loss.detach().float()] + [None if p.grad is None else p.grad.float() for p in model.parameters()]


def assert_no_further_from_float32_than_stock(reference, stock, fused):
    """Each of the loss and the gradients of a 16-bit run: the fused model's distance from the float32
    model's, relative to its largest value, at most twice the stock model's and two 16-bit roundings."""
    for number, (want, stock_value, got) in enumerate(zip(reference, stock, fused)):
        if want is None:
            assert stock_value is None and got is None
            continue
        scale = want.abs().max().item() + 1e-12
        stock_error = (stock_value - want).abs().max().item() / scale
        fused_error = (got - want).abs().max().item() / scale
        assert fused_error <= 2 * stock_error + 2 ** -7, (number, fused_error, stock_error)


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba"])
def test_16_bit_model_with_a_float32_residual_stream(model_type, device):
    """Mamba's blocks keep their residual stream in float32 in a bfloat16 model: its last norm takes that
    float32 stream with its bfloat16 weight, and its head casts the stream to its own dtype; the norm runs
    its own forward there, and the head + loss casts as the stock forward does (a variant the probe proves)."""
    reference = hf_families.build(model_type).to(device)
    stock = copy.deepcopy(reference).to(torch.bfloat16)
    fused = fused_ops.fuse(copy.deepcopy(stock))
    assert fused_kind(fused.backbone.norm_f) == "norm" and fused_kind(fused) == "lm_head_loss"
    ids = hf_families.batch(stock).to(device)
    assert_no_further_from_float32_than_stock(*(training_step(model, ids) for model in (reference, stock, fused)))
    calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    # Each block's norm and the head + loss; the last norm is its own forward's.
    assert calls == {"rms_norm": stock.config.num_hidden_layers, "linear_cross_entropy_with_gradients": 1}, calls


@pytest.mark.parametrize("model_type, rotary_op_runs", [("llama", True), ("qwen3", True), ("gemma3_text", True),
                                                         ("hy_v4", True), ("zaya", None)])
def test_autocast_training_step_matches_stock(model_type, rotary_op_runs, device):
    """Float32 parameters under autocast to bfloat16: the rotary op takes 16-bit heads with float32 tables
    where the probe proved the attention under autocast. Zaya's heads are one 16-bit and one float32 under
    the CPU's autocast (the stock function rotates them) and both 16-bit under CUDA's (the op does). Llama's
    and Qwen3's q/k norms promote to float32 there: their own forwards run."""
    reference = hf_families.build(model_type).to(device)
    stock, fused = copy.deepcopy(reference), fused_ops.fuse(copy.deepcopy(reference))
    ids = hf_families.batch(stock).to(device)
    assert_no_further_from_float32_than_stock(training_step(reference, ids), training_step(stock, ids, autocast=True),
                                              training_step(fused, ids, autocast=True))
    with torch.autocast(device, dtype=torch.bfloat16):
        calls = hf_families.fused_op_calls(lambda: fused(input_ids=ids, labels=ids))
    if rotary_op_runs is not None:
        assert ("rotary_embedding" in calls) == rotary_op_runs, calls
