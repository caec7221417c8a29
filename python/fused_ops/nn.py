"""nn.Modules over the fused ops; each is accepted by `torch.jit.script`."""
from typing import List, Optional, Tuple, Union

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


def _last_dim_size(module: str, normalized_shape: Union[int, List[int], Tuple[int, ...], torch.Size]) -> int:
    if isinstance(normalized_shape, int):
        return normalized_shape
    shape = list(normalized_shape)
    if len(shape) != 1:
        raise ValueError(f"{module}: normalises over the last dim only, so normalized_shape must be an int "
                         f"or have one element, got {normalized_shape!r}")
    return int(shape[0])


def _default_rms_norm_eps(dtype: torch.dtype) -> float:
    """What torch.nn.RMSNorm(eps=None) adds: the machine epsilon of the type it computes in, float32 for
    float16/bfloat16/float32 and float64 for float64 (written out because TorchScript has no torch.finfo)."""
    if dtype == torch.float64:
        return 2.220446049250313e-16
    return 1.1920928955078125e-07


class _Norm(torch.nn.Module):
    """Weight (and bias) over the last dim, created as torch.nn.RMSNorm / LayerNorm create them: weight
    ones, bias zeros, also with a weight offset (the norm multiplies by `offset + weight`), as Liger's and
    Nemotron's norms start; Gemma starts its weight at zeros (`torch.nn.init.zeros_(norm.weight)`).
    Without elementwise_affine there is no weight (None, as torch's) and no bias, and offset must be 0."""

    def __init__(self, module: str, normalized_shape, elementwise_affine: bool, bias: bool, offset: float,
                 device=None, dtype=None) -> None:
        super().__init__()
        size = _last_dim_size(module, normalized_shape)
        self.normalized_shape = (size,)
        self.elementwise_affine = elementwise_affine
        self.offset = float(offset)
        if not elementwise_affine and self.offset != 0.0:
            raise ValueError(f"{module}: offset is added to the weight, so it must be 0.0 without "
                             f"elementwise_affine, got {offset}")
        self.weight: Optional[Tensor] = None
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(size, device=device, dtype=dtype))
        self.bias: Optional[Tensor] = None
        if elementwise_affine and bias:
            self.bias = torch.nn.Parameter(torch.zeros(size, device=device, dtype=dtype))

    def extra_repr(self) -> str:
        offset = f", offset={self.offset}" if self.offset != 0.0 else ""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}{offset}"


class RMSNorm(_Norm):
    """Drop-in for `torch.nn.RMSNorm(normalized_shape)` over the last dim: `eps=None` means
    the machine epsilon of the type the norm computes in, as there: `torch.finfo(torch.float32).eps`
    for float16, bfloat16 and float32 x, `torch.finfo(torch.float64).eps` for float64. The weight may be
    float32 while x is float16/bfloat16
    (mixed precision); the output has x's dtype. `offset=1.0` is Gemma's RMSNorm (`x̂ * (1 + weight)`),
    the sum and product in float32 before the one rounding to x's dtype."""

    def __init__(self, normalized_shape, eps: Optional[float] = None, elementwise_affine: bool = True,
                 device=None, dtype=None, offset: float = 0.0) -> None:
        super().__init__("RMSNorm", normalized_shape, elementwise_affine, False, offset, device, dtype)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        eps = self.eps if self.eps is not None else _default_rms_norm_eps(x.dtype)
        return torch.ops.fused.rms_norm(x, self.weight, eps, self.offset)


class AddRMSNorm(RMSNorm):
    """`h = x + residual`, then RMSNorm of h; returns `(out, h)` (h is the next residual)."""

    def forward(self, x: Tensor, residual: Tensor) -> Tuple[Tensor, Tensor]:
        eps = self.eps if self.eps is not None else _default_rms_norm_eps(x.dtype)
        return torch.ops.fused.add_rms_norm(x, residual, self.weight, eps, self.offset)


class LayerNorm(_Norm):
    """Drop-in for `torch.nn.LayerNorm(normalized_shape)` over the last dim (same arguments and
    parameter names). The weight and bias may be float32 while x is float16/bfloat16. `offset=1.0` is
    Nemotron's LayerNorm1P (`x̂ * (weight + 1) + bias`)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, offset: float = 0.0) -> None:
        super().__init__("LayerNorm", normalized_shape, elementwise_affine, bias, offset, device, dtype)
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.fused.layer_norm(x, self.weight, self.bias, self.eps, self.offset)


class AddLayerNorm(LayerNorm):
    """`h = x + residual`, then LayerNorm of h; returns `(out, h)` (h is the next residual)."""

    def forward(self, x: Tensor, residual: Tensor) -> Tuple[Tensor, Tensor]:
        return torch.ops.fused.add_layer_norm(x, residual, self.weight, self.bias, self.eps, self.offset)


class LinearCrossEntropy(torch.nn.Module):
    """The LM head's loss without its logits: `forward(input, weight, target, bias=None)` is
    `F.cross_entropy(F.linear(input, weight, bias), target, ...)` with the options given here
    (fused_ops.linear_cross_entropy). Holds no parameters: pass the head's `weight` (and `bias`)."""

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                 softcap: float = 0.0) -> None:
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"LinearCrossEntropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"LinearCrossEntropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        if softcap < 0.0:
            raise ValueError(f"LinearCrossEntropy: softcap must be >= 0 (0: no cap), got {softcap}")
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)
        self.reduction = reduction
        self.softcap = float(softcap)

    def forward(self, input: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        return torch.ops.fused.linear_cross_entropy(input, weight, target, bias, self.ignore_index,
                                                    self.label_smoothing, self.reduction, self.softcap)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}, "
                f"reduction={self.reduction!r}, softcap={self.softcap}")

