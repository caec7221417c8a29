"""The package's public surface: paths, `python -m fused_ops`, registration."""
import os
import re
import subprocess
import sys

import torch

import fused_ops


def test_library_path_is_absolute_and_exists():
    path = fused_ops.library_path()
    assert os.path.isabs(path) and os.path.isfile(path)


def test_load_library_twice_is_harmless():
    torch.ops.load_library(fused_ops.library_path())
    torch.ops.load_library(fused_ops.library_path())
    assert torch.ops.fused.relu_add(torch.ones(2), torch.ones(2)).tolist() == [2.0, 2.0]


def test_python_m_fused_ops_reports_everything():
    result = subprocess.run([sys.executable, "-m", "fused_ops"], capture_output=True, text=True, check=True)
    out = result.stdout
    assert f"fused_ops {fused_ops.__version__}" in out
    assert fused_ops.library_path() in out
    assert torch.__version__ in out
    assert "CUDA kernels compiled: " + ("yes" if fused_ops.cuda_kernels_compiled() else "no") in out
    if fused_ops.cuda_kernels_compiled():
        assert f"CUDA architectures: {' '.join(fused_ops.cuda_arch_list())}" in out
    for index in range(torch.cuda.device_count()):
        assert f"GPU {index}: {torch.cuda.get_device_name(index)}: the CUDA kernels run" in out
    assert "fused::relu_add(Tensor x, Tensor y, float bias=0.) -> Tensor" in out
    assert "fused::relu_add_backward(Tensor grad, Tensor x) -> Tensor" in out
    assert "fused::relu_add_with_mask(Tensor x, Tensor y, float bias=0.) -> (Tensor out, Tensor mask)" in out
    assert "fused::relu_add_backward_masked(Tensor grad, Tensor mask) -> Tensor" in out
    assert "fused::bias_gelu(Tensor x, Tensor bias, str approximate=\"none\") -> Tensor" in out
    assert "fused::silu_mul(Tensor x) -> Tensor" in out
    assert "fused::gelu_mul(Tensor x, str approximate=\"none\") -> Tensor" in out


def test_python_m_fused_ops_into_a_reader_that_stops_early():
    """`python -m fused_ops | head -1`: writing into a pipe whose reader has gone ends quietly with exit
    code 0, no BrokenPipeError traceback. The read end is closed before the command starts, so every
    write meets the closed pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-u", "-m", "fused_ops"], stdout=write_end, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    finally:
        os.close(write_end)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


def test_cuda_arch_list_names_the_build_targets():
    """A CUDA build names its TORCH_CUDA_ARCH_LIST targets (by default the GPUs the building machine has,
    plus PTX of the newest, or 9.0+PTX where it has none); a CPU build none."""
    archs = fused_ops.cuda_arch_list()
    if not fused_ops.cuda_kernels_compiled():
        assert archs == []
        return
    assert archs, "a CUDA build names at least one target"
    # scripts/setup.sh builds with the TORCH_CUDA_ARCH_LIST the tests then run under
    capabilities = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    visible = ";".join(f"{major}.{minor}" for major, minor in capabilities) + "+PTX" if capabilities else "9.0+PTX"
    assert archs == (os.environ.get("TORCH_CUDA_ARCH_LIST") or visible).replace(";", " ").split()
    for arch in archs:
        assert re.fullmatch(r"\d+\.\d+[af]?(\+PTX)?", arch), arch


def test_every_op_has_every_kernel():
    """Every schema of the `fused` namespace, forward and backward ops alike, has an Autograd kernel and
    a CPU, Meta and (in a CUDA build) CUDA kernel, or one composite kernel that serves every backend
    (registration/composite.cpp)."""
    ops = sorted({schema.name for schema in torch._C._jit_get_all_schemas() if schema.name.startswith("fused::")})
    assert len(ops) >= 16
    composites = [op for op in ops if torch._C._dispatch_has_kernel_for_dispatch_key(op, "CompositeExplicitAutograd")]
    assert composites == ["fused::gated_mul_linear", "fused::gated_mul_linear_backward", "fused::moe_permute",
                          "fused::silu_mul_linear", "fused::silu_mul_linear_backward"]
    for op in ops:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "Autograd"), op
        if op in composites:
            continue
        for key in ("CPU", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op, key), (op, key)
        if fused_ops.cuda_kernels_compiled():
            assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"), op


def run_copied_package(tmp_path, stamp, before=""):
    """`import fused_ops` from a copy of the installed package whose build stamp says `stamp`, after
    `before` (Python run first in that process)."""
    import shutil
    copy = tmp_path / "fused_ops"
    shutil.copytree(os.path.dirname(fused_ops.__file__), copy)
    (copy / "lib" / "torch_build.txt").write_text(stamp)
    return subprocess.run([sys.executable, "-c", before + "import fused_ops"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=tmp_path)


def test_a_build_for_another_torch_is_a_clear_import_error(tmp_path):
    result = run_copied_package(tmp_path, "2.9.0\nOFF\n")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: fused_ops was built against torch 2.9.0, but torch {torch.__version__} "
                           "is imported; rebuild fused_ops against the torch you run"), last


def test_a_cuda_build_on_a_torch_without_cuda_is_a_clear_import_error(tmp_path):
    version = torch.__version__.split("+")[0]
    result = run_copied_package(tmp_path, f"{version}\nON\n", before="import torch; torch.version.cuda = None; ")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: fused_ops was built with CUDA kernels against a CUDA build of torch "
                           f"{version}, but torch {torch.__version__} has no CUDA"), last


def test_the_build_stamp_matches_the_running_torch():
    with open(os.path.join(os.path.dirname(fused_ops.library_path()), "torch_build.txt")) as file:
        built, cuda = file.read().split()
    assert built == torch.__version__.split("+")[0]
    assert (cuda in ("ON", "TRUE", "1")) == fused_ops.cuda_kernels_compiled()


def test_the_version_agrees_everywhere():
    """The package's __version__, its installed metadata, pyproject.toml, CMake's project and the newest
    release in CHANGELOG.md name one version."""
    import importlib.metadata
    import re
    root = os.path.join(os.path.dirname(__file__), "..")
    pyproject = re.search(r'^version = "([^"]+)"', open(os.path.join(root, "pyproject.toml")).read(), re.M).group(1)
    cmake = re.search(r"project\(fused_ops VERSION (\S+)", open(os.path.join(root, "CMakeLists.txt")).read()).group(1)
    released = re.search(r"^## (\d+\.\d+\.\d+) - ", open(os.path.join(root, "CHANGELOG.md")).read(), re.M).group(1)
    assert fused_ops.__version__ == importlib.metadata.version("fused_ops") == pyproject == cmake == released
