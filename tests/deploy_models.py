"""Models shared by the deploy tests: parameters, a matmul and relu_add."""
import torch

import fused_ops


class MatmulReluAdd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(torch.randn(16, 16, generator=generator))
        self.relu_add = fused_ops.nn.ReLUAdd(bias=0.25)

    def forward(self, x, y):
        hidden = self.relu_add(x @ self.weight, y)
        return hidden, hidden.sum(dim=-1)


def example_inputs(device="cpu"):
    generator = torch.Generator().manual_seed(2)
    return [torch.randn(8, 16, generator=generator).to(device),
            torch.randn(16, generator=generator).to(device)]
