"""linear_log_probs on every dtype and device: the log-probabilities, the entropy and the gradients of
input, weight and bias through both, for random signed per-token weights, against F.linear +
log_softmax in float64; temperatures, ignored rows, bias on and off, several chunks, modes and bad input."""
import os

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import fused_ops
from conftest import TOLERANCE, assert_bad_input_rejected
from op_specs import largest_logit, linear_log_probs_reference as reference


def make_inputs(leading, hidden, classes, dtype, device, bias=True, ignored=0.125, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*leading, hidden, generator=generator).to(dtype=dtype, device=device)
    weight = (torch.randn(classes, hidden, generator=generator) / hidden ** 0.5 * 2).to(dtype=dtype, device=device)
    target = torch.randint(0, classes, leading, generator=generator)
    target = target.masked_fill(torch.rand(leading, generator=generator) < ignored, -100).to(device)
    b = torch.randn(classes, generator=generator).to(dtype=dtype, device=device) if bias else None
    return x, weight, target, b


def check(x, weight, target, bias, dtype, temperature=1.0, return_entropy=True, seed=1, uses=(True, True),
          logit_scale=1.0, softcap=0.0):
    """Both results and every gradient against float64, for random signed weights on the results that
    `uses` says the loss takes (log-probabilities, entropy)."""
    leaves = [t.requires_grad_(True) for t in (x, weight, bias) if t is not None]
    result = fused_ops.linear_log_probs(x, weight, target, bias, temperature=temperature, return_entropy=return_entropy,
                                        logit_scale=logit_scale, softcap=softcap)
    outputs = result if return_entropy else (result,)
    leaves64 = [t.detach().double().requires_grad_(True) for t in leaves]
    bias64 = leaves64[2] if bias is not None else None
    expected = reference(leaves64[0], leaves64[1], target, bias64, temperature, -100, return_entropy, logit_scale,
                         softcap)
    expected = expected if return_entropy else expected[:1]
    output_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    zeros = torch.zeros(weight.shape[0], dtype=torch.float64, device=weight.device)
    # The raw product's rounding scales with the logit scale; a cap does not enlarge it.
    scale = largest_logit((leaves64[0], leaves64[1], target, bias64 if bias64 is not None else zeros)) / min(1, temperature)
    scale *= max(1.0, abs(logit_scale))
    tolerance = TOLERANCE[dtype] * 4
    for out, want in zip(outputs, expected, strict=True):
        assert out.shape == target.shape and out.dtype == output_dtype
        torch.testing.assert_close(out.double().cpu(), want.detach().cpu(), rtol=tolerance, atol=tolerance * scale)
    generator = torch.Generator().manual_seed(seed)
    used = [i for i, use in enumerate(uses[:len(outputs)]) if use]
    weights = [torch.randn(target.shape, generator=generator, dtype=torch.float64) for _ in used]
    grads = torch.autograd.grad([outputs[i] for i in used], leaves,
                                [w.to(output_dtype).to(x.device) for w in weights])
    want_grads = torch.autograd.grad([expected[i] for i in used], leaves64, [w.to(x.device) for w in weights])
    for grad, want, leaf in zip(grads, want_grads, leaves):
        assert grad.shape == leaf.shape and grad.dtype == leaf.dtype
        torch.testing.assert_close(grad.double().cpu(), want.cpu(), rtol=tolerance, atol=tolerance * scale)


# (leading dims, H, V): one row, V of 1 and 3, GPT-2's odd vocabulary, 3-D input, a 1-D input, no rows.
SHAPES = [((1,), 8, 1), ((5,), 16, 3), ((9,), 24, 50257), ((2, 3), 16, 40), ((), 8, 7), ((0,), 8, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{'x'.join(map(str, s[0])) or 'row'}-{s[1]}-{s[2]}")
@pytest.mark.parametrize("return_entropy", [True, False], ids=["entropy", "no_entropy"])
def test_values_and_gradients(device, dtype, shape, return_entropy):
    leading, hidden, classes = shape
    x, weight, target, bias = make_inputs(leading, hidden, classes, dtype, device)
    check(x, weight, target, bias, dtype, 0.7, return_entropy)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_temperature_and_no_bias(device, dtype, temperature, bias):
    x, weight, target, b = make_inputs((13,), 16, 29, dtype, device, bias=bias)
    check(x, weight, target, b, dtype, temperature)


# (logit scale, softcap): Cohere's and Granite's scales, Gemma 2's cap of 30 and a cap that bends every
# logit, a scale with a cap, a negative scale.
HEAD_FORMS = [(0.0625, 0.0), (8.0, 0.0), (1.0, 30.0), (1.0, 1.5), (2.0, 3.0), (-0.5, 0.0)]


@pytest.mark.parametrize("form", HEAD_FORMS, ids=lambda f: f"scale{f[0]:g}-cap{f[1]:g}")
@pytest.mark.parametrize("return_entropy", [True, False], ids=["entropy", "no_entropy"])
def test_logit_scale_and_softcap(device, dtype, form, return_entropy):
    """z = softcap * tanh(linear * logit_scale / softcap) / temperature, as the models apply them."""
    x, weight, target, bias = make_inputs((17,), 16, 37, dtype, device)
    check(x, weight, target, bias, dtype, 0.6, return_entropy, logit_scale=form[0], softcap=form[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_softcap_over_several_chunks(device, dtype, monkeypatch):
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "1")
    x, weight, target, bias = make_inputs((300,), 8, 2000, dtype, device)
    check(x, weight, target, bias, dtype, 0.8, logit_scale=0.25, softcap=2.0)


@pytest.mark.parametrize("uses", [(True, False), (False, True)], ids=["log_probs_only", "entropy_only"])
def test_gradient_through_one_result(device, dtype, uses):
    """A loss of one result alone: the other's gradient is absent, not zeros of the logits' size."""
    x, weight, target, bias = make_inputs((11,), 16, 23, dtype, device)
    check(x, weight, target, bias, dtype, 1.3, uses=uses)


def test_every_row_ignored(device):
    x, weight, target, bias = make_inputs((6,), 8, 5, torch.float32, device, ignored=1.0)
    leaves = [t.requires_grad_(True) for t in (x, weight, bias)]
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, bias, return_entropy=True)
    assert torch.count_nonzero(log_probs) == 0 and torch.count_nonzero(entropy) == 0
    for grad in torch.autograd.grad((log_probs + entropy).sum(), leaves):
        assert torch.count_nonzero(grad) == 0


def test_ignore_index_other_than_the_default(device):
    x, weight, target, bias = make_inputs((10,), 8, 6, torch.float64, device, ignored=0.0)
    target[::3] = 4
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, bias, ignore_index=4, return_entropy=True)
    want = reference(x, weight, target, bias, ignore_index=4, return_entropy=True)
    torch.testing.assert_close(log_probs, want[0])
    torch.testing.assert_close(entropy, want[1])
    assert torch.count_nonzero(log_probs[::3]) == 0


def test_wrapper_returns_one_or_two_results(device):
    x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device)
    alone = fused_ops.linear_log_probs(x, weight, target)
    assert isinstance(alone, torch.Tensor) and alone.shape == (4,)
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, return_entropy=True)
    torch.testing.assert_close(log_probs, alone)
    assert torch.ops.fused.linear_log_probs(x, weight, target)[1].shape == (0,)


def test_masked_classes_have_no_nan(device):
    """Classes masked with a bias of -inf have probability 0: they add nothing to the entropy or its
    gradient (p log p there is 0, not NaN)."""
    x, weight, target, bias = make_inputs((6,), 8, 9, torch.float32, device, ignored=0.0)
    bias[::2] = float("-inf")
    target = torch.full_like(target, 1)
    x.requires_grad_(True)
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, bias, return_entropy=True)
    kept = reference(x.double(), weight.double()[1::2], target.new_zeros(6), bias.double()[1::2], return_entropy=True)
    torch.testing.assert_close(log_probs.double(), kept[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy.double(), kept[1], rtol=1e-5, atol=1e-5)
    grad, = torch.autograd.grad((log_probs + entropy).sum(), x)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_several_chunks(device, dtype, monkeypatch):
    """With a 1 MB chunk, 300 rows of 2000 classes take several chunks (ops/cross_entropy/launch_plan.h):
    the weight's gradient adds up across them and each chunk's rows land in their own place."""
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "1")
    x, weight, target, bias = make_inputs((300,), 8, 2000, dtype, device)
    check(x, weight, target, bias, dtype, 0.8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_several_chunks_of_classes(device, dtype, monkeypatch):
    """The backward takes the classes in chunks (ops/cross_entropy/launch_plan.h): 300 rows with a 1 MB chunk
    take 1536 classes at a time, six chunks of 7000 classes with a short last one."""
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "1")
    x, weight, target, bias = make_inputs((300,), 8, 7000, dtype, device)
    check(x, weight, target, bias, dtype, 0.8, logit_scale=0.5, softcap=3.0)


@pytest.mark.parametrize("kept", ["512", "100000"], ids=["some_classes", "every_class"])
def test_backward_reads_the_logits_the_forward_kept(device, dtype, kept, monkeypatch):
    """The forward keeps the raw logits of the first classes (FUSED_OPS_KEPT_CLASSES: 512, or all 7000) and
    the backward reads them in place of a product, its chunks of classes ending where the kept ones end (1 MB
    chunks of 1536 classes for 300 rows): values and gradients against float64."""
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "1")
    monkeypatch.setenv("FUSED_OPS_KEPT_CLASSES", kept)
    x, weight, target, bias = make_inputs((3, 100), 8, 7000, dtype, device)
    check(x, weight, target, bias, dtype, 0.8, logit_scale=0.5, softcap=3.0)
    classes = min(int(kept), 7000)
    assert kept_classes_recorded(x, weight, target, bias) == classes
    kept_logits = torch.ops.fused.linear_log_probs_with_log_sum_exp(
        x.detach(), weight.detach(), target, bias.detach(), 0.8, -100, True, 0.5, 3.0, classes)[3]
    assert kept_logits.shape == (3, 100, classes) and kept_logits.dtype == dtype
    want = F.linear(x.detach().double(), weight.detach().double()[:classes], bias.detach().double()[:classes])
    tolerance = TOLERANCE[dtype] * 4
    torch.testing.assert_close(kept_logits.double(), want, rtol=tolerance, atol=tolerance * want.abs().max().item())
    # The backward reads them: kept logits shifted on one class give the gradients of logits shifted so.
    grads = torch.randn(3, 100, dtype=torch.float32, device=device), None
    arguments = (x.detach(), weight.detach(), target, bias.detach(), 0.8, -100, [True, True, True], 0.5, 3.0)
    statistics = torch.ops.fused.linear_log_probs_with_log_sum_exp(
        x.detach(), weight.detach(), target, bias.detach(), 0.8, -100, False, 0.5, 3.0, classes)
    shifted = kept_logits.clone()
    shifted[..., 3] += 4.0
    read = torch.ops.fused.linear_log_probs_backward(*grads, *arguments, statistics[2], None, statistics[3])
    altered = torch.ops.fused.linear_log_probs_backward(*grads, *arguments, statistics[2], None, shifted)
    assert not torch.equal(read[1][3], altered[1][3])  # class 3's weight gradient follows its kept logits
    torch.testing.assert_close(read[1][4:], altered[1][4:], rtol=0, atol=0)  # the others' do not


def test_a_second_backward_reads_the_same_kept_logits(device, monkeypatch):
    """The backward writes the gradient beside the kept logits, never over them: a second backward through
    the same graph (retain_graph) gives the same gradients."""
    monkeypatch.setenv("FUSED_OPS_KEPT_CLASSES", "256")
    x, weight, target, bias = make_inputs((40,), 8, 600, torch.float32, device)
    leaves = [t.requires_grad_(True) for t in (x, weight, bias)]
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, bias, return_entropy=True)
    loss = (log_probs * torch.randn_like(log_probs)).sum() + entropy.sum()
    first = torch.autograd.grad(loss, leaves, retain_graph=True)
    second = torch.autograd.grad(loss, leaves)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def kept_classes_recorded(x, weight, target, bias=None):
    """How many classes' logits linear_log_probs' autograd kernel saves for the backward (the last tensor
    it saves, [rows, K])."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fused_ops.linear_log_probs(x.detach().requires_grad_(True), weight, target, bias)
    assert saved[-1].shape[:-1] == x.shape[:-1]
    return saved[-1].shape[-1]


def test_kept_classes_setting(device, monkeypatch):
    """FUSED_OPS_KEPT_CLASSES: whole multiples of 256 classes at most V, 0 for none (anything but a whole
    number is an error naming the op: bad_linear_log_probs_inputs)."""
    x, weight, target, bias = make_inputs((4,), 8, 700, torch.float32, device)
    for setting, classes in (("0", 0), ("300", 256), ("700", 512), ("5000", 700)):
        monkeypatch.setenv("FUSED_OPS_KEPT_CLASSES", setting)
        assert kept_classes_recorded(x, weight, target, bias) == classes, setting


class OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The ops called below autograd, with their arguments."""
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def test_kept_classes_plan(device):
    """Unset, the forward keeps 24 x H classes (whole multiples of 256, at most V) and at most 1.5 weights'
    worth of logits in all: 768 classes of a [2048, 32] head at 100 rows, 256 at 200 rows (1.5 x 2048 x 32 /
    200 = 491), none at 400 (245), and never more than V; nothing without a gradient to record."""
    weight = torch.randn(2048, 32, device=device)
    for rows, classes in ((1, 768), (100, 768), (200, 256), (400, 0)):
        x = torch.randn(rows, 32, device=device)
        assert kept_classes_recorded(x, weight, torch.zeros(rows, dtype=torch.long, device=device)) == classes, rows
    assert kept_classes_recorded(torch.randn(3, 5, 32, device=device), weight[:300],
                                 torch.zeros(3, 5, dtype=torch.long, device=device)) == 300
    # Under no_grad the op runs without its autograd kernel: no forward that keeps logits is called.
    x = torch.randn(10, 32, device=device, requires_grad=True)
    target = torch.zeros(10, dtype=torch.long, device=device)
    for grad_mode, kept in ((True, [768]), (False, [])):
        with torch.set_grad_enabled(grad_mode), OpLog() as log:
            fused_ops.linear_log_probs(x, weight, target)
        keeping = torch.ops.fused.linear_log_probs_with_log_sum_exp.default
        assert [args[9] for op, args in log.calls if op == keeping] == kept


def test_any_kept_classes_count(device, dtype):
    """The op keeps any count it is asked for (301 classes: rows that start off the 16-byte vectors) and
    the backward given them gives the gradients it gives without them."""
    x, weight, target, bias = make_inputs((50,), 8, 700, dtype, device)
    arguments = (x, weight, target, bias, 0.8, -100, True, 0.5, 3.0)
    kept = torch.ops.fused.linear_log_probs_with_log_sum_exp(*arguments, 301)
    assert kept[3].shape == (50, 301)
    grads = torch.randn(50, device=device), torch.randn(50, device=device)
    common = (*grads, x, weight, target, bias, 0.8, -100, [True, True, True], 0.5, 3.0, kept[2], kept[1])
    with_kept = torch.ops.fused.linear_log_probs_backward(*common, kept[3])
    without = torch.ops.fused.linear_log_probs_backward(*common, None)
    for a, b in zip(with_kept, without):
        torch.testing.assert_close(a, b, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def relative_error(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def test_16_bit_gradients_are_rounded_once(device, monkeypatch):
    """bfloat16 gradients rounded once: against the float64 products of the bfloat16 logits' gradient (what
    every bfloat16 head computes before its products), within 1.5x of rounding those to bfloat16 once. The
    weight's rows of a chunk of classes come from one product over every row, and the input's gradient adds
    up the chunks in float32; a bfloat16 sum over the 8 chunks would round 8 times."""
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "1")  # 4096 rows: 8 chunks of 128 classes
    x, weight, target, _ = make_inputs((4096,), 64, 1024, torch.bfloat16, device, bias=False)
    leaves = [t.requires_grad_(True) for t in (x, weight)]
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, temperature=0.6, return_entropy=True)
    generator = torch.Generator().manual_seed(3)
    weights = [torch.randn(4096, generator=generator).to(device) for _ in range(2)]
    grads = torch.autograd.grad([log_probs, entropy], leaves, weights)
    x64, weight64 = x.detach().double(), weight.detach().double()
    logits = (x64 @ weight64.t()).to(torch.bfloat16).double().requires_grad_(True)
    log_p = torch.log_softmax(logits / 0.6, -1)
    kept = target != -100
    chosen = log_p.gather(-1, target.clamp(min=0)[:, None]).squeeze(-1) * kept
    row_entropy = -(log_p.exp() * log_p).sum(-1) * kept
    grad_logits, = torch.autograd.grad([chosen, row_entropy], logits, [w.double() for w in weights])
    grad_logits = grad_logits.to(torch.bfloat16).double()
    for grad, want in zip(grads, (grad_logits @ weight64, grad_logits.t() @ x64)):
        rounding = relative_error(want.to(torch.bfloat16), want)
        assert relative_error(grad, want) < 1.5 * rounding, (relative_error(grad, want), rounding)


def test_the_backward_with_and_without_the_forwards_statistics(device):
    """linear_log_probs_backward given the forward's log-sum-exp and entropy (as the autograd kernel calls
    it) and without them (computed again) gives the same gradients."""
    x, weight, target, bias = make_inputs((9,), 8, 13, torch.float64, device)
    log_probs, entropy, log_sum_exp, kept_logits = torch.ops.fused.linear_log_probs_with_log_sum_exp(
        x, weight, target, bias, 0.7, -100, True, 0.5, 2.0)
    assert kept_logits.shape == (9, 0)
    want = reference(x, weight, target, bias, 0.7, -100, True, 0.5, 2.0)
    torch.testing.assert_close(log_probs, want[0])
    torch.testing.assert_close(entropy, want[1])
    z = 2.0 * torch.tanh(F.linear(x, weight, bias) * 0.5 / 2.0) / 0.7
    kept = target != -100
    torch.testing.assert_close(log_sum_exp[kept], torch.logsumexp(z, -1)[kept])
    grads = torch.randn(9, dtype=torch.float64, device=device), torch.randn(9, dtype=torch.float64, device=device)
    given = torch.ops.fused.linear_log_probs_backward(*grads, x, weight, target, bias, 0.7, -100, [True, True, True],
                                                      0.5, 2.0, log_sum_exp, entropy)
    computed = torch.ops.fused.linear_log_probs_backward(*grads, x, weight, target, bias, 0.7, -100, [True, True, True],
                                                         0.5, 2.0)
    for a, b in zip(given, computed):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("wanted", ["input", "weight", "bias"])
def test_only_some_inputs_need_gradients(device, wanted):
    """A frozen head (gradient of the input only), a frozen body (weight only), a bias alone."""
    x, weight, target, bias = make_inputs((7,), 8, 11, torch.float64, device)
    tensors = {"input": x, "weight": weight, "bias": bias}
    tensors[wanted].requires_grad_(True)
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, bias, return_entropy=True)
    grad, = torch.autograd.grad((log_probs - 0.1 * entropy).sum(), tensors[wanted])
    copies = {name: t.detach().clone().requires_grad_(name == wanted) for name, t in tensors.items()}
    want_log_probs, want_entropy = reference(copies["input"], copies["weight"], target, copies["bias"],
                                             return_entropy=True)
    want, = torch.autograd.grad((want_log_probs - 0.1 * want_entropy).sum(), copies[wanted])
    torch.testing.assert_close(grad, want)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("return_entropy", [True, False], ids=["entropy", "no_entropy"])
@pytest.mark.parametrize("form", [(1.0, 0.0), (0.5, 1.2)], ids=["plain", "scale-cap"])
def test_gradcheck(device, bias, return_entropy, form):
    x, weight, target, b = make_inputs((4,), 3, 5, torch.float64, device, bias=bias)
    target[1] = -100
    leaves = [t.requires_grad_(True) for t in (x, weight, b) if t is not None]

    def function(*tensors):
        result = fused_ops.linear_log_probs(tensors[0], tensors[1], target, tensors[2] if bias else None,
                                            temperature=0.8, return_entropy=return_entropy, logit_scale=form[0],
                                            softcap=form[1])
        return result
    assert torch.autograd.gradcheck(function, leaves)


def test_double_backward_is_an_error(device):
    x, weight, target, bias = make_inputs((4,), 3, 5, torch.float64, device)
    x.requires_grad_(True)
    log_probs = fused_ops.linear_log_probs(x, weight, target, bias)
    with pytest.raises(RuntimeError, match="fused::linear_log_probs: double backward"):
        torch.autograd.grad(log_probs.sum(), x, create_graph=True)


def test_backward_op_is_not_differentiable(device):
    x, weight, target, bias = make_inputs((4,), 3, 5, torch.float64, device)
    grad = torch.randn(4, dtype=torch.float64, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="fused::linear_log_probs_backward: not differentiable"):
        torch.ops.fused.linear_log_probs_backward(grad, None, x, weight, target, bias, 1.0, -100, [True, True, True])
    x.requires_grad_(True)
    with pytest.raises(RuntimeError, match="fused::linear_log_probs_with_log_sum_exp: not differentiable"):
        torch.ops.fused.linear_log_probs_with_log_sum_exp(x, weight, target, bias, 1.0, -100, True, 1.0, 0.0)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("return_entropy", [True, False], ids=["entropy", "no_entropy"])
@pytest.mark.parametrize("form", [(), (0.5, 2.0)], ids=["defaults", "scale-cap"])
def test_opcheck(device, dtype, requires_grad, return_entropy, form, monkeypatch):
    monkeypatch.setenv("FUSED_OPS_KEPT_CLASSES", "256")  # every one of the 7 classes' logits kept
    x, weight, target, bias = make_inputs((5,), 8, 7, dtype, device)
    for t in (x, weight, bias):
        t.requires_grad_(requires_grad)
    opcheck(torch.ops.fused.linear_log_probs.default, (x, weight, target, bias, 0.7, -100, return_entropy, *form))
    detached = [t.detach() for t in (x, weight)]
    gradients = torch.randn(5, device=device), torch.randn(5, device=device)
    opcheck(torch.ops.fused.linear_log_probs_backward.default,
            (gradients[0], gradients[1] if return_entropy else None, *detached, target, bias.detach(), 0.7, -100,
             [True, False, True], *form))
    scale, cap = form or (1.0, 0.0)
    statistics = torch.ops.fused.linear_log_probs_with_log_sum_exp(*detached, target, bias.detach(), 0.7, -100,
                                                                  return_entropy, scale, cap)
    opcheck(torch.ops.fused.linear_log_probs_with_log_sum_exp.default,
            (*detached, target, bias.detach(), 0.7, -100, return_entropy, scale, cap))
    opcheck(torch.ops.fused.linear_log_probs_backward.default,
            (gradients[0], gradients[1] if return_entropy else None, *detached, target, bias.detach(), 0.7, -100,
             [True, True, True], scale, cap, statistics[2], statistics[1] if return_entropy else None))
    kept = torch.ops.fused.linear_log_probs_with_log_sum_exp(*detached, target, bias.detach(), 0.7, -100,
                                                            return_entropy, scale, cap, 7)
    assert kept[3].shape == (5, 7)
    opcheck(torch.ops.fused.linear_log_probs_with_log_sum_exp.default,
            (*detached, target, bias.detach(), 0.7, -100, return_entropy, scale, cap, 7))
    opcheck(torch.ops.fused.linear_log_probs_with_log_sum_exp.default,
            (*detached, target, bias.detach(), 0.7, -100, return_entropy, scale, cap, 3))
    opcheck(torch.ops.fused.linear_log_probs_backward.default,
            (gradients[0], gradients[1] if return_entropy else None, *detached, target, bias.detach(), 0.7, -100,
             [True, True, True], scale, cap, kept[2], kept[1] if return_entropy else None, kept[3]))


@pytest.mark.parametrize("return_entropy", [True, False], ids=["entropy", "no_entropy"])
def test_compile_fullgraph_dynamic_forward_and_backward(device, return_entropy, monkeypatch):
    monkeypatch.setenv("FUSED_OPS_KEPT_CLASSES", "256")  # the kept logits' shape follows the rows
    def step(x, weight, target, bias, advantages):
        result = fused_ops.linear_log_probs(x, weight, target, bias, temperature=0.9, return_entropy=return_entropy,
                                            logit_scale=0.5, softcap=20.0)
        if not return_entropy:
            return (advantages * result).sum()
        log_probs, entropy = result
        return (advantages * log_probs).sum() - 0.01 * entropy.sum()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        x, weight, target, bias = make_inputs((rows,), 8, 11, torch.float32, device)
        advantages = torch.randn(rows, device=device)
        leaves = [t.requires_grad_(True) for t in (x, weight, bias)]
        got = torch.autograd.grad(compiled(x, weight, target, bias, advantages), leaves)
        want = torch.autograd.grad(step(x, weight, target, bias, advantages), leaves)
        for grad, expected in zip(got, want):
            torch.testing.assert_close(grad, expected)


def test_compile_dynamic_follows_the_kept_classes_plan(device):
    """Unset, the kept count is an expression of the rows: 768, 512 and 256 classes at 100, 150 and 200
    rows run one compiled graph (a second only where none are kept, 400 rows), each with eager's gradients."""
    def step(x, weight, target):
        return fused_ops.linear_log_probs(x, weight, target, temperature=0.9).sum()
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    weight = torch.randn(2048, 32, device=device, requires_grad=True)
    for rows in (100, 150, 200, 400):
        x = torch.randn(rows, 32, device=device, requires_grad=True)
        target = torch.randint(0, 2048, (rows,), device=device)
        got = torch.autograd.grad(compiled(x, weight, target), (x, weight))
        want = torch.autograd.grad(step(x, weight, target), (x, weight))
        for grad, expected in zip(got, want):
            torch.testing.assert_close(grad, expected)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames
        assert graphs == (1 if rows < 400 else 2), (rows, graphs)


class PolicyLogProbs(torch.nn.Module):
    def forward(self, x, weight, target):
        return torch.ops.fused.linear_log_probs(x, weight, target, None, 0.7, -100, True, 0.5, 30.0)


def test_export_keeps_one_node(device):
    x, weight, target, _ = make_inputs((6,), 8, 11, torch.float32, device)
    exported = torch.export.export(PolicyLogProbs(), (x, weight, target))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.fused.linear_log_probs.default) == 1
    for got, want in zip(exported.module()(x, weight, target), PolicyLogProbs()(x, weight, target)):
        torch.testing.assert_close(got, want)


def test_torchscript_save_load_with_backward(device, tmp_path):
    module = PolicyLogProbs()
    torch.jit.script(module).save(str(tmp_path / "log_probs.pt"))
    loaded = torch.jit.load(str(tmp_path / "log_probs.pt"))
    x, weight, target, _ = make_inputs((6,), 8, 11, torch.float32, device)
    x.requires_grad_(True)
    got = loaded(x, weight, target)
    want = module(x, weight, target)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(torch.autograd.grad(sum(t.sum() for t in got), x)[0],
                               torch.autograd.grad(sum(t.sum() for t in want), x)[0])


@pytest.mark.cuda_only
@pytest.mark.parametrize("kept", [None, "0"], ids=["plan", "none_kept"])
def test_peak_memory_holds_one_chunk_not_the_logits(monkeypatch, kept):
    """Forward and backward hold one chunk of logits at a time beside the logits the forward keeps: 4096
    rows x 32000 classes would be 512 MB of float32 logits; with 16 MB chunks the peak above the inputs,
    gradients included (18 MB), stays far below that, plus the plan's kept logits (1.5 weights' worth: 2816
    classes, 22 MB) where they are kept."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "16")
    if kept is not None:
        monkeypatch.setenv("FUSED_OPS_KEPT_CLASSES", kept)
    kept_bytes = 0 if kept == "0" else 4096 * 2816 * 2
    x, weight, target, _ = make_inputs((4096,), 256, 32000, torch.bfloat16, "cuda")
    x.requires_grad_(True)
    weight.requires_grad_(True)
    advantages = torch.randn(4096, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    log_probs, entropy = fused_ops.linear_log_probs(x, weight, target, return_entropy=True)
    torch.autograd.backward([log_probs, entropy], [advantages, -advantages])
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - baseline - kept_bytes
    assert extra < 64 << 20, f"{extra / 2**20:.0f} MB above the inputs and the kept logits"


def bad_linear_log_probs_inputs(device):
    def make(**overrides):
        x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device, ignored=0.0)
        arguments = {"input": x, "weight": weight, "target": target, "bias": bias, "temperature": 1.0,
                     "ignore_index": -100, "return_entropy": True, "logit_scale": 1.0, "softcap": 0.0}
        arguments.update(overrides)
        return lambda: torch.ops.fused.linear_log_probs(*arguments.values())
    op = "fused::linear_log_probs: "
    cases = [
        (make(target=torch.tensor([0, 6, 1, 2], device=device)),
         op + "expected target values in [0, 6) or ignore_index (-100), but got 6"),
        (make(target=torch.tensor([0, -1, 1, 2], device=device)), op + "expected target values in [0, 6) or ignore_index (-100), but got -1"),
        (make(temperature=0.0), op + "expected temperature > 0 and finite, but got 0"),
        (make(temperature=-1.0), op + "expected temperature > 0 and finite, but got -1"),
        (make(temperature=float("inf")), op + "expected temperature > 0 and finite, but got inf"),
        (make(logit_scale=0.0), op + "expected logit_scale finite and not 0, but got 0"),
        (make(logit_scale=float("nan")), op + "expected logit_scale finite and not 0, but got nan"),
        (make(softcap=-1.0), op + "expected softcap >= 0 (0: no cap) and finite, but got -1"),
        (make(softcap=float("inf")), op + "expected softcap >= 0 (0: no cap) and finite, but got inf"),
        (make(target=torch.zeros(4, device=device)), op + "expected target to be int64 class indices, but got Float"),
        (make(target=torch.zeros(3, dtype=torch.long, device=device)),
         op + "expected target of input's leading shape [4], but got [3]"),
        (make(weight=torch.randn(6, 7, device=device)),
         op + "expected weight [V, H] with V >= 1 and H = input.size(-1) = 8, but got shape [6, 7]"),
        (make(weight=torch.randn(6, 8, device=device, dtype=torch.float64)),
         op + "expected weight to have the same dtype as input (Float), but got Double"),
        (make(bias=torch.randn(6, device=device, dtype=torch.float16)),
         op + "expected bias to have the same dtype as input (Float), but got Half"),
        (make(bias=torch.randn(5, device=device)), op + "expected bias to be 1-D of size V = weight.size(0) = 6, but got shape [5]"),
        (make(input=torch.randn((), device=device)), op + "expected input [..., H] to have at least one dim"),
        (make(input=torch.randint(0, 3, (4, 8), device=device)),
         op + "expected input to be float64, float32, float16 or bfloat16, but got Long"),
    ]
    def with_kept_classes(setting):
        def call():
            old = os.environ.get("FUSED_OPS_KEPT_CLASSES")
            os.environ["FUSED_OPS_KEPT_CLASSES"] = setting
            try:
                x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device)
                fused_ops.linear_log_probs(x.requires_grad_(True), weight, target, bias)
            finally:
                os.environ.pop("FUSED_OPS_KEPT_CLASSES")
                if old is not None:
                    os.environ["FUSED_OPS_KEPT_CLASSES"] = old
        return call

    def backward_with_kept(kept):
        x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device)
        return lambda: torch.ops.fused.linear_log_probs_backward(torch.ones(4, device=device), None, x, weight, target,
                                                                 bias, 1.0, -100, [True, True, True], 1.0, 0.0, None,
                                                                 None, kept)
    def forward_keeping(classes):
        x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device)
        return lambda: torch.ops.fused.linear_log_probs_with_log_sum_exp(x, weight, target, bias, 1.0, -100, False,
                                                                         1.0, 0.0, classes)
    cases += [
        (forward_keeping(7), "fused::linear_log_probs_with_log_sum_exp: expected kept_classes from 0 to "
         "weight.size(0) (6), but got 7"),
        (with_kept_classes("many"), op + "expected the environment variable FUSED_OPS_KEPT_CLASSES to be a whole "
         "number of classes from 0 to 1099511627776 (the logits of how many classes the forward keeps; 0: none), "
         "but got 'many'"),
        (backward_with_kept(torch.zeros(2, 2, 3, device=device)),
         "fused::linear_log_probs_backward: expected kept_logits (the forward's) of input's leading dims and at most "
         "weight.size(0) (6) classes, got kept_logits of shape [2, 2, 3] for input of shape [4, 8]"),
    ]
    if device == "cuda":
        cases.append((make(target=torch.zeros(4, dtype=torch.long)),
                      op + "expected target to be on the same device as input (cuda:0), but got cpu"))
        cases.append((make(weight=torch.randn(6, 8)),
                      op + "expected weight to be on the same device as input (cuda:0), but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(22))
@pytest.mark.absent(lambda device, case: case >= len(bad_linear_log_probs_inputs(device)))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_linear_log_probs_inputs(device), case)


def test_bad_gradients_of_the_backward(device):
    x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device)
    with pytest.raises(RuntimeError, match=r"linear_log_probs_backward: expected grad_entropy to have the shape of "
                                           r"target \[4\], but got \[3\]"):
        torch.ops.fused.linear_log_probs_backward(torch.ones(4, device=device), torch.ones(3, device=device), x, weight,
                                                  target, bias, 1.0, -100, [True, True, True])
    with pytest.raises(RuntimeError, match=r"linear_log_probs_backward: expected log_sum_exp to have the shape of "
                                           r"target \[4\], but got \[5\]"):
        torch.ops.fused.linear_log_probs_backward(torch.ones(4, device=device), None, x, weight, target, bias, 1.0,
                                                  -100, [True, True, True], 1.0, 0.0, torch.zeros(5, device=device))
    with pytest.raises(RuntimeError, match=r"linear_log_probs_backward: expected kept_logits \(the forward's\) of "
                                           r"input's leading dims and at most weight.size\(0\) \(6\) classes, got "
                                           r"kept_logits of shape \[4, 7\] for input of shape \[4, 8\]"):
        torch.ops.fused.linear_log_probs_backward(torch.ones(4, device=device), None, x, weight, target, bias, 1.0,
                                                  -100, [True, True, True], 1.0, 0.0, None, None,
                                                  torch.zeros(4, 7, device=device))
    with pytest.raises(RuntimeError, match=r"linear_log_probs_backward: expected kept_logits to have the same dtype"):
        torch.ops.fused.linear_log_probs_backward(torch.ones(4, device=device), None, x, weight, target, bias, 1.0,
                                                  -100, [True, True, True], 1.0, 0.0, None, None,
                                                  torch.zeros(4, 3, dtype=torch.float64, device=device))
    with pytest.raises(RuntimeError, match="linear_log_probs_backward: expected grad_log_probs to be float64, float32"):
        torch.ops.fused.linear_log_probs_backward(torch.ones(4, dtype=torch.long, device=device), None, x, weight,
                                                  target, bias, 1.0, -100, [True, True, True])
