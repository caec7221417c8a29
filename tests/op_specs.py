"""The op registry: every op described once. The cross-cutting tests (property, threads, CUDA graphs
and streams, huge tensors), the per-family tests (through the family views below: ACTIVATION_CASES,
NORM_CASES) and scripts/bench.py all read OPS, so a new op slots in with one OpSpec in OPS."""
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F

import fused_ops


def gated(activation):
    def composite(x):
        gate, up = x.chunk(2, dim=-1)
        return activation(gate) * up
    return composite


@dataclass
class OpSpec:
    name: str
    fused: Callable  # (*tensors, **options) -> Tensor
    reference: Callable  # the eager composite it replaces, same signature
    input_shapes: Callable[[Sequence[int]], list]  # output shape -> shape of each input
    # option name -> the values it may take: a list of choices, or a (low, high) float range
    options: dict = field(default_factory=dict)
    min_dims: int = 0  # least number of dims of the output
    broadcasts: Sequence[int] = ()  # inputs that may broadcast to the first input's shape
    # float64 inputs and options -> how much looser than the dtype's tolerance the absolute error
    # of gradients may be (ill-conditioned math, e.g. a norm of a row with a tiny RMS)
    gradient_scale: Callable = lambda inputs, **options: 1.0
    family: str = "elementwise"  # elementwise, activations, gated, norms, rotary, cross_entropy, down_projection
    # the eager code a user would write instead, as the bench times it (default: reference)
    composite: Optional[Callable] = None
    # the inputs that take gradients (default: all); the others must not require grad
    differentiable: Optional[Sequence[int]] = None
    # (index, input shapes, dtype, device, generator) -> that input, or None for a random float one
    make_input: Optional[Callable] = None
    # float64 inputs and options -> how much looser than the dtype's tolerance the outputs may be
    value_scale: Callable = lambda inputs, **options: 1.0
    # the outputs' dtype for inputs of `dtype` (a loss is float32 for 16-bit inputs)
    output_dtype: Callable = lambda dtype: dtype

    def takes_grad(self, index):
        return self.differentiable is None or index in self.differentiable

    def special_input(self, index, shapes, dtype, device, generator=None):
        return None if self.make_input is None else self.make_input(index, shapes, dtype, device, generator)

    def call(self, inputs, **options):
        return self.fused(*inputs, **options)

    @property
    def op(self):
        return getattr(torch.ops.fused, self.name).default

    def variants(self):
        """(label, options) for each choice of the options that take a list of choices: bias_gelu ->
        ("bias_gelu_none", {"approximate": "none"}), ("bias_gelu_tanh", ...); an op without choices -> (name, {})."""
        result = [(self.name, {})]
        for option, values in self.options.items():
            if isinstance(values, list):
                result = [(f"{label}_{value}", {**chosen, option: value}) for label, chosen in result for value in values]
        return result


def as_outputs(result):
    """An op's result as a tuple of tensors (norms with a residual return two)."""
    return result if isinstance(result, tuple) else (result,)


def relu_add_shapes(shape):
    return [list(shape), list(shape)]


def bias_shapes(shape):
    return [list(shape), [shape[-1]]]


def gated_shapes(shape):
    return [list(shape[:-1]) + [2 * shape[-1]]]


def norm_shapes(residual, bias):
    def shapes(shape):
        return [list(shape)] * (2 if residual else 1) + [[shape[-1]]] * (2 if bias else 1)
    return shapes


def rotary_shapes(shape):
    """q [B, 4, S, D] and k [B, 2, S, D] (grouped-query heads) and cos, sin [B, S, R] (or [S, R] for a
    shape of fewer than 3 dims) for a drawn shape [B, ..., S, W]: D is W rounded up to even; an odd W
    rotates only R = 2 * (D // 4) dims (partial rotation), an even one all D."""
    width = shape[-1] if shape else 1
    head_dim = max(2, width + width % 2)
    rotary_dim = head_dim if width % 2 == 0 else 2 * (head_dim // 4)
    sequence = shape[-2] if len(shape) >= 2 else 1
    batch = [shape[0]] if len(shape) >= 3 else []
    b = batch[0] if batch else 1
    return [[b, 4, sequence, head_dim], [b, 2, sequence, head_dim], batch + [sequence, rotary_dim],
            batch + [sequence, rotary_dim]]


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_every_two(x):
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def rotary_reference(q, k, cos, sin, unsqueeze_dim=1, interleaved=False):
    """Hugging Face's apply_rotary_pos_emb (GPT-J's pairs when interleaved) on the first R dims."""
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]

    def rope(x):
        rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
        turned = rotate_every_two(rotated) if interleaved else rotate_half(rotated)
        return torch.cat([rotated * cos + turned * sin, passed], dim=-1)
    return rope(q), rope(k)


def linear_cross_entropy_shapes(shape):
    """input [..., H], weight [V, H], target [...] and bias [V] for a drawn shape [..., W]: V = W (at
    least 1), H = 1 + W % 48."""
    width = shape[-1] if shape else 1
    classes, hidden = max(1, width), 1 + width % 48
    leading = list(shape[:-1])
    return [leading + [hidden], [classes, hidden], leading, [classes]]


def class_targets(index, shapes, dtype, device, generator=None):
    """linear_cross_entropy's target (input 2): classes of weight's V, about one row in eight ignored."""
    if index != 2:
        return None
    classes = shapes[1][0]
    target = torch.randint(0, classes, shapes[2], generator=generator)
    ignored = torch.rand(shapes[2], generator=generator) < 0.125
    return target.masked_fill(ignored, -100).to(device)


def linear_cross_entropy_reference(x, w, t, b=None, label_smoothing=0.0, reduction="mean", softcap=0.0,
                                   ignore_index=-100):
    """F.linear then F.cross_entropy; 'mean' over no rows is 0 (torch gives NaN)."""
    z = F.linear(x, w, b)
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    losses = F.cross_entropy(z.reshape(-1, z.shape[-1]), t.reshape(-1), ignore_index=ignore_index,
                             label_smoothing=label_smoothing, reduction="none").reshape(t.shape)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (t != ignore_index).sum().clamp_min(1)


def largest_logit(inputs, **options):
    """The largest |z|: 16-bit logits round by a few ulp of it, and the loss and gradients with them."""
    x, w, _, b = inputs
    if x.numel() == 0:
        return 1.0
    return max(1.0, F.linear(x.detach(), w.detach(), b.detach()).abs().max().item())


def linear_log_probs_reference(x, w, t, b=None, temperature=1.0, ignore_index=-100, return_entropy=False,
                               logit_scale=1.0, softcap=0.0):
    """log_softmax(softcap * tanh(F.linear * logit_scale / softcap) / temperature) at the target, and the
    entropy -sum(p log p) (an empty tensor when not asked for); 0 on ignored rows."""
    z = F.linear(x, w, b) * logit_scale
    if softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    log_p = torch.log_softmax(z.to(torch.float64 if z.dtype == torch.float64 else torch.float32), dim=-1)
    ignored = t == ignore_index
    log_probs = log_p.gather(-1, t.masked_fill(ignored, 0).unsqueeze(-1)).squeeze(-1).masked_fill(ignored, 0)
    if not return_entropy:
        return log_probs, log_p.new_empty(0)
    entropy = -(log_p.exp() * log_p).sum(-1).masked_fill(ignored, 0)
    return log_probs, entropy


def tempered_logit(inputs, temperature=1.0, logit_scale=1.0, **options):
    """largest_logit of z * logit_scale / temperature: the log-probabilities and gradients round with it."""
    return largest_logit(inputs) * max(1.0, abs(logit_scale)) / min(1.0, temperature)


def silu_mul_linear_shapes(shape):
    """x [..., 2d], weight [n, d] and bias [n] for a drawn output shape [..., n]: d = 1 + n % 24."""
    outputs = shape[-1] if shape else 1
    d = 1 + outputs % 24
    return [list(shape[:-1]) + [2 * d], [outputs, d], [outputs]]


def silu_mul_linear_reference(x, weight, bias):
    return F.linear(gated(F.silu)(x), weight, bias)


def largest_output(inputs, **options):
    """The largest |output| times sqrt(d): 16-bit results round by a few ulp of the output, and the
    rounded activation moves each of the product's d terms by an ulp of its own."""
    x, weight, bias = inputs
    out = silu_mul_linear_reference(x.detach(), weight.detach(), bias.detach())
    largest = out.abs().max().item() if out.numel() else 1.0
    return max(1.0, largest) * max(1.0, weight.shape[1] ** 0.5)


GATED_ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def gated_mul_reference(gate, up, activation="silu"):
    return GATED_ACTIVATIONS[activation](gate) * up


def gated_mul_shapes(shape):
    return [list(shape), list(shape)]


def gated_mul_linear_shapes(shape):
    """gate and up [..., d], weight [n, d] and bias [n] for a drawn output shape [..., n]: d = 1 + n % 24."""
    x, weight, bias = silu_mul_linear_shapes(shape)
    gate = x[:-1] + [x[-1] // 2]
    return [gate, list(gate), weight, bias]


def gated_mul_linear_reference(gate, up, weight, bias, activation="silu"):
    return F.linear(gated_mul_reference(gate, up, activation), weight, bias)


def largest_gated_output(inputs, activation="silu"):
    """largest_output for gated_mul_linear's inputs."""
    gate, up, weight, bias = inputs
    out = gated_mul_linear_reference(gate.detach(), up.detach(), weight.detach(), bias.detach(), activation)
    largest = out.abs().max().item() if out.numel() else 1.0
    return max(1.0, largest) * max(1.0, weight.shape[1] ** 0.5)


def rms_norm_reference(h, weight, eps=1e-6, offset=0.0):
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return out if weight is None else out * (offset + weight)


def layer_norm_reference(h, weight, bias=None, eps=1e-5, offset=0.0):
    return F.layer_norm(h, h.shape[-1:], None if weight is None else offset + weight, bias, eps)


# The norms' weight forms, an option of their OpSpecs: (whether the weight tensor is passed, offset).
# "none" passes weight=None (offset 0); the others multiply by offset + weight (Gemma: 1 + weight).
NORM_WEIGHT_FORMS = {"weight": (True, 0.0), "none": (False, 0.0), "one_plus_weight": (True, 1.0),
                     "weight_minus_half": (True, -0.5)}


def norm_weight(weight, weight_form):
    """(weight or None, offset) of a weight form."""
    passed, offset = NORM_WEIGHT_FORMS[weight_form]
    return (weight if passed else None), offset


def rms_norm_fused(x, w, eps=1e-6, weight_form="weight"):
    w, offset = norm_weight(w, weight_form)
    return torch.ops.fused.rms_norm(x, w, eps, offset)


def rms_norm_expected(x, w, eps=1e-6, weight_form="weight"):
    w, offset = norm_weight(w, weight_form)
    return rms_norm_reference(x, w, eps, offset)


def add_rms_norm_fused(x, r, w, eps=1e-6, weight_form="weight"):
    w, offset = norm_weight(w, weight_form)
    return torch.ops.fused.add_rms_norm(x, r, w, eps, offset)


def add_rms_norm_expected(x, r, w, eps=1e-6, weight_form="weight"):
    return rms_norm_expected(x + r, w, eps, weight_form), x + r


def layer_norm_fused(x, w, b, eps=1e-5, weight_form="weight"):
    w, offset = norm_weight(w, weight_form)
    return torch.ops.fused.layer_norm(x, w, b, eps, offset)


def layer_norm_expected(x, w, b, eps=1e-5, weight_form="weight"):
    w, offset = norm_weight(w, weight_form)
    return layer_norm_reference(x, w, b, eps, offset)


def add_layer_norm_fused(x, r, w, b, eps=1e-5, weight_form="weight"):
    w, offset = norm_weight(w, weight_form)
    return torch.ops.fused.add_layer_norm(x, r, w, b, eps, offset)


def add_layer_norm_expected(x, r, w, b, eps=1e-5, weight_form="weight"):
    return layer_norm_expected(x + r, w, b, eps, weight_form), x + r


def largest_rstd(inputs, eps=1e-6, residual=False, centered=False):
    """1 / the smallest RMS (or standard deviation) of a row of h: the conditioning of a norm's gradient."""
    h = inputs[0] + inputs[1] if residual else inputs[0]
    if h.numel() == 0:
        return 1.0
    h = h.detach() - (h.detach().mean(-1, keepdim=True) if centered else 0)
    return max(1.0, torch.rsqrt(h.pow(2).mean(-1) + eps).max().item())


EPS_RANGE = (1e-6, 1e-2)
# The registry-wide tests draw the weight form (property tests), or take the first (DTensor) or the last
# (threads, CUDA graphs, huge tensors).
NORM_OPTIONS = {"eps": EPS_RANGE, "weight_form": list(NORM_WEIGHT_FORMS)}

OPS = [
    OpSpec("relu_add", lambda x, y, bias=0.0: torch.ops.fused.relu_add(x, y, bias),
           lambda x, y, bias=0.0: torch.relu(x) + y + bias, relu_add_shapes,
           {"bias": (-4.0, 4.0)}, broadcasts=(1,)),
    OpSpec("bias_gelu", lambda x, b, approximate="none": torch.ops.fused.bias_gelu(x, b, approximate),
           lambda x, b, approximate="none": F.gelu(x + b, approximate=approximate), bias_shapes,
           {"approximate": ["none", "tanh"]}, min_dims=1, family="activations"),
    OpSpec("silu_mul", lambda x: torch.ops.fused.silu_mul(x), gated(F.silu), gated_shapes, min_dims=1,
           family="activations"),
    OpSpec("gelu_mul", lambda x, approximate="none": torch.ops.fused.gelu_mul(x, approximate),
           lambda x, approximate="none": gated(lambda t: F.gelu(t, approximate=approximate))(x), gated_shapes,
           {"approximate": ["none", "tanh"]}, min_dims=1, family="activations"),
    OpSpec("silu_mul_linear", lambda x, w, b: torch.ops.fused.silu_mul_linear(x, w, b), silu_mul_linear_reference,
           silu_mul_linear_shapes, min_dims=1, family="down_projection", value_scale=largest_output,
           gradient_scale=largest_output),
    OpSpec("gated_mul", lambda gate, up, activation="silu": torch.ops.fused.gated_mul(gate, up, activation),
           gated_mul_reference, gated_mul_shapes, {"activation": ["silu", "gelu", "gelu_tanh"]}, family="gated"),
    OpSpec("gated_mul_linear",
           lambda gate, up, w, b, activation="silu": torch.ops.fused.gated_mul_linear(gate, up, w, b, activation),
           gated_mul_linear_reference, gated_mul_linear_shapes, {"activation": ["silu", "gelu", "gelu_tanh"]},
           min_dims=1, family="down_projection", value_scale=largest_gated_output,
           gradient_scale=largest_gated_output),
    OpSpec("rms_norm", rms_norm_fused, rms_norm_expected, norm_shapes(False, False), NORM_OPTIONS, min_dims=1,
           gradient_scale=lambda inputs, eps=1e-6, **_: largest_rstd(inputs, eps), family="norms",
           composite=lambda x, w, eps=1e-6: F.rms_norm(x, x.shape[-1:], w, eps)),
    OpSpec("add_rms_norm", add_rms_norm_fused, add_rms_norm_expected, norm_shapes(True, False), NORM_OPTIONS,
           min_dims=1, gradient_scale=lambda inputs, eps=1e-6, **_: largest_rstd(inputs, eps, residual=True),
           family="norms", composite=lambda x, r, w, eps=1e-6: (F.rms_norm(x + r, x.shape[-1:], w, eps), x + r)),
    OpSpec("layer_norm", layer_norm_fused, layer_norm_expected, norm_shapes(False, True), NORM_OPTIONS, min_dims=1,
           gradient_scale=lambda inputs, eps=1e-5, **_: largest_rstd(inputs, eps, centered=True), family="norms"),
    OpSpec("add_layer_norm", add_layer_norm_fused, add_layer_norm_expected, norm_shapes(True, True), NORM_OPTIONS,
           min_dims=1,
           gradient_scale=lambda inputs, eps=1e-5, **_: largest_rstd(inputs, eps, residual=True, centered=True),
           family="norms"),
    OpSpec("rotary_embedding",
           lambda q, k, cos, sin, interleaved=False: torch.ops.fused.rotary_embedding(q, k, cos, sin, 1, interleaved),
           lambda q, k, cos, sin, interleaved=False: rotary_reference(q, k, cos, sin, 1, interleaved), rotary_shapes,
           {"interleaved": [False, True]}, family="rotary", differentiable=(0, 1)),
    OpSpec("linear_cross_entropy",
           lambda x, w, t, b, label_smoothing=0.0, reduction="mean", softcap=0.0: torch.ops.fused.linear_cross_entropy(
               x, w, t, b, -100, label_smoothing, reduction, softcap),
           linear_cross_entropy_reference, linear_cross_entropy_shapes,
           {"label_smoothing": (0.0, 0.5), "reduction": ["mean", "sum", "none"], "softcap": [0.0, 5.0]},
           min_dims=1, family="cross_entropy", differentiable=(0, 1, 3), make_input=class_targets,
           value_scale=largest_logit, gradient_scale=largest_logit,
           output_dtype=lambda dtype: torch.float64 if dtype == torch.float64 else torch.float32),
    # Both results with the entropy, the log-probabilities alone without it (its empty placeholder
    # takes no gradient).
    OpSpec("linear_log_probs",
           lambda x, w, t, b, temperature=1.0, return_entropy=True, logit_scale=1.0, softcap=0.0: (
               lambda out: out if return_entropy else out[0])(
               torch.ops.fused.linear_log_probs(x, w, t, b, temperature, -100, return_entropy, logit_scale, softcap)),
           lambda x, w, t, b, temperature=1.0, return_entropy=True, logit_scale=1.0, softcap=0.0: (
               lambda out: out if return_entropy else out[0])(
               linear_log_probs_reference(x, w, t, b, temperature, -100, return_entropy, logit_scale, softcap)),
           linear_cross_entropy_shapes, {"temperature": (0.5, 2.0), "return_entropy": [False, True],
                                         "logit_scale": (0.25, 2.0), "softcap": [0.0, 5.0]},
           min_dims=1, family="cross_entropy", differentiable=(0, 1, 3), make_input=class_targets,
           value_scale=tempered_logit, gradient_scale=tempered_logit,
           output_dtype=lambda dtype: torch.float64 if dtype == torch.float64 else torch.float32),
]
OPS_BY_NAME = {spec.name: spec for spec in OPS}


def random(shape, dtype, device):
    return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)


# ---- Family views of the registry, for the per-family tests and the bench.

@dataclass
class ActivationCase:
    """One variant of an activation op (bias_gelu with approximate='tanh', ...)."""
    spec: OpSpec
    options: dict

    @property
    def gated(self):  # x is [..., 2d] (else x [..., H] with a bias [H])
        return self.spec.input_shapes is gated_shapes

    @property
    def op(self):
        return self.spec.op

    @property
    def extra(self):  # trailing non-tensor arguments of the op
        return tuple(self.options.values())

    def fused(self, *inputs):
        return getattr(fused_ops, self.spec.name)(*inputs, **self.options)

    def reference(self, *inputs):
        return self.spec.reference(*inputs, **self.options)

    def composite(self, *inputs):
        return (self.spec.composite or self.spec.reference)(*inputs, **self.options)

    def inputs(self, shape, dtype, device):
        """Random inputs for an output of `shape`."""
        return tuple(random(tuple(input_shape), dtype, device) for input_shape in self.spec.input_shapes(list(shape)))


ACTIVATION_CASES = {label: ActivationCase(spec, options)
                    for spec in OPS if spec.family == "activations" for label, options in spec.variants()}


@dataclass
class NormCase:
    """A norm op with or without its bias (layer norms), with a weight form of NORM_WEIGHT_FORMS (weight,
    none, an offset), through the typed wrappers of fused_ops."""
    spec: OpSpec
    bias: bool
    weight_form: str = "weight"

    @property
    def layer(self):  # LayerNorm (else RMSNorm)
        return "layer_norm" in self.spec.name

    @property
    def residual(self):
        return self.spec.name.startswith("add_")

    @property
    def weight(self):  # whether a weight tensor is passed (else weight=None)
        return NORM_WEIGHT_FORMS[self.weight_form][0]

    @property
    def offset(self):
        return NORM_WEIGHT_FORMS[self.weight_form][1]

    @property
    def eps(self):
        return 1e-5 if self.layer else 1e-6

    @property
    def op(self):
        return self.spec.op

    def inputs(self, shape, dtype, device, weight_dtype=None):
        """x, [residual], [weight], [bias]; weight (and bias) of weight_dtype (default: x's dtype; a bias
        without a weight keeps x's dtype, as the op asks)."""
        weight_dtype = (weight_dtype or dtype) if self.weight else dtype
        hidden = shape[-1]
        tensors = [random(shape, dtype, device)]
        if self.residual:
            tensors.append(random(shape, dtype, device))
        if self.weight:
            tensors.append((1 + 0.5 * torch.randn(hidden, device=device)).to(weight_dtype))
        if self.bias:
            tensors.append(random((hidden,), weight_dtype, device))
        return tensors

    def split(self, tensors):
        tensors = list(tensors)
        x = tensors.pop(0)
        residual = tensors.pop(0) if self.residual else None
        weight = tensors.pop(0) if self.weight else None
        bias = tensors.pop(0) if self.bias else None
        return x, residual, weight, bias

    def op_arguments(self, tensors, eps=None):
        """The op's positional arguments: tensors (None for an absent weight or bias), then eps and offset."""
        x, residual, weight, bias = self.split(tensors)
        args = [x] + ([residual] if self.residual else []) + [weight] + ([bias] if self.layer else [])
        return (*args, self.eps if eps is None else eps, self.offset)

    def fused(self, *tensors, eps=None):
        """Outputs of the fused op (its typed wrapper) as a tuple."""
        return as_outputs(getattr(fused_ops, self.spec.name)(*self.op_arguments(tensors, eps)))

    def composite(self, *tensors):
        """The eager code the op replaces, as the bench times it."""
        if self.spec.composite is not None and self.weight_form == "weight":
            return self.spec.composite(*self.op_arguments(tensors)[:-1])
        return self.spec.reference(*self.op_arguments(tensors)[:-1], weight_form=self.weight_form)

    def reference(self, *tensors, eps=None):
        """The eager composite in float64; h = x + residual rounded to x's dtype first, as eager stores it."""
        x, residual, weight, bias = self.split(tensors)
        eps = self.eps if eps is None else eps
        h = x + residual if self.residual else x
        h64 = h if h.dtype == torch.float64 else h.double()
        weight = None if weight is None else weight.double()
        bias = None if bias is None else bias.double()
        if self.layer:
            out = layer_norm_reference(h64, weight, bias, eps, self.offset)
        else:
            out = rms_norm_reference(h64, weight, eps, self.offset)
        return (out, h64) if self.residual else (out,)


NORM_CASES = {}
for _spec in OPS:
    if _spec.family == "norms":
        NORM_CASES[_spec.name] = NormCase(_spec, bias="layer_norm" in _spec.name)
        if "layer_norm" in _spec.name:
            NORM_CASES[_spec.name + "_no_bias"] = NormCase(_spec, bias=False)
# The weight forms beside a plain weight, each through every norm test: an offset on both forward
# kernels (RMS, Layer) with and without a residual, and no weight (with a bias, and with neither).
NORM_CASES["add_rms_norm_one_plus_weight"] = NormCase(OPS_BY_NAME["add_rms_norm"], False, "one_plus_weight")
NORM_CASES["layer_norm_weight_minus_half"] = NormCase(OPS_BY_NAME["layer_norm"], True, "weight_minus_half")
NORM_CASES["rms_norm_no_weight"] = NormCase(OPS_BY_NAME["rms_norm"], False, "none")
NORM_CASES["add_layer_norm_no_weight"] = NormCase(OPS_BY_NAME["add_layer_norm"], True, "none")


def strided(shape, dtype, device, layout, generator=None):
    """A random tensor of `shape` laid out as `layout`: contiguous, offset (data pointer not
    16-byte aligned), stepped (every other element of the last dim) or transposed (last two dims)."""
    def random(size):
        return torch.randn(size, generator=generator).to(dtype=dtype, device=device)

    shape = list(shape)
    numel = 1
    for size in shape:
        numel *= size
    if layout == "offset":
        return random([numel + 1])[1:].view(shape)
    if layout == "stepped" and shape:
        return random(shape[:-1] + [2 * shape[-1]])[..., ::2]
    if layout == "transposed" and len(shape) >= 2:
        return random(shape[:-2] + [shape[-1], shape[-2]]).transpose(-1, -2)
    return random(shape)
