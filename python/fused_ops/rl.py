"""Per-token log-probabilities (and entropy) of a Hugging Face causal LM without its logits, for RL losses.

`token_log_probs(model, input_ids, ...)` calls the model as usual (so DDP, FSDP2, PEFT, accelerate and
every hook see an ordinary call) with its head swapped for the duration of the call by one that hands the
rows the head is given to `linear_log_probs`, with the head's weight and bias as the model holds them then
(FSDP2's unsharded ones inside the call) and the logit scale and final-logit softcap the model applies
after its head. Which scale and softcap that is, is proven once per model: its own forward runs over a
stand-in base model and a narrow head in float64, and must give the log-probabilities the op gives with
them. A model whose head is not a plain nn.Linear whose logits are only scaled and capped so is refused,
with the reason (HeadNotProven).
"""
import contextlib
import functools
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from . import _ops
from .patching.rules.lm_head import _head_constants, _positive
from .patching.swap import as_autocast_runs_linear, has_hooks, is_plain_linear

__all__ = ["token_log_probs", "HeadNotProven", "causal_lm_of", "add_fused_lm_head", "trl_heads"]

_PROOF_WIDTH = 16
_PROOF_TOLERANCE = 1e-4  # stock forwards that upcast their logits to float32 are compared in float32
# lm module -> (what the proof depended on, the proven HeadForm or the refusal's reason)
_PROOFS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# head module -> its stand-in (_LogProbsHead)
_STAND_INS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class HeadNotProven(ValueError):
    """The model's head cannot be proven to be linear(hidden) * logit_scale, capped by a softcap: its
    log-probabilities would not be the model's own."""


@dataclass(frozen=True)
class HeadForm:
    head: str  # the head's name in its parent module
    logit_scale: float
    softcap: float
    parent: str = ""  # the parent's qualified name in the causal LM ("" : the causal LM itself)


def causal_lm_of(model):
    """The causal LM inside `model`'s wrappers: DDP's and FSDP1's `.module`, PEFT's base model,
    torch.compile's original module."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        elif type(model).__name__ == "FullyShardedDataParallel" and isinstance(getattr(model, "module", None),
                                                                                torch.nn.Module):
            model = model.module
    return model


def head_form(model) -> HeadForm:
    """The proven form of `model`'s head (HeadNotProven with the reason where there is none)."""
    lm = causal_lm_of(model)
    head = lm.get_output_embeddings() if callable(getattr(lm, "get_output_embeddings", None)) else None
    key = (type(lm), id(head), tuple(_scale_candidates(lm)), tuple(_softcap_candidates(lm)))
    cached = _PROOFS.get(lm)
    if cached is None or cached[0] != key:
        try:
            cached = (key, _prove(lm, head))
        except HeadNotProven as refusal:
            cached = (key, str(refusal))
        _PROOFS[lm] = cached
    if isinstance(cached[1], str):
        raise HeadNotProven(cached[1])
    return cached[1]


def _scale_candidates(lm):
    """The logit scales the model's attributes and config name (Cohere's logit_scale, Granite's 1 /
    logits_scaling, Falcon-H1's lm_head_multiplier, ...), and logits_scaling itself (a multiplier in some)."""
    _, scales = _head_constants(lm)
    config = getattr(lm, "config", None)
    configs = [config, config.get_text_config()] if hasattr(config, "get_text_config") else [config]
    extra = [float(c.logits_scaling) for c in configs if _positive(getattr(c, "logits_scaling", None))]
    return list(scales) + [scale for scale in extra if scale not in scales]


def _head_path(lm, head):
    """Where the head sits: (its parent module, its name there), or None."""
    for name, module in lm.named_modules():
        for child_name, child in module._modules.items():
            if child is head:
                return module, child_name
    return None


def _softcap_candidates(lm):
    """The final-logit softcaps the config names (Gemma 2's final_logit_softcapping, RecurrentGemma's
    logits_soft_cap), and none."""
    softcap, _ = _head_constants(lm)
    config = getattr(lm, "config", None)
    configs = [config, config.get_text_config()] if hasattr(config, "get_text_config") else [config]
    found = [softcap] + [float(c.logits_soft_cap) for c in configs if _positive(getattr(c, "logits_soft_cap", None))]
    return list(dict.fromkeys(found + [0.0]))


class _ProbeHead(torch.nn.Module):
    """Stands in for the head in the proof: whatever rows it is handed, it gives the logits of its own
    float64 rows through a narrow float64 head, for the last positions it is handed."""

    def __init__(self, rows, narrow):
        super().__init__()
        self.rows, self.narrow = rows, narrow

    @property
    def weight(self):
        return self.narrow.weight

    @property
    def bias(self):
        return self.narrow.bias

    def forward(self, handed):
        if handed.dim() != 3 or handed.shape[0] != self.rows.shape[0]:
            raise HeadNotProven(f"its head is handed rows of shape {tuple(handed.shape)}, not [batch, positions, H]")
        return self.narrow(self.rows[:, self.rows.shape[1] - handed.shape[1]:])


def _prove(lm, head) -> HeadForm:
    """Runs the model's own forward with its head replaced by one whose logits come from known float64 rows
    and a narrow float64 head, and finds the scale and softcap with which linear_log_probs gives the
    log-probabilities of the logits the forward returns: what the forward does after its head."""
    if head is None:
        raise HeadNotProven(f"{type(lm).__name__}: it has no output embeddings (get_output_embeddings)")
    path = _head_path(lm, head)
    if path is None:
        raise HeadNotProven(f"{type(lm).__name__}: its output embeddings are not a module of the model")
    if type(head) is not torch.nn.Linear:
        raise HeadNotProven(f"{type(lm).__name__}: its head is not a plain nn.Linear ({type(head).__name__}; "
                            "a LoRA or quantised head computes more than weight and bias)")
    parent, name = path
    vocab, width = head.weight.shape[0], min(head.weight.shape[1], _PROOF_WIDTH)
    device = head.weight.device if head.weight.device.type != "meta" else torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(2, 5, width, generator=generator, dtype=torch.float64).to(device)
    # Drawn from its own generator: the proof leaves the global random state (dropout, sampling) as it was.
    narrow = torch.nn.utils.skip_init(torch.nn.Linear, width, vocab, bias=head.bias is not None, dtype=torch.float64,
                                      device=device)
    with torch.no_grad():
        narrow.weight.copy_(torch.randn(vocab, width, generator=generator, dtype=torch.float64) / width ** 0.5)
        if narrow.bias is not None:
            narrow.bias.copy_(torch.randn(vocab, generator=generator, dtype=torch.float64))
    targets = torch.randint(0, vocab, (2, 5), generator=generator).to(device)
    ids = torch.randint(0, max(1, min(vocab, _vocab_size(lm)) - 8), (2, 5), generator=generator).to(device)
    parent._modules[name] = _ProbeHead(rows, narrow)
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            try:
                output = lm(input_ids=ids, use_cache=False)
            except HeadNotProven as refusal:
                raise HeadNotProven(f"{type(lm).__name__}: {refusal}") from None
            except Exception as error:  # a forward that needs more than token ids
                raise HeadNotProven(f"{type(lm).__name__}: its forward did not run on token ids alone "
                                    f"({type(error).__name__}: {str(error)[:200]})") from None
            logits = getattr(output, "logits", None)
            if not torch.is_tensor(logits) or logits.shape != (2, 5, vocab):
                raise HeadNotProven(f"{type(lm).__name__}: its forward gave no logits of every position over the "
                                    "head's vocabulary")
            expected = torch.log_softmax(logits.double(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            for softcap in _softcap_candidates(lm):
                for scale in _scale_candidates(lm):
                    got = _ops.linear_log_probs(rows, narrow.weight, targets, narrow.bias, logit_scale=scale,
                                                softcap=softcap)
                    if torch.allclose(got, expected, rtol=0, atol=_PROOF_TOLERANCE):
                        return HeadForm(name, scale, softcap, _qualified_name(lm, parent))
    finally:
        parent._modules[name] = head
    raise HeadNotProven(f"{type(lm).__name__}: its logits are not its head's product times one of the scales its "
                        f"config names {_scale_candidates(lm)}, capped by one of {_softcap_candidates(lm)}")


def _qualified_name(lm, module):
    return next(name for name, candidate in lm.named_modules() if candidate is module)


def _vocab_size(lm):
    config = getattr(lm, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(config, "vocab_size", None) or 1


class _LogProbsHead(torch.nn.Module):
    """Stands in for the head during one call: takes the rows the model hands its head, gives their
    log-probabilities (and entropy) of the targets it holds through linear_log_probs with the real head's
    weight and bias, and returns a [..., 1] placeholder for the logits, which the caller discards."""

    def __init__(self, real, form):
        super().__init__()
        object.__setattr__(self, "real", real)  # not a child: its parameters stay where they are registered
        self.form = form
        self.ask(None)

    def ask(self, targets, temperature=1.0, return_entropy=False, float32=False):
        """What the next call computes; its results are cleared."""
        self.targets, self.temperature, self.return_entropy, self.float32 = targets, temperature, return_entropy, float32
        self.results = None

    def take(self):
        """(log_probs, entropy or None) of the last call, which the stand-in no longer holds (nor the autograd
        graph behind them); HeadNotProven where the model did not call its head."""
        results, self.results = self.results, None
        if results is None:
            raise HeadNotProven(f"{type(self.real).__name__}: the model's forward did not call its head")
        return results

    @property
    def weight(self):
        return self.real.weight

    @property
    def bias(self):
        return self.real.bias

    def forward(self, rows):
        if rows.dim() != 3:
            raise HeadNotProven(f"the model handed its head rows of shape {tuple(rows.shape)}, not [B, L, H]")
        targets = self.targets[:, -rows.shape[1]:].to(rows.device)
        weight, bias = self.real.weight, self.real.bias
        if isinstance(weight, torch.distributed.tensor.DTensor if _has_dtensor() else ()):
            weight = weight.full_tensor()
            bias = bias.full_tensor() if bias is not None else None
        if self.float32:
            rows, weight, bias = rows.float(), weight.float(), None if bias is None else bias.float()
        else:
            rows, weight, bias = as_autocast_runs_linear(rows, weight, bias)
        kept = targets != -100
        # Only the rows with a target go through the products; the others are 0.
        log_probs, entropy = _ops.linear_log_probs(
            rows[kept], weight, targets[kept], bias, temperature=self.temperature, return_entropy=True,
            logit_scale=self.form.logit_scale, softcap=self.form.softcap) if self.return_entropy else (
            _ops.linear_log_probs(rows[kept], weight, targets[kept], bias, temperature=self.temperature,
                                  logit_scale=self.form.logit_scale, softcap=self.form.softcap), None)
        self.results = tuple(None if values is None else values.new_zeros(kept.shape).masked_scatter(kept, values)
                             for values in (log_probs, entropy))
        return rows.new_zeros(*rows.shape[:-1], 1)


def _has_dtensor():
    return hasattr(torch.distributed, "tensor") and hasattr(torch.distributed.tensor, "DTensor")


@contextlib.contextmanager
def scoring_head(model, targets, temperature=1.0, return_entropy=False, float32=False):
    """Within the block, the causal LM inside `model` hands the rows its head is given to linear_log_probs
    for `targets` (aligned with the rows: the last targets.shape[1] positions), yielding the stand-in head,
    whose `results` holds (log_probs, entropy or None) after the model's call."""
    lm = causal_lm_of(model)
    form = head_form(lm)
    parent = lm.get_submodule(form.parent)
    real = parent._modules[form.head]
    if has_hooks(real) or not is_plain_linear(real):
        raise HeadNotProven(f"{type(lm).__name__}: its head has hooks or weights of a tensor subclass; the head's "
                            "stand-in would not honour them")
    # One stand-in per head, kept: a compiled model sees the same module at each call and compiles once for it.
    stand_in = _STAND_INS.get(real)
    if stand_in is None or stand_in.form != form:
        stand_in = _STAND_INS[real] = _LogProbsHead(real, form)
    stand_in.ask(targets, temperature, return_entropy, float32)
    parent._modules[form.head] = stand_in
    try:
        yield stand_in
    finally:
        parent._modules[form.head] = real
        stand_in.targets = None  # the caller's tensors are not kept alive


def next_token_targets(input_ids, attention_mask=None, labels=None):
    """Each position's next token (labels' or input_ids' shifted by one), -100 where the next token is
    padding or its label is -100, and -100 at the last position."""
    source = input_ids if labels is None else labels
    targets = F.pad(source[:, 1:], (0, 1), value=-100)
    if attention_mask is not None:
        targets = targets.masked_fill(F.pad(attention_mask[:, 1:], (0, 1), value=0) == 0, -100)
    return targets


def token_log_probs(model, input_ids, attention_mask=None, *, labels=None, logits_to_keep: Optional[int] = None,
                    temperature: float = 1.0, return_entropy: bool = False, **model_kwargs):
    """Per-token log-probabilities of a causal LM: of `input_ids[:, t + 1]` (or of `labels[:, t + 1]`) given
    the tokens up to t, under the model's logits (its logit scale and final-logit softcap applied) divided by
    `temperature`, without the logits in memory. Returns `log_probs` [B, L - 1] (the last `logits_to_keep`
    tokens' only, [B, logits_to_keep], where given), or `(log_probs, entropy)` with `return_entropy`; 0 where
    the token is padding (attention_mask 0) or its label -100. Differentiable in the model's parameters.

    `model` is a Hugging Face causal LM, also wrapped by PEFT, DDP, FSDP2 or accelerate, called as it
    is, with `model_kwargs` handed on. A model whose head cannot be proven is refused with HeadNotProven.
    """
    targets = next_token_targets(input_ids, attention_mask, labels)
    if logits_to_keep is not None:
        targets = targets.clone()
        targets[:, :-(logits_to_keep + 1)] = -100
    with scoring_head(model, targets, temperature, return_entropy) as stand_in:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **model_kwargs)
    log_probs, entropy = stand_in.take()
    keep = slice(-(logits_to_keep + 1), -1) if logits_to_keep is not None else slice(None, -1)
    log_probs = log_probs[:, keep]
    return (log_probs, entropy[:, keep]) if return_entropy else log_probs



def add_fused_lm_head(model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False,
                      outputs=("log_probs",), *, fuse_layers: bool = True):
    """TRL's `add_fused_lm_head` (trl.trainer.utils) with linear_log_probs as the head, and `fuse()`'s
    layer fusions on the model where `fuse_layers`: `model(..., labels=labels, fused_lm_head=True)` returns
    TRL's FusedCausalLMOutput (loss, log_probs, entropy, label_mask, aux_loss). Where the head cannot be
    proven, or `outputs` asks for statistics only TRL's head computes, TRL's own head is added, with a
    warning saying why. `trl_heads()` makes TRL's trainers call this one."""
    from trl.trainer import utils as trl_utils
    unsupported = sorted(set(outputs) - {"log_probs", "entropy"})
    try:
        if unsupported:
            raise HeadNotProven(f"the outputs {unsupported} are computed by TRL's head only")
        head_form(model)
    except HeadNotProven as refusal:
        warnings.warn(f"fused_ops.add_fused_lm_head: TRL's own fused head is used for {type(model).__name__}: "
                      f"{refusal}", stacklevel=2)
        return _TRL_ADD_FUSED_LM_HEAD.get("function", trl_utils.add_fused_lm_head)(
            model, temperature=temperature, cast_lm_head_to_fp32=cast_lm_head_to_fp32, outputs=outputs)
    if fuse_layers and not _fused(model):
        from .patching import fuse
        fuse(model)
    original_forward = model.forward
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return_entropy = "entropy" in outputs

    @functools.wraps(type(model).forward)
    def fused_forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None,
                      **kwargs):
        if not fused_lm_head:
            passed = dict(labels=labels, shift_labels=shift_labels, num_items_in_batch=num_items_in_batch)
            return original_forward(*args, **kwargs, **{k: v for k, v in passed.items() if v is not None})
        kwargs["use_cache"] = False
        if getattr(text_config, "output_router_logits", False):
            kwargs.setdefault("output_router_logits", True)
        targets = F.pad(labels[:, 1:], (0, 1), value=-100) if shift_labels is None else shift_labels
        with scoring_head(self, targets, temperature, return_entropy, cast_lm_head_to_fp32) as stand_in:
            output = original_forward(*args, **kwargs)
        log_probs, entropy = stand_in.take()
        if shift_labels is None:
            log_probs, entropy = log_probs[:, :-1], None if entropy is None else entropy[:, :-1]
        mask = targets[:, :log_probs.shape[1]] != -100
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        aux_loss = getattr(output, "aux_loss", None) if kwargs.get("output_router_logits") else None
        if aux_loss is not None:
            loss = loss + getattr(text_config, "router_aux_loss_coef", 0.0) * aux_loss
        return trl_utils.FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, label_mask=mask,
                                             aux_loss=aux_loss)

    model.forward = types.MethodType(fused_forward, model)


_TRL_ADD_FUSED_LM_HEAD = {}
_TRL_TRAINER_MODULES = ("trl.trainer.grpo_trainer", "trl.trainer.rloo_trainer")


@contextlib.contextmanager
def trl_heads(fuse_layers: bool = True):
    """Within the block, the TRL trainers built (GRPOTrainer, RLOOTrainer) add this library's head (and, with
    `fuse_layers`, fuse() the policy's and the reference model's layers) where they add TRL's fused head:

        with fused_ops.rl.trl_heads():
            trainer = GRPOTrainer(model=..., args=GRPOConfig(...), ...)
        trainer.train()
    """
    import importlib
    modules = [importlib.import_module(name) for name in _TRL_TRAINER_MODULES]
    originals = [module.add_fused_lm_head for module in modules]
    _TRL_ADD_FUSED_LM_HEAD.setdefault("function", originals[0])
    ours = functools.partial(add_fused_lm_head, fuse_layers=fuse_layers)
    for module in modules:
        module.add_fused_lm_head = ours
    try:
        yield
    finally:
        for module, original in zip(modules, originals):
            module.add_fused_lm_head = original


def _fused(model):
    return any(getattr(type(module), "_fused_ops_kind", None) for module in model.modules())
