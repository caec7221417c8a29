"""Gated RMSNorms that normalise before the gate, `act(gate) * (weight * x̂)` (the linear-attention layers of
Qwen3-Next, Qwen3.5 and OLMo hybrid): rms_norm, then gated_mul with the normalised tensor as the up half,
one rounding each where the module rounds too. The probe proves the offset and the activation; a module that
gates before it normalises (Mamba 2's) is left alone by the probe."""
import inspect

import torch

from ... import _ops
from .. import probe
from ..swap import forward_builder, holds_plain_tensors
from . import LeftAlone, Rule
from .gated_mlp import ACTIVATIONS
from .norm import NormRule, runs_its_fused_op


def takes_a_gate(module) -> bool:
    """A forward of exactly (hidden_states, gate)."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return [p.name for p in parameters] == ["hidden_states", "gate"] and all(
        p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters)


@forward_builder("gated_norm")
def _gated_norm_forward(base, options):
    eps, offset, activation = options["eps"], options["offset"], options["activation"]

    def forward(self, hidden_states, gate):
        # Mixed dtypes (autocast) round differently in the module's own float32 arithmetic: its forward.
        if (not torch.is_tensor(gate) or gate.dtype != hidden_states.dtype or gate.shape != hidden_states.shape
                or not runs_its_fused_op(self, hidden_states.dtype)):
            return base.forward(self, hidden_states, gate)
        normalised = _ops.rms_norm(hidden_states, self.weight, eps, offset=offset)
        return _ops.gated_mul(gate, normalised, activation)
    return forward


class GatedNormRule(Rule):
    kind = "gated_norm"
    large_inputs = True
    description = "gated RMSNorm (norm, then gate) -> rms_norm + gated_mul"

    def candidates(self, model):
        for name, module in NormRule.leaf_norms_with_a_weight(model):
            if takes_a_gate(module):
                yield name, module

    def variants(self, module, context):
        if not holds_plain_tensors(module, "weight"):
            raise LeftAlone("its weight is not a plain tensor (quantised?)")
        eps = NormRule.epsilon(module)
        if eps is None:
            raise LeftAlone("no epsilon attribute (eps, variance_epsilon, epsilon) with a number")
        if getattr(module, "bias", None) is not None:
            raise LeftAlone("it has a bias")
        return [(("activation", activation), ("eps", eps), ("offset", offset))
                for activation in ACTIVATIONS for offset in (0.0, 1.0)]

    def inputs(self, module, context):
        size = module.weight.shape[0]

        def make(dtype, device):
            generator = torch.Generator().manual_seed(probe.PROBE_SEED)
            x = NormRule.probe_rows(size, generator)
            gate = torch.randn(x.shape, generator=generator, dtype=torch.float64) * 3
            return tuple(t.to(device, dtype or torch.float64) for t in (x, gate)), {}
        return probe.Inputs(make)
