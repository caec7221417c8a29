"""One rule per pattern: how it finds candidates, the variants of the replacement it tries, and the probe
inputs that prove one (patching/probe.py). The fused forwards live beside their rule."""
from typing import Iterable, List, Optional, Tuple

import torch


class LeftAlone(Exception):
    """A candidate the rule cannot replace; the message says why."""


class Rule:
    kind = ""
    description = ""
    needs_capture = False          # its probe inputs are the arguments of a call in the model's probe forward
    random_parameters = True       # probe with random parameters (False: the module's own, e.g. a whole model)

    def candidates(self, model) -> Iterable[Tuple[str, torch.nn.Module]]:
        raise NotImplementedError

    def variants(self, module, context) -> List[tuple]:
        """The options of each replacement to try, in order; the first one proven is used."""
        raise NotImplementedError

    def inputs(self, module, context):
        raise NotImplementedError

    def select(self, module, options) -> Optional[callable]:
        """What of an output must match (None: all of it)."""
        return None


def named_children_of_every_module(model):
    for name, module in model.named_modules():
        yield name, module
