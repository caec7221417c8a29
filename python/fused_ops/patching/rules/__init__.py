"""One rule per pattern: how it finds candidates, the variants of the replacement it tries, and the probe
inputs that prove one (patching/probe.py). The fused forwards live beside their rule."""
import inspect
from typing import Iterable, List, Optional, Tuple

import torch

from ..swap import fused_class, fused_kind


class LeftAlone(Exception):
    """A candidate the rule cannot replace; the message says why (`summary`: the same in a user's words, the
    variants' internal options left out)."""

    def __init__(self, detail, summary=None):
        super().__init__(detail)
        self.summary = summary if summary is not None else detail


class Rule:
    kind = ""
    description = ""
    needs_capture = False          # its probe inputs are the arguments of a call in the model's probe forward
    random_parameters = True       # probe with random parameters (False: the module's own, e.g. a whole model)
    large_inputs = False           # prove again with inputs far above unit scale, where clamps act
    adds_to_fused = False          # also takes modules another rule has swapped, adding its option to theirs

    def candidates(self, model) -> Iterable[Tuple[str, torch.nn.Module]]:
        raise NotImplementedError

    def variants(self, module, context) -> List[tuple]:
        """The options of each replacement to try, in order; the first one proven is used."""
        raise NotImplementedError

    def inputs(self, module, context):
        raise NotImplementedError

    def proven_options(self, module, options, context) -> tuple:
        """The options a proven variant is swapped with: its own, and what else a further probe proves."""
        return options

    def fused_class(self, module, options):
        """The class `module` becomes with `options`: the rule's own fused class of the module's class, or,
        for a module another rule has swapped, that rule's with these options added."""
        if fused_kind(module):
            cls = type(module)
            return fused_class(cls.__bases__[0], cls._fused_ops_kind, cls._fused_ops_options + tuple(options))
        return fused_class(type(module), self.kind, tuple(options))

    def summary(self, options: dict) -> str:
        """What the swap does, in a user's words (the report's table; its detail view lists the options)."""
        return self.description

    def settle(self, model, report) -> None:
        """After every rule has run: undo what another rule's verdict has left without effect."""

    def select(self, module, options) -> Optional[callable]:
        """What of an output must match (None: all of it)."""
        return None


def check_takes_one_input(module):
    """Rules whose probe calls a module with one tensor prove nothing about calls with more arguments
    (Zamba2's gated RMSNorm takes `gate` too): such modules are left alone."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        raise LeftAlone("its forward's signature cannot be read") from None
    if len(parameters) != 1 or parameters[0].kind not in (parameters[0].POSITIONAL_ONLY,
                                                         parameters[0].POSITIONAL_OR_KEYWORD):
        raise LeftAlone(f"its forward takes more than one input: {[p.name for p in parameters]}")


def exporting():
    """Whether torch.export traces: torch.compiler.is_exporting() also answers True while torch.compile
    traces in torch 2.11, and the flag that torch.export sets is exact in every version."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else bool(flag)
