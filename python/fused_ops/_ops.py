"""Typed wrappers over `torch.ops.fused.*` (same semantics, docstrings and type hints)."""
import torch
from torch import Tensor

# Bound once: calling the overload skips the packet's overload resolution on every call.
_relu_add = torch.ops.fused.relu_add.default


def relu_add(x: Tensor, y: Tensor, bias: float = 0.0) -> Tensor:
    """`relu(x) + y + bias` in one pass; `y` broadcasts to `x`'s shape.

    Same values as the eager composite (half types computed in float32 and rounded once),
    differentiable in `x` and `y`.
    """
    return _relu_add(x, y, bias)
