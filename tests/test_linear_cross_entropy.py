"""linear_cross_entropy on every dtype and device: the loss and the gradients of input, weight and bias
against F.linear + F.cross_entropy in float64 for every reduction, label smoothing, soft cap, ignored
rows, odd sizes, several chunks, modes and bad input."""
import os

import pytest
import torch
from torch.library import opcheck

import fused_ops
from conftest import TOLERANCE, assert_bad_input_rejected
from op_specs import largest_logit, linear_cross_entropy_reference as reference

REDUCTIONS = ["mean", "sum", "none"]


def make_inputs(leading, hidden, classes, dtype, device, bias=True, ignored=0.125, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*leading, hidden, generator=generator).to(dtype=dtype, device=device)
    weight = (torch.randn(classes, hidden, generator=generator) / hidden ** 0.5 * 2).to(dtype=dtype, device=device)
    target = torch.randint(0, classes, leading, generator=generator)
    target = target.masked_fill(torch.rand(leading, generator=generator) < ignored, -100).to(device)
    b = torch.randn(classes, generator=generator).to(dtype=dtype, device=device) if bias else None
    return x, weight, target, b


def check(x, weight, target, bias, dtype, reduction="mean", label_smoothing=0.0, softcap=0.0, seed=1):
    """Loss and every gradient against float64, for a random grad_output."""
    leaves = [t.requires_grad_(True) for t in (x, weight, bias) if t is not None]
    loss = fused_ops.linear_cross_entropy(x, weight, target, bias, -100, label_smoothing, reduction, softcap)
    leaves64 = [t.detach().double().requires_grad_(True) for t in leaves]
    x64, weight64 = leaves64[:2]
    bias64 = leaves64[2] if bias is not None else None
    want = reference(x64, weight64, target, bias64, label_smoothing, reduction, softcap)
    assert loss.shape == want.shape and loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    zeros = torch.zeros(weight.shape[0], dtype=torch.float64, device=weight.device)
    scale = largest_logit((x64, weight64, target, bias64 if bias64 is not None else zeros))
    tolerance = TOLERANCE[dtype] * 4
    torch.testing.assert_close(loss.double().cpu(), want.detach().cpu(), rtol=tolerance, atol=tolerance * scale)
    grad_output = torch.randn(loss.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    grads = torch.autograd.grad(loss, leaves, grad_output.to(loss.dtype).to(loss.device))
    want_grads = torch.autograd.grad(want, leaves64, grad_output.to(want.device))
    for grad, expected, leaf in zip(grads, want_grads, leaves):
        assert grad.shape == leaf.shape and grad.dtype == leaf.dtype
        torch.testing.assert_close(grad.double().cpu(), expected.cpu(), rtol=tolerance, atol=tolerance * scale)


# (leading dims, H, V): one row, V of 1 and 3, GPT-2's odd vocabulary, 3-D input, a 1-D input (one row).
SHAPES = [((1,), 8, 1), ((5,), 16, 3), ((9,), 24, 50257), ((2, 3), 16, 40), ((), 8, 7), ((0,), 8, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{'x'.join(map(str, s[0])) or 'row'}-{s[1]}-{s[2]}")
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_values_and_gradients(device, dtype, shape, reduction):
    leading, hidden, classes = shape
    x, weight, target, bias = make_inputs(leading, hidden, classes, dtype, device)
    check(x, weight, target, bias, dtype, reduction)


# 29 classes take the CUDA row kernel's single loads and element tail only; 50257 also its batched loads.
@pytest.mark.parametrize("classes", [29, 50257])
@pytest.mark.parametrize("label_smoothing, softcap", [(0.1, 0.0), (0.0, 5.0), (0.3, 2.0), (1.0, 0.0)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_label_smoothing_softcap_and_no_bias(device, dtype, label_smoothing, softcap, reduction, bias, classes):
    x, weight, target, b = make_inputs((13,), 16, classes, dtype, device, bias=bias)
    check(x, weight, target, b, dtype, reduction, label_smoothing, softcap)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_every_row_ignored(device, reduction):
    """'mean' over no rows is 0, not torch's NaN; every gradient is 0."""
    x, weight, target, bias = make_inputs((6,), 8, 5, torch.float32, device, ignored=1.0)
    leaves = [t.requires_grad_(True) for t in (x, weight, bias)]
    loss = fused_ops.linear_cross_entropy(x, weight, target, bias, reduction=reduction)
    assert torch.count_nonzero(loss) == 0 and not loss.isnan().any()
    for grad in torch.autograd.grad(loss.sum(), leaves):
        assert torch.count_nonzero(grad) == 0


def test_ignore_index_other_than_the_default(device):
    x, weight, target, bias = make_inputs((10,), 8, 6, torch.float64, device, ignored=0.0)
    target[::3] = 4
    loss = fused_ops.linear_cross_entropy(x, weight, target, bias, ignore_index=4)
    want = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, weight, bias), target, ignore_index=4)
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_several_chunks(device, dtype, monkeypatch):
    """Rows that take several chunks (ops/cross_entropy/launch_plan.h): the weight gradient adds up
    across them and each chunk's rows land in their own place. On CUDA, the plan's own chunks of 2048
    rows of 50257 classes; on every device, 1 MB chunks (FUSED_OPS_LOGITS_CHUNK_MB) of 1000 rows of 8192
    classes, the last one short."""
    if device == "cuda":
        x, weight, target, bias = make_inputs((2048,), 8, 50257, dtype, device)
        check(x, weight, target, bias, dtype, "mean", 0.1)
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "1")
    x, weight, target, bias = make_inputs((1000,), 8, 8192, dtype, device)
    check(x, weight, target, bias, dtype, "mean", 0.1)


def test_16_bit_weight_gradient_is_rounded_once_over_several_chunks(device, monkeypatch):
    """The weight's gradient sums one product per chunk of rows in float32 and rounds once: against the
    float64 product of the bfloat16 logits' gradient, within 1.5x of rounding it to bfloat16 once; a
    bfloat16 sum over the 8 chunks would round 8 times."""
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "1")  # 4096 rows of 1024 classes: 8 chunks of 512 rows
    x, weight, target, _ = make_inputs((4096,), 64, 1024, torch.bfloat16, device, bias=False)
    weight.requires_grad_(True)
    loss = fused_ops.linear_cross_entropy(x, weight, target, None, -100, 0.0, "sum")
    grad, = torch.autograd.grad(loss, weight)
    x64 = x.double()
    logits = (x64 @ weight.detach().double().t()).to(torch.bfloat16).double().requires_grad_(True)
    want_loss = torch.nn.functional.cross_entropy(logits, target, reduction="sum")
    grad_logits, = torch.autograd.grad(want_loss, logits)
    want = grad_logits.to(torch.bfloat16).double().t() @ x64
    rounding = ((want.to(torch.bfloat16).double() - want).norm() / want.norm()).item()
    error = ((grad.double() - want).norm() / want.norm()).item()
    assert error < 1.5 * rounding, (error, rounding)


def test_gradients_ignore_what_earlier_memory_left_in_the_buffer(device, dtype):
    """The chunk buffer's rows are padded to whole vectors (ops/cross_entropy/launch_plan.h), and the
    allocator hands it out with what an earlier tensor of its size left there: here NaN, freed just
    before each call. No gradient may depend on that padding."""
    rows, hidden, classes = 48, 64, 101
    per_vector = 16 // dtype.itemsize
    row_stride = -(-classes // per_vector) * per_vector
    x, weight, target, bias = make_inputs((rows,), hidden, classes, dtype, device, bias=False)
    for _ in range(20):
        poison = torch.full((rows, row_stride), float("nan"), dtype=dtype, device=device)
        del poison
        check(x.detach().clone(), weight.detach().clone(), target, bias, dtype, "mean")


def test_chunk_plan(monkeypatch):
    """The rows per chunk (ops/cross_entropy/launch_plan.h), read through the library's C entry point:
    an eighth of the logits held between 120 MB and 1 GB and under an eighth of free memory, the rows
    split as evenly as whole multiples of 512 allow (of 64 under 512 rows); where the chunks add into the
    weight's gradient, at least 2048 rows within those caps."""
    import ctypes
    function = ctypes.CDLL(fused_ops.library_path()).fused_ops_cross_entropy_chunk_rows
    function.restype = ctypes.c_int64
    function.argtypes = [ctypes.c_int64] * 5
    monkeypatch.delenv("FUSED_OPS_LOGITS_CHUNK_MB", raising=False)
    plenty = 1 << 40
    megabyte = 1 << 20

    def chunks(rows, classes, element_size, available=plenty, adds_weight_gradient=0):
        chunk = function(rows, classes, element_size, available, adds_weight_gradient)
        count = -(-rows // chunk)
        return chunk, count, rows - (count - 1) * chunk

    # An eighth of the logits at Llama-3's, Qwen's and Gemma 3's vocabularies in bf16 (525 MB, 594 MB and
    # 1 GB): eight chunks of 2048 rows.
    assert chunks(16384, 128256, 2) == (2048, 8, 2048)
    assert chunks(16384, 151936, 2) == (2048, 8, 2048)
    assert chunks(16384, 262144, 2) == (2048, 8, 2048)
    # 1 GB is the largest: 2048 rows of Gemma 3's vocabulary however many rows there are.
    assert chunks(65536, 262144, 2) == (2048, 32, 2048)
    # An eighth of Qwen's float32 logits (297 MB): eight chunks of 512 rows.
    assert chunks(4096, 151936, 4) == (512, 8, 512)
    # 120 MB at most (1966 rows) for 8192 x 32000 bf16, in whole multiples of 512: five of 1536 and one
    # of 512, not four of 1664 and one of 1536.
    assert chunks(8192, 32000, 2) == (1536, 6, 512)
    assert function(8192, 32000, 2, plenty, 0) * 32000 * 2 <= 120 * megabyte
    # Under 512 rows a chunk holds whole multiples of 64: 3000 float32 rows of 262144 classes (1 MB a
    # row, an eighth is 375 rows): nine of 320 and one of 120.
    assert chunks(3000, 262144, 4) == (320, 10, 120)
    # Chunks that add into the weight's gradient: 2048 rows of gpt-oss's 201088 classes (823 MB) where an
    # eighth of 4096 rows' logits is 512 rows; 1 GB and an eighth of free memory still bound them.
    assert chunks(4096, 201088, 2) == (512, 8, 512)
    assert chunks(4096, 201088, 2, adds_weight_gradient=1) == (2048, 2, 2048)
    assert chunks(4096, 524288, 2, adds_weight_gradient=1) == (1024, 4, 1024)
    assert chunks(4096, 201088, 2, 2048 * megabyte, adds_weight_gradient=1) == (512, 8, 512)
    assert chunks(16384, 128256, 2, adds_weight_gradient=1) == (2048, 8, 2048)
    # Small logits take one chunk; one row is the least; free memory caps the chunk at an eighth of it.
    assert chunks(100, 50257, 4) == (100, 1, 100)
    assert function(3, 1, 4, plenty, 0) == 3
    assert function(4096, 1 << 24, 4, 1, 1) == 1
    assert function(8192, 32000, 2, 256 * megabyte, 0) * 32000 * 2 <= 32 * megabyte
    # FUSED_OPS_LOGITS_CHUNK_MB sets the size; 0 or empty leaves it to the plan; anything else is an error.
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "8")
    assert chunks(8192, 32000, 2) == (128, 64, 128)
    assert chunks(8192, 32000, 2, adds_weight_gradient=1) == (128, 64, 128)
    for setting in ("0", ""):
        monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", setting)
        assert chunks(8192, 32000, 2) == (1536, 6, 512)
    for setting in ("abc", "-5", "8MB", "1e3", str(1 << 21)):
        monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", setting)
        assert function(8192, 32000, 2, plenty, 1) == -1, setting


@pytest.mark.parametrize("wanted", ["input", "weight", "bias"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_only_some_inputs_need_gradients(device, wanted, reduction):
    """A frozen head (gradient of the input only), a frozen body (weight only), a bias alone."""
    x, weight, target, bias = make_inputs((7,), 8, 11, torch.float64, device)
    tensors = {"input": x, "weight": weight, "bias": bias}
    tensors[wanted].requires_grad_(True)
    loss = fused_ops.linear_cross_entropy(x, weight, target, bias, reduction=reduction)
    grad, = torch.autograd.grad(loss.sum(), tensors[wanted])
    copies = {name: t.detach().clone().requires_grad_(name == wanted) for name, t in tensors.items()}
    want, = torch.autograd.grad(reference(copies["input"], copies["weight"], target, copies["bias"],
                                          reduction=reduction).sum(), copies[wanted])
    torch.testing.assert_close(grad, want)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck(device, reduction):
    x, weight, target, bias = make_inputs((4,), 3, 5, torch.float64, device)
    target[1] = -100
    leaves = [t.requires_grad_(True) for t in (x, weight, bias)]
    assert torch.autograd.gradcheck(
        lambda a, w, b: fused_ops.linear_cross_entropy(a, w, target, b, -100, 0.1, reduction, 3.0), leaves)


def test_double_backward_is_an_error(device):
    x, weight, target, bias = make_inputs((4,), 3, 5, torch.float64, device)
    x.requires_grad_(True)
    loss = fused_ops.linear_cross_entropy(x, weight, target, bias)
    with pytest.raises(RuntimeError, match="fused::linear_cross_entropy: double backward"):
        torch.autograd.grad(loss, x, create_graph=True)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_second_backward_through_one_graph_recomputes(device, reduction):
    """The forward's gradients go to the first backward; a later one (retain_graph) recomputes them."""
    x, weight, target, bias = make_inputs((4,), 3, 5, torch.float64, device)
    leaves = [t.requires_grad_(True) for t in (x, weight, bias)]
    loss = fused_ops.linear_cross_entropy(x, weight, target, bias, reduction=reduction)
    first = torch.autograd.grad(2 * loss, leaves, retain_graph=True)
    second = torch.autograd.grad(3 * loss, leaves)
    for a, b in zip(first, second):
        torch.testing.assert_close(a * 1.5, b)


# Every dtype through the schema and Meta checks; the autograd and AOT-dispatch checks, which do not
# depend on the dtype, with one 32-bit and one 16-bit type.
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.absent(lambda dtype, requires_grad, **_: requires_grad and dtype not in (torch.float32, torch.bfloat16))
def test_opcheck(device, dtype, requires_grad, reduction):
    x, weight, target, bias = make_inputs((5,), 8, 7, dtype, device)
    for t in (x, weight, bias):
        t.requires_grad_(requires_grad)
    opcheck(torch.ops.fused.linear_cross_entropy.default, (x, weight, target, bias, -100, 0.1, reduction, 2.0))
    detached = [t.detach() for t in (x, weight)]
    mask = [True, True, True]
    opcheck(torch.ops.fused.linear_cross_entropy_with_gradients.default,
            (*detached, target, bias.detach(), -100, 0.1, reduction, 2.0, mask))
    grad_loss = torch.randn(target.shape if reduction == "none" else (), device=device)
    opcheck(torch.ops.fused.linear_cross_entropy_backward.default,
            (grad_loss, *detached, target, bias.detach(), -100, 0.1, reduction, 2.0, [True, False, True]))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_fullgraph_dynamic_forward_and_backward(device, reduction):
    def step(x, weight, target, bias):
        return fused_ops.linear_cross_entropy(x, weight, target, bias, label_smoothing=0.1, reduction=reduction).sum()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for rows in (5, 9):
        x, weight, target, bias = make_inputs((rows,), 8, 11, torch.float32, device)
        leaves = [t.requires_grad_(True) for t in (x, weight, bias)]
        got = torch.autograd.grad(compiled(x, weight, target, bias), leaves)
        want = torch.autograd.grad(step(x, weight, target, bias), leaves)
        for grad, expected in zip(got, want):
            torch.testing.assert_close(grad, expected)


def test_export_keeps_one_node(device):
    head = fused_ops.nn.LinearCrossEntropy(label_smoothing=0.1)

    class Loss(torch.nn.Module):
        def forward(self, x, weight, target):
            return head(x, weight, target)
    x, weight, target, _ = make_inputs((6,), 8, 11, torch.float32, device)
    exported = torch.export.export(Loss(), (x, weight, target))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.fused.linear_cross_entropy.default) == 1
    torch.testing.assert_close(exported.module()(x, weight, target), head(x, weight, target))


def test_torchscript_module_save_load(device, tmp_path):
    module = fused_ops.nn.LinearCrossEntropy(reduction="sum", softcap=4.0)
    torch.jit.script(module).save(str(tmp_path / "loss.pt"))
    loaded = torch.jit.load(str(tmp_path / "loss.pt"))
    x, weight, target, bias = make_inputs((6,), 8, 11, torch.float32, device)
    torch.testing.assert_close(loaded(x, weight, target, bias), module(x, weight, target, bias))


def test_module_rejects_bad_options():
    for options, message in (({"reduction": "avg"}, "reduction must be"), ({"label_smoothing": 2.0}, "label_smoothing"),
                             ({"softcap": -1.0}, "softcap must be")):
        with pytest.raises(ValueError, match=message):
            fused_ops.nn.LinearCrossEntropy(**options)


def bad_linear_cross_entropy_inputs(device):
    def make(**overrides):
        x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device, ignored=0.0)
        arguments = {"input": x, "weight": weight, "target": target, "bias": bias, "ignore_index": -100,
                     "label_smoothing": 0.0, "reduction": "mean", "softcap": 0.0}
        arguments.update(overrides)
        return lambda: torch.ops.fused.linear_cross_entropy(*arguments.values())
    op = "fused::linear_cross_entropy: "
    cases = [
        (make(target=torch.tensor([0, 6, 1, 2], device=device)),
         op + "expected target values in [0, 6) or ignore_index (-100), but got 6"),
        (make(target=torch.tensor([0, -1, 1, 2], device=device)), "or ignore_index (-100), but got -1"),
        (make(target=torch.zeros(4, device=device)), op + "expected target to be int64 class indices, but got Float"),
        (make(target=torch.zeros(3, dtype=torch.long, device=device)),
         op + "expected target of input's leading shape [4], but got [3]"),
        (make(weight=torch.randn(6, 7, device=device)),
         op + "expected weight [V, H] with V >= 1 and H = input.size(-1) = 8, but got shape [6, 7]"),
        (make(weight=torch.randn(6, 8, device=device, dtype=torch.float64)),
         op + "expected weight to have the same dtype as input (Float), but got Double"),
        (make(bias=torch.randn(5, device=device)), op + "expected bias to be 1-D of size V = weight.size(0) = 6, but got shape [5]"),
        (make(input=torch.randn((), device=device)), op + "expected input [..., H] to have at least one dim"),
        (make(reduction="avg"), op + "expected reduction to be 'mean', 'sum' or 'none', but got 'avg'"),
        (make(label_smoothing=1.5), op + "expected label_smoothing in [0, 1], but got 1.5"),
        (make(softcap=-1.0), op + "expected softcap >= 0 (0: no cap), but got -1"),
        (make(input=torch.randint(0, 3, (4, 8), device=device)),
         op + "expected input to be float64, float32, float16 or bfloat16, but got Long"),
    ]
    chunk_setting = ("expected the environment variable FUSED_OPS_LOGITS_CHUNK_MB to be a whole number of megabytes "
                     "from 0 to 1048576 (the memory of one chunk of logits; 0 or unset: the op's own choice), but got ")
    cases += [(with_chunk_setting("abc", make()), op + chunk_setting + "'abc'"),
              (with_chunk_setting("-5", make()), chunk_setting + "'-5'")]
    if device == "cuda":
        cases.append((make(target=torch.zeros(4, dtype=torch.long)),
                      op + "expected target to be on the same device as input (cuda:0), but got cpu"))
    return cases


def with_chunk_setting(value, call):
    """`call` with FUSED_OPS_LOGITS_CHUNK_MB set to `value`, restored after."""
    def call_with_setting():
        before = os.environ.get("FUSED_OPS_LOGITS_CHUNK_MB")
        os.environ["FUSED_OPS_LOGITS_CHUNK_MB"] = value
        try:
            return call()
        finally:
            if before is None:
                del os.environ["FUSED_OPS_LOGITS_CHUNK_MB"]
            else:
                os.environ["FUSED_OPS_LOGITS_CHUNK_MB"] = before
    return call_with_setting


@pytest.mark.parametrize("case", range(15))
@pytest.mark.absent(lambda device, case: case >= len(bad_linear_cross_entropy_inputs(device)))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_linear_cross_entropy_inputs(device), case)


def test_bad_grad_loss_of_the_backward(device):
    x, weight, target, bias = make_inputs((4,), 8, 6, torch.float32, device)
    with pytest.raises(RuntimeError, match=r"linear_cross_entropy_backward: expected grad_loss of the loss's shape \[4\]"):
        torch.ops.fused.linear_cross_entropy_backward(torch.ones(3, device=device), x, weight, target, bias, -100, 0.0,
                                                      "none", 0.0, [True, True, True])
