"""`fused_ops.fuse(model)`: swap, in place, the modules the fused ops replace.

Each pattern is recognised by its structure (attributes, parameter shapes, and the names its forward
uses), not by a version of a library: a module that looks different is left alone and logged. Hugging
Face transformers is never imported here; its modules are recognised on the model given.
"""
import collections
import inspect
import itertools
import logging
import sys
import types
import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from . import _ops
from . import nn as fused_nn

logger = logging.getLogger("fused_ops")

# The names a Llama-family module's forward uses (Llama, Mistral, Qwen2, Qwen3 and their copies).
_RMS_NORM_NAMES = {"dtype", "to", "torch", "float32", "pow", "mean", "rsqrt", "variance_epsilon", "weight"}
_GATED_MLP_NAMES = {"down_proj", "act_fn", "gate_proj", "up_proj"}
_DECODER_LAYER_NAMES = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}


def _code_names(function):
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    code = getattr(function, "__code__", None)
    return set(code.co_names) if code is not None else set()


def _innermost(function):
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def _is_silu(activation):
    return isinstance(activation, torch.nn.SiLU) or type(activation).__name__ == "SiLUActivation"


def _gelu_approximation(activation) -> Optional[str]:
    """'none' or 'tanh' where the activation is exactly F.gelu with that approximation, else None."""
    name = type(activation).__name__
    if isinstance(activation, torch.nn.GELU):
        return activation.approximate
    return {"GELUActivation": "none", "NewGELUActivation": "tanh", "GELUTanh": "tanh",
            "PytorchGELUTanh": "tanh"}.get(name)


def _swap_class(module, forward, label):
    """Gives `module` a subclass of its class whose forward is `forward` (attributes, parameters,
    hooks and isinstance checks stay as they were)."""
    cls = type(module)
    module.__class__ = type(f"Fused{cls.__name__}", (cls,), {"forward": forward, "_fused_ops_kind": label})


class _Fusion:
    def __init__(self):
        self.swapped = collections.Counter()
        self.left_alone = collections.Counter()

    def swap(self, kind, module):
        self.swapped[(kind, type(module).__name__)] += 1

    def leave(self, kind, module, reason):
        key = (kind, type(module).__name__, reason)
        if key not in self.left_alone:
            logger.info("fused_ops.fuse: left %s alone (%s): %s", type(module).__name__, kind, reason)
        self.left_alone[key] += 1


# ---- Norms

def _rms_norm_eps(module):
    return module.eps if hasattr(module, "eps") else module.variance_epsilon


def _fused_norm(module):
    """A fused module for a norm over the last dim sharing the module's parameters, or None."""
    if isinstance(module, (fused_nn.RMSNorm, fused_nn.LayerNorm)):
        return None
    if getattr(module, "weight", None) is None:  # no affine weight: nothing on the model's device to share
        return None
    if isinstance(module, torch.nn.RMSNorm) and len(module.normalized_shape) == 1:
        fused = fused_nn.RMSNorm(module.normalized_shape, module.eps, elementwise_affine=False)
    elif isinstance(module, torch.nn.LayerNorm) and len(module.normalized_shape) == 1:
        fused = fused_nn.LayerNorm(module.normalized_shape, module.eps, elementwise_affine=False)
    elif (type(module).__name__.endswith("RMSNorm") and _code_names(type(module).forward) == _RMS_NORM_NAMES
          and isinstance(getattr(module, "weight", None), torch.nn.Parameter) and module.weight.dim() == 1):
        fused = fused_nn.RMSNorm(module.weight.shape, float(module.variance_epsilon), elementwise_affine=False)
    else:
        return None
    del fused.weight  # the non-persistent buffer of ones: the module's own weight takes its place
    fused.weight = module.weight
    if isinstance(fused, fused_nn.LayerNorm):
        fused.bias = module.bias
    fused.elementwise_affine = True
    fused.train(module.training)
    return fused


def _fuse_norms(model, fusion):
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            fused = _fused_norm(child)
            if fused is not None:
                fusion.swap("norm", child)
                parent._modules[name] = fused
            elif type(child).__name__.endswith("RMSNorm") and not isinstance(child, fused_nn.RMSNorm):
                fusion.leave("norm", child, "its forward is not the Llama-family RMSNorm")


# ---- The gated MLP: gate and up in one projection feeding silu_mul

def _as_autocast_runs_linear(x, weight, bias):
    """x, weight and bias in the dtype autocast gives nn.Linear's product on x's device (unchanged outside
    autocast): the fused ops that hold a product take their operands in one dtype."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return x, weight, bias
    dtype = torch.get_autocast_dtype(device)
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


class FusedGatedMLP(torch.nn.Module):
    """`down_proj(silu(gate_proj(x)) * up_proj(x))` with gate_proj and up_proj merged into one
    projection of 2 * intermediate outputs (gate rows first) feeding `silu_mul`. Its state dict has the
    original keys: `gate_proj.*` and `up_proj.*` are split out of, and joined into, `gate_up_proj.*`."""

    def __init__(self, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Module):
        super().__init__()
        weight = gate_proj.weight
        self.intermediate_size = gate_proj.out_features
        self.gate_up_proj = torch.nn.Linear(gate_proj.in_features, 2 * self.intermediate_size,
                                            bias=gate_proj.bias is not None, device="meta")
        with torch.no_grad():
            self.gate_up_proj.weight = torch.nn.Parameter(torch.cat([weight, up_proj.weight]),
                                                          requires_grad=weight.requires_grad)
            if gate_proj.bias is not None:
                self.gate_up_proj.bias = torch.nn.Parameter(torch.cat([gate_proj.bias, up_proj.bias]),
                                                            requires_grad=gate_proj.bias.requires_grad)
        self.down_proj = down_proj
        self._register_state_dict_hook(FusedGatedMLP._split_state)
        self.register_load_state_dict_pre_hook(FusedGatedMLP._join_state)

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        down = self.down_proj
        if type(down) is torch.nn.Linear and not down._forward_hooks and not down._forward_pre_hooks:
            # The activation is recomputed by the backward rather than saved (silu_mul_linear).
            gate_up, weight, bias = _as_autocast_runs_linear(gate_up, down.weight, down.bias)
            if weight.dtype == gate_up.dtype:
                return _ops.silu_mul_linear(gate_up, weight, bias)
        return down(_ops.silu_mul(gate_up))

    @staticmethod
    def _split_state(module, state_dict, prefix, local_metadata):
        for kind in ("weight", "bias"):
            merged = state_dict.pop(f"{prefix}gate_up_proj.{kind}", None)
            if merged is not None:
                gate, up = merged.split(module.intermediate_size)
                state_dict[f"{prefix}gate_proj.{kind}"] = gate
                state_dict[f"{prefix}up_proj.{kind}"] = up
        return state_dict

    @staticmethod
    def _join_state(module, state_dict, prefix, *args):
        for kind in ("weight", "bias"):
            gate = state_dict.pop(f"{prefix}gate_proj.{kind}", None)
            up = state_dict.pop(f"{prefix}up_proj.{kind}", None)
            if gate is not None and up is not None:
                state_dict[f"{prefix}gate_up_proj.{kind}"] = torch.cat([gate, up])
            elif gate is not None or up is not None:  # let load_state_dict report the half that is missing
                state_dict[f"{prefix}{'gate' if gate is not None else 'up'}_proj.{kind}"] = (
                    gate if gate is not None else up)


def _fuse_gated_mlps(model, fusion):
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is None or _code_names(type(child).forward) != _GATED_MLP_NAMES:
                continue
            projections = [getattr(child, p, None) for p in ("gate_proj", "up_proj")]
            if not all(isinstance(p, torch.nn.Linear) for p in projections):
                fusion.leave("mlp", child, "gate_proj or up_proj is not an nn.Linear")
            elif not _is_silu(child.act_fn):
                fusion.leave("mlp", child, f"its activation is {type(child.act_fn).__name__}, not SiLU")
            elif (projections[0].weight.shape != projections[1].weight.shape
                  or (projections[0].bias is None) != (projections[1].bias is None)):
                fusion.leave("mlp", child, "gate_proj and up_proj differ in shape")
            else:
                fusion.swap("mlp", child)
                fused = FusedGatedMLP(*projections, child.down_proj)
                fused.train(child.training)
                parent._modules[name] = fused


# ---- Bias + GELU after a projection (GPT-2's MLP, BERT's intermediate layer)

def _bias_as_autocast_adds_it(hidden, bias):
    """The bias in the product's dtype under autocast (whose addmm adds it in that dtype)."""
    if bias.dtype != hidden.dtype and torch.is_autocast_enabled(hidden.device.type):
        return bias.to(hidden.dtype)
    return bias


def _gpt2_mlp_forward(self, hidden_states):
    projection = self.c_fc
    hidden = (hidden_states.reshape(-1, projection.weight.shape[0]) @ projection.weight).view(
        *hidden_states.shape[:-1], projection.weight.shape[1])
    hidden = _ops.bias_gelu(hidden, _bias_as_autocast_adds_it(hidden, projection.bias), self._fused_ops_gelu)
    return self.dropout(self.c_proj(hidden))


def _bert_intermediate_forward(self, hidden_states):
    hidden = F.linear(hidden_states, self.dense.weight)
    return _ops.bias_gelu(hidden, _bias_as_autocast_adds_it(hidden, self.dense.bias), self._fused_ops_gelu)


def _fuse_bias_gelu(model, fusion):
    for module in model.modules():
        names = _code_names(type(module).forward)
        if names == {"c_fc", "act", "c_proj", "dropout"}:  # GPT-2: Conv1D (x @ weight + bias), act, c_proj
            approximate, projection = _gelu_approximation(module.act), module.c_fc
            shaped = getattr(projection, "weight", None) is not None and getattr(projection, "bias", None) is not None
            if approximate is None or not shaped or type(projection).__name__ != "Conv1D":
                fusion.leave("bias_gelu", module, "not a Conv1D followed by an exact GELU")
                continue
            module._fused_ops_gelu = approximate
            fusion.swap("bias_gelu", module)
            _swap_class(module, _gpt2_mlp_forward, "bias_gelu")
        elif names == {"dense", "intermediate_act_fn"}:  # BERT's intermediate layer: Linear, then GELU
            approximate = _gelu_approximation(module.intermediate_act_fn)
            if approximate is None or not isinstance(module.dense, torch.nn.Linear) or module.dense.bias is None:
                fusion.leave("bias_gelu", module, "not an nn.Linear with a bias followed by an exact GELU")
                continue
            module._fused_ops_gelu = approximate
            fusion.swap("bias_gelu", module)
            _swap_class(module, _bert_intermediate_forward, "bias_gelu")


# ---- Rotary embedding in the attention

def _fused_apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    return _ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim)


def _fuse_rotary(model, fusion):
    for module in model.modules():
        forward = _innermost(type(module).forward)
        if "apply_rotary_pos_emb" not in _code_names(forward) or getattr(module, "_fused_ops_kind", None):
            continue
        if forward is not type(module).forward or forward.__closure__:
            fusion.leave("rope", module, "its forward is wrapped or a closure")
            continue
        # The same forward with apply_rotary_pos_emb bound to the fused op: this module only.
        namespace = dict(forward.__globals__, apply_rotary_pos_emb=_fused_apply_rotary_pos_emb)
        fused_forward = types.FunctionType(forward.__code__, namespace, forward.__name__, forward.__defaults__)
        fused_forward.__kwdefaults__ = forward.__kwdefaults__
        fusion.swap("rope", module)
        _swap_class(module, fused_forward, "rope")


# ---- The decoder layer's residual add + post-attention norm

def _decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                           use_cache=False, position_embeddings=None, **kwargs):
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                      position_ids=position_ids, past_key_values=past_key_values,
                                      use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    norm = self.post_attention_layernorm
    if hidden_states.dtype != residual.dtype:  # autocast: the attention's output in its dtype, the residual in the stream's
        common = torch.promote_types(hidden_states.dtype, residual.dtype)
        hidden_states, residual = hidden_states.to(common), residual.to(common)
    hidden_states, residual = _ops.add_rms_norm(hidden_states, residual, norm.weight, _rms_norm_eps(norm))
    return residual + self.mlp(hidden_states)


def _fuse_residual_norms(model, fusion):
    for module in model.modules():
        forward = type(module).forward
        if _code_names(forward) != _DECODER_LAYER_NAMES or getattr(module, "_fused_ops_kind", None):
            continue
        norm = module.post_attention_layernorm
        if not isinstance(norm, fused_nn.RMSNorm) or norm.eps is None or not norm.elementwise_affine:
            fusion.leave("residual_norm", module, "its post-attention norm is not an RMSNorm with a weight")
        elif _innermost(forward).__annotations__.get("return") not in (torch.Tensor, "torch.Tensor"):
            fusion.leave("residual_norm", module, "its forward does not return the hidden states alone")
        else:
            fusion.swap("residual_norm", module)
            _swap_class(module, _decoder_layer_forward, "residual_norm")


# ---- Causal attention without a materialized mask

# create_causal_mask's arguments that do not change the mask from the plain causal one when None (or,
# for allow_is_causal_skip, True); any other argument given keeps transformers' mask.
_PLAIN_MASK_ARGUMENTS = {"config", "inputs_embeds", "input_embeds", "attention_mask", "past_key_values",
                         "position_ids", "cache_position", "layer_idx", "allow_is_causal_skip"}


def _exporting():
    """Whether torch.export traces: torch.compiler.is_exporting() also answers True while torch.compile
    traces in torch 2.11, and the flag that torch.export sets is exact in every version."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)


def _plain_causal_mask(create_causal_mask):
    """transformers' create_causal_mask, returning None (SDPA's is_causal) for the plain causal case of a
    forward given neither a padding mask nor positions, with no cache or an empty DynamicCache: while
    torch.compile traces, transformers materialises that mask (it cannot look at the data to rule out
    padding), and SDPA with an explicit mask is slower and no longer skips the masked-out half.
    None where the function's parameters are not the ones this knows."""
    try:
        names = list(inspect.signature(create_causal_mask).parameters)
    except (TypeError, ValueError):
        return None
    if not {"config", "attention_mask", "past_key_values"} <= set(names):
        return None

    def create(*args, **kwargs):
        arguments = dict(zip(names, args), **kwargs)
        config, cache = arguments.get("config"), arguments.get("past_key_values")
        fresh = cache is None or (type(cache).__name__ == "DynamicCache" and cache.get_seq_length() == 0)
        plain = (arguments.get("attention_mask") is None and fresh and arguments.get("allow_is_causal_skip", True)
                 and all(value is None for name, value in arguments.items() if name not in _PLAIN_MASK_ARGUMENTS)
                 and getattr(config, "_attn_implementation", None) == "sdpa" and getattr(config, "is_causal", True)
                 and not _exporting())
        return None if plain else create_causal_mask(*args, **kwargs)
    return create


_rebound_modules = itertools.count()


def _module_globals_with(namespace, name, value):
    """A copy of a module's globals with `name` bound to `value`, as the namespace of a module registered
    in sys.modules under a name of its own: torch.compile guards a function's globals through the
    module that its `__name__` imports, so that module must be the copy, not the original."""
    module = types.ModuleType(f"_fused_ops_rebound_{next(_rebound_modules)}")
    own_name = module.__name__
    module.__dict__.update(namespace)
    module.__dict__.update({"__name__": own_name, "__spec__": None, name: value})
    sys.modules[own_name] = module
    return module.__dict__


def _with_global(function, name, value):
    """A copy of `function`, and of each decorator's wrapper around it, whose global `name` is `value`
    (None where a wrapper does not hold the function it wraps in its closure)."""
    inner = getattr(function, "__wrapped__", None)
    if inner is None:
        copied = types.FunctionType(function.__code__, _module_globals_with(function.__globals__, name, value),
                                    function.__name__, function.__defaults__, function.__closure__)
    else:
        copied_inner = _with_global(inner, name, value)
        cells = function.__closure__ or ()

        def holds_inner(cell):
            try:
                return cell.cell_contents is inner
            except ValueError:  # an empty cell
                return False
        if copied_inner is None or not any(holds_inner(cell) for cell in cells):
            return None
        closure = tuple(types.CellType(copied_inner) if holds_inner(cell) else cell for cell in cells)
        copied = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                                    closure)
    copied.__kwdefaults__ = function.__kwdefaults__
    copied.__dict__.update(function.__dict__)
    if inner is not None:
        copied.__wrapped__ = copied_inner
    return copied


def _fuse_causal_masks(model, fusion):
    for module in model.modules():
        forward = type(module).forward
        if "create_causal_mask" not in _code_names(forward) or getattr(module, "_fused_ops_kind", None):
            continue
        create = _innermost(forward).__globals__.get("create_causal_mask")
        plain_mask = _plain_causal_mask(create) if create else None
        plain = _with_global(forward, "create_causal_mask", plain_mask) if plain_mask else None
        if plain is None:
            fusion.leave("causal_mask", module, "its forward's decorators or create_causal_mask's arguments are not "
                         "recognised")
            continue

        def choose(self, *args, _plain=plain, _forward=forward, **kwargs):
            # Positions given may describe packed sequences, whose mask is not the plain causal one.
            if args[1:] or kwargs.get("position_ids") is not None or kwargs.get("attention_mask") is not None:
                return _forward(self, *args, **kwargs)
            return _plain(self, *args, **kwargs)
        fusion.swap("causal_mask", module)
        _swap_class(module, choose, "causal_mask")


# ---- The LM head + loss of a causal LM given labels

def _causal_lm_forward_with(output_class):
    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        shift_labels = kwargs.pop("shift_labels", None)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                             **kwargs)
        hidden_states = outputs.last_hidden_state
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden_states = hidden_states[:, slice_indices, :]
        loss = logits = None
        if labels is None and shift_labels is None:
            logits = self.lm_head(hidden_states)
        else:  # the loss without the logits (they are not returned)
            if shift_labels is None:
                shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
            head = self.lm_head
            rows, weight, bias = _as_autocast_runs_linear(hidden_states, head.weight, head.bias)
            loss = _ops.linear_cross_entropy(rows, weight, shift_labels.to(hidden_states.device), bias,
                                             reduction="mean" if num_items_in_batch is None else "sum")
            if num_items_in_batch is not None:
                loss = loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch)
                               else num_items_in_batch)
        return output_class(loss=loss, logits=logits, past_key_values=outputs.past_key_values,
                            hidden_states=outputs.hidden_states, attentions=outputs.attentions)
    return forward


def _fuse_cross_entropy(model, fusion):
    for module in model.modules():
        forward = _innermost(type(module).forward)
        if not {"lm_head", "loss_function", "model"} <= set(forward.__code__.co_names if hasattr(forward, "__code__")
                                                            else ()) or getattr(module, "_fused_ops_kind", None):
            continue
        output_class = getattr(sys.modules.get(type(module).__module__), "CausalLMOutputWithPast", None)
        if (not isinstance(getattr(module, "lm_head", None), torch.nn.Linear)
                or getattr(module, "loss_type", "ForCausalLM") not in ("ForCausalLM", None) or output_class is None
                or getattr(getattr(module, "config", None), "final_logit_softcapping", None)):
            fusion.leave("cross_entropy", module, "not a causal LM with an nn.Linear head and the causal-LM loss")
            continue
        fused = _causal_lm_forward_with(output_class)
        wrapper = type(module).forward
        if wrapper is not forward:  # keep the return_dict=False handling of transformers' decorator
            from transformers.utils.generic import can_return_tuple
            fused = can_return_tuple(fused)
        fusion.swap("cross_entropy", module)
        _swap_class(module, fused, "cross_entropy")


_KINDS = {"norm": "norms over the last dim -> fused_ops.nn.RMSNorm / LayerNorm",
          "mlp": "SwiGLU MLPs -> one gate_up projection + silu_mul_linear (the activation recomputed, not saved)",
          "bias_gelu": "projection bias + GELU -> bias_gelu",
          "rope": "rotary embedding in the attention -> rotary_embedding",
          "residual_norm": "residual add + post-attention RMSNorm -> add_rms_norm",
          "cross_entropy": "LM head + loss given labels -> linear_cross_entropy (no logits returned)",
          "causal_mask": "plain causal attention -> SDPA's is_causal, no materialized mask (also under torch.compile)"}


def fuse(model: torch.nn.Module, *, norms: bool = True, mlp: bool = True, rope: bool = True,
         residual_norms: bool = True, cross_entropy: bool = True, causal_mask: bool = True) -> torch.nn.Module:
    """Swaps, in place, the modules of `model` that fused ops replace, and returns it.

    Recognised: torch.nn.RMSNorm and LayerNorm over the last dim; Hugging Face Llama, Mistral, Qwen2,
    Qwen3 (and models that reuse their modules): RMSNorm classes, the SwiGLU MLP (gate and up merged
    into one projection feeding silu_mul), rotary embedding in the attention, the decoder layer's
    residual add + post-attention norm (add_rms_norm), and the causal-LM head + loss when the forward is
    given labels (linear_cross_entropy: `logits` is then None, as with Liger-Kernel); `causal_mask`: the
    base model's causal mask is left to SDPA's is_causal when a forward has no padding mask, no positions
    and no cache yet, under torch.compile too (transformers materialises it while tracing); GPT-2's MLP and
    BERT's intermediate layer (bias + exact GELU -> bias_gelu). Parameters are shared, not copied, and
    the state dict keeps its keys, shapes and values, so checkpoints load either way. Logs one line
    per kind swapped (logger "fused_ops"); a model with nothing to fuse comes back unchanged with a
    warning. Call it before creating the optimizer: the merged gate/up projection is a new parameter.
    """
    fusion = _Fusion()
    if mlp:
        _fuse_gated_mlps(model, fusion)
        _fuse_bias_gelu(model, fusion)
    if rope:
        _fuse_rotary(model, fusion)
    if cross_entropy:
        _fuse_cross_entropy(model, fusion)
    if norms:
        _fuse_norms(model, fusion)
    if residual_norms:
        _fuse_residual_norms(model, fusion)
    if causal_mask:
        _fuse_causal_masks(model, fusion)
    if not fusion.swapped:
        warnings.warn(f"fused_ops.fuse: nothing to fuse in {type(model).__name__}; returned unchanged", stacklevel=2)
        return model
    by_kind = collections.defaultdict(list)
    for (kind, class_name), count in fusion.swapped.items():
        by_kind[kind].append(f"{count} {class_name}")
    for kind, modules in by_kind.items():
        logger.info("fused_ops.fuse: %s: %s", _KINDS[kind], ", ".join(modules))
    return model
