"""The causal LM's head + loss when training with labels: linear_cross_entropy, without the logits.

The fused forward takes the stock forward's own arguments (bound to its signature, so positional
arguments mean what they meant), hands the base model (at `.model`, or at the class's
`base_model_prefix`: GPT-2's `transformer`) what the stock forward hands it, takes the loss of the head
over its last hidden state, and returns the stock output's class with the base model's fields. What
families put around the head is a variant the probe proves: a logit scale (Cohere's `logit_scale`,
Granite's `1 / logits_scaling`, Falcon-H1's `lm_head_multiplier`, MuseGlimmer's `output_multiplier`),
taken on the rows before the product, and a final-logit softcap (Gemma 2, 3), which the op applies.
The MoE families' router loss (`output_router_logits`) is added to the fused loss by the family's own
`load_balancing_loss_func`, as its stock forward adds it. Image-text models (Gemma 3, 4) hand the labels
to their base model too.

In eval mode, without labels, or when the head is not a plain nn.Linear (LoRA, quantised), the stock
forward runs and the logits come back as usual.
"""
import contextlib
import dataclasses
import inspect
import zlib

import torch
import torch.nn.functional as F

from ... import _ops
from .. import probe
from ..swap import CallSignature, as_autocast_runs_linear, forward_builder, innermost, is_plain_linear, rewrapped
from . import LeftAlone, Rule

# The arguments the probe gives every candidate; any other named argument of a forward is handed to the
# base model as it is, which the probe proves with a marker value in it.
_CORE = {"self", "input_ids", "attention_mask", "position_ids", "past_key_values", "inputs_embeds", "labels",
         "use_cache", "logits_to_keep", "output_router_logits"}
_PROBE_HEAD_WIDTH = 16
# Output fields the fused forward sets itself rather than takes from the base model's output.
_OWN_FIELDS = {"loss", "logits", "aux_loss"}
# The option saying the fused loss brings rows of another dtype to the head's (LMHeadLossRule.proven_options).
ROWS_TO_HEAD_DTYPE = "rows_to_head_dtype"


def _returns_a_tuple(module, args, kwargs):
    """Whether the call asks for a tuple (return_dict=False, passed or from the config): the stock tuple has
    the logits in its second place, which the fused output leaves empty, so such a call runs the stock forward."""
    return_dict = kwargs.get("return_dict")
    if return_dict is None:
        return_dict = getattr(getattr(module, "config", None), "return_dict", True)
    return not return_dict


@forward_builder("lm_head_loss", skips=lambda options: ("lm_head",), needs_stock=_returns_a_tuple)
def _causal_lm_forward(base, options):
    stock, output_class = base.forward, options["output_class"]
    logit_scale, softcap, labels_to_base = options["logit_scale"], options["softcap"], options["labels_to_base"]
    base_name, kwargs_to_base = options["base"], options["kwargs_to_base"]
    rows_to_head_dtype = options.get(ROWS_TO_HEAD_DTYPE)
    router_loss_function = (innermost(stock).__globals__.get("load_balancing_loss_func") if options["router_loss"]
                            else None)
    signature = CallSignature(inspect.signature(innermost(stock)))
    fields = [field.name for field in dataclasses.fields(output_class) if field.name not in _OWN_FIELDS
              and (field.name != "cross_attentions" or options.get("cross_attentions", True))]

    def fused_loss(self, hidden_states, labels, shift_labels, logits_to_keep, num_items_in_batch, ignore_index):
        """The causal LM's loss of the head over `hidden_states`, without the logits."""
        slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden_states = hidden_states[:, slice_indices, :]
        if shift_labels is None:
            shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        rows, weight, bias = as_autocast_runs_linear(hidden_states, self.lm_head.weight, self.lm_head.bias)
        if rows_to_head_dtype and rows.dtype != weight.dtype:
            rows = rows.to(weight.dtype)
        if logit_scale != 1.0:  # (rows * s) @ W^T = s * logits; a bias would be scaled too
            rows = rows * logit_scale
        loss = _ops.linear_cross_entropy(rows, weight, shift_labels.to(hidden_states.device), bias,
                                         ignore_index=ignore_index,
                                         reduction="mean" if num_items_in_batch is None else "sum",
                                         softcap=softcap)
        if num_items_in_batch is not None:
            loss = loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch)
                           else num_items_in_batch)
        return loss

    def forward(self, *args, **kwargs):
        arguments, extra = signature.bind((self, *args), kwargs)
        labels, shift_labels = arguments.pop("labels"), extra.get("shift_labels")
        router_logits_wanted = arguments.pop("output_router_logits", None)
        if router_logits_wanted is None:
            router_logits_wanted = extra.pop("output_router_logits", None)
        if router_logits_wanted is None:
            router_logits_wanted = getattr(getattr(self, "config", None), "output_router_logits", False)
        # The stock forward computes a loss only where labels are given (shift_labels alone gives none).
        ignore_index = extra.get("ignore_index", -100)
        if (not self.training or labels is None or not is_plain_linear(self.lm_head)
                or not _loss_as_proven(self, options)
                or (logit_scale != 1.0 and self.lm_head.bias is not None)  # a bias added since: scaled too
                or not isinstance(ignore_index, int) or isinstance(ignore_index, bool)
                or (router_logits_wanted and router_loss_function is None)):
            return innermost(stock)(self, *args, **kwargs)  # inside the stock decorators already
        logits_to_keep = arguments.pop("logits_to_keep", 0)
        num_items_in_batch = extra.get("num_items_in_batch")
        # The keyword arguments go to the base model where the stock forward hands them on (GPT-J's does not).
        handed = dict(extra) if kwargs_to_base else {}
        if options["router_to_base"]:
            handed["output_router_logits"] = bool(router_logits_wanted)
        if labels_to_base:
            arguments["labels"], handed["return_dict"] = labels, True
        outputs = self._modules[base_name](**arguments, **handed)
        loss = fused_loss(self, outputs.last_hidden_state, labels, shift_labels, logits_to_keep, num_items_in_batch,
                          ignore_index)
        passed = {name: getattr(outputs, name, None) for name in fields}
        if router_logits_wanted:
            aux_loss = router_loss_function(outputs.router_logits, self.num_experts, self.num_experts_per_tok,
                                            arguments.get("attention_mask"))
            loss = loss + self.router_aux_loss_coef * aux_loss.to(loss.device)
            passed["aux_loss"] = aux_loss
        return output_class(loss=loss, logits=None, **passed)
    # Inside the stock forward's decorators, which turn return_dict=False into a tuple and fill arguments
    # from the config (Mistral 3's vision_feature_layer) before the base model is handed them.
    decorated = rewrapped(stock, lambda _: forward)
    if decorated is None:
        raise LeftAlone("its forward's decorators do not hold the function they wrap")
    return decorated


def _loss_as_proven(module, options):
    """Whether the head computes now what it was proven with: the same final-logit softcap and logit scales,
    the loss type, and no loss_function set on the instance since (the stock forward calls that one)."""
    return (_head_constants(module) == options.get("_constants")
            and getattr(module, "loss_type", None) == options.get("_loss_type")
            and "_loss_function" not in vars(module))


def _head_constants(module):
    """(the final-logit softcap, the logit scales) the module's attributes and config give now: a proof
    holds for these, and the fused forward leaves a model whose config changed since to the stock one."""
    config = getattr(module, "config", None)
    configs = [config, config.get_text_config()] if hasattr(config, "get_text_config") else [config]
    softcaps = [getattr(c, "final_logit_softcapping", None) for c in configs]
    softcap = next((float(c) for c in softcaps if _positive(c)), 0.0)
    scales = [1.0]
    candidates = [getattr(module, "logit_scale", None)]
    for c in configs:  # Granite's divisor; Falcon-H1's and MuseGlimmer's multipliers
        logits_scaling = getattr(c, "logits_scaling", None)
        candidates += [1.0 / logits_scaling if _positive(logits_scaling) else None,
                       getattr(c, "lm_head_multiplier", None), getattr(c, "output_multiplier", None)]
    for scale in candidates:
        if _positive(scale) and scale not in scales:
            scales.append(float(scale))
    return softcap, tuple(scales)


def _marker(key, value):
    """A number that changes with what the base model was handed under `key`, and with its value."""
    if value is None:
        return 0.0
    weight = 1.0 + zlib.crc32(repr(key).encode()) % 1000 / 1000.0
    if torch.is_tensor(value):  # the golden ratio's fraction spreads integer sums (ids, labels) too
        return weight * (1.0 + float(value.detach().double().sum()) * 0.6180339887 % 1.0)
    return weight * (1.0 + zlib.crc32(repr(value).encode()) % 1000 / 1000.0)


class _HiddenStates(torch.nn.Module):
    """Stands in for the base model in a probe: returns its `hidden` parameter, shifted by a number that
    depends on every argument it was handed (so a fused forward that hands it anything else gives another
    loss), as the last hidden state; a distinct marker in every other field of its output class, and its
    `router_logits` parameters (one per layer) when it has them. The real base model's parameter names
    and numbers (Falcon-H1's `lm_head_multiplier`) are its own."""

    def __init__(self, base, hidden, output_class, router_logits=()):
        super().__init__()
        self.hidden = torch.nn.Parameter(hidden)
        self.router_logits = torch.nn.ParameterList(router_logits)
        self.output_class = output_class
        self.signature = CallSignature(inspect.signature(innermost(type(base).forward)))
        for name, value in vars(base).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not name.startswith("_"):
                setattr(self, name, value)

    def forward(self, *args, **kwargs):
        # By the real base model's parameter names: input_ids handed by position or by name is the same.
        named, more = self.signature.bind((None, *args), kwargs, defaults=False)
        handed = [_marker(name, value) for name, value in {**named, **more}.items() if name != "return_dict"]
        hidden = self.hidden + sum(handed) / 4
        fields = {}
        for number, field in enumerate(dataclasses.fields(self.output_class)):
            if field.name not in ("last_hidden_state", "router_logits"):
                fields[field.name] = torch.full((1,), number + 0.5, dtype=hidden.dtype, device=hidden.device)
        if len(self.router_logits):
            fields["router_logits"] = tuple(self.router_logits)
        return self.output_class(last_hidden_state=hidden, **fields)


class LMHeadLossRule(Rule):
    kind = "lm_head_loss"
    description = "LM head + loss when training with labels -> linear_cross_entropy (no logits then)"
    needs_capture = True

    def summary(self, options):
        extras = ([f"logit scale {options['logit_scale']:g}"] if options["logit_scale"] != 1.0 else []) + (
            [f"softcap {options['softcap']:g}"] if options["softcap"] else []) + (
            ["router loss added"] if options["router_loss"] else [])
        return ("LM head + cross-entropy without the logits when training with labels (eval and calls without "
                "labels return the logits as before)" + (f"; {', '.join(extras)}" if extras else ""))

    def candidates(self, model):
        for name, module in model.named_modules():
            if "lm_head" in module._modules and "labels" in _parameters(module):
                yield name, module

    def variants(self, module, context):
        if base_model_name(module) is None:
            raise LeftAlone("its base model is neither at .model nor at its base_model_prefix")
        parameters = _signature_parameters(module)
        kinds = [p.kind for p in parameters[1:]]
        names = [p.name for p in parameters]
        if ("input_ids" not in names or "labels" not in names or inspect.Parameter.VAR_KEYWORD not in kinds
                or inspect.Parameter.VAR_POSITIONAL in kinds or inspect.Parameter.POSITIONAL_ONLY in kinds):
            raise LeftAlone(f"its forward does not take input_ids, labels and keyword arguments by name: {names}")
        if not isinstance(module.lm_head, torch.nn.Linear):
            raise LeftAlone("its head is not an nn.Linear")
        if "_loss_function" in vars(module):
            raise LeftAlone("a loss_function of its own is set on it; the fused loss is the causal LM's cross-entropy")
        output = context.captured_output(module)
        if output is None or not hasattr(output, "logits") or not dataclasses.is_dataclass(output):
            raise LeftAlone("the probe forward gave no output with logits")
        constants = _head_constants(module)
        softcap, scales = constants
        if module.lm_head.bias is not None:
            scales = (1.0,)  # a scale taken on the rows would scale the bias too
        router_loss = _has_router_loss(module)
        # What the probe proves: whether the base model is handed the forward's keyword arguments (GPT-J's
        # is not), the labels (image-text models) and `output_router_logits` (most MoE families; Granite's MoE
        # reads it from its config), and whether an output's cross-attentions come from the base model or
        # stay empty (Bloom, Falcon, MPT).
        crosses = ([(("cross_attentions", True),), (("cross_attentions", False),)]
                   if "cross_attentions" in {field.name for field in dataclasses.fields(output)} else [()])
        return [(("base", base_model_name(module)),) + cross + (("kwargs_to_base", kwargs),
                 ("labels_to_base", labels), ("logit_scale", scale), ("output_class", type(output)),
                 ("router_loss", router_loss), ("router_to_base", router), ("softcap", softcap),
                 ("_constants", constants), ("_loss_type", getattr(module, "loss_type", None)))
                for cross in crosses
                for kwargs in (True, False)
                for labels in (False, True)
                for router in ((True, False) if "output_router_logits" in names else (False,))
                for scale in scales]

    def verify(self, module, fused_cls, context):
        with _stand_ins(module, context, fused_cls) as (make_inputs, extras):
            for extra in extras:
                probe.verify(module, fused_cls, make_inputs(extra), select=_all_but_logits)

    def proven_options(self, module, options, context):
        """The proven options, and whether the fused loss may bring a last hidden state of another dtype than
        the head's to the head's, as Mamba's forward does with its float32 residual stream in a 16-bit
        model; where the stock forward does otherwise (Llama's product raises), the op's check raises."""
        cast = tuple(options) + ((ROWS_TO_HEAD_DTYPE, True),)
        fused_cls = self.fused_class(module, cast)
        try:
            with _stand_ins(module, context, fused_cls) as (make_inputs, _):
                head = {f"lm_head.{name}" for name, _ in module.lm_head.named_parameters()}
                state = {name: p.detach().to("cpu", torch.bfloat16 if name in head else torch.float32).requires_grad_()
                         for name, p in module.named_parameters()}
                probe.verify_with_state(module, fused_cls, make_inputs({}), state, None,
                                        "a float32 last hidden state and a bfloat16 head", training=True,
                                        select=_all_but_logits)
        except Exception:  # a mismatch, or a stock forward that raises there: not proven
            return tuple(options) + ((ROWS_TO_HEAD_DTYPE, False),)
        return cast


@contextlib.contextmanager
def _stand_ins(module, context, fused_cls):
    """The module with a stand-in base model that returns random hidden states (_HiddenStates) and a narrow
    head in place of its own, for the probes; yields (inputs with these extra arguments, the extra arguments
    to prove each with)."""
    name = base_model_name(module)
    base_output = context.captured_output(module._modules[name])
    if not dataclasses.is_dataclass(base_output) or not hasattr(base_output, "last_hidden_state"):
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
    # Every argument beyond the core ones, once with a marker value: the base model must be handed it
    # as the stock forward hands it.
    markers = {p.name: torch.full((1,), 0.25 + number, dtype=torch.float64)
               for number, p in enumerate(_signature_parameters(module))
               if p.name not in _CORE and p.kind is not inspect.Parameter.VAR_KEYWORD}
    router_logits, extras = (), [{}, {"num_items_in_batch": 7}] + ([markers] if markers else [])
    if options["router_loss"]:
        router_logits = [torch.randn(10, module.num_experts, generator=generator, dtype=torch.float64)
                         .to(head.weight.device, head.weight.dtype) for _ in range(2)]
        extras += [{"output_router_logits": True}, {"output_router_logits": True, "num_items_in_batch": 7}]
    base = module._modules[name]
    stub = _HiddenStates(base, hidden.to(head.weight.device, head.weight.dtype), type(base_output), router_logits)

    def make_inputs(extra):
        def make(dtype, device):
            ids = torch.zeros(2, 5, dtype=torch.long, device=device)
            return (), dict(input_ids=ids, labels=labels.to(device), use_cache=False, **extra)
        return probe.Inputs(make, None)
    module._modules[name], module._modules["lm_head"] = stub, narrow_head
    try:
        yield make_inputs, extras
    finally:
        module._modules[name], module._modules["lm_head"] = base, head


def base_model_name(module):
    """Where a causal LM keeps its base model: `.model`, or its class's `base_model_prefix` (GPT-2's
    `transformer`, GPT-NeoX's `gpt_neox`); None where neither is a submodule."""
    for name in ("model", getattr(module, "base_model_prefix", None)):
        if isinstance(name, str) and isinstance(module._modules.get(name), torch.nn.Module):
            return name
    return None


def _has_router_loss(module):
    """A MoE causal LM whose forward adds `load_balancing_loss_func(router_logits, num_experts,
    num_experts_per_tok, attention_mask)` scaled by `router_aux_loss_coef` (the probe proves it)."""
    return ("output_router_logits" in _parameters(module)
            and callable(innermost(type(module).forward).__globals__.get("load_balancing_loss_func"))
            and all(isinstance(getattr(module, name, None), (int, float))
                    for name in ("num_experts", "num_experts_per_tok", "router_aux_loss_coef")))


def _positive(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def _all_but_logits(output):
    return {key: value for key, value in output.items() if key != "logits"}


def _signature_parameters(module):
    try:
        return list(inspect.signature(innermost(type(module).forward)).parameters.values())
    except (TypeError, ValueError):
        return []


def _parameters(module):
    return [p.name for p in _signature_parameters(module)]
