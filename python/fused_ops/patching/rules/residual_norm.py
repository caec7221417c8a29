"""The decoder layer's residual add + post-attention RMSNorm as one add_rms_norm, where the layer is
the Llama shape: norm, attention, residual add, norm, MLP, residual add."""
import torch

from ... import _ops
from ..swap import forward_builder, fused_kind
from . import LeftAlone, Rule

_LAYER_CHILDREN = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}


@forward_builder("residual_norm")
def _decoder_layer_forward(base, options):
    stock = base.forward
    eps = options["eps"]

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=False, position_embeddings=None, **kwargs):
        norm = self.post_attention_layernorm
        if fused_kind(norm) != "norm" or norm._forward_hooks or norm._forward_pre_hooks:
            return stock(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=past_key_values, use_cache=use_cache,
                         position_embeddings=position_embeddings, **kwargs)
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        if hidden_states.dtype != residual.dtype:  # autocast: the attention's output in its dtype
            common = torch.promote_types(hidden_states.dtype, residual.dtype)
            hidden_states, residual = hidden_states.to(common), residual.to(common)
        hidden_states, residual = _ops.add_rms_norm(hidden_states, residual, norm.weight, eps)
        return residual + self.mlp(hidden_states)
    return forward


class ResidualNormRule(Rule):
    kind = "residual_norm"
    description = "residual add + post-attention RMSNorm -> add_rms_norm"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if _LAYER_CHILDREN <= set(module._modules):
                yield name, module

    def variants(self, module, context):
        norm = module.post_attention_layernorm
        options = dict(getattr(type(norm), "_fused_ops_options", ()))
        if fused_kind(norm) != "norm" or options.get("function") != "rms_norm":
            raise LeftAlone("its post-attention norm is not a proven RMSNorm")
        if set(module._modules) != _LAYER_CHILDREN:
            raise LeftAlone(f"it has more than the Llama layer's parts: {sorted(set(module._modules) - _LAYER_CHILDREN)}")
        return [(("eps", options["eps"]),)]

    def inputs(self, module, context):
        return context.captured_inputs(module)
