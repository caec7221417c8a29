"""attention_with_sinks on every dtype and device: the output and the gradients of query, key, value and sinks
against gpt-oss's eager attention in float64 (GQA, full and sliding windows, head sizes torch's flash kernels
take and ones they do not); what the backward keeps; gradcheck, opcheck, compile, export, TorchScript,
torch.func and bad input."""
import pytest
import torch
from torch.library import opcheck

import fused_ops
from conftest import TOLERANCE, assert_bad_input_rejected, cuda_kernels_run_by


def eager_reference(query, key, value, sinks, scale, window):
    """transformers' gpt-oss eager_attention_forward (its causal or sliding-window mask, the sink logit
    appended to each row and dropped after the softmax) on [B, S, H, D] inputs, in their dtype."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    length = q.shape[2]
    rows, columns = torch.arange(length)[:, None], torch.arange(length)[None, :]
    allowed = columns <= rows
    if window:
        allowed &= columns > rows - window
    scores = (q @ k.transpose(2, 3) * scale).masked_fill(~allowed.to(q.device), float("-inf"))
    logits = torch.cat([scores, sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, length, 1)], dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probabilities = logits.softmax(dim=-1)[..., :-1]
    return (probabilities @ v).transpose(1, 2)


def make_inputs(batch, length, heads, key_heads, head_size, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, length, heads, head_size, generator=generator)
    key = torch.randn(batch, length, key_heads, head_size, generator=generator)
    value = torch.randn(batch, length, key_heads, head_size, generator=generator)
    sinks = torch.randn(heads, generator=generator)
    return [t.to(device=device, dtype=dtype) for t in (query, key, value, sinks)]


def check(inputs, scale, window, dtype, tolerance_scale=8.0):
    leaves = [t.requires_grad_(True) for t in inputs]
    out = fused_ops.attention_with_sinks(*leaves, scale, window)
    leaves64 = [t.detach().double().cpu().requires_grad_(True) for t in leaves]
    want = eager_reference(*leaves64, scale, window)
    assert out.shape == inputs[0].shape and out.dtype == dtype
    tolerance = TOLERANCE[dtype] * tolerance_scale
    torch.testing.assert_close(out.double().cpu(), want.detach(), rtol=tolerance, atol=tolerance)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, grad.to(device=out.device, dtype=dtype))
    expected = torch.autograd.grad(want, leaves64, grad)
    for name, a, b in zip(("query", "key", "value", "sinks"), got, expected):
        assert a.dtype == dtype, name
        size = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.double().cpu(), b, rtol=tolerance * 4, atol=tolerance * 4 * size, msg=name)


@pytest.mark.parametrize("window", [0, 1, 5, 64])
@pytest.mark.parametrize("heads,key_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("head_size", [16, 12])
def test_values_and_gradients(device, dtype, window, heads, key_heads, head_size):
    scale = head_size ** -0.5
    check(make_inputs(2, 37, heads, key_heads, head_size, dtype, device), scale, window, dtype)


@pytest.mark.cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("window", [0, 128])
def test_gpt_oss_heads_on_the_flash_kernels(device, dtype, window):
    """gpt-oss-20b's heads (64 query, 8 key/value heads of 64) over 300 tokens: the flash kernels, forward and
    backward, within the half type's rounding of the float64 eager attention."""
    inputs = make_inputs(1, 300, 64, 8, 64, dtype, device)
    kernels = cuda_kernels_run_by(lambda: fused_ops.attention_with_sinks(*inputs, 0.125, window))
    assert any("flash" in name for name in kernels), kernels
    check(inputs, 0.125, window, dtype, tolerance_scale=4.0)


@pytest.mark.cuda_only
@pytest.mark.parametrize("window", [0, 16])
def test_biased_values_on_the_flash_kernels_as_close_as_eager(device, window):
    """Values and keys with a large common part (projection biases) and near-uniform attention: bfloat16 on the
    flash kernels, every gradient is as close to float64 as gpt-oss's eager attention's in bfloat16 (the values'
    common part kept out of flash's rounded output, which the backward's row sums would carry into dq)."""
    generator = torch.Generator().manual_seed(3)
    batch, length, heads, key_heads, head_size = 2, 40, 8, 2, 64
    bias = lambda *shape: torch.rand(*shape, generator=generator) * 0.5 + 0.25
    noise = lambda *shape: torch.randn(*shape, generator=generator) * 0.1
    query = noise(batch, length, heads, head_size) + bias(heads, head_size)
    key = noise(batch, length, key_heads, head_size) + bias(key_heads, head_size)
    value = noise(batch, length, key_heads, head_size) + bias(key_heads, head_size)
    sinks = bias(heads)
    exact = [t.double().requires_grad_(True) for t in (query, key, value, sinks)]
    want = eager_reference(*exact, 0.125, window)
    grad = torch.randn(want.shape, generator=generator, dtype=torch.float64)
    expected = torch.autograd.grad(want, exact, grad)
    half = [t.to(device=device, dtype=torch.bfloat16).requires_grad_(True) for t in (query, key, value, sinks)]
    fused = torch.autograd.grad(fused_ops.attention_with_sinks(*half, 0.125, window), half,
                                grad.to(device=device, dtype=torch.bfloat16))
    eager = torch.autograd.grad(eager_reference(*half, 0.125, window), half,
                                grad.to(device=device, dtype=torch.bfloat16))
    distance = lambda got, want: ((got.double().cpu() - want).norm() / want.norm()).item()
    for name, got, stock, exact_gradient in zip(("query", "key", "value", "sinks"), fused, eager, expected):
        assert distance(got, exact_gradient) <= 1.5 * distance(stock, exact_gradient) + 2.0 ** -9, name


def test_sinks_of_another_dtype(device):
    """bfloat16 heads with float32 sinks (a model whose sinks stay in float32): the sinks' gradient in float32."""
    query, key, value, sinks = make_inputs(1, 9, 4, 2, 8, torch.bfloat16, device)
    sinks = sinks.float().requires_grad_(True)
    out = fused_ops.attention_with_sinks(query, key, value, sinks, 0.3)
    want = eager_reference(*(t.double() for t in (query, key, value, sinks)), 0.3, 0)
    torch.testing.assert_close(out.double(), want, rtol=0.03, atol=0.03)
    assert torch.autograd.grad(out.sum(), sinks)[0].dtype == torch.float32


def test_backward_keeps_no_scores(device):
    """The autograd node keeps the inputs, the output and the log-sum-exp: nothing of size S x S."""
    inputs = [t.requires_grad_(True) for t in make_inputs(1, 64, 4, 2, 8, torch.float32, device)]
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        fused_ops.attention_with_sinks(*inputs, 0.3)
    assert sum(saved) == sum(t.numel() for t in inputs) + inputs[0].numel() + 64 * 4, saved


@pytest.mark.parametrize("window", [0, 3])
def test_gradcheck(device, window):
    inputs = [t.requires_grad_(True) for t in make_inputs(2, 7, 4, 2, 4, torch.float64, device)]
    assert torch.autograd.gradcheck(lambda *t: fused_ops.attention_with_sinks(*t, 0.7, window), inputs)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, requires_grad):
    dtypes = [torch.float32] + ([torch.bfloat16] if device == "cuda" else [])
    for dtype in dtypes:
        query, key, value, sinks = make_inputs(2, 9, 4, 2, 16, dtype, device)
        query.requires_grad_(requires_grad)
        opcheck(torch.ops.fused.attention_with_sinks.default, (query, key, value, sinks, 0.25, 4))
        out, log_sum_exp = torch.ops.fused.attention_with_sinks(query, key, value, sinks, 0.25, 4)
        opcheck(torch.ops.fused.attention_with_sinks_backward.default,
                (torch.randn_like(out), query.detach(), key, value, sinks, out.detach(), log_sum_exp, 0.25, 4))


class Attention(torch.nn.Module):
    def forward(self, query, key, value, sinks):
        return torch.ops.fused.attention_with_sinks(query, key, value, sinks, 0.25, 3)[0]


def test_compile_fullgraph_dynamic_forward_and_backward(device):
    compiled = torch.compile(Attention(), fullgraph=True, dynamic=True)
    for length in (5, 11):
        inputs = [t.requires_grad_(True) for t in make_inputs(2, length, 4, 2, 8, torch.float32, device)]
        got, want = compiled(*inputs), Attention()(*inputs)
        torch.testing.assert_close(got, want)
        for a, b in zip(torch.autograd.grad(got.square().sum(), inputs),
                        torch.autograd.grad(want.square().sum(), inputs)):
            torch.testing.assert_close(a, b)


def test_export_keeps_one_node(device):
    inputs = tuple(make_inputs(2, 6, 4, 2, 8, torch.float32, device))
    exported = torch.export.export(Attention(), inputs)
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.fused.attention_with_sinks.default) == 1, targets
    torch.testing.assert_close(exported.module()(*inputs), Attention()(*inputs))


def test_torchscript_save_load_with_backward(device, tmp_path):
    torch.jit.script(Attention()).save(str(tmp_path / "attention.pt"))
    loaded = torch.jit.load(str(tmp_path / "attention.pt"))
    inputs = [t.requires_grad_(True) for t in make_inputs(2, 6, 4, 2, 8, torch.float32, device)]
    got, want = loaded(*inputs), Attention()(*inputs)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got.sum(), inputs), torch.autograd.grad(want.sum(), inputs)):
        torch.testing.assert_close(a, b)


def test_torch_func_grad_and_vmap(device):
    """Under torch.func the op runs its ATen math: grad and vmap give the eager attention's values."""
    query, key, value, sinks = make_inputs(2, 6, 4, 2, 8, torch.float64, device)
    loss = lambda q, s: fused_ops.attention_with_sinks(q, key, value, s, 0.3).square().sum()  # noqa: E731
    want_loss = lambda q, s: eager_reference(q, key, value, s, 0.3, 0).square().sum()  # noqa: E731
    for a, b in zip(torch.func.grad(loss, argnums=(0, 1))(query, sinks),
                    torch.func.grad(want_loss, argnums=(0, 1))(query, sinks)):
        torch.testing.assert_close(a, b)
    batched = torch.func.vmap(lambda q: fused_ops.attention_with_sinks(q, key, value, sinks, 0.3, 2))(
        query.unsqueeze(0).expand(3, *query.shape))
    torch.testing.assert_close(batched[1], eager_reference(query, key, value, sinks, 0.3, 2))


def bad_attention_inputs(device):
    """(call, message) of each bad input of attention_with_sinks (docs/reliability.md lists the same)."""
    query, key, value, sinks = make_inputs(2, 6, 4, 2, 8, torch.float32, device)
    op = fused_ops.attention_with_sinks
    return [
        (lambda: op(query[0], key, value, sinks, 0.3),
         "fused::attention_with_sinks: expected query of 4 dimensions [batch, sequence, heads, head size], but got 3"),
        (lambda: op(query, key, value[:, :, :1], sinks, 0.3),
         "fused::attention_with_sinks: expected value of key's shape [2, 6, 2, 8], but got [2, 6, 1, 8]"),
        (lambda: op(query, key[:, :5], value[:, :5], sinks, 0.3),
         "fused::attention_with_sinks: expected key of query's batch, sequence and head size"),
        (lambda: op(query[:, :, :3], key, value, sinks[:3], 0.3),
         "fused::attention_with_sinks: expected query's heads to be a multiple of key's, but got 3 and 2"),
        (lambda: op(query, key, value, sinks[:3], 0.3),
         "fused::attention_with_sinks: expected one sink per query head (4), but got 3"),
        (lambda: op(query, key.double(), value, sinks, 0.3),
         "fused::attention_with_sinks: expected query, key and value of one floating dtype, but got Float, Double "
         "and Float"),
        (lambda: op(query, key, value, sinks, 0.0),
         "fused::attention_with_sinks: expected scale > 0 and finite, but got 0"),
        (lambda: op(query, key, value, sinks, 0.3, -1),
         "fused::attention_with_sinks: expected window >= 0 (0: every earlier key), but got -1"),
    ]


@pytest.mark.parametrize("case", range(8))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_attention_inputs(device), case)
