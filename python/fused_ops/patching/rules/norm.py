"""Norms over the last dim: RMSNorm and LayerNorm, torch's and every family's own class."""
import torch

from ... import _ops
from .. import probe
from ..swap import forward_builder
from . import LeftAlone, Rule, check_takes_one_input

_EPSILON_NAMES = ("eps", "variance_epsilon", "epsilon")


def _epsilon(module):
    for name in _EPSILON_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


@forward_builder("norm")
def _norm_forward(base, options):
    function, eps = options["function"], options["eps"]
    if function == "rms_norm":
        def forward(self, hidden_states):
            return _ops.rms_norm(hidden_states, self.weight, eps)
    else:
        def forward(self, hidden_states):
            return _ops.layer_norm(hidden_states, self.weight, getattr(self, "bias", None), eps)
    return forward


class NormRule(Rule):
    kind = "norm"
    description = "norm over the last dim -> rms_norm / layer_norm"

    def candidates(self, model):
        for name, module in model.named_modules():
            if module._modules:
                continue
            weight = getattr(module, "weight", None)
            parameters = dict(module.named_parameters())
            if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1 or set(parameters) - {"weight", "bias"}:
                continue
            if isinstance(module, (torch.nn.RMSNorm, torch.nn.LayerNorm)) or "norm" in type(module).__name__.lower():
                yield name, module

    def variants(self, module, context):
        check_takes_one_input(module)
        eps = _epsilon(module)
        if eps is None:
            raise LeftAlone("no epsilon attribute (eps, variance_epsilon, epsilon) with a number")
        bias = getattr(module, "bias", None)
        if bias is not None and (not isinstance(bias, torch.nn.Parameter) or bias.shape != module.weight.shape):
            raise LeftAlone("its bias is not a parameter of the weight's shape")
        functions = ["layer_norm"] if bias is not None else ["rms_norm", "layer_norm"]
        return [(("eps", eps), ("function", function)) for function in functions]

    def inputs(self, module, context):
        size = module.weight.shape[0]

        def make(dtype, device):
            # Rows at scales down to the epsilon's, each off zero mean: a wrong epsilon, a missing mean
            # subtraction or a dropped constant all show.
            generator = torch.Generator().manual_seed(probe.PROBE_SEED)
            rows = torch.randn(2, 4, size, generator=generator, dtype=torch.float64)
            scales = torch.tensor([1.0, 3e-2, 1e-3, 3e-4], dtype=torch.float64)[:, None]
            offsets = torch.tensor([0.5, -0.02, 1e-3, 0.0], dtype=torch.float64)[:, None]
            x = rows * scales + offsets
            return (x.to(device, dtype or torch.float64),), {}
        return probe.Inputs(make)
