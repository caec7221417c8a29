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
