"""Projection bias + GELU: GPT-2's MLP (Conv1D, act, c_proj), GPT-J's and CodeGen's (fc_in, act, fc_out) and
BERT's intermediate layer."""
import torch

from ... import _ops
from .. import probe
from ..swap import forward_builder, holds_plain_tensors, is_plain_linear
from . import LeftAlone, Rule, check_takes_one_input


def _bias_as_autocast_adds_it(hidden, bias):
    """The bias in the product's dtype under autocast (whose addmm adds it in that dtype)."""
    if bias.dtype != hidden.dtype and torch.is_autocast_enabled(hidden.device.type):
        return bias.to(hidden.dtype)
    return bias


def _is_plain_conv1d(module):
    return (type(module).__name__ == "Conv1D" and not module._forward_hooks and not module._forward_pre_hooks
            and isinstance(getattr(module, "bias", None), torch.Tensor)
            and holds_plain_tensors(module, "weight", "bias"))


def _layout(module):
    return "gpt2_mlp" if "c_fc" in module._modules else "linear_mlp" if "fc_in" in module._modules else "intermediate"


# The children each layout's fused forward computes without calling them: the projection and the activation.
_SKIPPED = {"gpt2_mlp": ("c_fc", "act"), "linear_mlp": ("fc_in", "act"), "intermediate": ("dense", "intermediate_act_fn")}


@forward_builder("bias_gelu", skips=lambda options: _SKIPPED[options["layout"]])
def _bias_gelu_forward(base, options):
    approximate, layout = options["approximate"], options["layout"]
    stock = base.forward
    if layout == "gpt2_mlp":
        def forward(self, hidden_states):
            projection = self.c_fc
            if not _is_plain_conv1d(projection):
                return stock(self, hidden_states)
            hidden = (hidden_states.reshape(-1, projection.weight.shape[0]) @ projection.weight).view(
                *hidden_states.shape[:-1], projection.weight.shape[1])
            hidden = _ops.bias_gelu(hidden, _bias_as_autocast_adds_it(hidden, projection.bias), approximate)
            return self.dropout(self.c_proj(hidden))
    elif layout == "linear_mlp":
        def forward(self, hidden_states):
            if not is_plain_linear(self.fc_in) or self.fc_in.bias is None:
                return stock(self, hidden_states)
            hidden = torch.nn.functional.linear(hidden_states, self.fc_in.weight)
            hidden = _ops.bias_gelu(hidden, _bias_as_autocast_adds_it(hidden, self.fc_in.bias), approximate)
            return self.dropout(self.fc_out(hidden))
    else:
        def forward(self, hidden_states):
            if not is_plain_linear(self.dense) or self.dense.bias is None:
                return stock(self, hidden_states)
            hidden = torch.nn.functional.linear(hidden_states, self.dense.weight)
            return _ops.bias_gelu(hidden, _bias_as_autocast_adds_it(hidden, self.dense.bias), approximate)
    return forward


class BiasGELURule(Rule):
    kind = "bias_gelu"
    large_inputs = True
    description = "projection bias + GELU -> bias_gelu"

    def candidates(self, model):
        for name, module in model.named_modules():
            children = set(module._modules)
            if children in ({"c_fc", "act", "c_proj", "dropout"}, {"fc_in", "act", "fc_out", "dropout"}) or {
                    "dense", "intermediate_act_fn"} <= (children | set(vars(module))):
                yield name, module

    def variants(self, module, context):
        check_takes_one_input(module)
        layout = _layout(module)
        projection = {"gpt2_mlp": "c_fc", "linear_mlp": "fc_in"}.get(layout, "dense")
        if layout == "gpt2_mlp" and not _is_plain_conv1d(module.c_fc):
            raise LeftAlone("c_fc is not a Conv1D with a bias")
        if layout != "gpt2_mlp" and not (is_plain_linear(getattr(module, projection))
                                         and getattr(module, projection).bias is not None):
            raise LeftAlone(f"{projection} is not an nn.Linear with a bias")
        return [(("approximate", approximate), ("layout", layout)) for approximate in ("none", "tanh")]

    def inputs(self, module, context):
        layout = _layout(module)
        size = (module.c_fc.weight.shape[0] if layout == "gpt2_mlp"
                else module.fc_in.in_features if layout == "linear_mlp" else module.dense.in_features)

        def make(dtype, device):
            generator = torch.Generator().manual_seed(probe.PROBE_SEED)
            x = torch.randn(2, 3, size, generator=generator, dtype=torch.float64)
            return (x.to(device, dtype or torch.float64),), {}
        return probe.Inputs(make)
