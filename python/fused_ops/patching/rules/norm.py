"""Norms over the last dim: RMSNorm and LayerNorm, torch's and every family's own class, with the weight
as it is or offset by one (Gemma's `1 + weight` RMSNorm, Nemotron's LayerNorm1P), or with no parameters at
all (OLMo's LayerNorm, Gemma 4's value norm): the probe proves which, and the epsilon where a weightless
norm keeps it in its forward's code instead of an attribute. A weightless norm with no size attribute is
probed at the width of its call in the model's probe forward."""
import torch

from ... import _ops
from .. import probe
from ..swap import forward_builder, holds_plain_tensors
from . import LeftAlone, Rule, check_takes_one_input

_EPSILON_NAMES = ("eps", "variance_epsilon", "epsilon")
# The option saying the op may take float32 parameters on a 16-bit input (probe.verify_in_mixed_precision).
FLOAT32_ON_16_BIT = "float32_weight_on_16_bit_input"
# Epsilons to try on a weightless norm with no epsilon attribute (torch's and Llama's defaults).
_USUAL_EPSILONS = (1e-5, 1e-6)


def _epsilon(module):
    for name in _EPSILON_NAMES:
        value = getattr(module, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


# torch's norms given eps=None take the machine epsilon of the dtype they compute in (float32 for 16-bit
# inputs): the option's value where the probe proves that.
DTYPE_EPSILON = "the computation dtype's epsilon"


def epsilon_for(eps, dtype):
    """The number a proven epsilon option stands for on an input of `dtype`."""
    if eps != DTYPE_EPSILON:
        return eps
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


@forward_builder("norm")
def _norm_forward(base, options):
    function, eps, offset = options["function"], options["eps"], options["offset"]
    stock = base.forward
    if function == "rms_norm":
        def forward(self, hidden_states):
            if not runs_its_fused_op(self, hidden_states.dtype):
                return stock(self, hidden_states)
            return _ops.rms_norm(hidden_states, getattr(self, "weight", None), epsilon_for(eps, hidden_states.dtype),
                                 offset=offset)
    else:
        def forward(self, hidden_states):
            if not runs_its_fused_op(self, hidden_states.dtype):
                return stock(self, hidden_states)
            return _ops.layer_norm(hidden_states, getattr(self, "weight", None), getattr(self, "bias", None),
                                   epsilon_for(eps, hidden_states.dtype), offset=offset)
    return forward


def runs_its_fused_op(norm, dtype):
    """Whether a fused norm (or gated norm) may run its op on an input of `dtype`: its weight and bias hold
    plain values (not a quantised tensor), its epsilon attribute still holds the one it was proven with (one
    set after fuse() is the stock forward's to use), and its parameters hold `dtype`, as in the probes, or
    float32 on a 16-bit input where the probe proved that case too (FLOAT32_ON_16_BIT). Otherwise its own
    forward runs: Mamba's last norm takes its float32 residual stream with a 16-bit weight."""
    options = type(norm)._fused_ops_option_values
    now = _epsilon(norm)
    if options["eps"] == DTYPE_EPSILON:
        if getattr(norm, "eps", None) is not None:  # an epsilon set since: the stock forward's to use
            return False
    elif not (now is None or now == options["eps"]):
        return False
    if not holds_plain_tensors(norm, "weight", "bias"):
        return False
    float32_allowed = options.get(FLOAT32_ON_16_BIT) and dtype in (torch.float16, torch.bfloat16)
    for name in ("weight", "bias"):
        parameter = getattr(norm, name, None)
        if parameter is not None and parameter.dtype != dtype and not (
                float32_allowed and parameter.dtype == torch.float32):
            return False
    return True


def _weightless_size(module):
    """The normalised size of a norm without parameters, from its `normalized_shape` of one dim."""
    shape = getattr(module, "normalized_shape", None)
    if isinstance(shape, int):
        return shape
    if isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1 and isinstance(shape[0], int):
        return shape[0]
    return None


def _captured_width(module, context):
    """The last dim of the tensor a weightless norm was called on in the model's probe forward."""
    inputs = context.captured_inputs(module)
    args, kwargs = inputs.make(None, torch.device("cpu"))
    first = args[0] if args else next(iter(kwargs.values()), None)
    if not torch.is_tensor(first) or first.dim() == 0:
        raise LeftAlone("its probe call's input is not a tensor")
    return first.shape[-1]


class NormRule(Rule):
    kind = "norm"
    large_inputs = True
    description = "norm over the last dim -> rms_norm / layer_norm"
    needs_capture = True  # only a weightless norm with no size attribute uses its captured call

    @staticmethod
    def leaf_norms(model):
        """(name, module) of each leaf module that is torch's norm or has "norm" in its class name, and whose
        parameters are none or a 1-D weight (and a bias)."""
        for name, module in model.named_modules():
            if module._modules:
                continue
            if not isinstance(module, (torch.nn.RMSNorm, torch.nn.LayerNorm)) and "norm" not in type(module).__name__.lower():
                continue
            weight = getattr(module, "weight", None)
            parameters = dict(module.named_parameters())
            if not parameters and weight is None:
                yield name, module
            elif isinstance(weight, torch.nn.Parameter) and weight.dim() == 1 and not set(parameters) - {"weight", "bias"}:
                yield name, module

    @staticmethod
    def leaf_norms_with_a_weight(model):
        return ((name, module) for name, module in NormRule.leaf_norms(model)
                if getattr(module, "weight", None) is not None)

    epsilon = staticmethod(_epsilon)

    @staticmethod
    def probe_rows(size, generator):
        """[2, 4, size] float64 rows at scales down to the epsilon's, each off zero mean: a wrong epsilon, a
        missing mean subtraction or a dropped constant all show."""
        rows = torch.randn(2, 4, size, generator=generator, dtype=torch.float64)
        scales = torch.tensor([1.0, 3e-2, 1e-3, 3e-4], dtype=torch.float64)[:, None]
        offsets = torch.tensor([0.5, -0.02, 1e-3, 0.0], dtype=torch.float64)[:, None]
        return rows * scales + offsets

    def candidates(self, model):
        from .gated_norm import takes_a_gate  # the gated norms are that rule's
        return ((name, module) for name, module in self.leaf_norms(model) if not takes_a_gate(module))

    def variants(self, module, context):
        check_takes_one_input(module)
        if not holds_plain_tensors(module, "weight", "bias"):
            raise LeftAlone("its weight or bias is not a plain tensor (quantised?)")
        eps = _epsilon(module)
        if getattr(module, "weight", None) is None:
            return [(("eps", eps), ("function", function), ("offset", 0.0))
                    for eps in ([eps] if eps is not None else _USUAL_EPSILONS) for function in ("layer_norm", "rms_norm")]
        if eps is None and "eps" in vars(module) and module.eps is None:
            eps = DTYPE_EPSILON  # torch.nn.RMSNorm's default: the probe proves what it means
        if eps is None:
            raise LeftAlone("no epsilon attribute (eps, variance_epsilon, epsilon) with a number")
        bias = getattr(module, "bias", None)
        if bias is not None and (not isinstance(bias, torch.nn.Parameter) or bias.shape != module.weight.shape):
            raise LeftAlone("its bias is not a parameter of the weight's shape")
        functions = ["layer_norm"] if bias is not None else ["rms_norm", "layer_norm"]
        return [(("eps", eps), ("function", function), ("offset", offset))
                for function in functions for offset in (0.0, 1.0)]

    def summary(self, options):
        name = "RMSNorm" if options["function"] == "rms_norm" else "LayerNorm"
        weight = ", weight offset by one (1 + weight)" if options["offset"] else ""
        return f"{name} as one fused {options['function']} kernel{weight}"

    def proven_options(self, module, options, context):
        """A weighted norm's proven options, and whether the op also computes what its own forward does with
        float32 parameters on 16-bit inputs (Llama's RMSNorm promotes its output to float32 there; the op
        keeps the input's dtype)."""
        if getattr(module, "weight", None) is None:
            return options
        mixed = tuple(options) + ((FLOAT32_ON_16_BIT, True),)
        try:
            probe.verify_in_mixed_precision(module, self.fused_class(module, mixed), self.inputs(module, context),
                                            under_autocast=False)
        except Exception:  # a mismatch, or a stock forward that cannot run so: not proven
            return tuple(options) + ((FLOAT32_ON_16_BIT, False),)
        return mixed

    def inputs(self, module, context):
        size = module.weight.shape[0] if getattr(module, "weight", None) is not None else _weightless_size(module)
        if size is None:
            size = _captured_width(module, context)

        def make(dtype, device):
            generator = torch.Generator().manual_seed(probe.PROBE_SEED)
            return (self.probe_rows(size, generator).to(device, dtype or torch.float64),), {}
        return probe.Inputs(make)
