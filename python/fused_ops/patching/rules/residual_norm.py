"""The decoder layer's residual add + the norm after it as one add_rms_norm / add_layer_norm, where the
layer is one of these shapes (the norm after the first add is `add_norm`):
  llama      norm, attention, residual add, norm, MLP, residual add
  four_norm  Gemma 2/3's: norm, attention, post-attention norm, residual add, pre-feedforward norm, MLP,
             post-feedforward norm, residual add
  glm4       GLM-4's: the four-norm layer under other names
  phi3       Phi-3's: the Llama layer with a dropout on the attention's and the MLP's outputs before
             each add (in their places: the same random numbers in the same order)
Any of them may scale the attention's and the MLP's outputs by `residual_multiplier` before each add
(Granite). The MLP returns its output or, as gpt-oss's experts do, a tuple whose first item it is; the layer's
forward takes Llama's arguments, Gemma's or Qwen3-VL's. The probe proves the variant, and that the layer
computes what its own forward does.

Under torch.compile the two norms' outputs, which the projections after them would save for their
weight gradients, are recomputed in the backward from the residual stream the backward keeps anyway: two
fewer hidden-size tensors a layer, the same values."""
import inspect

import torch
from torch.utils.checkpoint import checkpoint

from ... import _ops
from ..swap import CallSignature, forward_builder, fused_kind, has_hooks, innermost
from . import LeftAlone, Rule, exporting
from .norm import epsilon_for, runs_its_fused_op

# layer: (its children, the norm after the attention, the norm after the first add, the norm after the MLP)
_LAYERS = {
    "llama": (None, "post_attention_layernorm", None),
    "four_norm": ("post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"),
    "glm4": ("post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"),
    "phi3": ("resid_attn_dropout", "post_attention_layernorm", "resid_mlp_dropout"),
}
_CHILDREN = {layer: {"input_layernorm", "self_attn", "mlp"} | {name for name in names if name}
             for layer, names in _LAYERS.items()}
# The arguments of the stock layer's forward, all but the hidden states passed on to the attention.
_SIGNATURES = {
    "llama": ["self", "hidden_states", "attention_mask", "position_ids", "past_key_values", "use_cache",
              "position_embeddings", "kwargs"],
    "gemma": ["self", "hidden_states", "position_embeddings", "attention_mask", "position_ids", "past_key_values",
              "kwargs"],
    "gemma_with_cache": ["self", "hidden_states", "position_embeddings", "attention_mask", "position_ids",
                         "past_key_values", "use_cache", "kwargs"],  # Qwen3-VL's, GLM-4V's
}


def _norm_op(norm, add, dtype):
    """The fused op a fused norm module runs, with the residual add before it or not, and the op's arguments
    after its input(s). They are read here, outside the recomputed region: torch.compile(dynamic=True)
    makes a float read inside one region an input of that region alone, which the next cannot use."""
    options = dict(type(norm)._fused_ops_options)
    weight, eps, offset = getattr(norm, "weight", None), epsilon_for(options["eps"], dtype), options["offset"]
    if options["function"] == "rms_norm":
        return (_ops._add_rms_norm if add else _ops._rms_norm), (weight, eps, offset)
    return (_ops._add_layer_norm if add else _ops._layer_norm), (weight, getattr(norm, "bias", None), eps, offset)


def _add_norm(x, residual, norm, layer):
    """(norm(x + residual), x + residual) in one op, x and residual first brought to one dtype as the stock
    add promotes them (autocast gives the attention's output its own dtype); the add, then the norm module,
    where its op does not run on that dtype."""
    if x.dtype != residual.dtype:
        common = torch.promote_types(x.dtype, residual.dtype)
        x, residual = x.to(common), residual.to(common)
    if not runs_its_fused_op(norm, x.dtype):
        residual = residual + x
        return norm(residual), residual
    op, arguments = _norm_op(norm, add=True, dtype=x.dtype)
    return _recomputed_in_backward(layer, op, x, residual, *arguments)


def _plain_fused_norm(module):
    """A norm the norm rule fused, with no hooks: one op, nothing else to run again (where it runs its op)."""
    return fused_kind(module) == "norm" and not has_hooks(module)


def _recomputed_in_backward(layer, function, *args):
    """function(*args), its output recomputed in the backward where torch.compile traces a training forward:
    a checkpointed region there tags its ops for recomputation, so the partitioner keeps the region's
    inputs (the residual stream, which the norm's own backward reads) instead of its output. Eager autograd
    cannot drop a tensor another op saves, a layer under gradient checkpointing saves none, and an exported
    program has no backward: there it is a plain call."""
    if (not torch.compiler.is_compiling() or not torch.is_grad_enabled() or exporting()
            or (layer.training and getattr(layer, "gradient_checkpointing", False))):
        return function(*args)
    return checkpoint(function, *args, use_reentrant=False)


@forward_builder("residual_norm", skips=lambda options: ("input_layernorm", _LAYERS[options["layer"]][1]))
def _decoder_layer_forward(base, options):
    stock = base.forward
    post_attention, add_norm, post_mlp = _LAYERS[options["layer"]]
    first_of_tuple = options["mlp_output"] == "first_of_tuple"
    multiplier = options.get("residual_multiplier")  # absent in a model pickled before the option existed
    scale = multiplier if options.get("scaled") else None

    def layer(self, hidden_states, attention_arguments):
        norm = getattr(self, add_norm)
        # The multiplier it was proven with; one set since is the stock forward's to use.
        if not _plain_fused_norm(norm) or getattr(self, "residual_multiplier", None) != multiplier:
            return stock(self, hidden_states, **attention_arguments)
        residual = hidden_states
        if _plain_fused_norm(self.input_layernorm) and runs_its_fused_op(self.input_layernorm, hidden_states.dtype):
            op, arguments = _norm_op(self.input_layernorm, add=False, dtype=hidden_states.dtype)
            hidden_states = _recomputed_in_backward(self, op, hidden_states, *arguments)
        else:
            hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **attention_arguments)
        if post_attention:
            hidden_states = getattr(self, post_attention)(hidden_states)
        if scale is not None:
            hidden_states = hidden_states * scale
        hidden_states, residual = _add_norm(hidden_states, residual, norm, self)
        hidden_states = self.mlp(hidden_states)
        if first_of_tuple:
            hidden_states = hidden_states[0]
        if post_mlp:
            hidden_states = getattr(self, post_mlp)(hidden_states)
        return residual + (hidden_states if scale is None else hidden_states * scale)

    signature = CallSignature(inspect.signature(innermost(stock)))

    def forward(self, *args, **kwargs):
        # Bound to the stock layer's own signature (one of _SIGNATURES): positional arguments keep their
        # meaning, and the defaults are the stock ones.
        arguments, more = signature.bind((self, *args), kwargs)
        hidden_states = arguments.pop("hidden_states")
        return layer(self, hidden_states, {**arguments, **more})
    return forward


class ResidualNormRule(Rule):
    kind = "residual_norm"
    description = "residual add + the norm after it -> add_rms_norm / add_layer_norm"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if _CHILDREN["llama"] <= set(module._modules):
                yield name, module

    def variants(self, module, context):
        layer = next((layer for layer, children in _CHILDREN.items() if set(module._modules) == children), None)
        if layer is None:
            extra = sorted(set(module._modules) - _CHILDREN["llama"])
            raise LeftAlone(f"it has other parts than the Llama, Gemma, GLM-4 or Phi-3 layer's: {extra}")
        try:
            parameters = list(inspect.signature(innermost(type(module).forward)).parameters)
        except (TypeError, ValueError):
            parameters = []
        signature = next((name for name, names in _SIGNATURES.items() if parameters == names), None)
        if signature is None:
            raise LeftAlone(f"its forward's arguments are not the Llama or Gemma layer's: {parameters}")
        add_norm = _LAYERS[layer][1]
        norm = getattr(module, add_norm)
        if fused_kind(norm) != "norm":
            raise LeftAlone(f"its {add_norm} is not a proven norm")
        # Granite's layer scales the attention's and the MLP's outputs before each add by a constant: a
        # variant proven only where the constant is not 1 (where the probe cannot tell it is applied).
        multiplier = getattr(module, "residual_multiplier", None)
        if not isinstance(multiplier, (int, float)) or isinstance(multiplier, bool):
            multiplier = None
        scalings = (True, False) if multiplier is not None and multiplier != 1.0 else (False,)
        # The norms' op, epsilon and offset are their own fused classes' (_norm_op), read at each call.
        return [(("layer", layer), ("mlp_output", output), ("residual_multiplier", multiplier), ("scaled", scaled),
                 ("signature", signature))
                for scaled in scalings for output in ("tensor", "first_of_tuple")]

    def inputs(self, module, context):
        return context.captured_inputs(module)
