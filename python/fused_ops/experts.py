"""transformers' experts implementation `"fused_ops"`: a mixture of experts' routed experts through this
library's ops (moe_permute, moe_expert_mlp, moe_unpermute), which keep for the backward only the hidden states
and the routing, where transformers' grouped products keep the gathered rows, the gate/up output and the
activation of every pair.

    fused_ops.experts.register()                  # makes "fused_ops" one of transformers' implementations
    model.set_experts_implementation("fused_ops")
    fused_ops.experts.set_recompute(model, False)  # optional: keep the gate/up product, skip it in the backward

`fused_ops.fuse(model)` selects it by itself for every experts module whose gate it proves. The gates it
computes: act(gate) * up for SiLU, GELU and tanh-GELU, and gpt-oss's clamped SwiGLU, on [gate; up] halves or
interleaved columns. Experts it cannot take (no gate, quantised weights, another gate) run transformers'
grouped products instead: the result is the stock one either way. The gate is proven at a module's first
call outside torch.compile's tracing; a model compiled before any eager call traces transformers' grouped
products (fuse() proves the gate up front, so a fused model compiles with the experts ops).
"""
import torch

from . import _ops
from .patching.swap import holds_plain_tensors

IMPLEMENTATION = "fused_ops"
ACTIVATIONS = ("silu", "gelu_tanh", "gelu")
# gpt-oss's gate: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = clamp(gate, max=limit).
CLAMPED_SWIGLU = "swiglu_oai"
# The clamped gate's constants where a gate has none of its own (the ops' defaults; unused by the other gates).
DEFAULT_ALPHA, DEFAULT_LIMIT = 1.702, 7.0
# Implementations of transformers that compute the same function as this one (checked per family by fuse()).
STOCK_IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")
# An experts module's choice of set_recompute (absent: recompute).
_RECOMPUTE = "_fused_ops_recompute"
# The gate is proven on values of these scales: a clamp (gpt-oss clamps at 7) shows at the larger one.
_PROOF_SCALES = (1.0, 1e3)
_PROOF_RTOL = 1e-6


def register() -> None:
    """Registers `"fused_ops"` in transformers' ExpertsInterface (again: nothing changes)."""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(IMPLEMENTATION, experts_forward)


def set_recompute(model: torch.nn.Module, recompute: bool) -> int:
    """Whether the backward of each experts module in `model` recomputes the gate/up product (True, the
    default: only the hidden states and the routing kept) or takes it from the forward (False: [pairs, 2I] kept
    per layer, 0.22x of what transformers' grouped products keep at Qwen3-30B-A3B's shape, and one of the
    backward's five products skipped). The values are the same either way. Returns how many modules it set."""
    count = 0
    for module in model.modules():
        if is_experts_module(module):
            setattr(module, _RECOMPUTE, bool(recompute))
            count += 1
    return count


def is_experts_module(module) -> bool:
    """A module of transformers' experts classes: a gate/up weight of its own and an `_apply_gate` method."""
    return "gate_up_proj" in module._parameters and callable(getattr(type(module), "_apply_gate", None))


def takes(experts) -> bool:
    """Whether the experts module's layout is one this implementation computes: a gate, gate and up in one
    3-D weight (halves or interleaved: proven_gate tells which), plain 3-D weights (and biases)."""
    if not getattr(experts, "has_gate", False):
        return False
    names = ("gate_up_proj", "down_proj") + (("gate_up_proj_bias", "down_proj_bias")
                                             if getattr(experts, "has_bias", False) else ())
    if not holds_plain_tensors(experts, *names):
        return False
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    return isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == down.dim() == 3


def gate_variants(experts):
    """Each gate this implementation computes, as the options of the experts ops ({activation, interleaved,
    alpha, limit}), the gpt-oss one with the module's own alpha and limit."""
    layouts = (False, True)  # [gate; up] halves, as most families store them, tried first
    variants = [dict(activation=a, interleaved=i, alpha=DEFAULT_ALPHA, limit=DEFAULT_LIMIT)
                for i in layouts for a in ACTIVATIONS]
    alpha, limit = getattr(experts, "alpha", None), getattr(experts, "limit", None)
    if isinstance(alpha, (int, float)) and isinstance(limit, (int, float)) and limit > 0:
        variants += [dict(activation=CLAMPED_SWIGLU, interleaved=i, alpha=float(alpha), limit=float(limit))
                     for i in reversed(layouts)]  # gpt-oss interleaves them
    return variants


def reference_gate(gate_up, activation, interleaved, alpha, limit):
    """A gate variant in plain torch (what the experts ops compute, checked against them in the tests)."""
    gate, up = (gate_up[..., ::2], gate_up[..., 1::2]) if interleaved else gate_up.chunk(2, dim=-1)
    if activation == CLAMPED_SWIGLU:
        g = gate.clamp(max=limit)
        return (up.clamp(-limit, limit) + 1) * g * torch.sigmoid(g * alpha)
    return _ops.gated_mul(gate.contiguous(), up.contiguous(), activation)


def gate_key(experts):
    """What the gate's function depends on beyond its code: the classes of its method and activation, the
    constants a clamped gate reads."""
    return (type(experts)._apply_gate, type(getattr(experts, "act_fn", None)), getattr(experts, "alpha", None),
            getattr(experts, "limit", None))


def proven_gate(experts):
    """The gate variant (gate_variants) equal to `experts._apply_gate(gate_up)` on random float64 values at unit
    and large scale, or None. Cached on the module by gate_key."""
    key = gate_key(experts)
    cached = experts.__dict__.get("_fused_ops_gate")
    if cached is not None and cached[0] == key:
        return cached[1]
    if torch.compiler.is_compiling():  # no proof while tracing: the stock products
        return None
    generator = torch.Generator().manual_seed(20261207)
    values = torch.randn(7, 2 * 24, generator=generator, dtype=torch.float64)
    found = None
    for variant in gate_variants(experts):
        try:
            with torch.no_grad():
                matches = all(torch.allclose(experts._apply_gate(values * scale),
                                             reference_gate(values * scale, **variant), rtol=_PROOF_RTOL, atol=0.0)
                              for scale in _PROOF_SCALES)
        except Exception:  # a gate that cannot run on float64 rows of this width proves nothing
            matches = False
        if matches:
            found = variant
            break
    experts.__dict__["_fused_ops_gate"] = (key, found)
    return found


def fused_experts(experts, hidden_states, top_k_index, top_k_weights, gate):
    """The experts' output through this library's ops with the gate variant `gate` (gate_variants), in
    hidden_states' dtype (the products in the weights' dtype, as transformers' are)."""
    weight_dtype = experts.gate_up_proj.dtype
    has_bias = getattr(experts, "has_bias", False)
    out = _ops.moe_experts(hidden_states.to(weight_dtype), top_k_index, top_k_weights, experts.gate_up_proj,
                           experts.down_proj, experts.gate_up_proj_bias if has_bias else None,
                           experts.down_proj_bias if has_bias else None, gate["activation"],
                           bool(getattr(experts, "is_transposed", False)), gate["interleaved"], gate["alpha"],
                           gate["limit"], getattr(experts, _RECOMPUTE, True))
    return out.to(hidden_states.dtype)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' experts forward signature: (experts module, hidden states [T, H], top-k expert indices
    [T, k], top-k routing weights [T, k]) -> [T, H]."""
    gate = proven_gate(self) if takes(self) else None
    if gate is None:
        from transformers.integrations.moe import grouped_mm_experts_forward
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    return fused_experts(self, hidden_states, top_k_index, top_k_weights, gate)



