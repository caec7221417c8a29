"""fused_ops: fused CUDA operators for PyTorch as `torch.ops.fused.*` dispatcher ops.

Importing this package loads the shared library, which registers every op. The library
holds no Python: `torch.ops.load_library(fused_ops.library_path())` alone is equivalent,
and a C++ process can link it directly.
"""
import functools
import os
from typing import Optional

import torch

__version__ = "0.2.0"

_PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))


def library_path() -> str:
    """Absolute path of libfused_ops.so."""
    return os.path.join(_PACKAGE_DIR, "lib", "libfused_ops.so")


def runner_path() -> str:
    """Absolute path of the `fused_run` executable (C++ runner, no Python)."""
    return os.path.join(_PACKAGE_DIR, "bin", "fused_run")


def cmake_prefix_path() -> str:
    """Prefix to pass to CMake (CMAKE_PREFIX_PATH) for `find_package(FusedOps)`."""
    return _PACKAGE_DIR


def cuda_kernels_compiled() -> bool:
    """Whether the library was built with its CUDA kernels."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("fused::relu_add", "CUDA")


def cuda_arch_list() -> list:
    """The GPU targets the CUDA kernels were built for, as TORCH_CUDA_ARCH_LIST named them at build
    time (for example ["9.0+PTX"]); empty for a build without CUDA kernels."""
    path = os.path.join(_PACKAGE_DIR, "lib", "cuda_arch_list.txt")
    if not os.path.exists(path):
        return []
    with open(path) as file:
        return file.read().replace(";", " ").split()


def cuda_kernels_run_on(device="cuda") -> bool:
    """Whether the CUDA kernels run on `device` (a CUDA device or its index): built in, and built for a
    target that GPU runs (`cuda_arch_list()`). `why_cuda_kernels_do_not_run_on` says why not."""
    return why_cuda_kernels_do_not_run_on(device) is None


def why_cuda_kernels_do_not_run_on(device="cuda") -> Optional[str]:
    """None where the CUDA kernels run on `device`; otherwise why they do not, and how to rebuild."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"fused_ops.why_cuda_kernels_do_not_run_on: expected a CUDA device, got {device}")
    return _why_kernels_do_not_run_on_index(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _why_kernels_do_not_run_on_index(index: int) -> Optional[str]:
    # Every kernel is built for the same targets, so whether one op runs answers for all of them.
    major, minor = torch.cuda.get_device_capability(index)
    gpu = f"{torch.cuda.get_device_name(index)} (cuda:{index}, compute capability {major}.{minor})"
    rebuild = (f"rebuild fused_ops for it: TORCH_CUDA_ARCH_LIST={major}.{minor} scripts/setup.sh, or "
               f"TORCH_CUDA_ARCH_LIST={major}.{minor} pip install --no-build-isolation . in its source folder")
    if not cuda_kernels_compiled():
        return f"this build of fused_ops has no CUDA kernels, so its ops do not run on {gpu}; {rebuild}"
    try:
        x = torch.ones(4, device=torch.device("cuda", index))
        if torch.equal(torch.ops.fused.relu_add(x, x), x + x):
            return None
        problem = "an op gave a wrong result there"
    except RuntimeError as error:
        problem = str(error).strip().splitlines()[0]
    return (f"the CUDA kernels, built for {' '.join(cuda_arch_list()) or 'unknown targets'}, do not run on {gpu}: "
            f"{problem}; {rebuild}")


def _check_built_for_this_torch() -> None:
    """A library built against another torch fails to load with undefined symbols, or crashes; say
    which versions differ and how to rebuild instead."""
    path = os.path.join(_PACKAGE_DIR, "lib", "torch_build.txt")
    if not os.path.exists(path):
        return
    with open(path) as file:
        lines = file.read().split()
    built = lines[0] if lines else ""
    running = torch.__version__.split("+")[0]
    rebuild = ("rebuild fused_ops against the torch you run: `pip install --no-build-isolation .` in its "
               "source folder, or `scripts/setup.sh` there (PYTHON=/path/to/python for another interpreter)")
    if built and built != running:
        raise ImportError(f"fused_ops was built against torch {built}, but torch {torch.__version__} is imported; "
                          f"{rebuild}")
    if len(lines) > 1 and lines[1] in ("ON", "TRUE", "1") and torch.version.cuda is None:
        raise ImportError(f"fused_ops was built with CUDA kernels against a CUDA build of torch {built}, but "
                          f"torch {torch.__version__} has no CUDA; {rebuild}, with FUSED_OPS_CUDA=OFF for a "
                          "CPU-only build")


_check_built_for_this_torch()
torch.ops.load_library(library_path())

from ._ops import (add_layer_norm, add_rms_norm, attention_with_sinks, bias_gelu, gated_mul, gated_mul_linear, gelu_mul,  # noqa: E402
                   layer_norm, linear_cross_entropy, linear_log_probs, moe_expert_mlp, moe_experts, moe_permute,
                   moe_unpermute, relu_add, rms_norm, rotary_embedding, silu_mul, silu_mul_linear)
from . import nn  # noqa: E402
from . import experts  # noqa: E402
from .patching import fuse, FusionReport  # noqa: E402
from .rl import token_log_probs, HeadNotProven  # noqa: E402
from ._lazy_distributed import register_sharding_rules_when_dtensor_loads  # noqa: E402

register_sharding_rules_when_dtensor_loads()

__all__ = [
    "__version__",
    "library_path",
    "runner_path",
    "cmake_prefix_path",
    "cuda_kernels_compiled",
    "cuda_arch_list",
    "cuda_kernels_run_on",
    "why_cuda_kernels_do_not_run_on",
    "relu_add",
    "bias_gelu",
    "silu_mul",
    "silu_mul_linear",
    "gelu_mul",
    "gated_mul",
    "gated_mul_linear",
    "rms_norm",
    "add_rms_norm",
    "layer_norm",
    "add_layer_norm",
    "rotary_embedding",
    "linear_cross_entropy",
    "linear_log_probs",
    "moe_permute",
    "moe_expert_mlp",
    "moe_unpermute",
    "moe_experts",
    "attention_with_sinks",
    "fuse",
    "FusionReport",
    "token_log_probs",
    "HeadNotProven",
    "nn",
]
