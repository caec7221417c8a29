"""Every op of the registry, described once for the reliability tests (property tests, threads,
CUDA graphs and streams, huge tensors). A new op slots in with one OpSpec line in OPS."""
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


def gated(activation):
    def composite(x):
        gate, up = x.chunk(2, dim=-1)
        return activation(gate) * up
    return composite


@dataclass
class OpSpec:
    name: str
    fused: Callable  # (*tensors, **options) -> Tensor
    reference: Callable  # the eager composite it replaces, same signature
    input_shapes: Callable[[Sequence[int]], list]  # output shape -> shape of each input
    # option name -> the values it may take: a list of choices, or a (low, high) float range
    options: dict = field(default_factory=dict)
    min_dims: int = 0  # least number of dims of the output
    broadcasts: Sequence[int] = ()  # inputs that may broadcast to the first input's shape
    # float64 inputs and options -> how much looser than the dtype's tolerance the absolute error
    # of gradients may be (ill-conditioned math, e.g. a norm of a row with a tiny RMS)
    gradient_scale: Callable = lambda inputs, **options: 1.0

    def call(self, inputs, **options):
        return self.fused(*inputs, **options)


def as_outputs(result):
    """An op's result as a tuple of tensors (norms with a residual return two)."""
    return result if isinstance(result, tuple) else (result,)


def relu_add_shapes(shape):
    return [list(shape), list(shape)]


def bias_shapes(shape):
    return [list(shape), [shape[-1]]]


def gated_shapes(shape):
    return [list(shape[:-1]) + [2 * shape[-1]]]


def norm_shapes(residual, bias):
    def shapes(shape):
        return [list(shape)] * (2 if residual else 1) + [[shape[-1]]] * (2 if bias else 1)
    return shapes


def rms_norm_reference(h, weight, eps=1e-6):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight


def layer_norm_reference(h, weight, bias=None, eps=1e-5):
    return F.layer_norm(h, h.shape[-1:], weight, bias, eps)


def largest_rstd(inputs, eps=1e-6, residual=False, centered=False):
    """1 / the smallest RMS (or standard deviation) of a row of h: the conditioning of a norm's gradient."""
    h = inputs[0] + inputs[1] if residual else inputs[0]
    if h.numel() == 0:
        return 1.0
    h = h.detach() - (h.detach().mean(-1, keepdim=True) if centered else 0)
    return max(1.0, torch.rsqrt(h.pow(2).mean(-1) + eps).max().item())


EPS_RANGE = (1e-6, 1e-2)

OPS = [
    OpSpec("relu_add", lambda x, y, bias=0.0: torch.ops.fused.relu_add(x, y, bias),
           lambda x, y, bias=0.0: torch.relu(x) + y + bias, relu_add_shapes,
           {"bias": (-4.0, 4.0)}, broadcasts=(1,)),
    OpSpec("bias_gelu", lambda x, b, approximate="none": torch.ops.fused.bias_gelu(x, b, approximate),
           lambda x, b, approximate="none": F.gelu(x + b, approximate=approximate), bias_shapes,
           {"approximate": ["none", "tanh"]}, min_dims=1),
    OpSpec("silu_mul", lambda x: torch.ops.fused.silu_mul(x), gated(F.silu), gated_shapes, min_dims=1),
    OpSpec("gelu_mul", lambda x, approximate="none": torch.ops.fused.gelu_mul(x, approximate),
           lambda x, approximate="none": gated(lambda t: F.gelu(t, approximate=approximate))(x), gated_shapes,
           {"approximate": ["none", "tanh"]}, min_dims=1),
    OpSpec("rms_norm", lambda x, w, eps=1e-6: torch.ops.fused.rms_norm(x, w, eps), rms_norm_reference,
           norm_shapes(False, False), {"eps": EPS_RANGE}, min_dims=1,
           gradient_scale=lambda inputs, eps=1e-6: largest_rstd(inputs, eps)),
    OpSpec("add_rms_norm", lambda x, r, w, eps=1e-6: torch.ops.fused.add_rms_norm(x, r, w, eps),
           lambda x, r, w, eps=1e-6: (rms_norm_reference(x + r, w, eps), x + r), norm_shapes(True, False),
           {"eps": EPS_RANGE}, min_dims=1,
           gradient_scale=lambda inputs, eps=1e-6: largest_rstd(inputs, eps, residual=True)),
    OpSpec("layer_norm", lambda x, w, b, eps=1e-5: torch.ops.fused.layer_norm(x, w, b, eps), layer_norm_reference,
           norm_shapes(False, True), {"eps": EPS_RANGE}, min_dims=1,
           gradient_scale=lambda inputs, eps=1e-5: largest_rstd(inputs, eps, centered=True)),
    OpSpec("add_layer_norm", lambda x, r, w, b, eps=1e-5: torch.ops.fused.add_layer_norm(x, r, w, b, eps),
           lambda x, r, w, b, eps=1e-5: (layer_norm_reference(x + r, w, b, eps), x + r), norm_shapes(True, True),
           {"eps": EPS_RANGE}, min_dims=1,
           gradient_scale=lambda inputs, eps=1e-5: largest_rstd(inputs, eps, residual=True, centered=True)),
]
OPS_BY_NAME = {spec.name: spec for spec in OPS}


def strided(shape, dtype, device, layout, generator=None):
    """A random tensor of `shape` laid out as `layout`: contiguous, offset (data pointer not
    16-byte aligned), stepped (every other element of the last dim) or transposed (last two dims)."""
    def random(size):
        return torch.randn(size, generator=generator).to(dtype=dtype, device=device)

    shape = list(shape)
    numel = 1
    for size in shape:
        numel *= size
    if layout == "offset":
        return random([numel + 1])[1:].view(shape)
    if layout == "stepped" and shape:
        return random(shape[:-1] + [2 * shape[-1]])[..., ::2]
    if layout == "transposed" and len(shape) >= 2:
        return random(shape[:-2] + [shape[-1], shape[-2]]).transpose(-1, -2)
    return random(shape)
