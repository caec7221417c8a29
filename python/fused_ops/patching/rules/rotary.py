"""Rotary embedding inside an attention: its forward, with the global `apply_rotary_pos_emb` it really
calls bound to the fused op. Which layout the tables and the rotation have is the one the probe proves:
  rotate_half               Llama's: pairs (j, j + R/2), tables [.., R] as the rotary module gives them
  interleaved               GPT-J's pairs (2i, 2i + 1), tables repeated per pair (Cohere)
  interleaved_half_table    GPT-J's pairs from tables whose first half is repeated per pair (GLM)
  rotate_half_half_table    Llama's pairs from tables of R/2 (gpt-oss)
Partial rotary (R below the head size, the rest passed through) is the op's own.
"""
import inspect

import torch

from ... import _ops
from ..swap import forward_builder, innermost, with_global
from . import LeftAlone, Rule


def _tables(cos, sin, layout):
    if layout == "interleaved_half_table":
        half = cos.shape[-1] // 2
        return cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)
    if layout == "rotate_half_half_table":
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return cos, sin


def _rotate(q, k, cos, sin, unsqueeze_dim, layout):
    cos, sin = _tables(cos, sin, layout)
    return _ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved=layout.startswith("interleaved"))


def _rotate_one(x, cos, sin, unsqueeze_dim, layout):
    """One tensor's rotation (Gemma 3n and 4 rotate queries and keys in separate calls): the op's keys
    are a detached view of no heads, so nothing is computed or differentiated for them."""
    no_heads = x.detach().narrow(unsqueeze_dim % 4, 0, 0)
    return _rotate(x, no_heads, cos, sin, unsqueeze_dim, layout)[0]


# The signatures transformers' apply_rotary_pos_emb has; the replacement keeps the one it replaces, so
# positional arguments mean what they meant.
_SIGNATURES = {
    ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"): "with_position_ids",
    ("q", "k", "cos", "sin", "unsqueeze_dim"): "without_position_ids",
    ("x", "cos", "sin", "unsqueeze_dim"): "one_tensor",
}


def _replacement(layout, signature):
    if signature == "with_position_ids":
        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            return _rotate(q, k, cos, sin, unsqueeze_dim, layout)
    elif signature == "one_tensor":
        def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
            return _rotate_one(x, cos, sin, unsqueeze_dim, layout)
    else:
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            return _rotate(q, k, cos, sin, unsqueeze_dim, layout)
    return apply_rotary_pos_emb


LAYOUTS = ("rotate_half", "interleaved", "interleaved_half_table", "rotate_half_half_table")


@forward_builder("rotary")
def _rotary_forward(base, options):
    return with_global(base.forward, "apply_rotary_pos_emb", _replacement(options["layout"], options["signature"]))


def _signature(function):
    try:
        parameters = inspect.signature(innermost(function)).parameters.values()
    except (TypeError, ValueError):
        return None
    return _SIGNATURES.get(tuple(p.name for p in parameters))


class RotaryRule(Rule):
    kind = "rotary"
    description = "rotary embedding in the attention -> rotary_embedding"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            forward = innermost(type(module).forward)
            code = getattr(forward, "__code__", None)
            if code is not None and "apply_rotary_pos_emb" in code.co_names:
                yield name, module

    def variants(self, module, context):
        function = innermost(type(module).forward).__globals__.get("apply_rotary_pos_emb")
        if not callable(function):
            raise LeftAlone("apply_rotary_pos_emb is not a global function of its forward's module")
        signature = _signature(function)
        if signature is None:
            raise LeftAlone("apply_rotary_pos_emb takes other arguments than (q, k, cos, sin[, position_ids], "
                            "unsqueeze_dim) or (x, cos, sin, unsqueeze_dim)")
        if with_global(type(module).forward, "apply_rotary_pos_emb", None) is None:
            raise LeftAlone("its forward's decorators do not hold the function they wrap")
        return [(("layout", layout), ("signature", signature)) for layout in LAYOUTS]

    def inputs(self, module, context):
        return context.captured_inputs(module)
