"""The norms' weight offset (`out = x̂ · (offset + weight)`, Gemma's and Nemotron's) and weightless form
(`weight=None`, OLMo's): values and gradients against float64 for all four ops, the model families'
own modules, the modules of fused_ops.nn, TorchScript, torch.compile, torch.export and bad input.
Every other norm test runs these forms too through the weight-form cases of op_specs.NORM_CASES."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import fused_ops
from conftest import assert_close_to_reference, assert_same_gradients
from op_specs import NORM_WEIGHT_FORMS, OPS_BY_NAME, NormCase, layer_norm_reference, random, rms_norm_reference

SCALE = 4.0  # a reduction over the row, then one rounding: a few ulp of the dtype
NAMES = ["rms_norm", "add_rms_norm", "layer_norm", "add_layer_norm"]
FORMS = ["weight", "one_plus_weight", "weight_minus_half", "none"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def case_of(name, weight_form):
    return NormCase(OPS_BY_NAME[name], bias="layer" in name, weight_form=weight_form)


def test_the_forms_are_the_offsets_asked_for():
    assert {form: NORM_WEIGHT_FORMS[form] for form in FORMS} == {
        "weight": (True, 0.0), "one_plus_weight": (True, 1.0), "weight_minus_half": (True, -0.5), "none": (False, 0.0)}


@pytest.mark.parametrize("weight_dtype", [None, torch.float32], ids=["weight_like_x", "float32_weight"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 33), (3, 2, 1024)])
@pytest.mark.parametrize("weight_form", FORMS)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.absent(lambda dtype, weight_dtype, **_: weight_dtype is not None and dtype == torch.float32)
def test_values_and_gradients_against_float64(device, name, weight_form, shape, dtype, weight_dtype):
    """Outputs and the gradients of x, residual, weight and bias through both outputs, against the
    float64 composite; float32 weight and bias with 16-bit x too (none: a bias keeps x's dtype)."""
    case = case_of(name, weight_form)
    inputs = [t.requires_grad_(True) for t in case.inputs(shape, dtype, device, weight_dtype)]
    outs = case.fused(*inputs)
    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    expected = case.reference(*inputs64)
    for out, want in zip(outs, expected, strict=True):
        assert out.dtype == dtype and out.shape == inputs[0].shape
        assert_close_to_reference(out.detach(), want.detach(), dtype, SCALE)
    grad_outs = [random(shape, dtype, device) for _ in outs]
    grads = torch.autograd.grad(outs, inputs, grad_outs)
    expected_grads = torch.autograd.grad(expected, inputs64, [g.double() for g in grad_outs])
    rows = inputs[0].numel() // shape[-1]
    for grad, want, tensor in zip(grads, expected_grads, inputs, strict=True):
        assert grad.dtype == tensor.dtype and grad.shape == tensor.shape
        assert_close_to_reference(grad, want, dtype, SCALE * (math.sqrt(rows) if tensor.dim() == 1 else 2))


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_no_weight_is_a_unit_weight_and_an_offset_moves_the_weight(device, name):
    """weight=None computes what a weight of ones computes, bit for bit; offset + weight what the weight
    offset + weight computes (up to the rounding of that sum, none here: small integers)."""
    x = random((5, 40), torch.bfloat16, device)
    op = getattr(fused_ops, name)
    ones = torch.ones(40, dtype=torch.bfloat16, device=device)
    assert torch.equal(op(x, None), op(x, ones))
    weight = torch.randint(-3, 4, (40,), device=device).to(torch.bfloat16)
    assert torch.equal(op(x, weight, offset=1.0), op(x, weight + 1))


@pytest.mark.parametrize("name", NAMES)
def test_backward_ops_with_weight_none_return_the_unit_weights_gradient(device, name):
    """The backward ops given weight None return the [H] gradient a unit weight gets (x's dtype), so their
    shapes never depend on None; autograd then gives the weight no gradient."""
    backward = torch.ops.fused.layer_norm_backward if "layer" in name else torch.ops.fused.rms_norm_backward
    grad, x = random((6, 24), torch.float32, device), random((6, 24), torch.float32, device)
    without = backward(grad, x, None, 1e-5)
    with_ones = backward(grad, x, torch.ones(24, device=device), 1e-5)
    for a, b in zip(without, with_ones, strict=True):
        assert torch.equal(a, b)
    meta = backward(grad.to("meta"), x.to("meta"), None, 1e-5)
    assert [tuple(t.shape) for t in meta] == [(6, 24)] + [(24,)] * (len(meta) - 1)
    case = case_of(name, "none")
    inputs = [t.requires_grad_(True) for t in case.inputs((6, 24), torch.float32, device)]
    outputs = case.fused(*inputs)
    grads = torch.autograd.grad(outputs[0].sum(), inputs)
    assert len(grads) == len(inputs) and all(g is not None for g in grads)


@pytest.mark.parametrize("weight_form", ["one_plus_weight", "none"])
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_and_gradgradcheck(device, name, weight_form):
    case = case_of(name, weight_form)
    inputs = [t.requires_grad_(True) for t in case.inputs((3, 6), torch.float64, device)]
    assert torch.autograd.gradcheck(lambda *t: case.fused(*t), inputs)
    assert torch.autograd.gradgradcheck(lambda *t: case.fused(*t), inputs)


@pytest.mark.parametrize("weight", [True, False], ids=["weight", "none"])
def test_backward_ops_gradcheck(device, weight):
    def tensor(*shape):
        return torch.randn(*shape, dtype=torch.float64, device=device, requires_grad=True)
    grad, x, grad_residual = tensor(4, 10), tensor(4, 10), tensor(4, 10)
    parameters = (tensor(10),) if weight else ()
    offset = 1.0 if weight else 0.0
    for backward in (torch.ops.fused.rms_norm_backward, torch.ops.fused.layer_norm_backward):
        assert torch.autograd.gradcheck(
            lambda g, a, r, *w: backward(g, a, w[0] if w else None, 1e-5, r, offset), (grad, x, grad_residual,
                                                                                         *parameters))


# ---------------------------------------------------------------------------------------------
# The model families' own modules (transformers): Gemma and Gemma 3 (RMSNorm of 1 + weight), Nemotron
# (LayerNorm1P: weight + 1), OLMo (LayerNorm without weight or bias).

def family_modules(hidden):
    """(name, the family's module, fused_ops.nn module of the same parameters) for each family."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P
    from transformers.models.olmo.modeling_olmo import OlmoLayerNorm
    return [
        ("gemma", GemmaRMSNorm(hidden, eps=1e-6), fused_ops.nn.RMSNorm(hidden, eps=1e-6, offset=1.0)),
        ("gemma3", Gemma3RMSNorm(hidden, eps=1e-6), fused_ops.nn.RMSNorm(hidden, eps=1e-6, offset=1.0)),
        ("nemotron", NemotronLayerNorm1P(hidden, eps=1e-5), fused_ops.nn.LayerNorm(hidden, eps=1e-5, offset=1.0)),
        ("olmo", OlmoLayerNorm(hidden), fused_ops.nn.LayerNorm(hidden, elementwise_affine=False)),
    ]


def float64_output(name, module, x):
    """The family's formula in float64 on the same parameters."""
    x = x.double()
    if name.startswith("gemma"):
        return rms_norm_reference(x, module.weight.double(), module.eps, offset=1.0)
    if name == "nemotron":
        return layer_norm_reference(x, module.weight.double(), module.bias.double(), module.eps, offset=1.0)
    return layer_norm_reference(x, None, None, 1e-5)


def rounding_magnitude(name, module, x, reference):
    """Per element, the magnitude whose rounding sets the error: the output's own for an RMSNorm (a
    product), and for a LayerNorm also the terms that cancel in it, mean · rstd · w and the bias."""
    if name.startswith("gemma"):
        return reference.abs()
    x = x.double()
    terms = (x.mean(-1, keepdim=True) * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)).abs()
    if name == "nemotron":
        terms = terms * (1 + module.weight.detach().double()).abs() + module.bias.detach().double().abs()
    return reference.abs().maximum(terms)


def ulps(value, reference, dtype, magnitude):
    """|value - reference| in units of the last place of dtype at `magnitude`."""
    exponent = torch.floor(torch.log2(magnitude.double().clamp_min(torch.finfo(dtype).tiny)))
    return (value.double() - reference.double()).abs() / (torch.finfo(dtype).eps * torch.exp2(exponent))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family", ["gemma", "gemma3", "nemotron", "olmo"])
def test_matches_the_family_module(device, family, dtype):
    """fused_ops.nn with the family's state_dict: its output within one ulp of the family module's (in
    the module's dtype), or else its worst error against float64 no larger than the module's (to an ulp:
    one element decides a maximum); gradients of x and the parameters as the module's in float32."""
    hidden = 256
    name, theirs, ours = next(entry for entry in family_modules(hidden) if entry[0] == family)
    with torch.no_grad():
        for parameter in theirs.parameters():  # random, not the zeros of a fresh Gemma or Nemotron norm
            parameter.normal_(0, 0.5)
    theirs = theirs.to(device=device, dtype=dtype)
    ours = ours.to(device=device, dtype=dtype)
    ours.load_state_dict(theirs.state_dict())
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    x = (random((8, 3, hidden), dtype, device).float() * 3 + 0.5).to(dtype)
    out, expected = ours(x), theirs(x)
    assert out.dtype == expected.dtype == dtype
    reference = float64_output(name, theirs, x)
    magnitude = rounding_magnitude(name, theirs, x, reference)
    if not (ulps(out, expected, dtype, magnitude) <= 1).all():  # else as close to float64, to an ulp
        assert ulps(out, reference, dtype, magnitude).max() <= ulps(expected, reference, dtype, magnitude).max() + 1
    if dtype == torch.float32:
        x.requires_grad_(True)
        leaves_ours, leaves_theirs = [x, *ours.parameters()], [x, *theirs.parameters()]
        grad = random(x.shape, dtype, device)
        for a, b in zip(torch.autograd.grad(ours(x), leaves_ours, grad),
                        torch.autograd.grad(theirs(x), leaves_theirs, grad), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Modules and modes.

def test_modules_start_with_torchs_weights_also_with_an_offset_and_without_weight_hold_none():
    for module in [fused_ops.nn.RMSNorm(8, offset=1.0), fused_ops.nn.AddLayerNorm(8, offset=1.0),
                   fused_ops.nn.LayerNorm(8)]:
        assert torch.equal(module.weight, torch.ones(8))
    assert torch.equal(fused_ops.nn.LayerNorm(8, offset=1.0).bias, torch.zeros(8))
    for module, eager in [(fused_ops.nn.RMSNorm(8, elementwise_affine=False),
                           torch.nn.RMSNorm(8, elementwise_affine=False)),
                          (fused_ops.nn.AddLayerNorm(8, elementwise_affine=False),
                           torch.nn.LayerNorm(8, elementwise_affine=False))]:
        assert module.weight is None and module.bias is None
        assert module.state_dict().keys() == eager.state_dict().keys() == set()
    assert "offset=1.0" in repr(fused_ops.nn.RMSNorm(8, offset=1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("form", ["offset", "no_weight"])
@pytest.mark.parametrize("module", ["RMSNorm", "AddRMSNorm"])
def test_fresh_modules_compute_what_a_fresh_offset_or_weightless_norm_computes(device, module, form, dtype):
    """A module built as a Gemma-style (offset 1, weight ones: x̂ · 2) or weightless norm, with no
    weight loaded, against the float64 composite of the same fresh parameters: outputs and gradients."""
    hidden, eps = 123, 1e-6
    kwargs = {"offset": 1.0} if form == "offset" else {"elementwise_affine": False}
    norm = getattr(fused_ops.nn, module)(hidden, eps=eps, **kwargs).to(device=device, dtype=dtype)
    inputs = [random((5, 7, hidden), dtype, device).requires_grad_(True) for _ in range(module.count("Add") + 1)]
    outs = norm(*inputs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    inputs64 = [t.detach().double().requires_grad_(True) for t in inputs]
    weight64 = None if norm.weight is None else norm.weight.detach().double().requires_grad_(True)
    h64 = sum(inputs64)
    expected = [rms_norm_reference(h64, weight64, eps, 1.0 if form == "offset" else 0.0)] + ([h64] if len(inputs) > 1 else [])
    for out, want in zip(outs, expected, strict=True):
        assert_close_to_reference(out.detach(), want.detach(), dtype, SCALE)
    grad_outs = [random(out.shape, dtype, device) for out in outs]
    leaves, leaves64 = inputs + list(norm.parameters()), inputs64 + ([weight64] if weight64 is not None else [])
    grads = torch.autograd.grad(outs, leaves, grad_outs)
    expected_grads = torch.autograd.grad(expected, leaves64, [g.double() for g in grad_outs])
    for grad, want, leaf in zip(grads, expected_grads, leaves, strict=True):
        rows = 35 if leaf.dim() == 1 else 1
        assert_close_to_reference(grad, want, dtype, SCALE * (math.sqrt(rows) if leaf.dim() == 1 else 2))
    with pytest.raises(ValueError, match="RMSNorm: offset is added to the weight, so it must be 0.0 without "
                                         "elementwise_affine, got 1.0"):
        fused_ops.nn.RMSNorm(8, elementwise_affine=False, offset=1.0)


# ---------------------------------------------------------------------------------------------
# Bad input: the Meta kernels (torch.compile, export) reject what the backends reject, with the same words.

def test_bad_weight_forms_are_named_on_meta_too():
    from test_norms import bad_weight_form_inputs
    f32 = lambda *shape: torch.randn(*shape, device="meta")  # noqa: E731
    bf16 = lambda *shape: torch.randn(*shape, device="meta", dtype=torch.bfloat16)  # noqa: E731
    for call, message in bad_weight_form_inputs(f32, bf16):
        with pytest.raises(RuntimeError) as error:
            call()
        assert message in str(error.value)


def test_errors_with_gradients_name_the_op_called(device):
    """With inputs that need gradients the checks run below autograd and in the backward's composite."""
    x = torch.randn(4, 8, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^fused::layer_norm: expected offset 0.0 when weight is None"):
        fused_ops.layer_norm(x, None, offset=1.0)
    with pytest.raises(RuntimeError, match=r"^fused::rms_norm_backward: expected offset 0.0 when weight is None"):
        torch.ops.fused.rms_norm_backward(x, x, None, 1e-6, None, 2.0)
