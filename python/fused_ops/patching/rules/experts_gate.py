"""A mixture of experts' experts: the routed pairs through this library's experts ops, and the gate
`act(gate) * up` between transformers' grouped products where those run.

The experts module (transformers' `@use_experts_implementation` classes) gets a forward that runs
moe_permute, moe_expert_mlp and moe_unpermute (fused_ops/experts.py) while the model's experts
implementation is one of those proven to compute the same function (eager, grouped_mm, batched_mm: each
proven on its own, on the experts call of the model's probe forward, with its real routing), and the stock
forward otherwise (sonicmoe, deepgemm, an implementation set after fuse() that was not proven, an activation
or weight replaced after fuse()). Its `_apply_gate`, which transformers' grouped and batched products call
between the two products, is gated_mul where the gate is act(gate) * up. Such a gate is proven first on a path
that calls `_apply_gate`: the model's experts implementation where it does, else the batched products (the
eager loop never calls it); gpt-oss's clamped gate, which stays its own there, is proven through the experts
ops alone.
"""
import contextlib

from ... import _ops, experts as fused_experts
from .. import probe
from ..swap import activation_children, forward_builder
from . import LeftAlone, Rule
from .gated_mlp import ACTIVATIONS

# The experts implementation a proof runs on where the model's own never calls `_apply_gate` (float64 on the CPU).
_PROOF_IMPLEMENTATION = "batched_mm"


def _current_implementation(module):
    config = getattr(module, "config", None)
    return getattr(config, "_experts_implementation", None)


@forward_builder("experts_gate", methods=("_apply_gate", "forward"),
                 skips=lambda options: tuple(name for name, _ in options.get("_activation_children") or ()))
def _experts_gate_methods(base, options):
    # None in a model pickled before the option existed: the stock forward (activation_children never equals it).
    activation, activations = options["activation"], options.get("_activation_children")
    implementations = options.get("implementations") or ()
    gate_options = _gate(options)
    stock_gate, stock_forward = base._apply_gate, base.forward

    def _apply_gate(self, gate_up_out):
        # An activation replaced after fuse(), or a gate gated_mul does not compute: the stock gate's.
        if activation_children(self) != activations or activation not in ACTIVATIONS:
            return stock_gate(self, gate_up_out)
        if gate_options["interleaved"]:
            return _ops.gated_mul(gate_up_out[..., ::2], gate_up_out[..., 1::2], activation)
        gate, up = gate_up_out.chunk(2, dim=-1)
        return _ops.gated_mul(gate, up, activation)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if (_current_implementation(self) not in implementations or activation_children(self) != activations
                or not fused_experts.takes(self)):
            return stock_forward(self, hidden_states, top_k_index, top_k_weights)
        return fused_experts.fused_experts(self, hidden_states, top_k_index, top_k_weights, gate_options)
    return {"_apply_gate": _apply_gate, "forward": forward}


def _gate(options):
    """The gate variant of a swap's options (fused_ops/experts.py's gate_variants)."""
    return dict(activation=options["activation"], interleaved=options.get("interleaved", False),
                alpha=options.get("alpha", fused_experts.DEFAULT_ALPHA),
                limit=options.get("limit", fused_experts.DEFAULT_LIMIT))


class ExpertsGateRule(Rule):
    kind = "experts_gate"
    large_inputs = True
    description = ("experts -> moe_permute + moe_expert_mlp + moe_unpermute (the gathered rows, gate/up output and "
                   "activation recomputed, not saved); their gate act(gate) * up -> gated_mul")
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if fused_experts.is_experts_module(module):
                yield name, module

    def summary(self, options):
        if options.get("implementations"):
            gate = "gpt-oss's clamped SwiGLU" if options["activation"] == fused_experts.CLAMPED_SWIGLU else \
                f"{options['activation']} gate"
            return (f"the routed experts ({gate}) through fused_ops' experts ops, which keep only the hidden states "
                    "and the routing for the backward")
        return f"the experts' {options['activation']} gate x up as one op between transformers' expert products"

    def variants(self, module, context):
        if not getattr(module, "has_gate", False):
            raise LeftAlone("its experts have no gate (has_gate is False)")
        variants = []
        for gate in fused_experts.gate_variants(module):
            # Only what differs from an act(gate) * up gate on halves is named (the options of earlier swaps).
            extra = ((("interleaved", True),) if gate["interleaved"] else ()) + (
                (("alpha", gate["alpha"]), ("limit", gate["limit"])) if gate["activation"] not in ACTIVATIONS else ())
            variants.append((("activation", gate["activation"]),) + extra
                            + (("_activation_children", activation_children(module)),))
        return variants

    def inputs(self, module, context):
        return context.captured_inputs(module)

    def verify(self, module, fused_cls, context):
        inputs = self.inputs(module, context)
        options = fused_cls._fused_ops_options
        if dict(options)["activation"] not in ACTIVATIONS:  # a gate kept as it is: the experts ops prove it
            implementation = _current_implementation(module)
            if implementation not in fused_experts.STOCK_IMPLEMENTATIONS or not fused_experts.takes(module):
                raise probe.Mismatch(f"its gate is its own, and its experts implementation ({implementation!r}) "
                                     "or weights are not ones the experts ops take")
            cls = self.fused_class(module, tuple(options) + (("implementations", (implementation,)),))
            probe.verify(module, cls, inputs, large_inputs=self.large_inputs)
            return
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

    def proven_options(self, module, options, context):
        """The gate's options, and the experts implementations on which the experts ops are proven to compute
        what the implementation does (none where the layout is not one they take)."""
        if not fused_experts.takes(module) or _current_implementation(module) is None:
            return options
        inputs, proven = self.inputs(module, context), []
        # A gate kept as it is was proven on the model's own implementation by verify already.
        own = _current_implementation(module) if dict(options)["activation"] not in ACTIVATIONS else None
        for implementation in fused_experts.STOCK_IMPLEMENTATIONS:
            if implementation == own:
                proven.append(implementation)
                continue
            fused_cls = self.fused_class(module, tuple(options) + (("implementations", (implementation,)),))
            try:
                with _experts_implementation(module, implementation):
                    probe.verify(module, fused_cls, inputs)
            except probe.Mismatch:
                continue
            proven.append(implementation)
        if proven:  # the model may then also be set to "fused_ops" itself
            fused_experts.register()
        return tuple(options) + ((("implementations", tuple(proven)),) if proven else ())


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
