"""The workloads scripts/bench.py times: each op's shapes, inputs, fused call, the eager code it
replaces, the elements it must move, and the peer library's call where one is importable."""
from dataclasses import dataclass, field
import itertools
import os
import sys
from typing import Callable, Optional, Sequence

import torch

import fused_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from op_specs import ACTIVATION_CASES, NORM_CASES, OPS_BY_NAME, rotary_reference  # noqa: E402


@dataclass
class Workload:
    op: str  # the row's label
    dtype: torch.dtype
    shape: Sequence[int]
    numel: int  # elements of the output (of q and k together for rotary_embedding)
    make_inputs: Callable[[], list]
    fused: Callable
    composite: Callable  # the eager code it replaces; torch.compile compiles this
    forward_elements: float  # the least elements the forward must move (in the first input's dtype)
    training_elements: float  # forward + backward
    peers: dict = field(default_factory=dict)  # name -> the same call in a peer library (liger)
    differentiable: Optional[Sequence[int]] = None  # inputs that take gradients (default: all)
    # inputs -> {name: error} of the fused op against float64, recorded with the row
    errors: Optional[Callable[[list], dict]] = None

    def takes_grad(self, index):
        return self.differentiable is None or index in self.differentiable


# Rows of 8192 (a transformer hidden size) once a tensor is that large, e.g. 2^27 = 16384 x 8192.
ROW = 8192


def shape_for(numel):
    return (numel // ROW, ROW) if numel >= ROW else (numel,)


RELU_ADD = OPS_BY_NAME["relu_add"]


def relu_add_composite(x, y):
    return (RELU_ADD.composite or RELU_ADD.reference)(x, y, bias=0.5)


def relu_add_fused(x, y):
    return RELU_ADD.fused(x, y, bias=0.5)


# Activation variants timed by default (the rest can be named with --ops).
DEFAULT_ACTIVATIONS = ["bias_gelu_tanh", "bias_gelu_none", "silu_mul", "gelu_mul_tanh"]
NORMS = ["rms_norm", "add_rms_norm", "add_layer_norm", "layer_norm"]
DEFAULT_OPS = ["relu_add", *DEFAULT_ACTIVATIONS, "gated_mul", *NORMS, "rotary_embedding", "linear_cross_entropy"]
# (rows, H): decode, 16384 x 8192, H of 4096 and 16384, the long-row kernels, and the per-head norm of
# queries (Qwen3, OLMo 2, Gemma 3: 16 heads of 128 over 8 x 2048 tokens).
NORM_SHAPES_CUDA = [(1, 8192), (16, 8192), (16384, 8192), (4096, 4096), (4096, 16384), (1024, 65536), (262144, 128)]
NORM_SHAPES_CPU = [(1, 1024), (16, 1024), (256, 1024)]
# --headline: the headline shapes (docs/ops.md's performance table), few enough to time before and after a change in one run.
HEADLINE_RELU_ADD = [(torch.float32, 1 << 28), (torch.bfloat16, 1 << 27), (torch.float32, 1 << 12)]
HEADLINE_ACTIVATION_ROWS = (16, 16384)
HEADLINE_NORM_SHAPES = [(16, 8192), (16384, 8192)]


def workloads(device, dtypes, sizes, ops, headline=False, norm_shapes=None):
    if "relu_add" in ops:
        relu_add_cases = HEADLINE_RELU_ADD if headline else [(dtype, numel) for dtype in dtypes for numel in sizes]
        for dtype, numel in relu_add_cases:
            shape = shape_for(numel)
            # forward: x, y in, out out. Backward: grad in, grad_x out (grad_y is grad), and the bit
            # mask that the forward writes and the backward reads, 1/8 byte per element each way.
            mask_elements = numel / 4 / dtype.itemsize
            yield Workload("relu_add", dtype, shape, numel, lambda shape=shape, dtype=dtype: [
                torch.randn(shape, device=device, dtype=dtype) for _ in range(2)],
                relu_add_fused, relu_add_composite, 3 * numel, 5 * numel + mask_elements)
    hidden = 8192 if device == "cuda" else 1024
    row_counts = (1, 16, 16384) if device == "cuda" else (1, 16, 256)
    for op, case in ACTIVATION_CASES.items():
        if op not in ops and op.rsplit("_", 1)[0] not in ops:
            continue
        fused, composite, gated = case.fused, case.composite, case.gated
        # float16 joins on CUDA: its bandwidth is compared with bfloat16's.
        activation_dtypes = dtypes + ([torch.float16] if device == "cuda" and torch.float16 not in dtypes else [])
        if headline:
            activation_dtypes, row_counts = [torch.bfloat16], HEADLINE_ACTIVATION_ROWS
        for dtype in activation_dtypes:
            for rows in row_counts if dtype == torch.bfloat16 else row_counts[-1:]:
                numel = rows * hidden
                if gated:  # x [rows, 2 * hidden] -> [rows, hidden]
                    make = lambda rows=rows, dtype=dtype: [torch.randn(rows, 2 * hidden, device=device, dtype=dtype)]
                    elements = (3 * numel, 8 * numel)
                else:  # x [rows, hidden], bias [hidden]
                    make = lambda rows=rows, dtype=dtype: [torch.randn(rows, hidden, device=device, dtype=dtype),
                                                           torch.randn(hidden, device=device, dtype=dtype)]
                    elements = (2 * numel + hidden, 5 * numel + 4 * hidden)
                yield Workload(op, dtype, (rows, hidden), numel, make, fused, composite, *elements)
    if "gated_mul" in ops:
        yield from gated_mul_workloads(device, hidden, row_counts[-1:] if headline else row_counts)
    # The norms' targets are for bfloat16; float16 joins when asked for.
    norm_dtypes = [torch.bfloat16] + ([torch.float16] if torch.float16 in dtypes else [])
    if headline:
        norm_dtypes = [torch.bfloat16]
    if norm_shapes is None:
        norm_shapes = HEADLINE_NORM_SHAPES if headline else NORM_SHAPES_CUDA if device == "cuda" else NORM_SHAPES_CPU
    for op in NORMS:
        if op not in ops and "norms" not in ops:
            continue
        case = NORM_CASES[op]
        fused, composite, residual, bias = case.fused, case.composite, case.residual, case.bias
        for dtype, (rows, hidden) in itertools.product(norm_dtypes, norm_shapes):
            numel = rows * hidden
            def make(rows=rows, hidden=hidden, residual=residual, bias=bias, dtype=dtype):
                tensors = [torch.randn(rows, hidden, device=device, dtype=dtype) for _ in range(1 + residual)]
                return tensors + [torch.randn(hidden, device=device, dtype=dtype) for _ in range(1 + bias)]
            rows_in = 1 + residual
            parameters = 1 + bias
            # forward: x (+ residual) and parameters in, out (+ h) out; backward: the gradient of out
            # (+ of h), h and weight in, one gradient of h (shared by x and residual) and the
            # parameters' gradients out.
            forward = (2 * rows_in) * numel + parameters * hidden
            backward = (3 + residual) * numel + (1 + parameters) * hidden
            yield Workload(op, dtype, (rows, hidden), numel, make, fused, composite, forward, forward + backward)
    if "rotary_embedding" in ops:
        yield from rotary_workloads(device, headline)
    if "linear_cross_entropy" in ops:
        yield from linear_cross_entropy_workloads(device)



def silu_gated(gate, up):
    return torch.nn.functional.silu(gate) * up


def gated_mul_workloads(device, hidden, row_counts):
    """gated_mul (silu) in bfloat16 on gate and up as two tensors ("separate") and as the halves of one
    [rows, 2 * hidden] tensor ("halves"), beside silu_mul's rows: the same elements move."""
    dtype = torch.bfloat16
    for rows in row_counts:
        numel = rows * hidden
        yield Workload("gated_mul_separate", dtype, (rows, hidden), numel,
                       lambda rows=rows: [torch.randn(rows, hidden, device=device, dtype=dtype) for _ in range(2)],
                       fused_ops.gated_mul, silu_gated, 3 * numel, 8 * numel)
        yield Workload("gated_mul_halves", dtype, (rows, hidden), numel,
                       lambda rows=rows: [torch.randn(rows, 2 * hidden, device=device, dtype=dtype)],
                       lambda x: fused_ops.gated_mul(*x.chunk(2, -1)), lambda x: silu_gated(*x.chunk(2, -1)),
                       3 * numel, 8 * numel)


# (B, Hq, Hk, S, D, R): Llama-3-8B, its decode step, and a partial rotation (R < D) as in Phi/NeoX.
ROTARY_SHAPES = [(2, 32, 8, 4096, 128, 128), (1, 32, 8, 1, 128, 128), (2, 32, 32, 4096, 80, 40)]


def hugging_face_rotary(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb (unsqueeze_dim=1), with the partial-rotation split of the
    models that rotate fewer dims than the head has."""
    if cos.shape[-1] < q.shape[-1]:
        return rotary_reference(q, k, cos, sin)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def liger_rope():
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError:
        return None
    return lambda q, k, cos, sin: LigerRopeFunction.apply(q, k, cos, sin)


def rotary_workloads(device, headline):
    """q and k as a Hugging Face attention layer passes them: [B, H, S, D] views of the projections'
    [B, S, H, D] outputs; cos and sin [B, S, R] of the model's dtype, as its rotary module returns them."""
    if device != "cuda":
        return
    liger = liger_rope()
    dtype = torch.bfloat16
    for batch, q_heads, k_heads, sequence, head_dim, rotary_dim in ROTARY_SHAPES:
        def make(batch=batch, q_heads=q_heads, k_heads=k_heads, sequence=sequence, head_dim=head_dim,
                 rotary_dim=rotary_dim):
            q = torch.randn(batch, sequence, q_heads, head_dim, device=device, dtype=dtype).transpose(1, 2)
            k = torch.randn(batch, sequence, k_heads, head_dim, device=device, dtype=dtype).transpose(1, 2)
            inverse = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2, device=device).float() / rotary_dim))
            angles = torch.arange(sequence, device=device).float()[:, None] * inverse
            angles = torch.cat([angles, angles], -1).expand(batch, sequence, rotary_dim)
            return [q, k, angles.cos().to(dtype).contiguous(), angles.sin().to(dtype).contiguous()]
        heads_elements = batch * sequence * (q_heads + k_heads) * head_dim
        table_elements = 2 * batch * sequence * rotary_dim
        forward = 2 * heads_elements + table_elements
        peers = {"liger": liger} if liger is not None and rotary_dim == head_dim else {}
        yield Workload("rotary_embedding", dtype, (batch, q_heads, k_heads, sequence, head_dim, rotary_dim),
                       heads_elements, make, fused_ops.rotary_embedding, hugging_face_rotary, forward, 2 * forward,
                       peers, differentiable=(0, 1))


# (N, H, V, dtype): a Llama-3 vocabulary, a Llama-2 one, Qwen's in float32.
LINEAR_CROSS_ENTROPY_SHAPES = [(16384, 4096, 128256, torch.bfloat16), (8192, 2048, 32000, torch.bfloat16),
                               (4096, 4096, 151936, torch.float32)]


def liger_linear_cross_entropy():
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction
    except ImportError:
        return None
    return lambda x, weight, target: LigerFusedLinearCrossEntropyFunction.apply(x, weight, target)[0]


def stock_linear_cross_entropy(x, weight, target):
    """The LM head and loss as Hugging Face's causal-LM loss computes them: logits upcast to float32."""
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, weight).float(), target)


def linear_cross_entropy_errors(inputs):
    """The fused loss's and gradients' largest errors against float64 (relative to the largest value)."""
    x, weight, target = inputs
    leaves = [t.detach().requires_grad_(True) for t in (x, weight)]
    loss = fused_ops.linear_cross_entropy(leaves[0], leaves[1], target)
    grads = torch.autograd.grad(loss, leaves)
    leaves64 = [t.detach().double().requires_grad_(True) for t in (x, weight)]
    want = torch.nn.functional.cross_entropy(torch.nn.functional.linear(*leaves64), target)
    want_grads = torch.autograd.grad(want, leaves64)
    errors = {"loss_abs": abs(loss.item() - want.item())}
    for name, grad, expected in zip(("grad_input", "grad_weight"), grads, want_grads):
        errors[f"{name}_rel"] = ((grad.double() - expected).abs().max() / expected.abs().max()).item()
    del want_grads, leaves64
    torch.cuda.empty_cache()
    return errors


def linear_cross_entropy_workloads(device):
    if device != "cuda":
        return
    liger = liger_linear_cross_entropy()
    for rows, hidden, classes, dtype in LINEAR_CROSS_ENTROPY_SHAPES:
        def make(rows=rows, hidden=hidden, classes=classes, dtype=dtype):
            x = torch.randn(rows, hidden, device=device, dtype=dtype)
            weight = (torch.randn(classes, hidden, device=device) / hidden ** 0.5).to(dtype)
            target = torch.randint(0, classes, (rows,), device=device)
            target[::16] = -100
            return [x, weight, target]
        # Elements a fused pass must move: input and weight read, the loss written (forward); again,
        # and both gradients written (backward). The products' time, not these bytes, bounds it.
        forward = rows * hidden + classes * hidden
        yield Workload("linear_cross_entropy", dtype, (rows, hidden, classes), rows * classes, make,
                       fused_ops.linear_cross_entropy, stock_linear_cross_entropy, forward, 2 * forward,
                       {"liger": liger} if liger is not None else {}, differentiable=(0, 1),
                       errors=linear_cross_entropy_errors)
