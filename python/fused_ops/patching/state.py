"""What a probe's calls change in a model, put back: the modules' own state and configs (state_kept), and the
values of buffers and parameters a call may change (values_kept)."""
import contextlib

import torch


@contextlib.contextmanager
def state_kept(model):
    """Puts back what a forward changes in the modules' own state (attributes, submodules, buffers) and
    in their configs, and what values_kept puts back: a model that picks its attention by the sequence
    length it is called with (BigBird's block-sparse attention falls back to full attention for short
    ones, for good) must not keep the probe forward's choice."""
    modules = list(model.modules())
    saved = [(module, dict(vars(module)), dict(module._modules), dict(module._buffers)) for module in modules]
    configs = {id(config): (config, dict(vars(config))) for config in (getattr(m, "config", None) for m in modules)
               if config is not None and hasattr(config, "__dict__")}
    try:
        with values_kept(model):
            yield
    finally:
        for module, attributes, children, buffers in saved:
            _put_back(module, attributes, lambda name: name.startswith("_"))
            module._modules.clear()
            module._modules.update(children)
            module._buffers.clear()
            module._buffers.update(buffers)
        for config, attributes in configs.values():
            _put_back(config, attributes, lambda name: False)


@contextlib.contextmanager
def values_kept(module):
    """Puts back what a call of `module` changes in its buffers' values and in its parameters (the tensor
    a parameter holds, its attributes and the objects they hold): an observer must not keep the probe's
    statistics, and a quantised layer that repacks its weight on its first eval call (bitsandbytes'
    4-bit layer on the CPU, after which no gradient flows through it) must not be repacked by a probe."""
    buffer_values = [(buffer, buffer.clone()) for buffer in {id(b): b for b in module.buffers()}.values()
                     if buffer.device.type != "meta"]
    parameters = [(parameter, parameter.data, dict(vars(parameter)), _held_objects(parameter))
                  for parameter in {id(p): p for p in module.parameters()}.values()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, values in buffer_values:
                if buffer.shape == values.shape and not torch.equal(buffer, values):
                    buffer.copy_(values)
        for parameter, data, attributes, held in parameters:
            if _holds_other_values(parameter, data):
                parameter.data = data
            _put_back(parameter, attributes, lambda name: False)
            for owner, owner_attributes in held:
                _put_back(owner, owner_attributes, lambda name: False)


def _held_objects(parameter):
    """(object, its attributes) of each plain Python object a parameter holds as an attribute."""
    return [(value, dict(vars(value))) for value in vars(parameter).values()
            if hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, type, torch.nn.Module))]


def _holds_other_values(parameter, data):
    """Whether `parameter.data` is no longer the tensor `data` (its storage, shape or dtype changed)."""
    now = parameter.data
    if type(now) is not type(data) or now.shape != data.shape or now.dtype != data.dtype:
        return True
    try:
        return now.data_ptr() != data.data_ptr()
    except RuntimeError:  # a tensor subclass without storage of its own
        return False


def _put_back(owner, attributes, kept):
    """Sets `owner`'s attributes back to `attributes`, except the names `kept(name)` leaves as they are."""
    for name in [name for name in vars(owner) if name not in attributes and not kept(name)]:
        delattr(owner, name)
    for name, value in attributes.items():
        if not kept(name) and vars(owner).get(name, _MISSING) is not value:
            object.__setattr__(owner, name, value)


_MISSING = object()
