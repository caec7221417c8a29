"""Deploy without Python: fused_run with TorchScript and AOTInductor, the CMake package, ldd."""
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import fused_ops
from deploy_models import MODELS, EveryFamily, MatmulReluAdd, example_inputs

RUNNER = fused_ops.runner_path()


def run_runner(*args):
    return subprocess.run([RUNNER, *map(str, args)], capture_output=True, text=True, timeout=300)


def save_scripted(model, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(model).save(str(path))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The relu_add model scripted, and the inputs, saved once per module."""
    folder = tmp_path_factory.mktemp("deploy")
    model = MatmulReluAdd()
    save_scripted(model, folder / "model.pt")
    torch.save(example_inputs(), folder / "inputs.pt")
    return folder, model


def expected_outputs(model, device, grad):
    inputs = [t.requires_grad_(grad) for t in example_inputs(device)]
    model = model.to(device)
    result = model(*inputs)
    outputs = list(result) if isinstance(result, tuple) else [result]
    if not grad:
        return [o.detach() for o in outputs]
    grads = torch.autograd.grad(sum(o.sum() for o in outputs), inputs)
    return [o.detach() for o in outputs] + list(grads)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("grad", [False, True])
def test_fused_run_torchscript(artifacts, device, grad, name):
    folder, _ = artifacts
    model = MODELS[name]()
    save_scripted(model, folder / f"{name}.pt")
    out = folder / f"out_{name}_{device}_{grad}.pt"
    flags = ["--device", device] + (["--grad"] if grad else [])
    result = run_runner(folder / f"{name}.pt", folder / "inputs.pt", out, *flags)
    assert result.returncode == 0, result.stderr
    got = torch.load(out)
    want = expected_outputs(model, device, grad)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.cpu(), rtol=1e-5, atol=1e-5)


def test_fresh_process_with_only_load_library(artifacts, device, tmp_path):
    """Saved TorchScript models of every op family run in a Python process that never imports fused_ops."""
    folder, _ = artifacts
    models = {name: model() for name, model in MODELS.items()}
    for name, model in models.items():
        save_scripted(model, tmp_path / f"{name}.pt")
    script = textwrap.dedent(f"""
        import sys, warnings, torch
        warnings.simplefilter("ignore")
        torch.ops.load_library({fused_ops.library_path()!r})
        torch.ops.load_library({fused_ops.library_path()!r})  # loading twice is harmless
        assert "fused_ops" not in sys.modules
        inputs = [t.to({device!r}) for t in torch.load({str(folder / 'inputs.pt')!r})]
        for name in {list(models)!r}:
            model = torch.jit.load(f"{{name}}.pt", map_location={device!r})
            torch.save(model(*inputs), f"out_{{name}}.pt")
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=300)
    for name, model in models.items():
        got = torch.load(tmp_path / f"out_{name}.pt")
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        want = expected_outputs(model, device, grad=False)
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w.cpu(), rtol=1e-5, atol=1e-5)


def aoti_cannot_load(folder):
    """Some torch builds crash constructing any AOTIModelPackageLoader: the reason when a plain package
    fails to load in a subprocess here, None when it loads."""
    script = textwrap.dedent(f"""
        import torch
        class Plain(torch.nn.Module):
            def forward(self, x):
                return x * 2
        path = torch._inductor.aoti_compile_and_package(
            torch.export.export(Plain(), (torch.randn(4),)), package_path={str(folder / 'plain.pt2')!r})
        loaded = torch._inductor.aoti_load_package(path)
        assert torch.equal(loaded(torch.ones(4)), torch.full((4,), 2.0))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        return f"AOTInductor cannot load even a plain package here (exit {result.returncode}): " \
               f"{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'no message'}"
    return None


def test_fused_run_aot_inductor_package(artifacts, tmp_path):
    """One package holding every op family's model (one compile: each costs seconds of C++ build)."""
    folder, _ = artifacts
    model = EveryFamily()
    inputs = example_inputs()
    exported = torch.export.export(model, tuple(inputs))
    called = {str(node.target).split(".")[1] for node in exported.graph.nodes if str(node.target).startswith("fused.")}
    assert {"relu_add", "bias_gelu", "silu_mul", "gelu_mul", "add_rms_norm", "add_layer_norm", "rms_norm",
            "layer_norm", "rotary_embedding", "linear_cross_entropy", "linear_log_probs"} <= called, called
    package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "model.pt2"))
    result = run_runner(package, folder / "inputs.pt", tmp_path / "out.pt")
    if result.returncode < 0 and (reason := aoti_cannot_load(tmp_path)):  # killed by a signal
        pytest.skip(reason)
    assert result.returncode == 0, result.stderr
    got = torch.load(tmp_path / "out.pt")
    want = expected_outputs(model, "cpu", grad=False)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # --grad is refused for packages, with a message, not a crash
    result = run_runner(package, folder / "inputs.pt", tmp_path / "out2.pt", "--grad")
    assert result.returncode == 1 and "--grad needs a TorchScript model" in result.stderr


def error_cases(folder):
    missing = folder / "missing.pt"
    not_a_model = folder / "inputs.pt"
    garbage = folder / "garbage.bin"
    garbage.write_bytes(b"PK\x03\x04 not really a zip" * 10)
    not_a_list = folder / "tensor.pt"
    torch.save(torch.ones(3), not_a_list)
    strings = folder / "strings.pt"
    torch.save(["a", "b"], strings)
    one_input = folder / "one_input.pt"
    torch.save([torch.randn(8, 16)], one_input)
    wrong_shape = folder / "wrong_shape.pt"
    torch.save([torch.randn(8, 5), torch.randn(16)], wrong_shape)
    model, inputs, out = folder / "model.pt", folder / "inputs.pt", folder / "err_out.pt"
    cases = [
        ("missing model", [missing, inputs, out], 1, "cannot read MODEL file"),
        ("not a model", [not_a_model, inputs, out], 1, "neither a TorchScript file nor an AOTInductor package"),
        ("corrupt model", [garbage, inputs, out], 1, "neither a TorchScript file"),
        ("missing inputs", [model, missing, out], 1, "cannot read INPUTS file"),
        ("inputs not a list", [model, not_a_list, out], 1, "must hold a list of tensors"),
        ("inputs not tensors", [model, strings, out], 1, "must hold only tensors"),
        ("wrong number of inputs", [model, one_input, out], 1, "model forward takes 2 inputs, INPUTS holds 1"),
        ("wrong input shape", [model, wrong_shape, out], 1, "error:"),
        ("unwritable outputs", [model, inputs, folder / "no" / "such" / "dir.pt"], 1, "cannot write OUTPUTS"),
        ("too few arguments", [model, inputs], 2, "expected MODEL INPUTS OUTPUTS"),
        ("bad device", [model, inputs, out, "--device", "tpu"], 2, "--device must be cpu or cuda"),
        ("device without value", [model, inputs, out, "--device"], 2, "--device needs a value"),
        ("unknown option", [model, inputs, out, "--fast"], 2, "unknown option --fast"),
    ]
    if not torch.cuda.is_available():
        cases.append(("cuda without a GPU", [model, inputs, out, "--device", "cuda"], 1, "no CUDA GPU is available"))
    return cases


def test_fused_run_errors_exit_cleanly(artifacts):
    folder, _ = artifacts
    for name, args, code, message in error_cases(folder):
        result = run_runner(*args)
        assert result.returncode == code, (name, result.returncode, result.stderr)
        assert message in result.stderr, (name, result.stderr)
        assert result.stderr.startswith("fused_run:"), (name, result.stderr)


def test_fused_run_model_failure_prints_the_ops_reason(tmp_path):
    """An op failing inside the TorchScript interpreter: the one error line is the op's own message, not
    the interpreter's "The following operation failed"."""
    save_scripted(fused_ops.nn.ReLUAdd(), tmp_path / "relu_add.pt")
    torch.save([torch.randn(4, 3), torch.randn(5)], tmp_path / "inputs.pt")
    result = run_runner(tmp_path / "relu_add.pt", tmp_path / "inputs.pt", tmp_path / "out.pt")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == ["fused_run: error: fused::relu_add: expected y of shape [5] to broadcast to the shape of x [4, 3] "
                     "(the result keeps x's shape)"], result.stderr


class AddIndex(torch.nn.Module):
    def forward(self, x, index):
        return torch.ops.fused.relu_add(x, index.to(x.dtype), 0.0)


def test_fused_run_grad_gives_integer_inputs_none(tmp_path):
    """--grad: a floating input gets its gradient, an integer one None (no gradient), with a note."""
    save_scripted(AddIndex(), tmp_path / "model.pt")
    x, index = torch.randn(4, 3), torch.arange(3)
    torch.save([x, index], tmp_path / "inputs.pt")
    result = run_runner(tmp_path / "model.pt", tmp_path / "inputs.pt", tmp_path / "out.pt", "--grad")
    assert result.returncode == 0, result.stderr
    assert "input 1 is Long, not floating point: it gets no gradient (None in OUTPUTS)" in result.stderr
    out, grad_x, grad_index = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(out, torch.relu(x) + index)
    torch.testing.assert_close(grad_x, (x > 0).to(x.dtype))
    assert grad_index is None


def test_fused_run_help():
    result = run_runner("--help")
    assert result.returncode == 0 and "usage: fused_run MODEL INPUTS OUTPUTS" in result.stdout


@pytest.mark.skipif(shutil.which("ldd") is None, reason="needs ldd")
def test_fused_run_links_no_python():
    linked = subprocess.run(["ldd", RUNNER], capture_output=True, text=True, check=True).stdout
    assert "libfused_ops.so" in linked
    assert "libpython" not in linked and "libtorch_python" not in linked
    library = subprocess.run(["ldd", fused_ops.library_path()], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in library and "libtorch_python" not in library


def test_cmake_prefix_path_command():
    result = subprocess.run([sys.executable, "-m", "fused_ops", "--cmake-prefix-path"],
                            capture_output=True, text=True, check=True)
    prefix = result.stdout.strip()
    assert os.path.isfile(os.path.join(prefix, "share", "cmake", "FusedOps", "FusedOpsConfig.cmake"))


@pytest.fixture(scope="module")
def example_binary(tmp_path_factory):
    """runtime/example configured and built once against the installed package."""
    source = os.path.join(os.path.dirname(__file__), "..", "runtime", "example")
    build = tmp_path_factory.mktemp("example_build")
    prefix = f"{fused_ops.cmake_prefix_path()};{torch.utils.cmake_prefix_path}"
    configure = ["cmake", "-S", source, "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
                 "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    for command in (configure, ["cmake", "--build", str(build)]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return build / "fused_example"


def test_cmake_example_app(example_binary, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(fused_ops.nn.ReLUAdd(bias=0.5)).save(str(tmp_path / "relu_add.pt"))
    linked = subprocess.run(["ldd", str(example_binary)], capture_output=True, text=True).stdout
    assert "libfused_ops.so" in linked
    result = subprocess.run([str(example_binary), str(tmp_path / "relu_add.pt")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    x = torch.linspace(-2.0, 2.0, 8).reshape(2, 4)
    expected = torch.relu(x) + 1.0 + 0.5
    printed = [float(v) for v in result.stdout.split() if v.replace(".", "").replace("-", "").isdigit()]
    assert printed[:8] == pytest.approx(expected.flatten().tolist(), abs=1e-4)
