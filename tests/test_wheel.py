"""The wheel: built as scripts/build_wheel.sh builds it (reusing the set-up's build), installed into a
fresh virtual environment that holds only torch and its dependencies, where `python -m fused_ops` and
one op run. The environment reaches the installed torch through a directory of links to exactly
torch's distributions (no copy, no download), so pip sees torch installed and must find the wheel's
pin satisfied from it, with no index to fall back on. About a minute, most of it CMake's configure
step (the compile is the set-up's, reused)."""
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def torch_distributions():
    """torch's distribution and every one it needs, with the extras asked for (markers evaluated here)."""
    found, pending = {}, [("torch", frozenset())]
    while pending:
        name, extras = pending.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found and extras <= found[key][1]:
            continue
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        extras = extras | (found[key][1] if key in found else frozenset())
        found[key] = (distribution, extras)
        for requirement in map(Requirement, distribution.requires or []):
            if requirement.marker is None or any(
                    requirement.marker.evaluate({**default_environment(), "extra": extra}) for extra in {"", *extras}):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return [distribution for distribution, _ in found.values()]


def link_torch_only(directory: Path):
    """Links in `directory` to the top-level files and folders of torch's distributions (with their
    .dist-info, so pip sees them installed)."""
    directory.mkdir()
    for distribution in torch_distributions():
        site = Path(distribution.locate_file(""))
        tops = {Path(file).parts[0] for file in distribution.files or [] if not str(file).startswith("..")}
        for top in tops:
            source, link = site / top, directory / top
            if source.exists() and not link.exists() and top != "__pycache__":
                link.symlink_to(source)


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.mark.skipif(bool(os.environ.get("FUSED_OPS_SANITIZE")), reason="a sanitizer build is not a wheel to ship")
def test_wheel_installs_and_runs_in_a_fresh_environment(tmp_path):
    config = [f"-Ccmake.define.{name}={os.environ[name]}" for name in ("FUSED_OPS_CUDA",) if os.environ.get(name)]
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", *config,
         "-w", str(tmp_path / "dist"), str(ROOT)], cwd=ROOT)
    (wheel,) = (tmp_path / "dist").glob("fused_ops-*.whl")

    environment = tmp_path / "venv"
    pip_version = tuple(int(part) for part in re.findall(r"\d+", importlib.metadata.version("pip"))[:2])
    # pip 22.3 and later install into another interpreter (--python); older ones need the environment's own.
    own_pip = pip_version < (22, 3)
    run([sys.executable, "-m", "venv", *([] if own_pip else ["--without-pip"]), str(environment)])
    python = environment / "bin" / "python"
    pip = [str(python), "-m", "pip"] if own_pip else [sys.executable, "-m", "pip", "--python", str(python)]
    link_torch_only(tmp_path / "torch_only")
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())
    (site / "torch_only.pth").write_text(str(tmp_path / "torch_only") + "\n")
    clean = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    # With dependencies and no index: the pin must be met by the torch installed.
    run([*pip, "install", "--no-index", "--no-cache-dir", str(wheel)], env=clean)

    info = run([str(python), "-m", "fused_ops"], env=clean, cwd=tmp_path)
    assert torch.__version__ in info
    assert str(site) in info  # the library the environment installed, not the set-up's
    check = """
import importlib.metadata, pathlib, torch, fused_ops
x, y = torch.randn(5, 7), torch.randn(7)
assert torch.equal(fused_ops.relu_add(x, y, bias=0.5), torch.relu(x) + y + 0.5)
print(importlib.metadata.requires("fused_ops"))
print((pathlib.Path(fused_ops.__file__).parent / "py.typed").is_file())
"""
    requires, typed = run([str(python), "-c", check], env=clean, cwd=tmp_path).split("\n")[:2]
    assert requires == repr([f"torch=={torch.__version__.split('+')[0]}"])
    assert typed == "True"
