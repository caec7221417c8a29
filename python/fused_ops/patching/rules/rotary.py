"""Rotary embedding inside an attention: its forward, with the global `apply_rotary_pos_emb` it really
calls bound to the fused op. Which layout (rotate_half or GPT-J's interleaved pairs) is the one the
probe proves."""
from ... import _ops
from .. import probe
from ..swap import forward_builder, innermost, with_global
from . import LeftAlone, Rule


def rotary_rotate_half(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    return _ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim)


def rotary_interleaved(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    return _ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved=True)


_LAYOUTS = {"rotate_half": rotary_rotate_half, "interleaved": rotary_interleaved}


@forward_builder("rotary")
def _rotary_forward(base, options):
    return with_global(base.forward, "apply_rotary_pos_emb", _LAYOUTS[options["layout"]])


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
        if not callable(innermost(type(module).forward).__globals__.get("apply_rotary_pos_emb")):
            raise LeftAlone("apply_rotary_pos_emb is not a global function of its forward's module")
        if with_global(type(module).forward, "apply_rotary_pos_emb", None) is None:
            raise LeftAlone("its forward's decorators do not hold the function they wrap")
        return [(("layout", layout),) for layout in _LAYOUTS]

    def inputs(self, module, context):
        return context.captured_inputs(module)
