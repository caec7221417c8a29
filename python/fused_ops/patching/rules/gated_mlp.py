"""Gated MLPs: `down_proj(act(gate_proj(x)) * up_proj(x))`, and Phi-3's one stored `gate_up_proj`.

The projections stay the user's modules and are called as modules (LoRA, quantised layers work); the
activation and the down projection run as one op that recomputes the activation in the backward
instead of holding it, whenever down_proj is a plain nn.Linear.
"""
import torch

from ... import _ops
from .. import probe
from ..swap import activation_children, as_autocast_runs_linear, forward_builder, is_plain_linear
from . import LeftAlone, Rule, check_takes_one_input

ACTIVATIONS = ("silu", "gelu_tanh", "gelu")


def gated_down_projection(gate, up, down, activation):
    """down(act(gate) * up), the product fused with the activation where down is a plain nn.Linear."""
    if is_plain_linear(down):
        gate_cast, weight, bias = as_autocast_runs_linear(gate, down.weight, down.bias)
        if weight.dtype == gate_cast.dtype:
            return _ops.gated_mul_linear(gate_cast, up.to(gate_cast.dtype), weight, bias, activation)
    return down(_ops.gated_mul(gate, up, activation))


_PROJECTIONS = ("gate_proj", "up_proj", "gate_up_proj", "down_proj")


def _skipped_children(options):
    """What the fused forward computes without calling it: the activation and the down projection."""
    return tuple(name for name, _ in options.get("_activation_children") or ()) + ("down_proj",)


@forward_builder("gated_mlp", skips=_skipped_children)
def _gated_mlp_forward(base, options):
    # None in a model pickled before the option existed: the stock forward (activation_children never equals it).
    activation, activations = options["activation"], options.get("_activation_children")
    stock = base.forward
    # An activation module replaced after fuse() is the stock forward's to call.
    if options["stored"] == "gate_up_proj":
        def forward(self, hidden_states):
            if activation_children(self, _PROJECTIONS) != activations:
                return stock(self, hidden_states)
            gate, up = self.gate_up_proj(hidden_states).chunk(2, dim=-1)
            return gated_down_projection(gate, up, self.down_proj, activation)
    else:
        def forward(self, x):
            if activation_children(self, _PROJECTIONS) != activations:
                return stock(self, x)
            return gated_down_projection(self.gate_proj(x), self.up_proj(x), self.down_proj, activation)
    return forward


def _in_features(projection):
    size = getattr(projection, "in_features", None)
    return size if isinstance(size, int) else projection.weight.shape[1]


class GatedMLPRule(Rule):
    kind = "gated_mlp"
    large_inputs = True
    description = "gated MLP -> gated_mul_linear (gate and up kept; the activation recomputed, not saved)"

    def candidates(self, model):
        for name, module in model.named_modules():
            children = module._modules
            if "down_proj" in children and ("gate_proj" in children and "up_proj" in children
                                             or "gate_up_proj" in children):
                yield name, module

    def summary(self, options):
        return (f"{options['activation']} gate x up and the down projection as one op, the activation recomputed "
                "in the backward instead of saved")

    def variants(self, module, context):
        check_takes_one_input(module)
        stored = "gate_up_proj" if "gate_up_proj" in module._modules else "gate_proj"
        return [(("activation", activation), ("stored", stored),
                 ("_activation_children", activation_children(module, _PROJECTIONS))) for activation in ACTIVATIONS]

    def inputs(self, module, context):
        projection = module.gate_up_proj if "gate_up_proj" in module._modules else module.gate_proj
        try:
            size = _in_features(projection)
        except AttributeError:
            raise LeftAlone("its projections have neither in_features nor a weight") from None

        def make(dtype, device):
            generator = torch.Generator().manual_seed(probe.PROBE_SEED)
            x = torch.randn(2, 3, size, generator=generator, dtype=torch.float64)
            return (x.to(device, dtype or torch.float64),), {}
        return probe.Inputs(make)
