"""nn.Modules over the fused ops; each is accepted by `torch.jit.script`."""
import torch
from torch import Tensor


class ReLUAdd(torch.nn.Module):
    """`relu(x) + y + bias` with a fixed scalar `bias` (for example a residual branch)."""

    def __init__(self, bias: float = 0.0) -> None:
        super().__init__()
        self.bias = float(bias)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.ops.fused.relu_add(x, y, self.bias)

    def extra_repr(self) -> str:
        return f"bias={self.bias}"


class BiasGELU(torch.nn.Module):
    """`gelu(x + bias)` with a learnable bias of size `features` (the bias of the preceding
    projection, moved here so it fuses with the activation)."""

    def __init__(self, features: int, approximate: str = "none", device=None, dtype=None) -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"BiasGELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        self.bias = torch.nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.fused.bias_gelu(x, self.bias, self.approximate)

    def extra_repr(self) -> str:
        return f"features={self.bias.numel()}, approximate={self.approximate!r}"


class SiLUMul(torch.nn.Module):
    """SwiGLU activation: `silu(x[..., :d]) * x[..., d:]` for `x` of shape `[..., 2d]`."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.fused.silu_mul(x)


class GELUMul(torch.nn.Module):
    """GeGLU activation: `gelu(x[..., :d], approximate) * x[..., d:]` for `x` of shape `[..., 2d]`."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELUMul: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.fused.gelu_mul(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"
