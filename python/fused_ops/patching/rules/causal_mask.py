"""Plain causal attention without a materialized mask: the base model's create_causal_mask returns None
(SDPA's is_causal) for a forward given neither a padding mask nor positions, with no cache or an empty
one, also while torch.compile traces (where transformers otherwise materialises the mask, and SDPA runs
its slower masked kernels and no longer skips the masked-out half)."""
import inspect

import torch

from ..swap import forward_builder, innermost, with_global
from . import LeftAlone, Rule, exporting

# create_causal_mask's arguments that do not change the mask from the plain causal one when None (or,
# for allow_is_causal_skip, True); any other argument given keeps transformers' mask.
_PLAIN_MASK_ARGUMENTS = {"config", "inputs_embeds", "input_embeds", "attention_mask", "past_key_values",
                         "position_ids", "cache_position", "layer_idx", "allow_is_causal_skip"}


class PlainCausalMask:
    """transformers' create_causal_mask, returning None for the plain causal case (module docstring)."""

    def __init__(self, create_causal_mask):
        self.create_causal_mask = create_causal_mask
        self.names = list(inspect.signature(create_causal_mask).parameters)

    def __call__(self, *args, **kwargs):
        arguments = dict(zip(self.names, args), **kwargs)
        config, cache = arguments.get("config"), arguments.get("past_key_values")
        fresh = cache is None or (type(cache).__name__ == "DynamicCache" and cache.get_seq_length() == 0)
        plain = (arguments.get("attention_mask") is None and fresh and arguments.get("allow_is_causal_skip", True)
                 and all(value is None for name, value in arguments.items() if name not in _PLAIN_MASK_ARGUMENTS)
                 and getattr(config, "_attn_implementation", None) == "sdpa" and getattr(config, "is_causal", True)
                 and not exporting())
        return None if plain else self.create_causal_mask(*args, **kwargs)


@forward_builder("causal_mask")
def _causal_mask_forward(base, options):
    stock = base.forward
    create = innermost(stock).__globals__["create_causal_mask"]
    plain = with_global(stock, "create_causal_mask", PlainCausalMask(create))

    def forward(self, *args, **kwargs):
        # Positions given may describe packed sequences, whose mask is not the plain causal one.
        if args[1:] or kwargs.get("position_ids") is not None or kwargs.get("attention_mask") is not None:
            return stock(self, *args, **kwargs)
        return plain(self, *args, **kwargs)
    return forward


class CausalMaskRule(Rule):
    kind = "causal_mask"
    description = "plain causal attention -> SDPA's is_causal, no materialized mask (also under torch.compile)"
    needs_capture = True
    random_parameters = False  # a whole base model; the mask, not the weights, is what changes

    def candidates(self, model):
        for name, module in model.named_modules():
            code = getattr(innermost(type(module).forward), "__code__", None)
            if code is not None and "create_causal_mask" in code.co_names:
                yield name, module

    def variants(self, module, context):
        create = innermost(type(module).forward).__globals__.get("create_causal_mask")
        try:
            names = set(inspect.signature(create).parameters) if callable(create) else set()
        except (TypeError, ValueError):
            names = set()
        if not {"config", "attention_mask", "past_key_values"} <= names:
            raise LeftAlone("create_causal_mask's arguments are not the ones this rule knows")
        if with_global(type(module).forward, "create_causal_mask", None) is None:
            raise LeftAlone("its forward's decorators do not hold the function they wrap")
        return [()]

    def inputs(self, module, context):
        return context.captured_inputs(module)
