"""The causal LM's head + loss when training with labels: linear_cross_entropy, without the logits.

What families put around the head is a variant the probe proves: a logit scale (Cohere's `logit_scale`,
Granite's `1 / logits_scaling`), taken on the rows before the product, and a final-logit softcap
(Gemma 2 and 3), which the op applies. The MoE families' router loss (`output_router_logits`) is added to
the fused loss by the family's own `load_balancing_loss_func`, as its stock forward adds it. Gemma 3's
image-text model has a forward of its own arguments (images and token types go to its base model).

In eval mode, without labels, or when the head is not a plain nn.Linear (LoRA, quantised), the stock
forward runs and the logits come back as usual.
"""
import inspect

import torch
import torch.nn.functional as F

from ... import _ops
from .. import probe
from ..swap import as_autocast_runs_linear, forward_builder, innermost, is_plain_linear
from . import LeftAlone, Rule

# The causal-LM forwards whose arguments this rule knows: Llama's and its copies', and the MoE families'
# with `output_router_logits`.
_PARAMETERS = ["self", "input_ids", "attention_mask", "position_ids", "past_key_values", "inputs_embeds", "labels",
               "use_cache", "logits_to_keep", "kwargs"]
_MOE_PARAMETERS = _PARAMETERS[:8] + ["output_router_logits"] + _PARAMETERS[8:]
_PROBE_HEAD_WIDTH = 16


# Gemma 3's image-text model: the image inputs and the labels go to the base model, the loss is the
# causal LM's.
_IMAGE_TEXT_PARAMETERS = ["self", "input_ids", "pixel_values", "attention_mask", "position_ids", "past_key_values",
                          "token_type_ids", "inputs_embeds", "labels", "use_cache", "logits_to_keep", "lm_kwargs"]


@forward_builder("lm_head_loss")
def _causal_lm_forward(base, options):
    stock, output_class = base.forward, options["output_class"]
    logit_scale, softcap = options["logit_scale"], options["softcap"]
    router_loss_function = innermost(stock).__globals__.get("load_balancing_loss_func") if options["router_loss"] else None

    def fused_loss(self, hidden_states, labels, shift_labels, logits_to_keep, num_items_in_batch):
        """The causal LM's loss of the head over `hidden_states`, without the logits."""
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden_states = hidden_states[:, slice_indices, :]
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
        rows, weight, bias = as_autocast_runs_linear(hidden_states, self.lm_head.weight, self.lm_head.bias)
        if logit_scale != 1.0:  # (rows * s) @ W^T = s * logits; a bias would be scaled too
            rows = rows * logit_scale
        loss = _ops.linear_cross_entropy(rows, weight, shift_labels.to(hidden_states.device), bias,
                                         reduction="mean" if num_items_in_batch is None else "sum",
                                         softcap=softcap)
        if num_items_in_batch is not None:
            loss = loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch)
                           else num_items_in_batch)
        return loss

    def runs_stock(self, labels, shift_labels):
        training_with_labels = self.training and (labels is not None or shift_labels is not None)
        return not training_with_labels or not is_plain_linear(self.lm_head)

    if options.get("signature") == "image_text":
        def forward(self, input_ids=None, pixel_values=None, attention_mask=None, position_ids=None,
                    past_key_values=None, token_type_ids=None, inputs_embeds=None, labels=None, use_cache=None,
                    logits_to_keep=0, **lm_kwargs):
            shift_labels = lm_kwargs.get("shift_labels")
            if runs_stock(self, labels, shift_labels):
                return stock(self, input_ids=input_ids, pixel_values=pixel_values, attention_mask=attention_mask,
                             position_ids=position_ids, past_key_values=past_key_values,
                             token_type_ids=token_type_ids, inputs_embeds=inputs_embeds, labels=labels,
                             use_cache=use_cache, logits_to_keep=logits_to_keep, **lm_kwargs)
            num_items_in_batch = lm_kwargs.pop("num_items_in_batch", None)
            lm_kwargs.pop("shift_labels", None)
            outputs = self.model(input_ids=input_ids, pixel_values=pixel_values, token_type_ids=token_type_ids,
                                 attention_mask=attention_mask, position_ids=position_ids,
                                 past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                                 labels=labels, return_dict=True, **lm_kwargs)
            loss = fused_loss(self, outputs.last_hidden_state, labels, shift_labels, logits_to_keep,
                              num_items_in_batch)
            return output_class(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                hidden_states=outputs.hidden_states, attentions=outputs.attentions,
                                image_hidden_states=getattr(outputs, "image_hidden_states", None))
    else:
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
            shift_labels = kwargs.get("shift_labels")
            router_loss = kwargs.get("output_router_logits")
            if router_loss is None:
                router_loss = getattr(getattr(self, "config", None), "output_router_logits", False)
            if runs_stock(self, labels, shift_labels) or (router_loss and router_loss_function is None):
                return stock(self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                             use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
            num_items_in_batch = kwargs.pop("num_items_in_batch", None)
            kwargs.pop("shift_labels", None)
            kwargs.pop("output_router_logits", None)
            if options["router_loss"]:
                kwargs["output_router_logits"] = bool(router_loss)
            outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                                 **kwargs)
            loss = fused_loss(self, outputs.last_hidden_state, labels, shift_labels, logits_to_keep,
                              num_items_in_batch)
            extra = {}
            if router_loss:
                aux_loss = router_loss_function(outputs.router_logits, self.num_experts, self.num_experts_per_tok,
                                                attention_mask)
                loss = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
                extra = dict(aux_loss=aux_loss, router_logits=outputs.router_logits)
            return output_class(loss=loss, logits=None, past_key_values=outputs.past_key_values,
                                hidden_states=outputs.hidden_states, attentions=outputs.attentions, **extra)
    if stock is not innermost(stock):  # keep the return_dict=False handling of transformers' decorator
        from transformers.utils.generic import can_return_tuple
        forward = can_return_tuple(forward)
    return forward


class _HiddenStates(torch.nn.Module):
    """Stands in for the base model in a probe: returns its `hidden` parameter as the last hidden state,
    and its `router_logits` parameters (one per layer) when asked for them."""

    def __init__(self, hidden, output_class, router_logits=()):
        super().__init__()
        self.hidden = torch.nn.Parameter(hidden)
        self.router_logits = torch.nn.ParameterList(router_logits)
        self.output_class = output_class

    def forward(self, *args, output_router_logits=False, **kwargs):
        if output_router_logits:
            return self.output_class(last_hidden_state=self.hidden, router_logits=tuple(self.router_logits))
        return self.output_class(last_hidden_state=self.hidden)


class LMHeadLossRule(Rule):
    kind = "lm_head_loss"
    description = "LM head + loss when training with labels -> linear_cross_entropy (no logits then)"
    needs_capture = True

    def candidates(self, model):
        for name, module in model.named_modules():
            if "lm_head" in module._modules and "labels" in _parameters(module):
                yield name, module

    def variants(self, module, context):
        if "model" not in module._modules:
            raise LeftAlone("its base model is not at .model")
        if _parameters(module) not in (_PARAMETERS, _MOE_PARAMETERS, _IMAGE_TEXT_PARAMETERS):
            raise LeftAlone(f"its forward's arguments are not the Llama-shaped causal LM's: {_parameters(module)}")
        if not isinstance(module.lm_head, torch.nn.Linear):
            raise LeftAlone("its head is not an nn.Linear")
        output = context.captured_output(module)
        if output is None or not hasattr(output, "logits"):
            raise LeftAlone("the probe forward gave no output with logits")
        config = getattr(module, "config", None)
        softcap = getattr(config, "final_logit_softcapping", None)
        softcap = float(softcap) if isinstance(softcap, (int, float)) and softcap > 0 else 0.0
        scales = [1.0]
        logits_scaling = getattr(config, "logits_scaling", None)
        for scale in (getattr(module, "logit_scale", None), 1.0 / logits_scaling if _positive(logits_scaling) else None):
            if _positive(scale) and scale not in scales:
                scales.append(float(scale))
        if module.lm_head.bias is not None:
            scales = [1.0]  # a scale taken on the rows would scale the bias too
        router_loss = _has_router_loss(module)
        signature = (("signature", "image_text"),) if _parameters(module) == _IMAGE_TEXT_PARAMETERS else ()
        return [(("logit_scale", scale), ("output_class", type(output)), ("router_loss", router_loss),
                 ("softcap", softcap)) + signature for scale in scales]

    def verify(self, module, fused_cls, context):
        base_output = context.captured_output(module.model)
        if base_output is None or not hasattr(base_output, "last_hidden_state"):
            raise probe.Mismatch("the base model's output has no last_hidden_state")
        head = module.lm_head
        vocab = head.weight.shape[0]
        # The fused path runs only for a plain nn.Linear head, and the head's width enters both forwards
        # only through its product: a narrow plain head of the same vocabulary and bias proves the same
        # function in float64, where the real one (262144 x 1152 in Gemma 3 1B) took minutes in float32.
        width = min(head.weight.shape[1], _PROBE_HEAD_WIDTH)
        narrow_head = torch.nn.Linear(width, vocab, bias=head.bias is not None, device=head.weight.device,
                                      dtype=head.weight.dtype)
        generator = torch.Generator().manual_seed(probe.PROBE_SEED)
        hidden = torch.randn(2, 5, width, generator=generator, dtype=torch.float64)
        labels = torch.randint(0, vocab, (2, 5), generator=generator)
        labels[0, :2] = -100
        options = dict(fused_cls._fused_ops_options)
        router_logits, extras = (), [{}, {"num_items_in_batch": 7}]
        if options["router_loss"]:
            router_logits = [torch.randn(10, module.num_experts, generator=generator, dtype=torch.float64)
                             .to(head.weight.device, head.weight.dtype) for _ in range(2)]
            extras += [{"output_router_logits": True}, {"output_router_logits": True, "num_items_in_batch": 7}]
        stub = _HiddenStates(hidden.to(head.weight.device, head.weight.dtype), type(base_output), router_logits)
        base = module._modules["model"]
        module._modules["model"], module._modules["lm_head"] = stub, narrow_head
        try:
            for extra in extras:
                def make(dtype, device, extra=extra):
                    ids = torch.zeros(2, 5, dtype=torch.long, device=device)
                    return (), dict(input_ids=ids, labels=labels.to(device), use_cache=False, **extra)
                probe.verify(module, fused_cls, probe.Inputs(make, None), select=_all_but_logits)
        finally:
            module._modules["model"], module._modules["lm_head"] = base, head


def _has_router_loss(module):
    """A MoE causal LM whose forward adds `load_balancing_loss_func(router_logits, num_experts,
    num_experts_per_tok, attention_mask)` scaled by `router_aux_loss_coef` (the probe proves it)."""
    return (_parameters(module) == _MOE_PARAMETERS
            and callable(innermost(type(module).forward).__globals__.get("load_balancing_loss_func"))
            and all(isinstance(getattr(module, name, None), (int, float))
                    for name in ("num_experts", "num_experts_per_tok", "router_aux_loss_coef")))


def _positive(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def _all_but_logits(output):
    return {key: value for key, value in output.items() if key != "logits"}


def _parameters(module):
    try:
        return list(inspect.signature(innermost(type(module).forward)).parameters)
    except (TypeError, ValueError):
        return []
