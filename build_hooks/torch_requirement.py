"""scikit-build-core metadata provider: the wheel's `dependencies` pin the torch it is built against.

The library links libtorch's C++ ABI, which changes between torch releases, so the binary loads only
with the torch release it was compiled with. The pin is the public version (`torch==2.14.1` for
2.14.1+cu130), which pip matches against any local build label of that release.
"""
from __future__ import annotations

import sys


def dynamic_metadata(field: str, settings: dict) -> list[str]:
    if field != "dependencies":
        raise RuntimeError(f"build_hooks.torch_requirement provides 'dependencies', not {field!r}")
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "fused_ops builds against the torch installed in this Python environment, and "
            f"{sys.executable} cannot import torch. pip's default build isolation builds in a new "
            "environment without it: install torch, then build with\n"
            "    pip install --no-build-isolation .\n"
            "(or scripts/setup.sh, which does that)") from None
    return [f"torch=={torch.__version__.split('+')[0]}"]
