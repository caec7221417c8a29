"""Attention with a learned sink logit per head (gpt-oss) as one attention_with_sinks call. transformers runs such
attention eagerly: it materialises the scores and a mask of size S x S for every head, appends the sink logit,
takes the softmax and drops the sink column, and keeps the probabilities for the backward. Under eager attention
the base model here hands these layers a marker instead of the mask in the plain causal case (rules/causal_mask.py:
FullCausal, or SlidingWindowCausal for a sliding layer), and their attention runs attention_with_sinks with the
window: on the GPU torch's flash kernels, the sink folded into a rescale of their output. Anything else (a mask
that is a tensor, attention dropout, another attention implementation, the proof's reference) runs the module's
own attention, the marker materialised as the mask transformers builds for it."""
import torch

from ... import _ops
from ..swap import forward_builder, forward_option, innermost, with_global
from . import LeftAlone, Rule
from .sliding_window import (MARKERS, FullCausal, SlidingWindowCausal, count_taken, marker_aware,
                             settle_marker_consumers, sliding_window_mask, verify_with_markers)


def eager_mask(marker, query, key):
    """The additive mask transformers' eager attention takes for the marker's pattern: 0 where a query sees the
    key, the dtype's least value elsewhere, [B, 1, Q, K]."""
    allowed = sliding_window_mask(marker.window, query.shape[2], key.shape[2], query.device)
    mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    mask = mask.masked_fill(~allowed, torch.finfo(query.dtype).min)
    return mask.expand(query.shape[0], 1, *mask.shape)


def sink_attention(attention, default, reference, module, query, key, value, attention_mask, *args, **kwargs):
    """An attention function that takes the markers: attention_with_sinks where the call is the module's own
    eager attention with no dropout, queries and keys aligned; the materialised mask otherwise (and as the
    reference a proof compares with). Queries, keys and values as (batch, heads, length, dim), the output as
    (batch, length, heads, dim), as transformers' attention functions take and give them."""
    if not isinstance(attention_mask, MARKERS):
        return attention(module, query, key, value, attention_mask, *args, **kwargs)
    count_taken()
    dropout, scaling = kwargs.get("dropout", 0.0), kwargs.get("scaling")
    sinks = getattr(module, "sinks", None)
    if (reference or args or default is None or attention is not default or query.shape[2] != key.shape[2]
            or value.shape != key.shape or key.shape[-1] != query.shape[-1] or query.shape[1] % key.shape[1]
            or not isinstance(dropout, (int, float)) or dropout != 0 or not isinstance(scaling, float)
            or not torch.is_tensor(sinks) or sinks.shape != (query.shape[1],)):
        return attention(module, query, key, value, eager_mask(attention_mask, query, key), *args, **kwargs)
    output = _ops.attention_with_sinks(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), sinks,
                                       scaling, attention_mask.window)
    return output, None


@forward_option("sink_attention")
def _sink_attention_forward(forward, value):
    """`forward` with its attention functions taking the markers; "reference" materialises their masks."""
    return marker_aware(forward, sink_attention, value == "reference")


@forward_builder("attention_sinks")
def _stock_forward(base, options):
    """An attention no other rule has swapped: its own forward, made marker-aware by the option."""
    return base.forward


# The markers the proof hands the attention on the probe's six tokens: the full causal pattern, and windows of
# two, three and five (one block, a window the sequence overruns by one, and one it overruns by four).
_PROOF_MARKERS = (FullCausal(), SlidingWindowCausal(2), SlidingWindowCausal(3), SlidingWindowCausal(5))


def _attention_output(output):
    return output[0] if isinstance(output, tuple) else output


class AttentionSinksRule(Rule):
    kind = "attention_sinks"
    description = ("eager attention with a sink logit per head (gpt-oss) -> attention_with_sinks (torch's flash "
                   "kernels with the window on the GPU; no S x S scores or mask)")
    needs_capture = True
    adds_to_fused = True  # an attention whose rotary embedding is swapped takes the markers on top

    def candidates(self, model):
        for name, module in model.named_modules():
            code = getattr(innermost(type(module).forward), "__code__", None)
            if (code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names
                    and isinstance(module._parameters.get("sinks"), torch.nn.Parameter)):
                yield name, module

    def variants(self, module, context):
        implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if implementation != "eager":
            raise LeftAlone(f"its attention runs as {implementation!r}; attention_with_sinks replaces the eager one")
        if with_global(type(module).forward, "ALL_ATTENTION_FUNCTIONS", None) is None:
            raise LeftAlone("its forward's decorators do not hold the function they wrap")
        return [(("sink_attention", True),)]

    def verify(self, module, fused_cls, context):
        """The marker-aware forward against the same forward given each marker's materialised mask, with random
        parameters in float64, in eval and train mode, the attention's output and the gradients, for each of
        _PROOF_MARKERS; in the module's own dtype and device the gradients too (the flash kernels on a GPU). Its
        attention weights are None, as SDPA's: the markers come only where no one records them
        (rules/causal_mask.py)."""
        verify_with_markers(self, module, fused_cls, context, "sink_attention", _PROOF_MARKERS,
                            select=_attention_output, own_gradients=True)

    def settle(self, model, report):
        """An attention that no swapped base model hands the markers would never take one: it goes back to the
        class it had, and the report says so."""
        settle_marker_consumers(model, report, self.kind, "sink_attention", "eager_markers",
                                "no swapped base model hands it a causal marker")
