"""Models shared by the deploy tests: parameters, a matmul and each family's ops."""
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


class MatmulActivations(torch.nn.Module):
    """A gated MLP block: matmul, bias_gelu, then silu_mul and gelu_mul of the result."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.weight = torch.nn.Parameter(torch.randn(16, 32, generator=generator) / 4)
        self.bias_gelu = fused_ops.nn.BiasGELU(32, approximate="tanh")
        with torch.no_grad():
            self.bias_gelu.bias.copy_(torch.randn(32, generator=generator))
        self.silu_mul = fused_ops.nn.SiLUMul()
        self.gelu_mul = fused_ops.nn.GELUMul()

    def forward(self, x, y):
        h = self.bias_gelu(x @ self.weight)
        return self.silu_mul(h) * y + self.gelu_mul(h)


class MatmulNorms(torch.nn.Module):
    """A pre-norm residual block: add_rms_norm, matmul, add_layer_norm, rms_norm and layer_norm, and
    the weight forms: an offset (Gemma's 1 + weight) and no weight."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(4)
        self.weight = torch.nn.Parameter(torch.randn(16, 16, generator=generator) / 4)
        self.add_rms = fused_ops.nn.AddRMSNorm(16, eps=1e-6)
        self.add_layer = fused_ops.nn.AddLayerNorm(16)
        self.rms = fused_ops.nn.RMSNorm(16, eps=1e-5)
        self.layer = fused_ops.nn.LayerNorm(16, bias=False)
        self.offset_rms = fused_ops.nn.RMSNorm(16, eps=1e-6, offset=1.0)
        self.weightless_layer = fused_ops.nn.LayerNorm(16, elementwise_affine=False)
        with torch.no_grad():
            for norm in (self.add_rms, self.add_layer, self.rms, self.layer, self.offset_rms):
                for parameter in norm.parameters():
                    parameter.copy_(torch.randn(parameter.shape, generator=generator))

    def forward(self, x, y):
        normed, residual = self.add_rms(x, y.expand_as(x))
        out, residual = self.add_layer(normed @ self.weight, residual)
        return self.rms(out) + self.layer(residual), self.offset_rms(out) * self.weightless_layer(residual)


class MatmulRotary(torch.nn.Module):
    """q and k projections (two query heads, one key head), RoPE on the first half of each head."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.q = torch.nn.Parameter(torch.randn(16, 16, generator=generator) / 4)
        self.k = torch.nn.Parameter(torch.randn(16, 8, generator=generator) / 4)
        angles = torch.outer(torch.arange(8.0), torch.tensor([1.0, 0.1]))
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos())  # [S, R]: S = 8, R = 4
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin())

    def forward(self, x, y):
        q = (x @ self.q).view(1, 8, 2, 8)  # [B, S, H, D]
        k = (x @ self.k).view(1, 8, 1, 8)
        q, k = torch.ops.fused.rotary_embedding(q, k, self.cos.to(x.dtype), self.sin.to(x.dtype), 2, False)
        return q.reshape(8, 16) * y, k.reshape(8, 8)


class MatmulLinearCrossEntropy(torch.nn.Module):
    """A projection, then an LM head of 11 classes and its mean loss (one target ignored), and the
    per-row losses of the same head."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(6)
        self.weight = torch.nn.Parameter(torch.randn(16, 16, generator=generator) / 4)
        self.head = torch.nn.Parameter(torch.randn(11, 16, generator=generator) / 4)
        self.head_bias = torch.nn.Parameter(torch.randn(11, generator=generator))
        self.register_buffer("target", torch.tensor([3, 0, 10, -100, 7, 7, 1, 5]))
        self.loss = fused_ops.nn.LinearCrossEntropy(label_smoothing=0.1)
        self.row_losses = fused_ops.nn.LinearCrossEntropy(reduction="none", softcap=3.0)

    def forward(self, x, y):
        hidden = (x @ self.weight) * y
        return (self.loss(hidden, self.head, self.target, self.head_bias),
                self.row_losses(hidden, self.head, self.target, self.head_bias))


class MatmulLinearLogProbs(torch.nn.Module):
    """A projection, then an LM head of 11 classes: each row's log-probability of its target at a
    temperature (one target ignored) and the entropy."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(7)
        self.weight = torch.nn.Parameter(torch.randn(16, 16, generator=generator) / 4)
        self.head = torch.nn.Parameter(torch.randn(11, 16, generator=generator) / 4)
        self.head_bias = torch.nn.Parameter(torch.randn(11, generator=generator))
        self.register_buffer("target", torch.tensor([3, 0, 10, -100, 7, 7, 1, 5]))

    def forward(self, x, y):
        hidden = (x @ self.weight) * y
        return torch.ops.fused.linear_log_probs(hidden, self.head, self.target, self.head_bias, 0.8, -100, True)


class MatmulAttentionWithSinks(torch.nn.Module):
    """q, k and v projections (two query heads, one key/value head of 8) and attention with a sink per head over
    the 8 tokens, a window of 3."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(9)
        self.q = torch.nn.Parameter(torch.randn(16, 16, generator=generator) / 4)
        self.kv = torch.nn.Parameter(torch.randn(16, 16, generator=generator) / 4)
        self.sinks = torch.nn.Parameter(torch.randn(2, generator=generator))

    def forward(self, x, y):
        q = (x @ self.q).view(1, 8, 2, 8)  # [B, S, H, D]
        k, v = (x @ self.kv).view(1, 8, 2, 8).split(1, dim=2)
        out, _ = torch.ops.fused.attention_with_sinks(q, k.contiguous(), v.contiguous(), self.sinks, 0.35, 3)
        return out.reshape(8, 16) * y


class EveryFamily(torch.nn.Module):
    """Every model below in one, their outputs in one tuple: one compiled package covers every op."""

    def __init__(self):
        super().__init__()
        self.models = torch.nn.ModuleList([model() for model in MODELS.values()])

    def forward(self, x, y):
        outputs = []
        for model in self.models:
            result = model(x, y)
            outputs.extend(result if isinstance(result, tuple) else (result,))
        return tuple(outputs)


MODELS = {"relu_add": MatmulReluAdd, "activations": MatmulActivations, "norms": MatmulNorms,
          "rotary": MatmulRotary, "cross_entropy": MatmulLinearCrossEntropy, "log_probs": MatmulLinearLogProbs,
          "attention": MatmulAttentionWithSinks}
