"""Registers the DTensor sharding rules (distributed.py) once `torch.distributed.tensor` is imported,
so that a process that never uses DTensor does not import it, and `import fused_ops` works where
torch.distributed is unavailable."""
import importlib.abc
import importlib.util
import sys
import warnings

import torch

_DTENSOR_MODULE = "torch.distributed.tensor"


def _register():
    try:
        from .distributed import register_sharding_rules
        register_sharding_rules()
    except Exception as error:  # noqa: BLE001 - a torch without this API must still import fused_ops
        warnings.warn(f"fused_ops: DTensor sharding rules not registered ({type(error).__name__}: {error}); "
                      "fused ops on DTensors will fail with 'no sharding strategy registered'")


class _RegisterAfterDTensorImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when torch.distributed.tensor is being imported, it wraps that module's
    loader so that the rules register right after the module has run."""

    def find_spec(self, name, path, target=None):
        if name != _DTENSOR_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_module_then_register(module):
            exec_module(module)
            _register()
        spec.loader.exec_module = exec_module_then_register
        return spec


def register_sharding_rules_when_dtensor_loads():
    if not torch.distributed.is_available():
        return
    if _DTENSOR_MODULE in sys.modules:
        _register()
    elif not any(isinstance(finder, _RegisterAfterDTensorImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterDTensorImport())
