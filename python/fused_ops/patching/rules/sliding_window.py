"""Sliding-window causal attention without a sequence-wide mask. transformers materialises the mask of a
sliding-window layer whenever the sequence reaches the window (Phi-3-mini's window is 2047 tokens, so a
2048-token batch has one), and SDPA then runs its masked kernel over every query-key pair. Here the base
model hands such layers a `SlidingWindowCausal` marker instead (rules/causal_mask.py), and their attention
computes the same function without it: on a GPU whose flash kernel takes a window (half-precision heads
it supports), as one call of that kernel with the window, which skips every pair outside the band;
elsewhere in two SDPA calls, the first `window` queries plain causal (SDPA's is_causal) and every later
block of queries attending one fixed-width window of keys under one small band mask that all blocks share.
A marker reaching anything else raises: it is no tensor."""
import functools
import inspect
import sys
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .. import probe
from ..report import Entry
from ..swap import forward_builder, forward_option, fused_class, fused_kind, innermost, swap, with_global
from . import LeftAlone, Rule

# How many markers the base models' mask functions have made and attention functions have taken (outside
# torch.compile): the causal mask's proof checks that its probe forward did both.
markers = {"made": 0, "taken": 0}


def count_taken():
    if not torch.compiler.is_compiling():
        markers["taken"] += 1


class SlidingWindowCausal(NamedTuple):
    """What a sliding-window layer attends: each query the `window` latest keys up to its own position."""
    window: int


class FullCausal(NamedTuple):
    """What a full layer attends, handed to an attention that takes no materialised mask under eager attention
    (rules/attention_sinks.py): every key up to the query's own position."""
    window: int = 0


MARKERS = (SlidingWindowCausal, FullCausal)


def sliding_window_mask(window, query_length, key_length, device):
    """The boolean mask transformers builds for the marker's pattern (the queries are the last keys' tokens);
    window 0: plain causal."""
    rows = torch.arange(query_length, device=device)[:, None] + (key_length - query_length)
    keys = torch.arange(key_length, device=device)[None, :]
    return (keys <= rows) & (keys > rows - window) if window else keys <= rows


def _stock_sdpa():
    module = sys.modules.get("transformers.integrations.sdpa_attention")
    return getattr(module, "sdpa_attention_forward", None)


@functools.lru_cache(maxsize=None)
def _flash_takes_window(device_index, head_dim):
    """Whether torch's flash kernel runs these heads with a window on this GPU, forward and backward: a
    torch built with it, on Ampere and Hopper, heads a multiple of 8 up to 256 (192 where the backward's
    tiles do not fit the shared memory, on every Ampere but the A100)."""
    if torch.version.hip is not None or not torch.backends.cuda.is_flash_attention_available():
        return False
    major, minor = torch.cuda.get_device_capability(device_index)
    return major in (8, 9) and head_dim % 8 == 0 and head_dim <= (256 if minor == 0 else 192)


def flash_takes_window(device_index: int, head_dim: int) -> bool:
    """_flash_takes_window, unless SDPA's flash backend is switched off (`sdpa_kernel`, `enable_flash_sdp`),
    which keeps the banded SDPA calls on the backends left on. torch.compile calls it when it traces the
    layer and keeps the answer (_mark_for_torch_compile)."""
    return torch.backends.cuda.flash_sdp_enabled() and _flash_takes_window(device_index, head_dim)


def _mark_for_torch_compile():
    """torch.compile runs flash_takes_window once, as a constant, instead of tracing into the CUDA queries;
    marked when fuse() builds a band-aware attention, not at import: the mark imports torch._dynamo, which
    `import fused_ops` leaves unimported."""
    global flash_takes_window
    if not getattr(flash_takes_window, "_marked_for_torch_compile", False):
        flash_takes_window = torch.compiler.assume_constant_result(flash_takes_window)
        flash_takes_window._marked_for_torch_compile = True


def flash_window_attention(query, key, value, window, scaling):
    """The sliding-window causal pattern as one call of torch's flash kernel with its window (each query
    the keys from `window` - 1 back to itself), keys and values of fewer heads taken as they are (GQA):
    queries, keys, values as (batch, heads, length, dim), the output as (batch, length, heads, dim)."""
    length = query.shape[2]
    return torch.ops.aten._flash_attention_forward(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, None, length, length, 0.0, True,
        False, scale=scaling, window_size_left=window - 1, window_size_right=0)[0]


def _flash_window_applies(query, key, value):
    return (query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
            and key.dtype == value.dtype == query.dtype and query.shape[-1] == key.shape[-1] == value.shape[-1]
            and query.shape[1] % key.shape[1] == 0 and key.shape[1] == value.shape[1]
            and flash_takes_window(query.device.index, query.shape[-1]))


def _slices_a_wider_row(states):
    """Whether (batch, heads, length, dim) states are a slice of a wider projection's rows (Phi-3's values
    in its one `qkv_proj` output): tokens lie further apart than the heads span."""
    return states.stride(2) > states.shape[1] * states.shape[3]


def values_of_their_own(query, key, value):
    """`value` copied out of a projection shared with the queries and keys when those are already tensors of
    their own (the rotary embedding's outputs) and a backward will follow: the attention's backward keeps
    what it saves alive, and a slice keeps the whole projection output (three times the values, for Phi-3)
    until the backward."""
    if not (torch.is_grad_enabled() and value.requires_grad):
        return value
    if _slices_a_wider_row(value) and not _slices_a_wider_row(query) and not _slices_a_wider_row(key):
        return value.transpose(1, 2).contiguous().transpose(1, 2)
    return value


def banded_attention(attention, module, query, key, value, window, **kwargs):
    """`attention` (transformers' SDPA function: queries, keys, values as (batch, heads, length, dim), the
    output as (batch, length, heads, dim)) under the sliding-window causal pattern: the flash kernel with
    its window where it applies, else a causal head block and one batched call over the later blocks of
    min(window, rest) queries, each attending the block + window - 1 keys that end at its last query
    (padded at the end; padded rows are dropped). Values sliced from a wider projection are copied first
    (values_of_their_own)."""
    batch, _, length, _ = query.shape
    value = values_of_their_own(query, key, value)
    if length > window and _flash_window_applies(query, key, value):
        return flash_window_attention(query, key, value, window, kwargs.get("scaling")), None
    head_kwargs = dict(kwargs, is_causal=True)
    if length <= window:
        return attention(module, query, key, value, None, **head_kwargs)
    head, _ = attention(module, query[:, :, :window], key[:, :, :window], value[:, :, :window], None, **head_kwargs)
    rest = length - window
    block = min(rest, window)
    blocks = -(-rest // block)
    span = block + window - 1
    queries = query[:, :, window:]

    def windows(states):  # block b's keys start at b * block + 1
        states = states[:, :, 1:]
        if blocks == 1:  # the keys after the first: a view, which the backward saves without a copy
            return states
        states = F.pad(states, (0, 0, 0, (blocks - 1) * block + span - (length - 1)))
        return states.unfold(2, span, block).permute(0, 2, 1, 4, 3).reshape(batch * blocks, states.shape[1], span,
                                                                              states.shape[-1])
    if blocks > 1:
        queries = F.pad(queries, (0, 0, 0, blocks * block - rest))
        queries = queries.reshape(batch, query.shape[1], blocks, block, -1).transpose(1, 2).reshape(
            batch * blocks, query.shape[1], block, -1)
    rows = torch.arange(block, device=query.device)[:, None]
    columns = torch.arange(span, device=query.device)[None, :]
    band = ((columns >= rows) & (columns < rows + window)).expand(batch * blocks, 1, block, span)
    tail, _ = attention(module, queries, windows(key), windows(value), band, **dict(kwargs, is_causal=False))
    tail = tail.reshape(batch, blocks * block, *tail.shape[2:])[:, :rest]
    return torch.cat([head, tail], dim=1), None


def band_aware_attention(attention, default, reference, module, query, key, value, attention_mask, *args,
                         **kwargs):
    """An attention function that takes the marker: banded where the call is the plain causal SDPA one it
    was proven for (no dropout, queries and keys aligned), the materialised mask otherwise (and as the
    reference a proof compares with)."""
    if not isinstance(attention_mask, SlidingWindowCausal):
        return attention(module, query, key, value, attention_mask, *args, **kwargs)
    count_taken()
    dropout = kwargs.get("dropout", 0.0)
    if (reference or args or attention is not _stock_sdpa() or query.shape[2] != key.shape[2]
            or not isinstance(dropout, (int, float)) or dropout != 0 or kwargs.get("position_bias") is not None):
        mask = sliding_window_mask(attention_mask.window, query.shape[2], key.shape[2], query.device)
        mask = mask.expand(query.shape[0], 1, *mask.shape)
        return attention(module, query, key, value, mask, *args, **kwargs)
    return banded_attention(attention, module, query, key, value, attention_mask.window, **kwargs)


class MarkerAwareFunctions:
    """transformers' ALL_ATTENTION_FUNCTIONS as one attention forward sees it: each function wrapped by
    `consumer(function, default, reference, module, query, ...)`, which takes the markers; `default` is the
    forward's own (eager) function, None where the forward names one."""

    def __init__(self, functions, consumer, reference):
        self.functions, self.consumer, self.reference = functions, consumer, reference

    def get_interface(self, name, default):
        return functools.partial(self.consumer, self.functions.get_interface(name, default), default, self.reference)

    def __getitem__(self, name):
        return functools.partial(self.consumer, self.functions[name], None, self.reference)

    def __getattr__(self, name):
        return getattr(self.functions, name)


def marker_aware(forward, consumer, reference):
    """`forward` with its attention functions taking the markers through `consumer`."""
    functions = innermost(forward).__globals__["ALL_ATTENTION_FUNCTIONS"]
    return with_global(forward, "ALL_ATTENTION_FUNCTIONS", MarkerAwareFunctions(functions, consumer, reference))


@forward_option("band_aware")
def _band_aware_forward(forward, value):
    """`forward` with its attention functions band-aware; "reference" materialises the marker's mask."""
    _mark_for_torch_compile()
    return marker_aware(forward, band_aware_attention, value == "reference")


@forward_builder("sliding_window_attention")
def _stock_forward(base, options):
    """An attention no other rule has swapped: its own forward, made band-aware by the option."""
    return base.forward


def has_sliding_window(module):
    """An attention that may take a sliding-window mask: its own `sliding_window` (None on a full layer), else
    its config's (a layer's type need not say which mask its base model hands it: MiniMax's full-attention
    layers take the sliding-window one). One that never takes it runs as before."""
    if "sliding_window" in vars(module):
        window = vars(module)["sliding_window"]
    else:
        window = getattr(getattr(module, "config", None), "sliding_window", None)
    return isinstance(window, int) and not isinstance(window, bool) and window > 0


# Windows the proof runs the banded attention with on the probe's six tokens: blocks of two, one block of
# three, one of two, and a single query after the head. (A window of one gives queries no gradient at
# all, which leaves nothing but rounding to compare.)
_PROOF_WINDOWS = (2, 3, 4, 5)


class SlidingWindowAttentionRule(Rule):
    kind = "sliding_window_attention"
    description = ("sliding-window causal attention -> torch's flash kernel with the window (Ampere, Hopper), "
                   "else a causal block and key windows under one small band mask (no sequence-wide mask)")
    needs_capture = True
    adds_to_fused = True  # an attention whose rotary embedding is swapped becomes band-aware on top

    def candidates(self, model):
        for name, module in model.named_modules():
            code = getattr(innermost(type(module).forward), "__code__", None)
            if code is not None and "ALL_ATTENTION_FUNCTIONS" in code.co_names and has_sliding_window(module):
                yield name, module

    def variants(self, module, context):
        implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if implementation != "sdpa":
            raise LeftAlone(f"its attention runs as {implementation!r}; the banded form is SDPA's")
        if with_global(type(module).forward, "ALL_ATTENTION_FUNCTIONS", None) is None:
            raise LeftAlone("its forward's decorators do not hold the function they wrap")
        return [(("band_aware", True),)]

    def verify(self, module, fused_cls, context):
        """The banded forward against the same forward given the materialised mask, with random parameters in
        float64, in eval and train mode, outputs and gradients, for each of _PROOF_WINDOWS."""
        verify_with_markers(self, module, fused_cls, context, "band_aware",
                            [SlidingWindowCausal(window) for window in _PROOF_WINDOWS], fused_op_must_run=False)

    def settle(self, model, report):
        """A band-aware attention that no swapped base model hands the marker (its causal mask left as is,
        or its mask made elsewhere, as an image-text model's) would never take one: it goes back to the
        class it had, and the report says so."""
        settle_marker_consumers(model, report, self.kind, "band_aware", "sliding_window",
                                "no swapped base model hands it a sliding-window marker")


def settle_marker_consumers(model, report, kind, option, mask_option, reason):
    """Attention swapped by `kind` (its fused forward carrying `option`) that no base model swapped with the
    causal mask's `mask_option` reaches goes back to the class it had; the report says why."""
    marking = [module for module in model.modules() if fused_kind(module) == "causal_mask"
               and dict(type(module)._fused_ops_options).get(mask_option)]
    reached = {id(sub) for base in marking for sub in base.modules()}
    for index, entry in enumerate(report.entries):
        if entry.kind != kind or not entry.swapped:
            continue
        module = model.get_submodule(entry.path)
        if id(module) in reached:
            continue
        cls = type(module)
        options = tuple(item for item in cls._fused_ops_options if item[0] != option)
        if cls._fused_ops_kind == kind:
            module.__class__ = cls.__bases__[0]
        else:
            swap(module, fused_class(cls.__bases__[0], cls._fused_ops_kind, options))
        report.entries[index] = Entry(entry.path, entry.module_class, kind, False, reason)


def verify_with_markers(rule, module, fused_cls, context, option, markers, **verify_options):
    """probe.verify (with `verify_options`) of `fused_cls`'s forward given each of `markers` as its attention
    mask, on the captured call's other arguments, against the forward with `option` "reference", which
    materialises the marker as transformers' mask. A forward that reads the mask itself, not only handing it
    to its attention function, fails on the marker: not proven, with the reason."""
    inputs = context.captured_inputs(module)
    try:
        names = list(inspect.signature(type(module).forward).parameters)[1:]
    except (TypeError, ValueError):
        raise LeftAlone("its forward's signature cannot be read") from None
    if "attention_mask" not in names:
        raise LeftAlone("its forward takes no attention_mask")
    position = names.index("attention_mask")
    reference_cls = rule.fused_class(module, ((option, "reference"),))
    for marker in markers:
        def make(dtype, device, marker=marker):
            args, kwargs = inputs.make(dtype, device)
            if position < len(args):
                args = args[:position] + (marker,) + args[position + 1:]
            else:
                kwargs = dict(kwargs, attention_mask=marker)
            return args, kwargs
        with probe.as_class(module, reference_cls):
            try:
                probe.verify(module, fused_cls, probe.Inputs(make, inputs.grad_input), **verify_options)
            except probe.Mismatch as mismatch:
                raise probe.Mismatch(f"with {marker}: {mismatch}") from None
            except Exception as error:  # a forward that reads the mask itself (HY v4's sparse index)
                raise probe.Mismatch(f"its forward does not pass a marker to its attention function "
                                     f"({type(error).__name__}: {error})") from None
