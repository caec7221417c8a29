"""Proof by probe: a fused forward replaces a module's only where both compute the same function.

A candidate is run twice on the same seeded inputs, through its own forward and through the fused one,
with fresh random parameters (so weights of ones or biases of zeros hide nothing), in eval and in train
mode under the same random seed (so dropout must match too), in float64 on the CPU (so a wrong epsilon
or a dropped constant shows far above rounding; in float32 where the module's own forward has no
float64 kernel, as grouped matrix products of experts); outputs and the gradients of every input and parameter
are compared. Rules of elementwise functions (norms, activations, gates) prove again with every floating
input a thousand times larger: a clamp or a threshold (DeepSeek-V4's and gpt-oss's experts clamp the gate
at 10 and 7) that unit-scale values never reach shows there. A second run in the module's own dtype,
device and parameters checks the output dtypes. Where a rule's fused forward may also take mixed dtypes,
verify_in_mixed_precision proves that case after the variant holds: float32 parameters on 16-bit inputs,
or float32 inputs under autocast.
A mixture of experts is probed with as few experts as its routing needs and a gated MLP with a narrow
intermediate width (`stand_in`): a rule's proof depends on neither, and 128 experts' or a 14336-wide
MLP's random float copies and gradients would cost gigabytes and minutes of host time per probe.
"""
import contextlib
import copy
import dataclasses
import zlib
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch.func import functional_call

from . import swap as swapping
from .state import state_kept, values_kept

PROBE_SEED = 20261204
_PROBE_RTOL = 2e-5
# Float64 parameters above this many elements would cost more host memory than a probe is worth.
_FLOAT64_ELEMENTS = 1 << 24
# Tensors are compared this many elements at a time, so a large gradient needs no float64 copy whole.
_COMPARE_CHUNK = 1 << 22
# Modules of at least this many parameter elements are probed (and their gradients compared) on all the
# host threads fuse() found; the probes otherwise run on one: their tensors are tiny, and more threads
# only cost their start-up.
_THREADED_ELEMENTS = 1 << 20
host_threads = 1
# Gated MLPs are probed with this intermediate width (stand_in).
_MLP_WIDTH = 32
# How much larger the inputs of a second proof are, for rules whose functions may clamp (verify's large_inputs).
_LARGE_INPUT_SCALE = 1e3
# A clamp changes values wholesale; this looser bound leaves the rounding of stock forwards that compute in
# float32 at that scale (OLMo's LayerNorm) to the unit-scale proof's tight one.
_LARGE_INPUT_RTOL = 1e-3
# Two roundings apart at most in float16 or bfloat16 (verify_in_mixed_precision).
_16_BIT_RTOL = 1e-2
# The names under which routers keep how many experts a token goes to.
_TOP_K_NAMES = ("top_k", "num_experts_per_tok", "experts_per_token")


class Mismatch(Exception):
    """The fused forward does not compute what the module computes (the message says where)."""


@dataclasses.dataclass
class Inputs:
    """How to call a module in a probe: `make(dtype, device)` gives (args, kwargs); the tensor at
    `grad_input` (an index into args or a keyword) gets a gradient."""
    make: Callable[[torch.dtype, torch.device], Tuple[tuple, dict]]
    grad_input: Any = 0


def _map_tensors(value, function):
    if torch.is_tensor(value):
        return function(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(v, function) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, function) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, function) for k, v in value.items()}
    return value


def converted(value, dtype, device):
    """`value` with floating tensors in `dtype` and every tensor on `device`, detached."""
    def convert(tensor):
        tensor = tensor.detach().to(device)
        return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    return _map_tensors(value, convert)


def captured(args, kwargs) -> Inputs:
    """Inputs replaying a call recorded during the probe forward."""
    args, kwargs = converted(args, None, "cpu"), converted(kwargs, None, "cpu")
    grad_input = 0 if args else next((k for k, v in kwargs.items() if torch.is_tensor(v) and v.is_floating_point()),
                                     None)
    return Inputs(lambda dtype, device: (converted(args, dtype, device), converted(kwargs, dtype, device)), grad_input)


def scaled(inputs: Inputs, factor: float) -> Inputs:
    """`inputs` with every floating tensor times `factor`."""
    if factor == 1.0:
        return inputs

    def make(dtype, device):
        return _map_tensors(inputs.make(dtype, device), lambda t: t * factor if t.is_floating_point() else t)
    return Inputs(make, inputs.grad_input)


def _tensors_of(value, found):
    if torch.is_tensor(value):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _tensors_of(v, found)
    elif isinstance(value, dict) or hasattr(value, "items"):
        for v in value.values():
            _tensors_of(v, found)
    return found


def _compare_values(want, got, where, rtol):
    """Raises Mismatch unless every |got - want| <= rtol * (|want| + want's largest finite |value|), a chunk
    at a time, in float32 or wider (float32 differences of close values are exact)."""
    if want.numel() == 0:
        return
    dtype = torch.promote_types(torch.promote_types(want.dtype, got.dtype), torch.float32)
    pairs = [(w.to(dtype), g.to(dtype)) for w, g in zip(want.reshape(-1).split(_COMPARE_CHUNK),
                                                         got.reshape(-1).split(_COMPARE_CHUNK))]
    scale = max((w.abs().nan_to_num_(0, 0, 0).max().item() for w, _ in pairs), default=0.0)
    atol = rtol * scale + 1e-30

    def close(w, g):  # the plain bound first; NaN, infinities and misses through allclose's own rules
        if torch.le((g - w).abs_(), w.abs().mul_(rtol).add_(atol)).all():
            return True
        return torch.allclose(g.double(), w.double(), rtol=rtol, atol=atol, equal_nan=True)
    if all(close(w, g) for w, g in pairs):
        return
    error = max((g.double() - w.double()).abs().nan_to_num(float("inf")).max().item() for w, g in pairs)
    raise Mismatch(f"{where} differs by up to {error:.3g} (largest value {scale:.3g})")


def _compare(want, got, where, rtol, same_dtype=True):
    if want is None or got is None:
        if want is not got and not (want is None and got is None):
            raise Mismatch(f"{where}: one output is None")
        return
    if torch.is_tensor(want) or torch.is_tensor(got):
        if not (torch.is_tensor(want) and torch.is_tensor(got)):
            raise Mismatch(f"{where}: a tensor against a {type(got if torch.is_tensor(want) else want).__name__}")
        if want.shape != got.shape or (same_dtype and want.dtype != got.dtype):
            raise Mismatch(f"{where}: {tuple(got.shape)} {got.dtype} instead of {tuple(want.shape)} {want.dtype}")
        if want.is_floating_point() and got.is_floating_point():
            _compare_values(want, got, where, rtol)
        elif not torch.equal(got, want):
            raise Mismatch(f"{where} differs")
        return
    if isinstance(want, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(want) != len(got):
            raise Mismatch(f"{where}: another structure")
        for i, (w, g) in enumerate(zip(want, got)):
            _compare(w, g, f"{where}[{i}]", rtol, same_dtype)
        return
    if hasattr(want, "items") and hasattr(got, "items"):
        want_items = {k: v for k, v in want.items() if v is not None}
        got_items = {k: v for k, v in got.items() if v is not None}
        if set(want_items) != set(got_items):
            raise Mismatch(f"{where}: outputs {sorted(got_items)} instead of {sorted(want_items)}")
        for key in want_items:
            _compare(want_items[key], got_items[key], f"{where}.{key}", rtol, same_dtype)


@contextlib.contextmanager
def _threads(count):
    saved = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@contextlib.contextmanager
def _modes(module, training):
    saved = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, mode in saved:
            m.training = mode


@contextlib.contextmanager
def as_class(module, cls):
    saved = module.__class__
    module.__class__ = cls
    try:
        yield
    finally:
        module.__class__ = saved


_random_parameters: Dict[tuple, torch.Tensor] = {}


def _random_like(name, parameter, dtype):
    """A random stand-in for a parameter, the same for every parameter of that name and shape, in any
    process whatever was probed before. Its seed is never the inputs' (PROBE_SEED): a weight drawn from the
    inputs' own sequence lines up with them and makes one product several times too large."""
    key = (name, tuple(parameter.shape), dtype)
    if key not in _random_parameters:
        generator = torch.Generator().manual_seed(PROBE_SEED + 1 + zlib.crc32(repr(key[:2]).encode()))
        values = torch.randn(parameter.shape, generator=generator, dtype=dtype)
        # Matrices keep activations near unit scale; vectors (norm weights, biases) sit away from 0 and 1.
        _random_parameters[key] = values / parameter.shape[-1] ** 0.5 if parameter.dim() > 1 else values * 0.5 + 0.25
    return _random_parameters[key].clone().requires_grad_(True)


def forget_random_parameters():
    _random_parameters.clear()


def _fused_ops_seen(seen):
    """A dispatch mode that appends to `seen` each torch.ops.fused op a forward calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "fused":
                seen.append(func)
            return func(*args, **(kwargs or {}))
    return Watch()


def _run(module, cls, state, inputs, dtype, device, training, select, grads: bool, fused_ops_seen=None):
    args, kwargs = inputs.make(dtype, device)
    grad_target = None
    if grads and inputs.grad_input is not None:
        container = args if isinstance(inputs.grad_input, int) else kwargs
        if isinstance(container, tuple):
            args = list(args)
            container = args
        grad_target = container[inputs.grad_input]
        if torch.is_tensor(grad_target) and grad_target.is_floating_point():
            grad_target = grad_target.clone().requires_grad_(True)
            container[inputs.grad_input] = grad_target
        else:
            grad_target = None
        args = tuple(args)
    watching = _fused_ops_seen(fused_ops_seen) if fused_ops_seen is not None else contextlib.nullcontext()
    with as_class(module, cls), _modes(module, training), values_kept(module), torch.random.fork_rng(devices=[]):
        torch.manual_seed(PROBE_SEED)
        with torch.enable_grad() if grads else torch.no_grad(), watching:
            output = select(functional_call(module, state, args, kwargs, strict=False))
    if not grads:
        return output, []
    leaves = ([grad_target] if grad_target is not None else []) + [v for v in state.values() if v.requires_grad]
    outputs = [t for t in _tensors_of(output, []) if t.requires_grad]
    if not outputs or not leaves:
        return output, []
    # Not the inputs' seed: a cotangent along its input (a norm's output has the input's shape) is one a
    # norm's backward maps to zero, which proves nothing about its input gradient.
    generator = torch.Generator().manual_seed(PROBE_SEED - 1)
    cotangents = [torch.randn(t.shape, generator=generator, dtype=t.dtype).to(t.device) for t in outputs]
    gradients = torch.autograd.grad(outputs, leaves, cotangents, allow_unused=True)
    return output, [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(gradients, leaves)]


class _RefusesFloat64(Exception):
    """The module's own forward has no float64 kernel (grouped matrix products): probe in float32."""


def _compare_with_random_parameters(module, fused_cls, inputs, select, modes, parameters, dtype, rtol,
                                    fused_op_must_run):
    state = {name: _random_like(name, p, dtype) for name, p in parameters.items()}
    state.update({name: b.detach().to("cpu", dtype if b.is_floating_point() else b.dtype)
                  for name, b in module.named_buffers()})
    device = torch.device("cpu")
    for training in modes:
        mode = "train" if training else "eval"
        try:
            want, want_grads = _run(module, type(module), state, inputs, dtype, device, training, select, True)
        except RuntimeError as error:
            if dtype == torch.float64 and "Double" in str(error):
                raise _RefusesFloat64() from error
            raise
        seen = [] if fused_op_must_run else None
        got, got_grads = _run(module, fused_cls, state, inputs, dtype, device, training, select, True, seen)
        if fused_op_must_run and not seen and training == modes[-1]:
            raise Mismatch(f"its fused forward ran no fused op in {mode} mode (the stock computation it replaces "
                           "is not on the path this call takes), so the probe proves nothing")
        # Float32 tolerances: stock forwards often compute in float32 whatever the input (Llama's
        # RMSNorm, the causal-LM loss); the probe's inputs put any epsilon or constant far above them.
        # The dtypes are compared in the module's own dtype below.
        _compare(want, got, f"{mode} output", rtol, same_dtype=False)
        _compare(want_grads, got_grads, f"{mode} gradients", rtol * 10, same_dtype=False)


def _experts_of(module):
    """{name: submodule} of the parts of `module` indexed by expert: an int `num_experts` and a parameter
    with one row per expert (transformers' experts and their routers)."""
    found = {}
    for name, sub in module.named_modules():
        count = getattr(sub, "num_experts", None)
        if isinstance(count, int) and not isinstance(count, bool) and any(
                p is not None and p.dim() > 0 and p.shape[0] == count for p in sub._parameters.values()):
            found[name] = sub
    return found


def _first_experts(part, keep):
    """A copy of an experts module or router with its first `keep` experts."""
    count, clone = part.num_experts, copy.copy(part)
    clone.__dict__["_parameters"] = {
        key: p if p is None or p.dim() == 0 or p.shape[0] != count else
        torch.nn.Parameter(p.detach()[:keep], requires_grad=p.requires_grad) for key, p in part._parameters.items()}
    clone.__dict__["_buffers"] = {key: b if b is None or b.dim() == 0 or b.shape[0] != count else b[:keep]
                                  for key, b in part._buffers.items()}
    clone.__dict__["num_experts"] = keep
    return clone


def _cut_linear(linear, rows, columns=None):
    """A copy of an nn.Linear with the weight's rows (and bias's entries) at `rows`, its columns at `columns`."""
    clone = copy.copy(linear)
    weight = linear.weight.detach()[rows]
    weight = weight if columns is None else weight[:, columns]
    clone.__dict__["_parameters"] = dict(
        weight=torch.nn.Parameter(weight, requires_grad=linear.weight.requires_grad),
        bias=None if linear.bias is None else torch.nn.Parameter(linear.bias.detach()[rows],
                                                                 requires_grad=linear.bias.requires_grad))
    clone.__dict__["out_features"], clone.__dict__["in_features"] = weight.shape
    return clone


def _narrower_mlp(mlp):
    """A copy of a gated MLP (gate_proj and up_proj, or one gate_up_proj, then down_proj, all nn.Linear)
    with its intermediate width cut to _MLP_WIDTH, or None where it is no such MLP or no wider."""
    linears = {key: child for key, child in mlp._modules.items() if type(child) is torch.nn.Linear}
    down = linears.get("down_proj")
    width = down.in_features if down is not None else 0
    if width <= _MLP_WIDTH:
        return None
    everything = slice(None)
    if {"gate_proj", "up_proj"} <= set(linears) and "gate_up_proj" not in mlp._modules:
        if not linears["gate_proj"].out_features == linears["up_proj"].out_features == width:
            return None
        cuts = {"gate_proj": slice(0, _MLP_WIDTH), "up_proj": slice(0, _MLP_WIDTH)}
    elif "gate_up_proj" in linears and "gate_proj" not in mlp._modules and "up_proj" not in mlp._modules:
        if linears["gate_up_proj"].out_features != 2 * width:
            return None
        halves = torch.cat([torch.arange(_MLP_WIDTH), width + torch.arange(_MLP_WIDTH)])
        cuts = {"gate_up_proj": halves}
    else:
        return None
    clone = copy.copy(mlp)
    clone.__dict__["_modules"] = dict(mlp._modules)
    for key, rows in cuts.items():
        clone._modules[key] = _cut_linear(linears[key], rows)
    clone._modules["down_proj"] = _cut_linear(down, everything, slice(0, _MLP_WIDTH))
    return clone


def _with_replaced(module, replacements):
    """`module` with the submodules named in `replacements` replaced: shallow copies on the way down to
    each, every other submodule shared."""
    if "" in replacements:
        return replacements[""]

    def copy_down(sub, prefix):
        clone = copy.copy(sub)
        children = {}
        for key, child in sub._modules.items():
            name = f"{prefix}.{key}" if prefix else key
            if name in replacements:
                children[key] = replacements[name]
            elif child is not None and any(other.startswith(name + ".") for other in replacements):
                children[key] = copy_down(child, name)
            else:
                children[key] = child
        clone.__dict__["_modules"] = children
        return clone
    return copy_down(module, "")


def stand_in(module, inputs: Inputs):
    """(stand-in, inputs) to probe with random parameters in place of (`module`, `inputs`): its experts and
    routers cut to their top-k + 1 first experts, its gated MLPs' intermediate width to _MLP_WIDTH (a
    rule's proof depends on neither; at full size their random float copies and gradients cost gigabytes
    and minutes of host time). `module` and `inputs` themselves where there is nothing to cut; a copy on
    the way down to each cut part otherwise, the module and every other submodule untouched. Where
    `module` is itself the experts, the expert indices of its call are taken modulo the experts kept."""
    replacements, call_indices = {}, []
    parts = _experts_of(module)
    if parts:
        top_k = [value for sub in module.modules() for name in _TOP_K_NAMES
                 if isinstance(value := getattr(sub, name, None), int) and not isinstance(value, bool)]
        if "" in parts:  # the experts themselves: their call carries the routing, top-k indices per token
            args, kwargs = inputs.make(None, torch.device("cpu"))
            call_indices = [t for t in _tensors_of((args, kwargs), []) if not t.is_floating_point() and t.dim() > 0]
            top_k += [t.shape[-1] for t in call_indices]
        keep = max(top_k, default=1) + 1
        replacements = {name: _first_experts(part, keep) for name, part in parts.items() if part.num_experts > keep}
    for name, sub in module.named_modules():
        if not any(name == other or name.startswith(other + ".") or other == "" for other in replacements):
            narrower = _narrower_mlp(sub)
            if narrower is not None:
                replacements[name] = narrower
    if not replacements:
        return module, inputs
    subject = _with_replaced(module, replacements)
    if "" not in parts or "" not in replacements:
        return subject, inputs

    def remap(tensor):
        return tensor if tensor.is_floating_point() or tensor.dim() == 0 else tensor % keep

    def make(dtype, device):
        args, kwargs = inputs.make(dtype, device)
        return _map_tensors(args, remap), _map_tensors(kwargs, remap)
    return subject, Inputs(make, inputs.grad_input)


def _prove_with_random_parameters(subject, fused_cls, inputs, select, modes, rtol=_PROBE_RTOL,
                                  fused_op_must_run=True):
    parameters = dict(subject.named_parameters())
    elements = sum(p.numel() for p in parameters.values())
    dtypes = [torch.float64, torch.float32] if elements <= _FLOAT64_ELEMENTS else [torch.float32]
    with _threads(host_threads if elements >= _THREADED_ELEMENTS else torch.get_num_threads()):
        for dtype in dtypes:
            try:
                _compare_with_random_parameters(subject, fused_cls, inputs, select, modes, parameters, dtype, rtol,
                                                fused_op_must_run)
                return
            except _RefusesFloat64:
                continue


def _prove_at_scales(subject, fused_cls, inputs, select, modes, large_inputs, fused_op_must_run):
    _prove_with_random_parameters(subject, fused_cls, inputs, select, modes, fused_op_must_run=fused_op_must_run)
    if large_inputs:
        try:
            # Eval mode alone: the unit-scale proof has shown that train mode (dropout) matches.
            _prove_with_random_parameters(subject, fused_cls, scaled(inputs, _LARGE_INPUT_SCALE), select,
                                          modes[:1], _LARGE_INPUT_RTOL)
        except Mismatch as mismatch:
            raise Mismatch(f"with inputs {_LARGE_INPUT_SCALE:g} times larger, {mismatch}") from None


def verify(module, fused_cls, inputs: Inputs, *, random_parameters: bool = True,
           select: Optional[Callable] = None, modes=(False, True), large_inputs: bool = False,
           fused_op_must_run: bool = True, own_gradients: bool = False) -> None:
    """Raises Mismatch unless `fused_cls`'s forward computes what `module`'s own forward does (see the
    module docstring); `select` picks from an output what must match; `large_inputs` proves it again with
    the inputs _LARGE_INPUT_SCALE times larger. With `fused_op_must_run`, a proof counts only where the
    fused forward ran a fused op (in the last of `modes`): a forward whose fused op is off the path the probe
    takes computes the stock function there and proves nothing. `own_gradients` compares the gradients in the
    module's own dtype and device too (in train mode): a GPU kernel of its own that the float64 probe on the
    CPU never runs (attention_with_sinks' flash kernels)."""
    select = select or (lambda output: output)
    stock_cls = type(module)
    if random_parameters:
        subject, subject_inputs = stand_in(module, inputs)
        try:
            _prove_at_scales(subject, fused_cls, subject_inputs, select, modes, large_inputs, fused_op_must_run)
        except Mismatch:
            raise
        except Exception:  # a stand-in the module's own forward cannot run: the module whole decides
            if subject is module:
                raise
            _prove_at_scales(module, fused_cls, inputs, select, modes, large_inputs, fused_op_must_run)
    # In the module's own dtype, device and parameters: the same output dtypes and close values.
    parameter = next(module.parameters(), None)
    own_dtype = parameter.dtype if parameter is not None else torch.float32
    own_device = parameter.device if parameter is not None else torch.device("cpu")
    if own_device.type == "meta":
        raise Mismatch("its parameters are on the meta device")
    tolerance = 1e-4 if own_dtype in (torch.float32, torch.float64) else 6e-2
    want, _ = _run(module, stock_cls, {}, inputs, own_dtype, own_device, False, select, False)
    got, _ = _run(module, fused_cls, {}, inputs, own_dtype, own_device, False, select, False)
    _compare(want, got, f"{own_dtype} output", tolerance)
    if own_gradients:
        state = {name: p.detach().clone().requires_grad_(True) for name, p in module.named_parameters()
                 if p.is_floating_point()}
        want, want_grads = _run(module, stock_cls, state, inputs, own_dtype, own_device, True, select, True)
        got, got_grads = _run(module, fused_cls, state, inputs, own_dtype, own_device, True, select, True)
        _compare(want, got, f"{own_dtype} output on {own_device.type} in train mode", tolerance)
        for index, (want_grad, got_grad) in enumerate(zip(want_grads, got_grads)):
            _compare(want_grad, got_grad, f"{own_dtype} gradient {index} on {own_device.type}", tolerance)


def verify_in_mixed_precision(module, fused_cls, inputs: Inputs, *, under_autocast: bool) -> None:
    """Raises Mismatch unless `fused_cls`'s forward computes what `module`'s own does with float32
    parameters, on float16 and bfloat16 inputs (a module a 16-bit model keeps in float32), or on float32
    inputs under autocast (to bfloat16: the CPU's autocast to float16 leaves some products in bfloat16).
    Llama's RMSNorm, say, promotes its output to float32 on a 16-bit input; Gemma's keeps the input's dtype."""
    state = {name: _random_like(name, p, torch.float32) for name, p in module.named_parameters()}
    state.update({name: b.detach().to("cpu", torch.float32 if b.is_floating_point() else b.dtype)
                  for name, b in module.named_buffers()})
    for dtype in (torch.bfloat16,) if under_autocast else (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype, enabled=under_autocast):
            verify_with_state(module, fused_cls, inputs, state, torch.float32 if under_autocast else dtype,
                              f"under autocast to {dtype}" if under_autocast else f"{dtype} input, float32 parameters")


def verify_with_state(module, fused_cls, inputs: Inputs, state, input_dtype, where, training=False,
                      select=None) -> None:
    """Raises Mismatch unless `fused_cls`'s forward computes what `module`'s own does on the CPU with `state`
    (tensors by name, of any dtypes) in place of its parameters and buffers: the same output dtypes, and
    values and gradients within 16-bit rounding."""
    cpu, select = torch.device("cpu"), select or (lambda output: output)
    want, want_grads = _run(module, type(module), state, inputs, input_dtype, cpu, training, select, True)
    got, got_grads = _run(module, fused_cls, state, inputs, input_dtype, cpu, training, select, True)
    _compare(want, got, f"{where}: output", _16_BIT_RTOL)
    _compare(want_grads, got_grads, f"{where}: gradients", _16_BIT_RTOL)


def runs_a_fused_op(module, fused_cls, inputs: Inputs) -> bool:
    """Whether `fused_cls`'s forward calls a torch.ops.fused op on `inputs` (in the module's own dtype): a
    forward whose replaced function it does not call (another one of the module's code, picked by its
    config) proves equal without fusing anything."""
    seen = []
    parameter = next(module.parameters(), None)
    dtype = parameter.dtype if parameter is not None else torch.float32
    device = parameter.device if parameter is not None else torch.device("cpu")
    _run(module, fused_cls, {}, inputs, dtype, device, False, lambda output: output, False, seen)
    return bool(seen)


def capture_calls(model, modules, probe):
    """Runs `probe()` once (eval, no grad) and returns {module: (args, kwargs, output)} of each module's
    first call."""
    calls, handles = {}, []

    def recorder(module):
        def hook(_, args, kwargs, output):
            if module not in calls:
                calls[module] = (args, dict(kwargs), output)
        return hook
    for module in modules:
        handles.append(module.register_forward_hook(recorder(module), with_kwargs=True))
    try:
        with _modes(model, False), torch.no_grad(), state_kept(model):
            probe()
    finally:
        for handle in handles:
            handle.remove()
    return calls
