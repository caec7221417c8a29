"""Typed wrappers over `torch.ops.fused.*` (same semantics, docstrings and type hints)."""
from typing import Optional, Tuple

import torch
from torch import Tensor

# Bound once: calling the overload skips the packet's overload resolution on every call.
_relu_add = torch.ops.fused.relu_add.default
_bias_gelu = torch.ops.fused.bias_gelu.default
_silu_mul = torch.ops.fused.silu_mul.default
_gelu_mul = torch.ops.fused.gelu_mul.default
_rms_norm = torch.ops.fused.rms_norm.default
_add_rms_norm = torch.ops.fused.add_rms_norm.default
_layer_norm = torch.ops.fused.layer_norm.default
_add_layer_norm = torch.ops.fused.add_layer_norm.default


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


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """`x * rsqrt(mean(x**2, -1) + eps) * weight` over the last dim, statistics in float32.

    `weight` is 1-D of size `x.size(-1)`, with x's dtype or float32 for float16/bfloat16 `x`;
    the result has x's dtype. Differentiable in `x` and `weight`.
    """
    return _rms_norm(x, weight, eps)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> Tuple[Tensor, Tensor]:
    """`h = x + residual` (in x's dtype); returns `(rms_norm(h, weight, eps), h)`.

    Differentiable in `x`, `residual` and `weight` through either output or both.
    """
    return _add_rms_norm(x, residual, weight, eps)


def layer_norm(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """`(x - mean) * rsqrt(var + eps) * weight + bias` over the last dim, statistics in float32."""
    return _layer_norm(x, weight, bias, eps)


def add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                   eps: float = 1e-5) -> Tuple[Tensor, Tensor]:
    """`h = x + residual` (in x's dtype); returns `(layer_norm(h, weight, bias, eps), h)`."""
    return _add_layer_norm(x, residual, weight, bias, eps)
