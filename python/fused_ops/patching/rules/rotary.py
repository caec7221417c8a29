"""Rotary embedding inside an attention: its forward, with the global `apply_rotary_pos_emb` it really
calls bound to the fused op. Which layout the tables and the rotation have is the one the probe proves:
  rotate_half               Llama's: pairs (j, j + R/2), tables [.., R] as the rotary module gives them
  interleaved               GPT-J's pairs (2i, 2i + 1), tables repeated per pair (Cohere)
  interleaved_half_table    GPT-J's pairs from tables whose first half is repeated per pair (GLM)
  rotate_half_half_table    Llama's pairs from tables of R/2 (gpt-oss)
  complex_heads_*           GPT-J's pairs times complex factors (Llama 4's and DeepSeek-V2's apply_rotary_emb)
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


def _rotate_complex(xq, xk, freqs_cis, unsqueeze_dim):
    """Llama 4's and DeepSeek-V2's rotation, pairs (2i, 2i + 1) times complex factors [B, S, D/2]: the
    interleaved rotation with the factors' real and imaginary parts as cos and sin, in float32 for 16-bit
    heads as their forwards compute it."""
    table_dtype = torch.float32 if xq.dtype in (torch.float16, torch.bfloat16) else xq.dtype
    cos = freqs_cis.real.repeat_interleave(2, dim=-1).to(xq.device, table_dtype)
    sin = freqs_cis.imag.repeat_interleave(2, dim=-1).to(xq.device, table_dtype)
    return _ops.rotary_embedding(xq, xk, cos, sin, unsqueeze_dim, interleaved=True)


# The signatures transformers' rotary functions have (by the global name each is called by); the
# replacement keeps the one it replaces, so positional arguments mean what they meant.
_SIGNATURES = {
    ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"): "with_position_ids",
    ("q", "k", "cos", "sin", "unsqueeze_dim"): "without_position_ids",
    ("x", "cos", "sin", "unsqueeze_dim"): "one_tensor",
    ("xq", "xk", "freqs_cis"): "complex_factors",
}
_FUNCTION_NAMES = ("apply_rotary_pos_emb", "apply_rotary_emb")


def _replacement(layout, signature):
    if signature == "with_position_ids":
        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            return _rotate(q, k, cos, sin, unsqueeze_dim, layout)
    elif signature == "one_tensor":
        def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
            return _rotate_one(x, cos, sin, unsqueeze_dim, layout)
    elif signature == "complex_factors":
        heads_dim = 1 if layout == "complex_heads_second" else 2

        def apply_rotary_pos_emb(xq, xk, freqs_cis):
            return _rotate_complex(xq, xk, freqs_cis, heads_dim)
    else:
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            return _rotate(q, k, cos, sin, unsqueeze_dim, layout)
    return apply_rotary_pos_emb


LAYOUTS = ("rotate_half", "interleaved", "interleaved_half_table", "rotate_half_half_table")
# Complex factors broadcast over the heads in dim 1 (DeepSeek-V2: [B, H, S, D]) or dim 2 (Llama 4).
COMPLEX_LAYOUTS = ("complex_heads_second", "complex_heads_third")


@forward_builder("rotary")
def _rotary_forward(base, options):
    return with_global(base.forward, options["function"], _replacement(options["layout"], options["signature"]))


def _signature(function):
    try:
        parameters = inspect.signature(innermost(function)).parameters.values()
    except (TypeError, ValueError):
        return None
    return _SIGNATURES.get(tuple(p.name for p in parameters))


def _called_function(module):
    """The rotary function's global name that the module's forward calls."""
    code = getattr(innermost(type(module).forward), "__code__", None)
    return next((name for name in _FUNCTION_NAMES if code is not None and name in code.co_names), None)


class RotaryRule(Rule):
    kind = "rotary"
    description = "rotary embedding in the attention -> rotary_embedding"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if _called_function(module) is not None:
                yield name, module

    def variants(self, module, context):
        name = _called_function(module)
        function = innermost(type(module).forward).__globals__.get(name)
        if not callable(function):
            raise LeftAlone(f"{name} is not a global function of its forward's module")
        signature = _signature(function)
        if signature is None:
            raise LeftAlone(f"{name} takes other arguments than (q, k, cos, sin[, position_ids], unsqueeze_dim), "
                            "(x, cos, sin, unsqueeze_dim) or (xq, xk, freqs_cis)")
        if with_global(type(module).forward, name, None) is None:
            raise LeftAlone("its forward's decorators do not hold the function they wrap")
        layouts = COMPLEX_LAYOUTS if signature == "complex_factors" else LAYOUTS
        return [(("function", name), ("layout", layout), ("signature", signature)) for layout in layouts]

    def inputs(self, module, context):
        return context.captured_inputs(module)
