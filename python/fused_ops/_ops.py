"""Typed wrappers over `torch.ops.fused.*` (same semantics, docstrings and type hints)."""
import torch
from torch import Tensor

# Bound once: calling the overload skips the packet's overload resolution on every call.
_relu_add = torch.ops.fused.relu_add.default
_bias_gelu = torch.ops.fused.bias_gelu.default
_silu_mul = torch.ops.fused.silu_mul.default
_gelu_mul = torch.ops.fused.gelu_mul.default


def relu_add(x: Tensor, y: Tensor, bias: float = 0.0) -> Tensor:
    """`relu(x) + y + bias` in one pass; `y` broadcasts to `x`'s shape.

    Same values as the eager composite (half types computed in float32 and rounded once),
    differentiable in `x` and `y`.
    """
    return _relu_add(x, y, bias)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """`gelu(x + bias, approximate=approximate)`; `bias` is 1-D of size `x.size(-1)`.

    `approximate` is "none" (erf) or "tanh". Differentiable in `x` and `bias`.
    """
    return _bias_gelu(x, bias, approximate)


def silu_mul(x: Tensor) -> Tensor:
    """`silu(x[..., :d]) * x[..., d:]` for `x` of shape `[..., 2d]` (SwiGLU gate-up layout)."""
    return _silu_mul(x)


def gelu_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """`gelu(x[..., :d], approximate) * x[..., d:]` for `x` of shape `[..., 2d]` (GeGLU)."""
    return _gelu_mul(x, approximate)
