"""`fused_ops.fuse(model)`: model patching that is proven, not guessed.

Each rule (rules/) finds candidates by structure, proves each variant of its replacement on a seeded
probe against what the module really computes (probe.py), and swaps the first one proven, on this
instance only (swap.py). Anything not proven is left alone, with the reason, in the report.
Hugging Face transformers is never imported by `import fused_ops`; its models are recognised as given.
"""
import contextlib
import functools
import logging
import types
import warnings

import torch

from .. import why_cuda_kernels_do_not_run_on
from . import probe
from .report import Entry, FusionReport
from .rules import LeftAlone
from .rules.attention_sinks import AttentionSinksRule
from .rules.bias_gelu import BiasGELURule
from .rules.causal_mask import CausalMaskRule
from .rules.experts_gate import ExpertsGateRule
from .rules.gated_mlp import GatedMLPRule
from .rules.gated_norm import GatedNormRule
from .rules.lm_head import LMHeadLossRule, base_model_name
from .rules.norm import NormRule
from .rules.residual_norm import ResidualNormRule
from .rules.rotary import RotaryRule
from .rules.sliding_window import SlidingWindowAttentionRule
from .swap import fused_kind, shadowed_methods, swap

logger = logging.getLogger("fused_ops")

# The order matters twice: residual_norm builds on the norms proven before it, and the causal mask's
# marker variants on the attention proven before it to take the markers.
_RULES = [(GatedMLPRule(), "mlp"), (ExpertsGateRule(), "mlp"), (BiasGELURule(), "mlp"), (RotaryRule(), "rope"),
          (LMHeadLossRule(), "cross_entropy"), (NormRule(), "norms"), (GatedNormRule(), "norms"),
          (ResidualNormRule(), "residual_norms"), (SlidingWindowAttentionRule(), "causal_mask"),
          (AttentionSinksRule(), "causal_mask"), (CausalMaskRule(), "causal_mask")]


class _Context:
    """The calls of one probe forward of the whole model, for rules whose inputs are a real call's."""

    def __init__(self, model, modules):
        self.calls, self.failure, self.error = {}, None, None
        if not modules:
            return
        forward_model = getattr(model, "_orig_mod", model)  # a compiled model: probe the eager one
        config = getattr(forward_model, "config", None)
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        vocab_size = getattr(text_config, "vocab_size", None)
        if not isinstance(vocab_size, int):
            self.failure = "no probe forward: the model has no config.vocab_size to draw input_ids from"
            return
        embeddings = forward_model.get_input_embeddings() if hasattr(forward_model, "get_input_embeddings") else None
        parameter = getattr(embeddings, "weight", None)
        if parameter is None:
            parameter = next(forward_model.parameters())
        if parameter.device.type == "meta":
            self.failure = "no probe forward: the parameters are on the meta device"
            return
        generator = torch.Generator().manual_seed(probe.PROBE_SEED)
        ids = torch.randint(0, vocab_size, (2, 6), generator=generator).to(parameter.device)
        try:
            self.calls = probe.capture_calls(forward_model, modules,
                                             lambda: forward_model(input_ids=ids, use_cache=False))
        except Exception as error:  # the model's own forward: whatever it raises, nothing is swapped from it
            self.failure = self.error = f"the probe forward failed: {type(error).__name__}: {error}"

    def captured_inputs(self, module):
        if module not in self.calls:
            raise LeftAlone(self.failure or "the probe forward did not call it")
        args, kwargs, _ = self.calls[module]
        return probe.captured(args, kwargs)

    def captured_output(self, module):
        return self.calls[module][2] if module in self.calls else None


def _prove(rule, module, context, errors):
    """The options of the first variant proven for `module`, or raises LeftAlone with every reason. Where every
    variant's probe failed with an error (not a mismatch: a bad FUSED_OPS_* setting, an exception inside the
    module), their messages go to `errors`, which fuse() warns of."""
    reasons, failures = [], []
    for options in rule.variants(module, context):
        fused_cls = rule.fused_class(module, options)
        try:
            if hasattr(rule, "verify"):
                rule.verify(module, fused_cls, context)
            else:
                probe.verify(module, fused_cls, rule.inputs(module, context), random_parameters=rule.random_parameters,
                             select=rule.select(module, options), large_inputs=rule.large_inputs)
            return rule.proven_options(module, options, context)
        except LeftAlone:
            raise
        except probe.Mismatch as mismatch:
            reasons.append((options, str(mismatch)))
        except Exception as error:  # the probe of a module that is not what the rule replaces, or a failure
            message = f"the probe failed: {type(error).__name__}: {error}"
            failures.append(message)
            reasons.append((options, message))
    if failures and len(failures) == len(reasons):
        for message in dict.fromkeys(failures):
            errors.setdefault(message, []).append(type(module).__name__)
    detail = "not proven: " + "; ".join(f"{_describe(options)}: {message}" for options, message in reasons)
    raise LeftAlone(detail, "not proven: " + "; ".join(dict.fromkeys(message for _, message in reasons)))


def _configuration(module):
    """What makes two modules the same function: their classes, parameter and buffer types, shapes and
    dtypes, and attributes (plain values, and tensors, functions and partial functions by what they
    are), for the module and every submodule; only `layer_idx`, which indexes the cache, may differ."""
    described = []
    for name, sub in module.named_modules():
        attributes = tuple(sorted((key, _attribute(value)) for key, value in vars(sub).items()
                                  if not key.startswith("_") and key != "layer_idx"))
        tensors = tuple((key, type(t), tuple(t.shape), t.dtype, t.device.type) for key, t in
                        list(sub._parameters.items()) + list(sub._buffers.items()) if t is not None)
        # A module with hooks of its own is a function of its own: a proof of its twin without them is not its.
        hooks = tuple(tuple(hooks) for hooks in (sub._forward_hooks, sub._forward_pre_hooks, sub._backward_hooks,
                                                 sub._backward_pre_hooks))
        described.append((name, type(sub), attributes, tensors, hooks))
    return tuple(described)


def _attribute(value):
    """An attribute as far as it can change what a forward computes: plain values by value, a small tensor
    by its values (a larger one is itself), a function by its name, a partial function by its parts;
    other objects (a config the layers share, say) by their type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_attribute(item) for item in value))
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return ("dict", tuple(sorted((key, _attribute(item)) for key, item in value.items())))
    if torch.is_tensor(value):
        small = value.numel() <= 64 and value.device.type != "meta" and type(value) is torch.Tensor
        return ("tensor", tuple(value.shape), value.dtype, tuple(value.flatten().tolist()) if small else id(value))
    if isinstance(value, functools.partial):
        return ("partial", _attribute(value.func), _attribute(value.args), _attribute(value.keywords))
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
        return ("function", getattr(value, "__module__", None), getattr(value, "__qualname__", None))
    if isinstance(value, types.MethodType):
        return ("method", _attribute(value.__func__), id(value.__self__))
    return ("object", type(value).__module__, type(value).__qualname__)


def _describe(options):
    """The options a report shows: all but those named with a leading underscore (what a proof held for)."""
    return ", ".join(f"{name}={getattr(value, '__name__', value)}" for name, value in options
                     if not name.startswith("_")) or "as is"


def fuse(model: torch.nn.Module, *, norms: bool = True, mlp: bool = True, rope: bool = True,
         residual_norms: bool = True, cross_entropy: bool = True, causal_mask: bool = True,
         verbose: bool = False) -> torch.nn.Module:
    """Swaps, in place, the modules of `model` that fused ops are proven to replace, and returns it.

    Each candidate (found by structure) is swapped only where its fused forward computes, on a seeded
    probe with random parameters in float64, in eval and train mode, the same outputs and gradients as
    the module's own forward; anything else is left alone. Parameters are untouched (same objects,
    names, shapes, state-dict keys), so an optimizer made before fuse(), LoRA adapters and checkpoints
    keep working. The swaps are instance-level subclasses that pickle and deepcopy. The LM head + loss
    skips the logits only when training with labels; in eval mode the logits come back with the loss.
    `model.fused_ops_report` says what was swapped and left alone, and why (`verbose=True` prints it).
    A model on a GPU the CUDA kernels do not run on (a build for other targets) is returned unchanged.
    A probe that fails with an error (a bad FUSED_OPS_* setting, an exception inside a module) is a warning,
    once per reason. Each fused module keeps the stock forward's signature and docstring, and a call the
    fused code cannot honour runs the stock forward: under a torch.func transform or forward-mode AD, with a
    hook on a part the fused code does not call (or a global module hook), with arguments or edits made
    since fuse() that its proof does not cover.
    The keyword flags turn kinds off (`causal_mask` also turns off the sliding-window attention and the
    attention with sinks).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fused_ops.fuse: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(getattr(model, "fused_ops_report", None), FusionReport) or any(
            fused_kind(module) for module in model.modules()):
        warnings.warn(f"fused_ops.fuse: {type(model).__name__} is already fused; returned unchanged", stacklevel=2)
        return model
    enabled = dict(norms=norms, mlp=mlp, rope=rope, residual_norms=residual_norms, cross_entropy=cross_entropy,
                   causal_mask=causal_mask)
    rules = [rule for rule, flag in _RULES if enabled[flag]]
    candidates = {rule.kind: list(rule.candidates(model)) for rule in rules}
    cuda_devices = sorted({t.device.index for t in (*model.parameters(), *model.buffers()) if t.is_cuda})
    refusal = _why_the_kernels_do_not_run_on_its_gpus(cuda_devices)
    if refusal is not None:  # a swap would make the stock model's first call fail there
        report = _empty_report(model)
        report.entries = [Entry(path, type(module).__name__, rule.kind, False, refusal)
                          for rule in rules for path, module in candidates[rule.kind]]
        model.fused_ops_report = report
        warnings.warn(f"fused_ops.fuse: {refusal}; {type(model).__name__} returned unchanged", stacklevel=2)
        return model
    captured = {module for rule in rules if rule.needs_capture for _, module in candidates[rule.kind]}
    captured |= {module._modules[base_model_name(module)] for rule in rules if rule.kind == "lm_head_loss"
                 for _, module in candidates[rule.kind] if base_model_name(module) is not None}
    threads = probe.host_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the probes' tensors are tiny: more threads only cost their start-up
    # The probes draw random numbers (a stand-in head's initialisation, for one): the caller's generators,
    # which seed their data and dropout, are left where they were. An autocast region fuse() is called in
    # would run the float64 probes in bfloat16 and refuse proven swaps: the probes run outside it, and make
    # their tensors on the CPU whatever default device the caller has set (`with torch.device("cuda")`).
    try:
        with contextlib.ExitStack() as outside:
            outside.enter_context(torch.random.fork_rng(devices=cuda_devices))
            outside.enter_context(_global_hooks_suspended())
            outside.enter_context(torch.device("cpu"))
            for device_type in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
                outside.enter_context(torch.autocast(device_type, enabled=False))
            context = _Context(model, captured)
            errors = {}
            report = _fuse_proven(model, rules, candidates, context, errors)
    finally:
        torch.set_num_threads(threads)
        probe.forget_random_parameters()
    model.fused_ops_report = report
    _log(report)
    if context.error is not None:
        errors.setdefault(context.error, []).append(type(model).__name__)
    for message, classes in errors.items():  # once per reason, whole
        warnings.warn(f"fused_ops.fuse: {', '.join(dict.fromkeys(classes))} left alone because {message}",
                      stacklevel=2)
    if verbose:
        print(report)
    if not report.swapped:
        warnings.warn(f"fused_ops.fuse: nothing to fuse in {type(model).__name__}; returned unchanged", stacklevel=2)
    return model


@contextlib.contextmanager
def _global_hooks_suspended():
    """Global module hooks set aside while the probes run: a user's hook sees the model's calls, not the
    probes', and a proof is of the computation itself (at each call, a global hook sends every fused module
    that skips a child to its stock forward)."""
    from torch.nn.modules import module as hooks
    registries = [hooks._global_forward_hooks, hooks._global_forward_pre_hooks, hooks._global_backward_hooks,
                  hooks._global_backward_pre_hooks]
    saved = [dict(registry) for registry in registries]
    for registry in registries:
        registry.clear()
    try:
        yield
    finally:
        for registry, entries in zip(registries, saved):
            registry.update(entries)


def _why_the_kernels_do_not_run_on_its_gpus(cuda_devices):
    """Why the CUDA kernels do not run on one of the model's GPUs (a build for other targets, or without
    CUDA kernels), or None."""
    return next(filter(None, (why_cuda_kernels_do_not_run_on(index) for index in cuda_devices)), None)


def _empty_report(model):
    config = getattr(getattr(model, "_orig_mod", model), "config", None)
    return FusionReport(type(model).__name__, str(getattr(config, "model_type", "") or ""))


def _fuse_proven(model, rules, candidates, context, errors):
    report = _empty_report(model)
    verdicts = {}  # identical modules (_configuration) share one proof: layers of a model are proven once
    for rule in rules:
        for path, module in candidates[rule.kind]:
            if fused_kind(module) and not rule.adds_to_fused:
                continue
            module_class = (type(module).__bases__[0] if fused_kind(module) else type(module)).__name__
            shadowed = shadowed_methods(module, rule.kind)
            if shadowed:  # a probe of it would compare the instance's method with itself
                report.entries.append(Entry(path, module_class, rule.kind, False,
                                            f"its {', '.join(shadowed)} is set on the instance (a wrapper such as "
                                            "accelerate's mixed precision): call fuse() before wrapping"))
                continue
            key = (rule.kind, _configuration(module))
            if key not in verdicts:
                try:
                    verdicts[key] = _prove(rule, module, context, errors)
                except LeftAlone as reason:
                    verdicts[key] = reason
            options = verdicts[key]
            if isinstance(options, LeftAlone):
                report.entries.append(Entry(path, module_class, rule.kind, False, str(options), options.summary))
                continue
            report.entries.append(Entry(path, module_class, rule.kind, True, _describe(options),
                                        rule.summary(dict(options))))
            swap(module, rule.fused_class(module, options))
    for rule in rules:
        rule.settle(model, report)
    return report


def _log(report):
    by_kind = {}
    for entry in report.entries:
        swapped, left = by_kind.setdefault(entry.kind, ({}, {}))
        side = swapped if entry.swapped else left
        side[entry.module_class] = side.get(entry.module_class, 0) + 1
    for kind, (swapped, left) in by_kind.items():
        text = lambda counts: ", ".join(f"{count} {name}" for name, count in counts.items()) or "none"  # noqa: E731
        logger.info("fused_ops.fuse: %s: swapped %s; left alone %s", kind, text(swapped), text(left))


__all__ = ["fuse", "FusionReport", "Entry"]
