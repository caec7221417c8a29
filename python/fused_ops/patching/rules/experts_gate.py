"""The experts' gate of a mixture of experts: `act(gate) * up` on the halves of the grouped gate_up product.

transformers' experts implementations (grouped and batched products) call the experts module's
`_apply_gate(gate_up_out)` between the two products; that hook is what is replaced, so the products, the
routing and the experts' parameters stay transformers' own. Proven on the experts call of the model's probe
forward (its real routing), on a path that calls `_apply_gate`: the model's experts implementation where it
does, else the batched products (the eager loop never calls it, and a proof where neither forward runs the
gate proves nothing about the implementation a user switches to after fuse()).
"""
import contextlib

from ... import _ops
from .. import probe
from ..swap import activation_children, forward_builder
from . import LeftAlone, Rule
from .gated_mlp import ACTIVATIONS

# The experts implementation a proof runs on where the model's own never calls `_apply_gate` (float64 on the CPU).
_PROOF_IMPLEMENTATION = "batched_mm"


@forward_builder("experts_gate", methods=("_apply_gate",),
                 skips=lambda options: tuple(name for name, _ in options.get("_activation_children") or ()))
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

    def summary(self, options):
        return f"the experts' {options['activation']} gate x up as one op between transformers' expert products"

    def variants(self, module, context):
        if not getattr(module, "has_gate", False):
            raise LeftAlone("its experts have no gate (has_gate is False)")
        return [(("activation", activation), ("_activation_children", activation_children(module)))
                for activation in ACTIVATIONS]

    def inputs(self, module, context):
        return context.captured_inputs(module)

    def verify(self, module, fused_cls, context):
        inputs = self.inputs(module, context)
        calls = []
        stock_gate = type(module)._apply_gate

        def counted_gate(self, gate_up_out):
            calls.append(1)
            return stock_gate(self, gate_up_out)
        counting = type(type(module).__name__, (type(module),), {"_apply_gate": counted_gate})
        for implementation in (None, _PROOF_IMPLEMENTATION):
            calls.clear()
            try:
                with _experts_implementation(module, implementation), probe.as_class(module, counting):
                    probe.verify(module, fused_cls, inputs, large_inputs=self.large_inputs)
            except probe.Mismatch:
                if calls:  # a mismatch on a path that calls the gate: not this variant
                    raise
            if calls:
                return
        raise probe.Mismatch("its forward never calls _apply_gate, on its own experts implementation or on "
                             f"{_PROOF_IMPLEMENTATION!r}")


@contextlib.contextmanager
def _experts_implementation(module, implementation):
    """The experts module's config set to run `implementation` (None: as it is) while the block runs."""
    config = getattr(module, "config", None)
    if implementation is None or config is None or "_experts_implementation_internal" not in vars(config):
        yield
        return
    saved = config._experts_implementation_internal
    config._experts_implementation_internal = implementation
    try:
        yield
    finally:
        config._experts_implementation_internal = saved
