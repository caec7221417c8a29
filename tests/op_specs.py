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

    def call(self, inputs, **options):
        return self.fused(*inputs, **options)


def relu_add_shapes(shape):
    return [list(shape), list(shape)]


def bias_shapes(shape):
    return [list(shape), [shape[-1]]]


def gated_shapes(shape):
    return [list(shape[:-1]) + [2 * shape[-1]]]


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
