"""Plain causal attention without a materialized mask: the base model's create_causal_mask returns None
(SDPA's is_causal) for a forward given neither a padding mask nor positions, with no cache or an empty
one, also while torch.compile traces (where transformers otherwise materialises the mask, and SDPA runs
its slower masked kernels and no longer skips the masked-out half). In the same plain case, a proven
variant has create_sliding_window_causal_mask return None where the sequence fits the window and the
SlidingWindowCausal marker where it does not, for attention made band-aware (rules/sliding_window.py). Under eager
attention, where None would mean no mask at all, a proven variant whose attention takes the markers
(rules/attention_sinks.py) hands full layers FullCausal and sliding layers SlidingWindowCausal, unless
attention weights are to be recorded (`output_attentions`), which only the eager attention gives."""
import contextlib
import inspect

import torch

from .. import probe
from ..swap import forward_builder, fused_class, fused_kind, innermost, with_global
from . import LeftAlone, Rule, exporting
from .sliding_window import FullCausal, SlidingWindowCausal, markers

# create_causal_mask's arguments that do not change the mask from the plain causal one when None (or,
# for allow_is_causal_skip, True); any other argument given keeps transformers' mask.
_PLAIN_MASK_ARGUMENTS = {"config", "inputs_embeds", "input_embeds", "attention_mask", "past_key_values",
                         "position_ids", "cache_position", "layer_idx", "allow_is_causal_skip"}


# The window the sliding-window variant is proven with on the probe's six tokens.
_PROOF_WINDOW = 2


class PlainCausalMask:
    """transformers' create_causal_mask, returning None for the plain causal case under SDPA, and with
    `eager_markers` FullCausal for it under eager attention (module docstring)."""

    def __init__(self, create_causal_mask, eager_markers=False):
        self.create_causal_mask, self.eager_markers = create_causal_mask, eager_markers
        self.names = list(inspect.signature(create_causal_mask).parameters)

    def __call__(self, *args, **kwargs):
        arguments = dict(zip(self.names, args), **kwargs)
        if not self.plain(arguments):
            return self.create_causal_mask(*args, **kwargs)
        return FullCausal() if self.eager(arguments) else None

    def eager(self, arguments):
        return getattr(arguments.get("config"), "_attn_implementation", None) == "eager"

    def plain(self, arguments):
        """No padding mask, positions or filled cache, SDPA (or eager attention taking the markers), and no
        export or TorchScript trace (which would keep the shapes of the mask this call skips)."""
        config, cache = arguments.get("config"), arguments.get("past_key_values")
        fresh = cache is None or (type(cache).__name__ == "DynamicCache" and cache.get_seq_length() == 0)
        implementation = getattr(config, "_attn_implementation", None)
        return (self.no_padding(arguments) and fresh and arguments.get("allow_is_causal_skip", True)
                and all(value is None for name, value in arguments.items() if name not in _PLAIN_MASK_ARGUMENTS)
                and (implementation == "sdpa" or (self.eager_markers and implementation == "eager"))
                and getattr(config, "is_causal", True) and not exporting() and not torch.jit.is_tracing())


    def no_padding(self, arguments):
        """No padding mask; with `eager_markers`, outside torch.compile, also a [batch, length] mask of ones (a
        data collator's for unpadded rows), whose causal mask transformers builds as for none: one check on
        the device, as transformers' own SDPA path makes."""
        mask, embeddings = arguments.get("attention_mask"), arguments.get("inputs_embeds",
                                                                          arguments.get("input_embeds"))
        if mask is None:
            return True
        return (self.eager_markers and torch.is_tensor(mask) and mask.dim() == 2 and torch.is_tensor(embeddings)
                and embeddings.dim() == 3 and tuple(mask.shape) == tuple(embeddings.shape[:2])
                and not mask.is_floating_point() and not torch.compiler.is_compiling() and not exporting()
                and not torch.jit.is_tracing() and bool(mask.all()))


class PlainSlidingWindowMask(PlainCausalMask):
    """transformers' create_sliding_window_causal_mask, returning for the plain case (PlainCausalMask's) None
    where the sequence fits the window and the SlidingWindowCausal marker where it does not."""

    def __call__(self, *args, **kwargs):
        arguments = dict(zip(self.names, args), **kwargs)
        window = getattr(arguments.get("config"), "sliding_window", None)
        embeddings = arguments.get("inputs_embeds", arguments.get("input_embeds"))
        if (not self.plain(arguments) or not torch.is_tensor(embeddings) or embeddings.dim() != 3
                or not isinstance(window, int) or isinstance(window, bool) or window < 1):
            return self.create_causal_mask(*args, **kwargs)
        if embeddings.shape[1] <= window and not self.eager(arguments):
            return None
        if not torch.compiler.is_compiling():
            markers["made"] += 1
        return SlidingWindowCausal(window)


@forward_builder("causal_mask")
def _causal_mask_forward(base, options):
    stock = base.forward
    functions = innermost(stock).__globals__
    eager_markers = bool(options.get("eager_markers"))
    plain = with_global(stock, "create_causal_mask", PlainCausalMask(functions["create_causal_mask"], eager_markers))
    if options.get("sliding_window"):
        plain = with_global(plain, "create_sliding_window_causal_mask",
                            PlainSlidingWindowMask(functions["create_sliding_window_causal_mask"], eager_markers))

    def forward(self, *args, **kwargs):
        # Positions given may describe packed sequences, whose mask is not the plain causal one; a padding mask
        # given keeps transformers' mask (under eager markers PlainCausalMask reads one of ones as none).
        if args[1:] or kwargs.get("position_ids") is not None or (
                kwargs.get("attention_mask") is not None and not eager_markers):
            return stock(self, *args, **kwargs)
        if eager_markers and kwargs.get("output_attentions", getattr(self.config, "output_attentions", False)):
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
        code = innermost(type(module).forward).__code__
        sliding = "create_sliding_window_causal_mask" in code.co_names and callable(
            innermost(type(module).forward).__globals__.get("create_sliding_window_causal_mask"))
        variants = [(("sliding_window", True),), ()] if sliding else [()]
        if _eager_attention_takes_markers(module):
            variants.insert(0, (("eager_markers", True),) + variants[0])
        return variants

    def inputs(self, module, context):
        return context.captured_inputs(module)

    def summary(self, options):
        if options.get("eager_markers"):
            return "plain causal attention -> a causal marker for attention_with_sinks, no materialized mask"
        return self.description

    def verify(self, module, fused_cls, context):
        """The whole base model, stock against swapped, with its own parameters (its mask, not its weights,
        is what changes); the sliding-window variant once more with the config's window cut to
        _PROOF_WINDOW, so that the probe's tokens overrun it and its attention takes the marker. With eager
        markers its sink-aware attention runs in its reference form (the marker materialised as transformers'
        mask), so that this proves the masks the markers stand for, exactly in any dtype; attention_with_sinks is
        proven against the eager attention by its own rule (a whole model compared in bfloat16 would differ
        wherever rounding flips a router's choice of experts)."""
        with _sink_attention_as_reference(module) if dict(fused_cls._fused_ops_options).get("eager_markers") \
                else contextlib.nullcontext():
            self._verify(module, fused_cls, context)

    def _verify(self, module, fused_cls, context):
        inputs = self.inputs(module, context)
        probe.verify(module, fused_cls, inputs, random_parameters=False)
        if not dict(fused_cls._fused_ops_options).get("sliding_window"):
            return
        config = getattr(module, "config", None)
        window = getattr(config, "sliding_window", None)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise probe.Mismatch("its config has no sliding window")
        before = dict(markers)
        config.sliding_window = min(window, _PROOF_WINDOW)
        try:
            probe.verify(module, fused_cls, inputs, random_parameters=False)
        finally:
            config.sliding_window = window
        if markers["made"] == before["made"] or markers["taken"] == before["taken"]:
            raise probe.Mismatch("its probe forward made no sliding-window marker for an attention that takes it")


@contextlib.contextmanager
def _sink_attention_as_reference(base):
    """Each sink-aware attention in `base` as its reference class for the duration (rules/attention_sinks.py)."""
    with contextlib.ExitStack() as stack:
        for module in base.modules():
            cls = type(module)
            options = getattr(cls, "_fused_ops_options", ())
            if dict(options).get("sink_attention") is True:
                reference = tuple((name, "reference" if name == "sink_attention" else value) for name, value in options)
                stack.enter_context(probe.as_class(module, fused_class(cls.__bases__[0], cls._fused_ops_kind,
                                                                       reference)))
        yield


def _eager_attention_takes_markers(base):
    """Whether `base` runs eager attention and every attention in it takes the markers (attention_sinks)."""
    if getattr(getattr(base, "config", None), "_attn_implementation", None) != "eager":
        return False

    def stock_code(module):
        cls = type(module).__bases__[0] if fused_kind(module) else type(module)
        return getattr(innermost(cls.forward), "__code__", None)
    attentions = [module for module in base.modules()
                  if "ALL_ATTENTION_FUNCTIONS" in getattr(stock_code(module), "co_names", ())]
    return bool(attentions) and all(
        fused_kind(module) and dict(type(module)._fused_ops_options).get("sink_attention") for module in attentions)
