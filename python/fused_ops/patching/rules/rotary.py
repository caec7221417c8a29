"""Rotary embedding inside an attention: its forward, with the global `apply_rotary_pos_emb` it really
calls bound to the fused op. Which layout the tables and the rotation have is the one the probe proves:
  rotate_half               Llama's: pairs (j, j + R/2), tables [.., R] as the rotary module gives them
  interleaved               GPT-J's pairs (2i, 2i + 1), tables repeated per pair (Cohere)
  interleaved_half_table    GPT-J's pairs from tables whose first half is repeated per pair (GLM)
  rotate_half_half_table    Llama's pairs from tables of R/2 (gpt-oss)
  complex_heads_*           GPT-J's pairs times complex factors (Llama 4's and DeepSeek-V2's apply_rotary_emb)
GPT-J's and CodeGen's own function rotates one [B, S, H, D] tensor a call by tables of one value a pair,
(tensor, sin, cos): the interleaved rotation with the tables repeated per pair.
DeepSeek-V3's and Mistral 4's apply_rotary_pos_emb_interleave lays pairs out as halves first, then rotates
them as Llama's; the forward must call the function replaced (its config may pick another).
Partial rotary (R below the head size, the rest passed through) is the op's own.
"""
import inspect

import torch

from ... import _ops
from .. import probe
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
    ("tensor", "sin", "cos"): "sin_cos_pairs",  # GPT-J's: [B, S, H, D] and tables [B, S, R/2], one per pair
}
_FUNCTION_NAMES = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_emb")


def _halves_of_pairs(x):
    """x's pairs (2i, 2i + 1) laid out as halves (i, i + D/2), as DeepSeek-V3's and Mistral 4's
    apply_rotary_pos_emb_interleave lays out its result."""
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


def _runs_the_op(tensors, under_autocast):
    """Whether the op may take these tensors (q, k, cos, sin or x, cos, sin): of one dtype, as the probes
    prove; or, where the probe proved the attention under autocast too, under autocast with 16-bit heads of
    one dtype and tables of theirs or float32. Otherwise the stock function runs: it promotes mixed dtypes
    its own way (Llama's to float32 heads; HY-V4 rotates float32 keys beside 16-bit queries)."""
    heads, tables = tensors[:-2], tensors[-2:]
    if len({t.dtype for t in tensors}) == 1:
        return True
    return (under_autocast and torch.is_autocast_enabled(heads[0].device.type)
            and len({t.dtype for t in heads}) == 1 and heads[0].dtype in (torch.float16, torch.bfloat16)
            and len({t.dtype for t in tables}) == 1 and tables[0].dtype in (heads[0].dtype, torch.float32))


def _replacement(name, layout, signature, stock, under_autocast):
    if name == "apply_rotary_pos_emb_interleave":
        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            if not _runs_the_op((q, k, cos, sin), under_autocast):
                return stock(q, k, cos, sin, position_ids, unsqueeze_dim)
            return _rotate(_halves_of_pairs(q), _halves_of_pairs(k), cos, sin, unsqueeze_dim, layout)
    elif signature == "with_position_ids":
        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
            if not _runs_the_op((q, k, cos, sin), under_autocast):
                return stock(q, k, cos, sin, position_ids, unsqueeze_dim)
            return _rotate(q, k, cos, sin, unsqueeze_dim, layout)
    elif signature == "one_tensor":
        def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1):
            if not _runs_the_op((x, cos, sin), under_autocast):
                return stock(x, cos, sin, unsqueeze_dim)
            return _rotate_one(x, cos, sin, unsqueeze_dim, layout)
    elif signature == "complex_factors":
        heads_dim = 1 if layout == "complex_heads_second" else 2

        def apply_rotary_pos_emb(xq, xk, freqs_cis):  # complex factors beside real heads: mixed by design
            return _rotate_complex(xq, xk, freqs_cis, heads_dim)
    elif signature == "sin_cos_pairs":
        def apply_rotary_pos_emb(tensor, sin, cos):
            if not _runs_the_op((tensor, cos, sin), under_autocast):
                return stock(tensor, sin, cos)
            return _rotate_one(tensor, cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1), 2, layout)
    else:
        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
            if not _runs_the_op((q, k, cos, sin), under_autocast):
                return stock(q, k, cos, sin, unsqueeze_dim)
            return _rotate(q, k, cos, sin, unsqueeze_dim, layout)
    return apply_rotary_pos_emb


LAYOUTS = ("rotate_half", "interleaved", "interleaved_half_table", "rotate_half_half_table")
# The option saying the op may take 16-bit heads with float32 tables under autocast (_runs_the_op).
UNDER_AUTOCAST = "under_autocast"
# Complex factors broadcast over the heads in dim 1 (DeepSeek-V2: [B, H, S, D]) or dim 2 (Llama 4).
COMPLEX_LAYOUTS = ("complex_heads_second", "complex_heads_third")


@forward_builder("rotary")
def _rotary_forward(base, options):
    name = options["function"]
    stock = innermost(base.forward).__globals__[name]
    replacement = _replacement(name, options["layout"], options["signature"], stock, options.get(UNDER_AUTOCAST))
    return with_global(base.forward, name, replacement)


def _signature(function):
    try:
        parameters = inspect.signature(innermost(function)).parameters.values()
    except (TypeError, ValueError):
        return None
    return _SIGNATURES.get(tuple(p.name for p in parameters))


def _called_functions(module):
    """The rotary functions' global names that the module's forward may call (DeepSeek-V3's picks one of
    two by its config)."""
    code = getattr(innermost(type(module).forward), "__code__", None)
    return [name for name in _FUNCTION_NAMES if code is not None and name in code.co_names]


class RotaryRule(Rule):
    kind = "rotary"
    description = "rotary embedding in the attention -> rotary_embedding"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if _called_functions(module):
                yield name, module

    def variants(self, module, context):
        variants, reasons = [], []
        for name in _called_functions(module):
            function = innermost(type(module).forward).__globals__.get(name)
            signature = _signature(function) if callable(function) else None
            if signature is None:
                reasons.append(f"{name} is not a global function taking (q, k, cos, sin[, position_ids], "
                               "unsqueeze_dim), (x, cos, sin, unsqueeze_dim), (xq, xk, freqs_cis) or "
                               "(tensor, sin, cos)")
            elif with_global(type(module).forward, name, None) is None:
                reasons.append("its forward's decorators do not hold the function they wrap")
            else:
                layouts = {"complex_factors": COMPLEX_LAYOUTS, "sin_cos_pairs": ("interleaved",)}.get(signature, LAYOUTS)
                variants += [(("function", name), ("layout", layout), ("signature", signature)) for layout in layouts]
        if not variants:
            raise LeftAlone("; ".join(reasons))
        return variants

    def inputs(self, module, context):
        return context.captured_inputs(module)

    def proven_options(self, module, options, context):
        """The proven options, and whether the attention also computes what its own forward does under
        autocast with float32 parameters, where its heads are 16-bit and its tables float32."""
        under_autocast = tuple(options) + ((UNDER_AUTOCAST, True),)
        try:
            probe.verify_in_mixed_precision(module, self.fused_class(module, under_autocast),
                                            self.inputs(module, context), under_autocast=True)
        except Exception:  # a mismatch, or a forward that cannot run so: not proven
            return tuple(options) + ((UNDER_AUTOCAST, False),)
        return under_autocast

    def verify(self, module, fused_cls, context):
        inputs = self.inputs(module, context)
        probe.verify(module, fused_cls, inputs)
        if not probe.runs_a_fused_op(module, fused_cls, inputs):
            raise probe.Mismatch("its forward does not call this function (its config picks another)")
