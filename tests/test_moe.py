"""The experts' ops (moe_permute, moe_expert_mlp, moe_unpermute) on every dtype and device: the routed experts'
output and every gradient (hidden states, routing weights, weights, biases) against a per-token float64 loop,
for both weight layouts, each activation, pairs routed to no expert, experts with no pairs; what the
backward keeps; gradcheck, opcheck, compile, export, TorchScript and bad input."""
import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

import fused_ops
from conftest import TOLERANCE, assert_bad_input_rejected

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def make_inputs(tokens, hidden, intermediate, experts, top_k, dtype, device, bias=False, transposed=False,
                foreign=0.0, seed=0):
    """Hidden states, top-k indices (some pairs routed to no expert where `foreign` > 0: an id of -1 or
    `experts`, as expert parallelism marks experts of other ranks), routing weights, weights and biases."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=generator)
    index = torch.stack([torch.randperm(experts, generator=generator)[:top_k] for _ in range(tokens)]) \
        if tokens else torch.zeros(0, top_k, dtype=torch.long)
    if foreign:
        outside = torch.rand(tokens, top_k, generator=generator) < foreign
        index = torch.where(outside, torch.where(torch.rand(tokens, top_k, generator=generator) < 0.5, -1, experts),
                            index)
    weights = torch.rand(tokens, top_k, generator=generator)
    gate_up = torch.randn(experts, 2 * intermediate, hidden, generator=generator) / hidden ** 0.5
    down = torch.randn(experts, hidden, intermediate, generator=generator) / intermediate ** 0.5
    if transposed:
        gate_up, down = gate_up.transpose(1, 2).contiguous(), down.transpose(1, 2).contiguous()
    biases = (torch.randn(experts, 2 * intermediate, generator=generator),
              torch.randn(experts, hidden, generator=generator)) if bias else (None, None)
    cast = [t.to(device=device, dtype=dtype) if t is not None else None for t in (x, weights, gate_up, down, *biases)]
    return cast[0], index.to(device), cast[1], cast[2], cast[3], cast[4], cast[5]


def gated(product, activation, interleaved=False, alpha=1.702, limit=7.0):
    gate, up = (product[..., ::2], product[..., 1::2]) if interleaved else product.chunk(2, dim=-1)
    if activation == "swiglu_oai":  # gpt-oss's modeling code
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        return (up + 1) * gate * torch.sigmoid(gate * alpha)
    return ACTIVATIONS[activation](gate) * up


def reference(x, index, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed, interleaved=False,
              alpha=1.702, limit=7.0):
    """Token by token, expert by expert, in float64."""
    experts = gate_up.shape[0]
    rows = []
    for t in range(x.shape[0]):
        total = x[t] * 0
        for j in range(index.shape[1]):
            e = int(index[t, j])
            if not 0 <= e < experts:
                continue
            w_gate_up = gate_up[e].T if transposed else gate_up[e]
            w_down = down[e].T if transposed else down[e]
            product = w_gate_up @ x[t] + (gate_up_bias[e] if gate_up_bias is not None else 0)
            out = w_down @ gated(product, activation, interleaved, alpha, limit) + (
                down_bias[e] if down_bias is not None else 0)
            total = total + weights[t, j] * out
        rows.append(total)
    return torch.stack(rows) if rows else x.new_zeros(x.shape)


def check(inputs, activation="silu", transposed=False, dtype=torch.float32, recompute=True, **gate):
    """Output and gradients against the float64 loop; returns them (None without pairs)."""
    x, index, weights, gate_up, down, gate_up_bias, down_bias = inputs
    leaves = [t.requires_grad_(True) for t in (x, weights, gate_up, down, gate_up_bias, down_bias) if t is not None]
    out = fused_ops.moe_experts(x, index, weights, gate_up, down, gate_up_bias, down_bias, activation, transposed,
                                recompute=recompute, **gate)
    leaves64 = [t.detach().double().cpu().requires_grad_(True) for t in leaves]
    biases64 = leaves64[4:] + [None] * (6 - len(leaves64))
    want = reference(leaves64[0], index.cpu(), leaves64[1], leaves64[2], leaves64[3], biases64[0], biases64[1],
                     activation, transposed, **gate)
    assert out.shape == x.shape and out.dtype == x.dtype
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    tolerance = TOLERANCE[dtype] * 8
    torch.testing.assert_close(out.double().cpu(), want.detach(), rtol=tolerance, atol=tolerance * scale)
    if not want.numel():
        return None
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = torch.autograd.grad(out, leaves, grad.to(out.device, out.dtype))
    expected = [torch.zeros_like(leaf) if g is None else g
                for g, leaf in zip(torch.autograd.grad(want, leaves64, grad, allow_unused=True), leaves64)]
    for name, a, b in zip(("hidden", "routing weights", "gate_up", "down", "gate_up bias", "down bias"), got, expected):
        bound = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a.double().cpu(), b, rtol=tolerance, atol=tolerance * bound, msg=name)
    return (out.detach(), *got)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("transposed", [False, True], ids=["out_by_in", "transposed"])
def test_values_and_gradients(device, dtype, activation, transposed):
    inputs = make_inputs(9, 16, 8, 5, 2, dtype, device, transposed=transposed)
    check(inputs, activation, transposed, dtype)


@pytest.mark.parametrize("transposed", [False, True], ids=["out_by_in", "transposed"])
def test_biases_and_pairs_of_no_expert(device, transposed):
    """gpt-oss-style biases on both products; pairs routed to no expert (-1, or the expert count) add nothing;
    some experts get no pair at all (7 experts, 5 tokens of top-2)."""
    inputs = make_inputs(5, 16, 8, 7, 2, torch.float64, device, bias=True, transposed=transposed, foreign=0.3)
    check(inputs, "gelu_tanh", transposed, torch.float64)


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "interleaved"])
def test_gpt_oss_clamped_gate(device, dtype, interleaved):
    """gpt-oss's experts: transposed weights, biases, gate and up interleaved, the clamped SwiGLU with its alpha
    and limit; inputs large enough that both clamps act on some values."""
    inputs = list(make_inputs(9, 16, 8, 5, 2, dtype, device, bias=True, transposed=True))
    inputs[0] = inputs[0] * 4
    check(inputs, "swiglu_oai", True, dtype, interleaved=interleaved, alpha=1.702, limit=3.0)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_interleaved_gate_and_up(device, activation):
    inputs = make_inputs(7, 16, 8, 4, 2, torch.float64, device)
    check(inputs, activation, False, torch.float64, interleaved=True)


@pytest.mark.parametrize("case", ["silu", "gelu_transposed_biases", "clamped_interleaved"])
def test_kept_gate_up_product_gives_the_recomputed_results(device, dtype, case):
    """recompute=False: the backward takes the forward's gate/up product instead of recomputing it; output and
    every gradient are those of the float64 loop and bit for bit those of the recomputing backward (the same
    products, pairs of no expert and experts without pairs included)."""
    activation, transposed, bias, gate = {
        "silu": ("silu", False, False, {}),
        "gelu_transposed_biases": ("gelu", True, True, {}),
        "clamped_interleaved": ("swiglu_oai", True, True, dict(interleaved=True, alpha=1.702, limit=3.0)),
    }[case]
    results = []
    for recompute in (True, False):
        inputs = list(make_inputs(9, 16, 8, 7, 2, dtype, device, bias=bias, transposed=transposed, foreign=0.2))
        inputs[0] = inputs[0] * 4
        results.append(check(inputs, activation, transposed, dtype, recompute=recompute, **gate))
    for recomputed, kept in zip(*results):
        assert torch.equal(recomputed, kept)


@pytest.mark.parametrize("recompute", [True, False])
def test_every_pair_routed_elsewhere_and_no_tokens(device, recompute):
    inputs = make_inputs(4, 8, 4, 3, 2, torch.float64, device, foreign=1.0)
    assert not ((inputs[1] >= 0) & (inputs[1] < 3)).any()
    check(inputs, dtype=torch.float64, recompute=recompute)
    check(make_inputs(0, 8, 4, 3, 2, torch.float64, device), dtype=torch.float64, recompute=recompute)


def test_output_and_hidden_gradient_are_deterministic(device):
    """Each token's rows are summed in a fixed order, forward and backward: repeated runs agree bit for bit."""
    x, index, weights, gate_up, down, _, _ = make_inputs(64, 32, 16, 8, 4, torch.float32, device)
    x.requires_grad_(True)
    grad = torch.randn(64, 32, generator=torch.Generator().manual_seed(9)).to(device)
    runs = []
    for _ in range(3):
        out = fused_ops.moe_experts(x, index, weights, gate_up, down)
        runs.append((out.detach(), torch.autograd.grad(out, x, grad)[0]))
    for out, grad_x in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(grad_x, runs[0][1])


def test_permute_is_a_stable_sort_by_expert(device):
    index = torch.tensor([[2, 0], [1, 2], [4, -1], [0, 2]], device=device)
    order, offsets = fused_ops.moe_permute(index, 4)
    assert order.dtype == torch.int64 and offsets.dtype == torch.int32
    # Pairs 0..7 go to experts 2, 0, 1, 2, none, none, 0, 2.
    assert order.tolist() == [1, 6, 2, 0, 3, 7, 4, 5] and offsets.tolist() == [2, 3, 6, 6]
    order32, offsets32 = fused_ops.moe_permute(index.int(), 4)
    assert torch.equal(order32, order) and torch.equal(offsets32, offsets)


def test_unpermute_weighted_sum_and_gradients(device, dtype):
    """The weighted un-permute alone: each token's rows by its weights, and the gradients of both."""
    generator = torch.Generator().manual_seed(5)
    index = torch.randint(-1, 4, (6, 3), generator=generator).to(device)
    order, offsets = fused_ops.moe_permute(index, 4)
    rows = torch.randn(18, 16, generator=generator).to(device, dtype).requires_grad_(True)
    weights = torch.rand(6, 3, generator=generator).to(device, dtype).requires_grad_(True)
    out = fused_ops.moe_unpermute(rows, order, offsets, 3, weights)
    rows64, weights64 = rows.detach().double().requires_grad_(True), weights.detach().double().requires_grad_(True)
    position = torch.empty_like(order)
    position[order] = torch.arange(18, device=device)
    valid = (index >= 0).reshape(-1, 1).double()
    want = (rows64[position] * valid * weights64.reshape(-1, 1)).reshape(6, 3, 16).sum(1)
    tolerance = TOLERANCE[dtype] * 4
    torch.testing.assert_close(out.double(), want, rtol=tolerance, atol=tolerance * 4)
    grad = torch.randn(6, 16, generator=generator, dtype=torch.float64).to(device)
    for a, b in zip(torch.autograd.grad(out, (rows, weights), grad.to(dtype)),
                    torch.autograd.grad(want, (rows64, weights64), grad)):
        torch.testing.assert_close(a.double(), b, rtol=tolerance, atol=tolerance * 8)


def saved_bytes(function):
    """The bytes of the tensors autograd saves while `function` runs, by shape."""
    saved = []

    def pack(tensor):
        saved.append((tuple(tensor.shape), tensor.numel() * tensor.element_size()))
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function()
    return saved


def test_backward_keeps_the_inputs_not_the_pairs_activations():
    """What moe_experts keeps for the backward: its inputs and the routing, no [pairs, ...] activation; what
    transformers' grouped products keep is many times that."""
    tokens, hidden, intermediate, experts, top_k = 64, 32, 16, 8, 4
    x, index, weights, gate_up, down, _, _ = make_inputs(tokens, hidden, intermediate, experts, top_k, torch.float32,
                                                         "cpu")
    for t in (x, weights, gate_up, down):
        t.requires_grad_(True)
    saved = saved_bytes(lambda: fused_ops.moe_experts(x, index, weights, gate_up, down))
    activations = [shape for shape, _ in saved if len(shape) == 2 and shape[0] == tokens * top_k]
    assert not activations, saved
    inputs = {tuple(t.shape) for t in (x, weights, gate_up, down)}
    assert {shape for shape, _ in saved if len(shape) > 1} <= inputs, saved


def test_kept_gate_up_product_is_all_the_backward_keeps_beyond_the_inputs():
    """recompute=False keeps one [pairs, 2I] tensor, the gate/up product, and nothing else of the pairs'."""
    tokens, hidden, intermediate, experts, top_k = 64, 32, 16, 8, 4
    x, index, weights, gate_up, down, _, _ = make_inputs(tokens, hidden, intermediate, experts, top_k, torch.float32,
                                                         "cpu")
    for t in (x, weights, gate_up, down):
        t.requires_grad_(True)
    saved = saved_bytes(lambda: fused_ops.moe_experts(x, index, weights, gate_up, down, recompute=False))
    pairs = [shape for shape, _ in saved if len(shape) == 2 and shape[0] == tokens * top_k]
    assert pairs == [(tokens * top_k, 2 * intermediate)], saved
    with torch.no_grad():  # nothing to keep without a graph
        assert not saved_bytes(lambda: fused_ops.moe_experts(x, index, weights, gate_up, down, recompute=False))


def test_gradcheck(device):
    x, index, weights, gate_up, down, gate_up_bias, down_bias = make_inputs(4, 6, 3, 3, 2, torch.float64, device,
                                                                            bias=True, foreign=0.2)
    order, offsets = fused_ops.moe_permute(index, 3)
    leaves = [t.requires_grad_(True) for t in (x, weights, gate_up, down, gate_up_bias, down_bias)]

    for recompute in (True, False):
        def experts(x, weights, gate_up, down, gate_up_bias, down_bias):
            rows = torch.ops.fused.moe_expert_mlp(x, order, offsets, weights, gate_up, down, gate_up_bias, down_bias,
                                                  "swiglu_oai", False, True, 1.702, 1.0, recompute)
            return torch.ops.fused.moe_unpermute(rows, order, offsets, 2, weights)
        assert torch.autograd.gradcheck(experts, leaves)


def test_backward_ops_are_not_differentiable(device):
    x, index, weights, gate_up, down, _, _ = make_inputs(4, 8, 4, 3, 2, torch.float64, device)
    order, offsets = fused_ops.moe_permute(index, 3)
    grad = torch.randn(8, 8, dtype=torch.float64, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="moe_expert_mlp_backward: not differentiable"):
        torch.ops.fused.moe_expert_mlp_backward(grad, x, order, offsets, weights, gate_up, down, None, None, "silu",
                                                False, False, 1.702, 7.0, [True] * 6)
    with pytest.raises(RuntimeError, match="moe_expert_mlp_keeping_gate_up: not differentiable"):
        torch.ops.fused.moe_expert_mlp_keeping_gate_up(x.requires_grad_(True), order, offsets, weights, gate_up, down,
                                                       None, None, "silu", False, False, 1.702, 7.0)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_opcheck(device, requires_grad, bias):
    x, index, weights, gate_up, down, gate_up_bias, down_bias = make_inputs(5, 8, 4, 3, 2, torch.float32, device,
                                                                            bias=bias, foreign=0.2)
    opcheck(torch.ops.fused.moe_permute.default, (index, 3))
    order, offsets = fused_ops.moe_permute(index, 3)
    for t in (x, weights, gate_up, down, gate_up_bias, down_bias):
        if t is not None:
            t.requires_grad_(requires_grad)
    opcheck(torch.ops.fused.moe_expert_mlp.default,
            (x, order, offsets, weights, gate_up, down, gate_up_bias, down_bias, "silu", False))
    opcheck(torch.ops.fused.moe_expert_mlp.default,
            (x, order, offsets, weights, gate_up, down, gate_up_bias, down_bias, "swiglu_oai", False, True, 1.702, 7.0))
    opcheck(torch.ops.fused.moe_expert_mlp.default,
            (x, order, offsets, weights, gate_up, down, gate_up_bias, down_bias, "silu", False, False, 1.702, 7.0,
             False))
    detached = [None if t is None else t.detach() for t in (x, weights, gate_up, down, gate_up_bias, down_bias)]
    opcheck(torch.ops.fused.moe_expert_mlp_keeping_gate_up.default,
            (detached[0], order, offsets, *detached[1:], "gelu", False, False, 1.702, 7.0))
    rows = torch.randn(10, 8, device=device, requires_grad=requires_grad)
    opcheck(torch.ops.fused.moe_unpermute.default, (rows, order, offsets, 2, weights))
    opcheck(torch.ops.fused.moe_unpermute.default, (rows, order, offsets, 2, None))
    grad = torch.randn(10, 8, device=device)
    opcheck(torch.ops.fused.moe_expert_mlp_backward.default,
            (grad, x.detach(), order, offsets, weights.detach(), gate_up.detach(), down.detach(),
             None if gate_up_bias is None else gate_up_bias.detach(), None if down_bias is None else down_bias.detach(),
             "silu", False, False, 1.702, 7.0, [True] * 6))
    _, kept = torch.ops.fused.moe_expert_mlp_keeping_gate_up(detached[0], order, offsets, *detached[1:], "silu",
                                                             False, False, 1.702, 7.0)
    opcheck(torch.ops.fused.moe_expert_mlp_backward.default,
            (grad, detached[0], order, offsets, *detached[1:], "silu", False, False, 1.702, 7.0,
             [True, True, False, True, bias, False], kept))
    opcheck(torch.ops.fused.moe_unpermute_backward.default,
            (torch.randn(5, 8, device=device), rows.detach(), order, offsets, 2, weights.detach(), [True, True]))
    opcheck(torch.ops.fused.moe_unpermute_backward.default,
            (torch.randn(5, 8, device=device), None, order, offsets, 2, None, [True, False]))


class Experts(torch.nn.Module):
    def __init__(self, recompute=True):
        super().__init__()
        self.recompute = recompute

    def forward(self, x, index, weights, gate_up, down):
        order, offsets = torch.ops.fused.moe_permute(index, gate_up.shape[0])
        rows = torch.ops.fused.moe_expert_mlp(x, order, offsets, weights, gate_up, down, None, None, "silu", False,
                                              False, 1.702, 7.0, self.recompute)
        return torch.ops.fused.moe_unpermute(rows, order, offsets, index.shape[1], None)


@pytest.mark.parametrize("recompute", [True, False])
def test_compile_fullgraph_dynamic_forward_and_backward(device, recompute):
    compiled = torch.compile(Experts(recompute), fullgraph=True, dynamic=True)
    for tokens in (5, 9):
        x, index, weights, gate_up, down, _, _ = make_inputs(tokens, 8, 4, 3, 2, torch.float32, device)
        leaves = [t.requires_grad_(True) for t in (x, weights, gate_up, down)]
        got_out = compiled(x, index, weights, gate_up, down)
        want_out = Experts(recompute)(x, index, weights, gate_up, down)
        torch.testing.assert_close(got_out, want_out)
        got = torch.autograd.grad(got_out.square().sum(), leaves)
        want = torch.autograd.grad(want_out.square().sum(), leaves)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)


def test_compiled_graphs_pass_the_kept_gate_up_product_to_the_backward():
    """Under torch.compile, recompute=False puts moe_expert_mlp_keeping_gate_up in the forward graph and its
    gate/up product into the backward op; the default keeps moe_expert_mlp and passes none."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs
    for recompute, forward_op in ((True, torch.ops.fused.moe_expert_mlp.default),
                                  (False, torch.ops.fused.moe_expert_mlp_keeping_gate_up.default)):
        backend = AotEagerAndRecordGraphs()
        x, index, weights, gate_up, down, _, _ = make_inputs(5, 8, 4, 3, 2, torch.float32, "cpu")
        leaves = [t.requires_grad_(True) for t in (x, weights, gate_up, down)]
        torch.compile(Experts(recompute), backend=backend, fullgraph=True)(*leaves[:1], index, *leaves[1:]).sum() \
            .backward()
        forward_targets = [n.target for g in backend.fw_graphs for n in g.graph.nodes if n.op == "call_function"]
        backward = [n for g in backend.bw_graphs for n in g.graph.nodes
                    if n.target is torch.ops.fused.moe_expert_mlp_backward.default]
        assert forward_targets.count(forward_op) == 1 and len(backward) == 1, forward_targets
        kept = backward[0].args[15] if len(backward[0].args) > 15 else backward[0].kwargs.get("gate_up")
        assert (kept is None) == recompute, backward[0].args


@pytest.mark.parametrize("recompute", [True, False])
def test_export_keeps_the_three_ops(device, recompute):
    inputs = make_inputs(6, 8, 4, 3, 2, torch.float32, device)[:5]
    exported = torch.export.export(Experts(recompute), inputs)
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    for op in (torch.ops.fused.moe_permute.default, torch.ops.fused.moe_expert_mlp.default,
               torch.ops.fused.moe_unpermute.default):
        assert targets.count(op) == 1, targets
    torch.testing.assert_close(exported.module()(*inputs), Experts()(*inputs))


def test_torchscript_save_load_with_backward(device, tmp_path):
    torch.jit.script(Experts()).save(str(tmp_path / "experts.pt"))
    loaded = torch.jit.load(str(tmp_path / "experts.pt"))
    x, index, weights, gate_up, down, _, _ = make_inputs(6, 8, 4, 3, 2, torch.float32, device)
    x.requires_grad_(True)
    got, want = loaded(x, index, weights, gate_up, down), Experts()(x, index, weights, gate_up, down)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0])


def test_torch_func_is_a_clear_error(device):
    x, index, weights, gate_up, down, _, _ = make_inputs(4, 8, 4, 3, 2, torch.float32, device)
    with pytest.raises(RuntimeError, match="moe_expert_mlp: torch.func transforms"):
        torch.func.grad(lambda x: fused_ops.moe_experts(x, index, weights, gate_up, down).sum())(x)


def bad_moe_inputs(device):
    """(call, message) of each bad input of the experts' ops (docs/reliability.md lists the same)."""
    x, index, weights, gate_up, down, _, _ = make_inputs(4, 8, 4, 3, 2, torch.float32, device)
    order, offsets = fused_ops.moe_permute(index, 3)
    mlp = torch.ops.fused.moe_expert_mlp
    return [
        (lambda: fused_ops.moe_permute(index.float(), 3),
         "fused::moe_permute: expected top_k_index to be int64 or int32 (each token's experts), but got Float"),
        (lambda: fused_ops.moe_permute(index, 0), "fused::moe_permute: expected num_experts >= 1, but got 0"),
        (lambda: mlp(x, order, offsets.long(), weights, gate_up, down, None, None, "silu", False),
         "fused::moe_expert_mlp: expected offsets to be Int (as moe_permute returns it), but got Long"),
        (lambda: mlp(x, order[:-1], offsets, weights, gate_up, down, None, None, "silu", False),
         "fused::moe_expert_mlp: expected order of size tokens * top_k = 8, but got 7"),
        (lambda: mlp(x, order, offsets, weights, gate_up.double(), down, None, None, "silu", False),
         "fused::moe_expert_mlp: expected gate_up_weight to have the same dtype as hidden_states (Float), but got "
         "Double"),
        (lambda: mlp(x, order, offsets, weights, gate_up, down.transpose(1, 2), None, None, "silu", False),
         "fused::moe_expert_mlp: expected down_weight of shape [experts, 8, 4], but got shape [3, 4, 8]"),
        (lambda: mlp(x, order, offsets, weights, gate_up, down, None, None, "relu", False),
         "fused::moe_expert_mlp: expected activation 'silu', 'gelu', 'gelu_tanh' or 'swiglu_oai', but got 'relu'"),
        (lambda: mlp(x, order, offsets, weights, gate_up, down, None, None, "swiglu_oai", False, False, 1.7, 0.0),
         "fused::moe_expert_mlp: expected a finite alpha and a finite limit > 0 for 'swiglu_oai', but got alpha 1.7, "
         "limit 0"),
        (lambda: mlp(x, order, offsets, weights, gate_up, down, torch.zeros(3, 5, device=device), None, "silu", False),
         "fused::moe_expert_mlp: expected gate_up_bias of shape [experts = 3, 8], but got shape [3, 5]"),
        (lambda: fused_ops.moe_unpermute(torch.zeros(8, 8, device=device), order, offsets, 3),
         "fused::moe_unpermute: expected top_k >= 1 dividing the pairs (8), but got 3"),
        (lambda: torch.ops.fused.moe_expert_mlp_backward(torch.zeros(8, 8, device=device), x, order, offsets, weights,
                                                         gate_up, down, None, None, "silu", False, False, 1.702, 7.0,
                                                         [True] * 6, torch.zeros(8, 4, device=device)),
         "fused::moe_expert_mlp_backward: expected gate_up (the forward's gate/up product) of shape "
         "[order.size(0) = 8, 2 * intermediate = 8], but got shape [8, 4]"),
    ]


@pytest.mark.parametrize("case", range(11))
def test_bad_inputs(device, case):
    assert_bad_input_rejected(bad_moe_inputs(device), case)


def test_bad_input_keeping_the_product_names_the_op_called(device):
    """recompute=False with gradients runs moe_expert_mlp_keeping_gate_up inside the node: an error still names
    moe_expert_mlp."""
    x, index, weights, gate_up, down, _, _ = make_inputs(4, 8, 4, 3, 2, torch.float32, device)
    order, offsets = fused_ops.moe_permute(index, 3)
    x.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"^fused::moe_expert_mlp: expected order of size tokens \* top_k = 8"):
        fused_ops.moe_expert_mlp(x, order[:-1], offsets, weights, gate_up, down, recompute=False)
