"""Instance-level swaps: a module gets a subclass of its own class whose forward (or the one method a
forward calls, as an experts module's gate) is the fused one.

Attributes, parameters, hooks and isinstance checks stay as they were; nothing process-wide changes. A
fused class is named by (its base class, the kind of fusion, the options), which is also how it pickles:
`torch.save`, `copy.deepcopy` and `pickle` store that triple and rebuild the same class on load.
"""
import inspect
import itertools
import sys
import types
from typing import Callable, Dict, Tuple

import torch
from torch.nn.modules import module as _module_hooks

# kind -> function(base_class, options: dict) -> forward, or {method name: method}
_FORWARD_BUILDERS: Dict[str, Callable] = {}
_CLASSES: Dict[Tuple, type] = {}
# kind -> the names of the methods its fused class defines
_REPLACED_METHODS: Dict[str, Tuple[str, ...]] = {}
# option name -> function(forward, value) -> forward: a change any kind's fused forward may carry on top
_FORWARD_OPTIONS: Dict[str, Callable] = {}
# kind -> function(options: dict) -> the names of the children its fused methods compute without calling them
_SKIPPED_CHILDREN: Dict[str, Callable] = {}
# kind -> function(module, args, kwargs) -> whether this call needs the stock method (an argument the fused
# one does not honour)
_STOCK_CALLS: Dict[str, Callable] = {}


def forward_builder(kind: str, methods: Tuple[str, ...] = ("forward",), skips: Callable = None,
                    needs_stock: Callable = None):
    """Registers the function that makes a fused forward of `kind` (or the fused `methods`, by name) for a
    base class and options. `skips(options)` names the children the fused methods compute without calling
    them (a hook on one of those sends the call to the stock method); `needs_stock(module, args, kwargs)`
    says whether a call takes arguments the fused method does not honour."""
    def register(build):
        _FORWARD_BUILDERS[kind] = build
        _REPLACED_METHODS[kind] = methods
        _SKIPPED_CHILDREN[kind] = skips or (lambda options: ())
        _STOCK_CALLS[kind] = needs_stock
        return build
    return register


def forward_option(name: str):
    """Registers a change of the fused forward that an option `name` makes whatever the kind (the
    band-aware attention of rules/sliding_window.py on top of a rotary one, say)."""
    def register(change):
        _FORWARD_OPTIONS[name] = change
        return change
    return register


def shadowed_methods(module, kind: str) -> Tuple[str, ...]:
    """The methods `kind` replaces that `module` has set on the instance, which a class swap cannot reach
    (accelerate's mixed precision wraps a prepared model's forward so)."""
    return tuple(name for name in _REPLACED_METHODS[kind] if name in vars(module))


def fused_class(base: type, kind: str, options: tuple) -> type:
    """The one subclass of `base` whose forward (or other methods) are `kind`'s with `options` (a tuple of
    (name, value) pairs)."""
    key = (base, kind, options)
    if key not in _CLASSES:
        built = _FORWARD_BUILDERS[kind](base, dict(options))
        methods = dict(built) if isinstance(built, dict) else {"forward": built}
        for name, value in options:
            if name in _FORWARD_OPTIONS:
                methods["forward"] = _FORWARD_OPTIONS[name](methods.get("forward", base.forward), value)
        skipped = tuple(_SKIPPED_CHILDREN[kind](dict(options)))
        methods = {name: _as_seen_by_callers(base, name, method, skipped, _STOCK_CALLS[kind])
                   for name, method in methods.items()}
        _CLASSES[key] = type(f"Fused{base.__name__}", (base,), {
            **methods, "_fused_ops_kind": kind, "_fused_ops_options": options,
            "_fused_ops_option_values": dict(options),
            "__reduce_ex__": _reduce_fused, "__module__": base.__module__})
    return _CLASSES[key]


def _as_seen_by_callers(base, name, fused, skipped, needs_stock):
    """The fused method as callers see the stock one: its signature, name and docstring (Trainer, TRL and
    generate read them), and a check at each call that sends to the stock method any call the fused one
    cannot honour: one under a torch.func transform or forward-mode AD (whose rules the fused ops lack),
    hooks on a child the fused method does not call (or global module hooks, which would see fewer calls),
    and the arguments `needs_stock` names."""
    stock = getattr(base, name)

    def method(self, *args, **kwargs):
        if stock_call_needed(self, skipped) or (needs_stock is not None and needs_stock(self, args, kwargs)):
            return stock(self, *args, **kwargs)
        return fused(self, *args, **kwargs)
    method.__name__, method.__doc__ = getattr(stock, "__name__", name), getattr(stock, "__doc__", None)
    method.__qualname__ = f"{base.__qualname__}.{method.__name__}"
    method.__module__ = getattr(stock, "__module__", base.__module__)
    try:
        method.__signature__ = inspect.signature(stock)
    except (TypeError, ValueError):  # a stock method without a readable signature: callers read none either
        pass
    method._fused_ops_fused = fused
    return method


def stock_call_needed(module, skipped=()) -> bool:
    """Whether a fused module's call must run the stock method: under a torch.func transform or forward-mode
    AD, or where a child it does not call (`skipped`) has a hook, or any global module hook is registered
    while it skips children. Dict lookups only: nothing measurable per call."""
    if not torch.compiler.is_compiling() and (torch._C._functorch.peek_interpreter_stack() is not None
                                              or torch.autograd.forward_ad._current_level >= 0):
        return True
    if not skipped:
        return False
    if (_module_hooks._global_forward_hooks or _module_hooks._global_forward_pre_hooks
            or _module_hooks._global_backward_hooks or _module_hooks._global_backward_pre_hooks):
        return True
    children = module._modules
    for name in skipped:
        child = children.get(name)
        if child is not None and has_hooks(child):
            return True
    return False


def has_hooks(module) -> bool:
    """Whether `module` has a forward, forward-pre, backward or backward-pre hook of its own."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def fused_kind(module) -> str:
    """The kind of fusion `module` has, or None."""
    return getattr(type(module), "_fused_ops_kind", None)


def swap(module, cls: type) -> None:
    """Makes `module` an instance of `cls`, a fused class of its own class (fused_class)."""
    module.__class__ = cls
    _keep_output_recording(module)


def _keep_output_recording(module):
    """transformers finds what a model records (hidden states, attentions, router logits) by str(its
    class), registered when an instance is built: the fused class records what its base class does."""
    recording = sys.modules.get("transformers.utils.output_capturing")
    registry = getattr(recording, "_CAN_RECORD_REGISTRY", None)
    base = str(type(module).__bases__[0])
    if registry is not None and base in registry:
        registry[str(type(module))] = registry[base]


def _reduce_fused(self, protocol):
    cls = type(self)
    if "_fused_ops_kind" not in cls.__dict__:  # another library's subclass on top (FSDP): its own rules
        return object.__reduce_ex__(self, protocol)
    return _restore_fused, (cls.__bases__[0], cls._fused_ops_kind, cls._fused_ops_options), self.__getstate__()


def _restore_fused(base, kind, options):
    cls = fused_class(base, kind, options)
    module = cls.__new__(cls)
    _keep_output_recording(module)
    return module


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


def innermost(function):
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


class CallSignature:
    """A function's signature as plain names, binding a call's arguments as inspect.Signature.bind does, in
    code torch.compile traces whole: inspect's binding reads mapping proxies, which Dynamo refuses once the
    traced code has changed a dict (transformers' decorators fill keyword arguments from the config)."""

    def __init__(self, signature: inspect.Signature):
        parameters = list(signature.parameters.values())
        kind = inspect.Parameter
        self.order = tuple(p.name for p in parameters)
        self.first = self.order[0] if self.order else None
        self.positional = tuple(p.name for p in parameters
                                if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD))
        self.positional_only = frozenset(p.name for p in parameters if p.kind is kind.POSITIONAL_ONLY)
        self.keyword_only = tuple(p.name for p in parameters if p.kind is kind.KEYWORD_ONLY)
        self.var_positional = next((p.name for p in parameters if p.kind is kind.VAR_POSITIONAL), None)
        self.var_keyword = next((p.name for p in parameters if p.kind is kind.VAR_KEYWORD), None)
        self.defaults = {p.name: p.default for p in parameters if p.default is not kind.empty}

    def bind(self, args, kwargs, defaults=True):
        """A method call's arguments, its first (self) dropped: (the named ones in the signature's order, with
        its defaults where `defaults`; the keyword arguments its **kwargs collects). Positional arguments
        keep the meaning they have for the stock forward; a call the signature does not accept raises
        TypeError, as the stock forward would."""
        if len(args) > len(self.positional) and self.var_positional is None:
            raise TypeError(f"too many positional arguments: {len(args)}, at most {len(self.positional)}")
        named = dict(zip(self.positional, args))
        more = {}
        for name, value in kwargs.items():
            if name in self.positional_only or (name not in self.positional and name not in self.keyword_only):
                if self.var_keyword is None:
                    raise TypeError(f"got an unexpected keyword argument {name!r}")
                more[name] = value
            elif name in named:
                raise TypeError(f"multiple values for argument {name!r}")
            else:
                named[name] = value
        if self.var_positional is not None and (defaults or len(args) > len(self.positional)):
            named[self.var_positional] = tuple(args[len(self.positional):])
        if defaults:
            for name in self.positional + self.keyword_only:
                if name not in named:
                    if name not in self.defaults:
                        raise TypeError(f"missing a required argument: {name!r}")
                    named[name] = self.defaults[name]
        return {name: named[name] for name in self.order if name in named and name != self.first}, more


def rewrapped(function, replace_innermost):
    """A copy of each decorator's wrapper around `function`, wrapping `replace_innermost(the innermost
    function)` instead (None where that gives None or a wrapper does not hold the function it wraps in its
    closure): the stock forward's decorators (transformers' output and config-default handling) around a
    forward of our own."""
    inner = getattr(function, "__wrapped__", None)
    if inner is None:
        return replace_innermost(function)
    copied_inner = rewrapped(inner, replace_innermost)
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
    copied.__wrapped__ = copied_inner
    return copied


def with_global(function, name, value):
    """A copy of `function`, and of each decorator's wrapper around it, whose global `name` is `value`
    (None where a wrapper does not hold the function it wraps in its closure)."""
    def copy_with_global(inner):
        if not hasattr(inner, "__code__"):
            return None
        copied = types.FunctionType(inner.__code__, _module_globals_with(inner.__globals__, name, value),
                                    inner.__name__, inner.__defaults__, inner.__closure__)
        copied.__kwdefaults__ = inner.__kwdefaults__
        copied.__dict__.update(inner.__dict__)
        return copied
    return rewrapped(function, copy_with_global)


def holds_plain_tensors(module, *names) -> bool:
    """Whether the module's `names` (parameters, buffers, attributes) are each None or a tensor the fused
    ops take as it is: a plain tensor or parameter, a DTensor (the ops have sharding rules) or the fake
    stand-in that tracing puts in a parameter's place. A quantised weight (a tensor subclass, as torchao
    makes, or a parameter subclass, as bitsandbytes does) holds codes and scales, not the values: the
    module's own forward computes with it."""
    for name in names:
        value = getattr(module, name, None)
        if value is None or type(value) in (torch.Tensor, torch.nn.Parameter):
            continue
        if isinstance(value, _TRACING_TENSORS):
            continue
        dtensor = sys.modules.get("torch.distributed.tensor")
        if dtensor is not None and isinstance(value, dtensor.DTensor):
            continue
        return False
    return True


_TRACING_TENSORS = (torch._subclasses.fake_tensor.FakeTensor, torch._subclasses.functional_tensor.FunctionalTensor)


def activation_children(module, projections=()) -> Tuple[Tuple[str, type], ...]:
    """(name, class) of a module's children other than its `projections`: what computes its activation,
    which a fused forward that takes the activation from its proof does not call."""
    return tuple((name, type(child)) for name, child in module._modules.items() if name not in projections)


def is_plain_linear(module) -> bool:
    """An nn.Linear with no hooks (its own or global) and a weight and bias of plain values: its product may be
    taken from its weight without calling it."""
    return (type(module) is torch.nn.Linear and not has_hooks(module)
            and not _module_hooks._global_forward_hooks and not _module_hooks._global_forward_pre_hooks
            and not _module_hooks._global_backward_hooks and not _module_hooks._global_backward_pre_hooks
            and holds_plain_tensors(module, "weight", "bias"))


def as_autocast_runs_linear(x, weight, bias):
    """x, weight and bias in the dtype autocast gives nn.Linear's product on x's device (unchanged outside
    autocast): the fused ops that hold a product take their operands in one dtype."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return x, weight, bias
    dtype = torch.get_autocast_dtype(device)
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)
