"""rotary_embedding on every dtype and device: values of Hugging Face's apply_rotary_pos_emb in both
layouts, grouped-query attention, partial and interleaved rotation, views of one qkv buffer, gradients,
modes and bad input."""
import pytest
import torch
from torch.library import opcheck

import fused_ops
from conftest import assert_bad_input_rejected, assert_close_to_reference
from op_specs import rotary_reference as reference

# A rotation sums two products, then one rounding: a few ulp of the dtype.
SCALE = 4.0


def tables(batch, sequence, rotary_dim, dtype, device, interleaved=False):
    """cos and sin of a position table as models build it (frequencies repeated over the two halves,
    or interleaved), for positions offset per batch row."""
    frequencies = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    positions = torch.arange(sequence, dtype=torch.float64)[None] + 7 * torch.arange(batch, dtype=torch.float64)[:, None]
    angles = positions[..., None] * frequencies
    angles = angles.repeat_interleave(2, -1) if interleaved else torch.cat([angles, angles], -1)
    return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype, device=device)


def make_inputs(batch, q_heads, k_heads, sequence, head_dim, rotary_dim, dtype, device, unsqueeze_dim=1,
                interleaved=False, table_dtype=None):
    def random(heads):
        shape = (batch, heads, sequence, head_dim) if unsqueeze_dim == 1 else (batch, sequence, heads, head_dim)
        return torch.randn(shape, dtype=torch.float32).to(dtype=dtype, device=device)
    cos, sin = tables(batch, sequence, rotary_dim, table_dtype or dtype, device, interleaved)
    return random(q_heads), random(k_heads), cos, sin


# (B, Hq, Hk, S, D, R): decode, GQA, odd sequences, head dims 2 to 256, partial rotation (with R/2 a
# multiple of 16 bytes, of 8, of 4, and odd).
SHAPES = [(1, 1, 1, 1, 2, 2), (2, 4, 2, 3, 64, 64), (1, 2, 1, 1023, 80, 40), (2, 4, 4, 5, 128, 128),
          (1, 2, 2, 3, 256, 128), (2, 8, 2, 1, 128, 64), (2, 3, 1, 7, 24, 12), (1, 2, 1, 9, 24, 6)]
PARTIAL_SHAPES = [shape for shape in SHAPES if shape[5] < shape[4]]


def check_values(q, k, cos, sin, unsqueeze_dim, interleaved, dtype):
    q_out, k_out = fused_ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)
    want_q, want_k = reference(q.double(), k.double(), cos.double(), sin.double(), unsqueeze_dim, interleaved)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == dtype
    for x, out in ((q, q_out), (k, k_out)):  # a dense input's layout, as eager's results keep it
        assert out.stride() == torch.empty_like(x).stride()
    assert_close_to_reference(q_out, want_q, dtype, SCALE)
    assert_close_to_reference(k_out, want_k, dtype, SCALE)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_values(device, dtype, shape, unsqueeze_dim, interleaved):
    q, k, cos, sin = make_inputs(*shape, dtype, device, unsqueeze_dim, interleaved)
    check_values(q, k, cos, sin, unsqueeze_dim, interleaved, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("rotary_dim", [64, 40])
def test_float32_tables_with_16_bit_heads(device, dtype, rotary_dim):
    q, k, cos, sin = make_inputs(2, 4, 2, 5, 64, rotary_dim, dtype, device, table_dtype=torch.float32)
    check_values(q, k, cos, sin, 1, False, dtype)


def test_tables_of_one_batch_and_without_batch(device, dtype):
    q, k, cos, sin = make_inputs(3, 2, 1, 4, 16, 16, dtype, device)
    for table_cos, table_sin in ((cos[:1], sin[:1]), (cos[0], sin[0])):
        check_values(q, k, table_cos, table_sin, 1, False, dtype)


def test_views_of_one_qkv_projection(device, dtype):
    """q and k as views of one [B, S, (Hq + 2 Hk) D] projection output: row strides past D, no copy."""
    batch, sequence, q_heads, k_heads, head_dim = 2, 5, 4, 2, 32
    qkv = torch.randn(batch, sequence, (q_heads + 2 * k_heads) * head_dim).to(dtype=dtype, device=device)
    q = qkv[..., :q_heads * head_dim].view(batch, sequence, q_heads, head_dim)
    k = qkv[..., q_heads * head_dim:(q_heads + k_heads) * head_dim].view(batch, sequence, k_heads, head_dim)
    cos, sin = tables(batch, sequence, head_dim, dtype, device)
    check_values(q, k, cos, sin, 2, False, dtype)
    check_values(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1, False, dtype)  # [B, H, S, D] views


def test_empty(device, dtype):
    q, k, cos, sin = make_inputs(2, 3, 1, 0, 8, 8, dtype, device)
    q_out, k_out = fused_ops.rotary_embedding(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_keys_of_no_heads_rotate_the_queries_alone(device, dtype, unsqueeze_dim):
    """A detached view of no heads as k (one tensor's rotation, as fuse() runs Gemma 3n and 4's): q's
    values and gradient as with keys, an empty k."""
    q, _, cos, sin = make_inputs(2, 4, 1, 7, 64, 64, dtype, device, unsqueeze_dim)
    no_heads = q.narrow(unsqueeze_dim, 0, 0)
    check_values(q, no_heads, cos, sin, unsqueeze_dim, False, dtype)
    q = q.double().requires_grad_()
    cos, sin = cos.double(), sin.double()
    q_out, k_out = fused_ops.rotary_embedding(q, q.detach().narrow(unsqueeze_dim, 0, 0), cos, sin, unsqueeze_dim)
    assert k_out.numel() == 0
    grad = torch.randn_like(q_out)
    q_out.backward(grad)
    reference_q = q.detach().clone().requires_grad_()
    want_q, _ = reference(reference_q, reference_q.detach().narrow(unsqueeze_dim, 0, 0), cos, sin, unsqueeze_dim, False)
    (want_grad,) = torch.autograd.grad(want_q, reference_q, grad)
    torch.testing.assert_close(q.grad, want_grad)


@pytest.mark.parametrize("shape", PARTIAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("table_dtype", [None, torch.float32], ids=["tables_of_heads_dtype", "float32_tables"])
def test_backward_of_partial_rotations(device, dtype, shape, table_dtype):
    """The transposed rotation reads sin at each element's partner, R/2 away: in one run where a vector
    lies inside one half, element by element where it spans the middle."""
    if table_dtype is not None and dtype.itemsize != 2:
        pytest.skip("float32 tables go with 16-bit heads")
    q, k, cos, sin = make_inputs(*shape, dtype, device, table_dtype=table_dtype)
    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    got = torch.ops.fused.rotary_embedding_backward(grad_q, grad_k, cos, sin, 1, False)
    q64, k64 = (t.double().requires_grad_(True) for t in (q, k))
    want = torch.autograd.grad(reference(q64, k64, cos.double(), sin.double(), 1, False), (q64, k64),
                               [grad_q.double(), grad_k.double()])
    for grad, expected in zip(got, want):
        assert_close_to_reference(grad, expected, dtype, SCALE)


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_gradients(device, dtype, unsqueeze_dim, interleaved):
    q, k, cos, sin = make_inputs(2, 4, 2, 3, 16, 8, dtype, device, unsqueeze_dim, interleaved)
    q.requires_grad_(True)
    k.requires_grad_(True)
    outs = fused_ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)
    grad_outs = [torch.randn_like(out) for out in outs]
    grads = torch.autograd.grad(outs, (q, k), grad_outs)
    q64, k64 = (t.detach().double().requires_grad_(True) for t in (q, k))
    expected = torch.autograd.grad(reference(q64, k64, cos.double(), sin.double(), unsqueeze_dim, interleaved),
                                   (q64, k64), [g.double() for g in grad_outs])
    for grad, want in zip(grads, expected):
        assert_close_to_reference(grad, want, dtype, SCALE)


def test_gradient_of_one_output_only(device):
    q, k, cos, sin = make_inputs(1, 2, 1, 3, 8, 8, torch.float64, device)
    q.requires_grad_(True)
    k.requires_grad_(True)
    q_out, _ = fused_ops.rotary_embedding(q, k, cos, sin)
    grad_q, grad_k = torch.autograd.grad(q_out.sum(), (q, k))
    want_q, = torch.autograd.grad(reference(q, k, cos, sin)[0].sum(), q)
    torch.testing.assert_close(grad_q, want_q)
    assert torch.count_nonzero(grad_k) == 0


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_gradcheck_and_gradgradcheck(device, interleaved):
    q, k, cos, sin = make_inputs(1, 2, 1, 3, 8, 6, torch.float64, device, 2, interleaved)
    q.requires_grad_(True)
    k.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: fused_ops.rotary_embedding(a, b, cos, sin, 2, interleaved), (q, k))
    assert torch.autograd.gradgradcheck(lambda a, b: fused_ops.rotary_embedding(a, b, cos, sin, 2, interleaved),
                                        (q, k))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, dtype, requires_grad):
    q, k, cos, sin = make_inputs(2, 2, 1, 3, 8, 4, dtype, device, 2, True)
    q.requires_grad_(requires_grad)
    k.requires_grad_(requires_grad)
    opcheck(torch.ops.fused.rotary_embedding.default, (q, k, cos, sin, 2, True))
    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    opcheck(torch.ops.fused.rotary_embedding_backward.default, (grad_q, grad_k, cos, sin, 2, True))


def test_compile_fullgraph_dynamic_forward_and_backward(device):
    def step(q, k, cos, sin):
        q_out, k_out = fused_ops.rotary_embedding(q, k, cos, sin)
        return (q_out * 2).sum() + k_out.sum()
    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    for sequence in (3, 5):
        q, k, cos, sin = make_inputs(2, 4, 2, sequence, 16, 16, torch.float32, device)
        q.requires_grad_(True)
        k.requires_grad_(True)
        grads = torch.autograd.grad(compiled(q, k, cos, sin), (q, k))
        expected = torch.autograd.grad(step(q, k, cos, sin), (q, k))
        for grad, want in zip(grads, expected):
            torch.testing.assert_close(grad, want)


def test_export_keeps_one_node(device):
    class Rope(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            return fused_ops.rotary_embedding(q, k, cos, sin, 2)
    inputs = make_inputs(1, 2, 1, 3, 8, 8, torch.float32, device, 2)
    exported = torch.export.export(Rope(), tuple(inputs))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.fused.rotary_embedding.default) == 1
    for out, want in zip(exported.module()(*inputs), reference(*inputs, 2)):
        torch.testing.assert_close(out.double(), want.double(), rtol=1e-5, atol=1e-5)


def test_torchscript_save_load(device, tmp_path):
    class Rope(torch.nn.Module):
        def forward(self, q, k, cos, sin):
            return torch.ops.fused.rotary_embedding(q, k, cos, sin, 1, False)
    scripted = torch.jit.script(Rope())
    scripted.save(str(tmp_path / "rope.pt"))
    loaded = torch.jit.load(str(tmp_path / "rope.pt"))
    inputs = make_inputs(1, 2, 2, 3, 8, 8, torch.float32, device)
    for out, want in zip(loaded(*inputs), fused_ops.rotary_embedding(*inputs)):
        torch.testing.assert_close(out, want)


def bad_rotary_inputs(device):
    def make(**overrides):
        q, k, cos, sin = make_inputs(2, 4, 2, 3, 8, 8, torch.float32, device)
        arguments = {"q": q, "k": k, "cos": cos, "sin": sin, "unsqueeze_dim": 1}
        arguments.update(overrides)
        return lambda: torch.ops.fused.rotary_embedding(arguments["q"], arguments["k"], arguments["cos"],
                                                        arguments["sin"], arguments["unsqueeze_dim"], False)
    table = tables(2, 3, 8, torch.float32, device)
    cases = [
        (make(cos=table[0][..., :7], sin=table[1][..., :7]),
         "fused::rotary_embedding: expected the rotated dims R = cos.size(-1) to be even and at most the head dim 8, but got 7"),
        (make(cos=torch.randn(2, 3, 10, device=device), sin=torch.randn(2, 3, 10, device=device)),
         "expected the rotated dims R = cos.size(-1) to be even and at most the head dim 8, but got 10"),
        (make(cos=table[0][:, :2], sin=table[1][:, :2]),
         "fused::rotary_embedding: expected cos of shape [2, 2, 8] to have q's sequence length 3 in dim -2"),
        (make(cos=torch.randn(3, 3, 8, device=device), sin=torch.randn(3, 3, 8, device=device)),
         "fused::rotary_embedding: expected cos of shape [3, 3, 8] to have q's batch 2 or 1 in dim 0"),
        (make(sin=table[1][:1]), "fused::rotary_embedding: expected sin to have the shape of cos [2, 3, 8], but got [1, 3, 8]"),
        (make(k=torch.randn(2, 2, 3, 6, device=device)),
         "fused::rotary_embedding: expected k of shape [2, 2, 3, 6] to match q [2, 4, 3, 8] in every dim but the heads (dim 1)"),
        (make(unsqueeze_dim=3),
         "fused::rotary_embedding: expected unsqueeze_dim to be 1 (q [B, H, S, D]) or 2 (q [B, S, H, D]), but got 3"),
        (make(q=torch.randn(2, 4, 8, device=device)),
         "fused::rotary_embedding: expected q and k to be 4-D ([B, H, S, D]), but got shapes [2, 4, 8] and [2, 2, 3, 8]"),
        (make(k=torch.randn(2, 2, 3, 8, device=device, dtype=torch.float64)),
         "fused::rotary_embedding: expected k to have the same dtype as q (Float), but got Double"),
        (make(cos=table[0].double(), sin=table[1].double()),
         "fused::rotary_embedding: expected cos to have q's dtype (Float) or, for a 16-bit q, float32, but got Double"),
        (make(q=torch.randn(2, 4, 3, 8, device=device, dtype=torch.float64),
              k=torch.randn(2, 2, 3, 8, device=device, dtype=torch.float64)),
         "fused::rotary_embedding: expected cos to have q's dtype (Double) or, for a 16-bit q, float32, but got Float"),
        (make(cos=table[0].clone().requires_grad_(True)),
         "fused::rotary_embedding: expected cos and sin not to require grad"),
    ]
    if device == "cuda":
        cases.append((make(cos=table[0].cpu(), sin=table[1].cpu()),
                      "fused::rotary_embedding: expected cos to be on the same device as q (cuda:0), but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(12))
@pytest.mark.absent(lambda device, case: case >= len(bad_rotary_inputs(device)))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_rotary_inputs(device), case)


@pytest.mark.parametrize("layout", ["stepped", "offset"])
def test_stepped_and_misaligned_heads(device, dtype, layout):
    """Head vectors with a stride (every other element) or a data pointer off the vector alignment (the
    inputs the vectorized kernel leaves to the strided one): the same values as contiguous heads."""
    q, k, cos, sin = make_inputs(2, 4, 2, 5, 64, 64, dtype, device)
    if layout == "stepped":
        q = torch.stack([q, q], -1)[..., 0]
    else:
        q = torch.cat([torch.zeros(1, dtype=dtype, device=device), q.flatten()])[1:].view(q.shape)
    check_values(q, k, cos, sin, 1, False, dtype)


@pytest.mark.cuda_only
@pytest.mark.slow
def test_more_than_2_to_the_31_elements():
    """q and k of more than 2^31 bf16 elements each, forward and backward, checked on the positions at
    both ends and around element 2^31."""
    head_dim = 128
    sequence = (1 << 31) // head_dim + 3
    if torch.cuda.mem_get_info()[0] < 48 * 2**30:
        pytest.skip("needs about 48 GB of free GPU memory")
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, cos, sin = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
                      for shape in ((1, 1, sequence, head_dim),) * 2 + ((sequence, head_dim),) * 2)
    q.requires_grad_(True)
    k.requires_grad_(True)
    outs = fused_ops.rotary_embedding(q, k, cos, sin)
    grad_outs = [torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=generator) for out in outs]
    grads = torch.autograd.grad(outs, (q, k), grad_outs)
    boundary = (1 << 31) // head_dim
    for rows in (slice(0, 2), slice(boundary - 1, boundary + 2), slice(sequence - 2, sequence)):
        pieces = [t.detach()[:, :, rows].double().requires_grad_(True) for t in (q, k)]
        expected = reference(*pieces, cos[rows].double(), sin[rows].double())
        for out, want in zip(outs, expected):
            assert_close_to_reference(out[:, :, rows], want, torch.bfloat16, SCALE)
        expected_grads = torch.autograd.grad(expected, pieces, [g[:, :, rows].double() for g in grad_outs])
        for grad, want in zip(grads, expected_grads):
            assert_close_to_reference(grad[:, :, rows], want, torch.bfloat16, SCALE)
