"""The decoder layer's residual add + the norm after it as one add_rms_norm / add_layer_norm, where the
layer has one of two shapes:
  llama      norm, attention, residual add, norm, MLP, residual add (the norm after the first add is
             post_attention_layernorm)
  four_norm  Gemma 2/3's: norm, attention, post-attention norm, residual add, pre-feedforward norm, MLP,
             post-feedforward norm, residual add (the norm after the first add is pre_feedforward_layernorm)
The MLP returns its output or, as gpt-oss's experts do, a tuple whose first item it is: the probe proves
which, and that the layer computes what its own forward does."""
import torch

from ... import _ops
from ..swap import forward_builder, fused_kind
from . import LeftAlone, Rule

_LAYER_CHILDREN = {
    "llama": {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"},
    "four_norm": {"input_layernorm", "self_attn", "post_attention_layernorm", "pre_feedforward_layernorm", "mlp",
                  "post_feedforward_layernorm"},
}
_NORM_AFTER_THE_ADD = {"llama": "post_attention_layernorm", "four_norm": "pre_feedforward_layernorm"}


def _add_norm(x, residual, norm, options):
    """(norm(x + residual), x + residual) in one op, x and residual first brought to one dtype as the stock
    add promotes them (autocast gives the attention's output its own dtype)."""
    if x.dtype != residual.dtype:
        common = torch.promote_types(x.dtype, residual.dtype)
        x, residual = x.to(common), residual.to(common)
    if options["function"] == "rms_norm":
        return _ops.add_rms_norm(x, residual, getattr(norm, "weight", None), options["eps"], offset=options["offset"])
    return _ops.add_layer_norm(x, residual, getattr(norm, "weight", None), getattr(norm, "bias", None), options["eps"],
                               offset=options["offset"])


def _norm_is_fused(norm):
    return fused_kind(norm) == "norm" and not norm._forward_hooks and not norm._forward_pre_hooks


@forward_builder("residual_norm")
def _decoder_layer_forward(base, options):
    stock = base.forward
    first_of_tuple = options["mlp_output"] == "first_of_tuple"

    def mlp(self, hidden_states):
        output = self.mlp(hidden_states)
        return output[0] if first_of_tuple else output

    if options["layer"] == "llama":
        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=False, position_embeddings=None, **kwargs):
            if not _norm_is_fused(self.post_attention_layernorm):
                return stock(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, use_cache=use_cache,
                             position_embeddings=position_embeddings, **kwargs)
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                              position_ids=position_ids, past_key_values=past_key_values,
                                              use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
            hidden_states, residual = _add_norm(hidden_states, residual, self.post_attention_layernorm, options)
            return residual + mlp(self, hidden_states)
    else:
        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, position_ids=None,
                    past_key_values=None, **kwargs):
            if not _norm_is_fused(self.pre_feedforward_layernorm):
                return stock(self, hidden_states, position_embeddings=position_embeddings,
                             attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, **kwargs)
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                              attention_mask=attention_mask, position_ids=position_ids,
                                              past_key_values=past_key_values, **kwargs)
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states, residual = _add_norm(hidden_states, residual, self.pre_feedforward_layernorm, options)
            return residual + self.post_feedforward_layernorm(mlp(self, hidden_states))
    return forward


class ResidualNormRule(Rule):
    kind = "residual_norm"
    description = "residual add + the norm after it -> add_rms_norm / add_layer_norm"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if _LAYER_CHILDREN["llama"] <= set(module._modules):
                yield name, module

    def variants(self, module, context):
        layer = next((layer for layer, children in _LAYER_CHILDREN.items() if set(module._modules) == children), None)
        if layer is None:
            extra = sorted(set(module._modules) - _LAYER_CHILDREN["llama"])
            raise LeftAlone(f"it has other parts than the Llama or Gemma layer's: {extra}")
        norm = getattr(module, _NORM_AFTER_THE_ADD[layer])
        options = dict(getattr(type(norm), "_fused_ops_options", ()))
        if fused_kind(norm) != "norm":
            raise LeftAlone(f"its {_NORM_AFTER_THE_ADD[layer]} is not a proven norm")
        return [(("eps", options["eps"]), ("function", options["function"]), ("layer", layer),
                 ("mlp_output", output), ("offset", options.get("offset", 0.0)))
                for output in ("tensor", "first_of_tuple")]

    def inputs(self, module, context):
        return context.captured_inputs(module)
