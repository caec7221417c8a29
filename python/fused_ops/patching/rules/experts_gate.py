"""The experts' gate of a mixture of experts: `act(gate) * up` on the halves of the grouped gate_up product.

transformers' experts implementations (grouped and batched products) call the experts module's
`_apply_gate(gate_up_out)` between the two products; that hook is what is replaced, so the products, the
routing and the experts' parameters stay transformers' own. Proven on the experts call of the model's probe
forward (its real routing), like every rule.
"""
from ... import _ops
from ..swap import activation_children, forward_builder
from . import LeftAlone, Rule
from .gated_mlp import ACTIVATIONS


@forward_builder("experts_gate", methods=("_apply_gate",))
def _experts_gate_methods(base, options):
    # None in a model pickled before the option existed: the stock forward (activation_children never equals it).
    activation, activations = options["activation"], options.get("_activation_children")
    stock = base._apply_gate

    def _apply_gate(self, gate_up_out):
        if activation_children(self) != activations:  # an activation replaced after fuse(): the stock gate's
            return stock(self, gate_up_out)
        gate, up = gate_up_out.chunk(2, dim=-1)
        return _ops.gated_mul(gate, up, activation)
    return {"_apply_gate": _apply_gate}


class ExpertsGateRule(Rule):
    kind = "experts_gate"
    large_inputs = True
    description = "experts' gate act(gate) * up -> gated_mul (between transformers' grouped expert products)"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if callable(getattr(type(module), "_apply_gate", None)) and "gate_up_proj" in module._parameters:
                yield name, module

    def variants(self, module, context):
        if not getattr(module, "has_gate", False):
            raise LeftAlone("its experts have no gate (has_gate is False)")
        return [(("activation", activation), ("_activation_children", activation_children(module)))
                for activation in ACTIVATIONS]

    def inputs(self, module, context):
        return context.captured_inputs(module)
