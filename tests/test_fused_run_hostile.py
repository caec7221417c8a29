"""fused_run against hostile files: truncated, corrupt and zero-byte models and inputs, a zip that is not
a model, inputs of the wrong count or dtype, an output path that cannot be written, a model whose ops
are not registered, and a few hundred mutated copies of valid files. Each is one line on stderr and
exit code 1 (or a clean run, for a mutation that changed nothing that matters): never a crash or a hang."""
import concurrent.futures
import random
import subprocess
import warnings
import zipfile

import pytest
import torch

import fused_ops
from conftest import RUN_SLOW
from deploy_models import MatmulNorms, example_inputs

RUNNER = fused_ops.runner_path()
FUZZ_CASES = 160 if RUN_SLOW else 48  # each case starts a process: the full count with FUSED_OPS_SLOW=1
UNREGISTERED_OP_LIBRARY = None


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(MatmulNorms()).save(str(folder / "model.pt"))
    torch.save(example_inputs(), folder / "inputs.pt")
    # An op this test process defines, which fused_run (no Python) does not have. The library lives as
    # long as the process: once freed, torch 2.11 still lists the op, and every later decomposition
    # table (opcheck, torch.compile) fails on it.
    global UNREGISTERED_OP_LIBRARY
    UNREGISTERED_OP_LIBRARY = torch.library.Library("hostile_test", "DEF")
    UNREGISTERED_OP_LIBRARY.define("double_it(Tensor x) -> Tensor")
    UNREGISTERED_OP_LIBRARY.impl("double_it", lambda x: 2 * x, "CompositeExplicitAutograd")

    class Unregistered(torch.nn.Module):
        def forward(self, x, y):
            return torch.ops.hostile_test.double_it(x) + y
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(Unregistered()).save(str(folder / "unregistered_ops.pt"))
    return folder


def run(*args):
    return subprocess.run([RUNNER, *map(str, args)], capture_output=True, text=True, errors="strict", timeout=60)


def assert_one_line_error(result, fragment=""):
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fused_run: error: "), result.stderr
    assert fragment in lines[0], lines[0]


def test_the_valid_files_run(valid):
    assert run(valid / "model.pt", valid / "inputs.pt", valid / "out.pt").returncode == 0


def write(path, data):
    path.write_bytes(data)
    return path


def hostile_cases(valid, tmp_path):
    model, inputs = (valid / "model.pt").read_bytes(), (valid / "inputs.pt").read_bytes()
    not_a_model = tmp_path / "archive.pt"
    with zipfile.ZipFile(not_a_model, "w") as archive:
        archive.writestr("readme.txt", "a zip archive, not a model")
    torch.save([torch.ones(8, 16)], tmp_path / "one_input.pt")
    torch.save([torch.ones(8, 16, dtype=torch.int32), torch.ones(16, dtype=torch.int32)], tmp_path / "ints.pt")
    torch.save({"x": torch.ones(2)}, tmp_path / "dict.pt")

    return [
        ("zero-byte model", write(tmp_path / "empty.pt", b""), valid / "inputs.pt", "neither a TorchScript"),
        ("truncated model", write(tmp_path / "half.pt", model[: len(model) // 2]), valid / "inputs.pt", ""),
        ("a zip that is not a model", not_a_model, valid / "inputs.pt", "neither a TorchScript file nor"),
        ("a model that is not a zip", write(tmp_path / "text.pt", b"not a model at all"), valid / "inputs.pt",
         "neither a TorchScript"),
        ("missing model", tmp_path / "missing.pt", valid / "inputs.pt", "cannot read MODEL file"),
        ("zero-byte inputs", valid / "model.pt", write(tmp_path / "empty_inputs.pt", b""), ""),
        ("truncated inputs", valid / "model.pt", write(tmp_path / "half_inputs.pt", inputs[: len(inputs) // 2]), ""),
        ("inputs of the wrong count", valid / "model.pt", tmp_path / "one_input.pt", "model forward takes 2 inputs"),
        ("inputs of the wrong dtype", valid / "model.pt", tmp_path / "ints.pt", ""),
        ("inputs that are not a list", valid / "model.pt", tmp_path / "dict.pt", "must hold a list of tensors"),
        ("a model whose ops are not registered", valid / "unregistered_ops.pt", valid / "inputs.pt",
         "hostile_test::double_it"),
    ]


@pytest.mark.parametrize("case", range(11))
def test_hostile_file(valid, tmp_path, case):
    name, model, inputs, fragment = hostile_cases(valid, tmp_path)[case]
    assert_one_line_error(run(model, inputs, tmp_path / "out.pt"), fragment)


def test_an_output_path_that_cannot_be_written(valid, tmp_path):
    assert_one_line_error(run(valid / "model.pt", valid / "inputs.pt", tmp_path / "no" / "such" / "out.pt"),
                          "cannot write OUTPUTS file")


def mutate(data, rng):
    data = bytearray(data)
    kind = rng.choice(["truncate", "flip", "zero", "splice"])
    if kind == "truncate":
        return bytes(data[: rng.randrange(len(data))])
    if kind == "flip":
        for _ in range(rng.randint(1, 20)):
            index = rng.randrange(len(data))
            data[index] ^= 1 << rng.randrange(8)
    elif kind == "zero":
        index = rng.randrange(len(data))
        length = min(rng.randint(1, 200), len(data) - index)
        data[index:index + length] = bytes(length)
    else:
        index, source = rng.randrange(len(data)), rng.randrange(len(data))
        data[index:index + 50] = data[source:source + 50]
    return bytes(data)


@pytest.mark.slow  # the hand-made hostile files above run by default
def test_mutated_files_never_crash_or_hang(valid, tmp_path):
    """FUZZ_CASES mutated copies of the model or the inputs, seeded: each run ends with exit code 0 or a
    one-line error and 1, within a minute."""
    rng = random.Random(0)
    model, inputs = (valid / "model.pt").read_bytes(), (valid / "inputs.pt").read_bytes()
    jobs = []
    for case in range(FUZZ_CASES):
        mutated_model = case % 2 == 0
        path = write(tmp_path / f"case{case}.pt", mutate(model if mutated_model else inputs, rng))
        jobs.append((case, path if mutated_model else valid / "model.pt",
                     valid / "inputs.pt" if mutated_model else path, tmp_path / f"out{case}.pt"))
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: (job[0], run(*job[1:])), jobs))
    failures = []
    for case, result in results:
        lines = result.stderr.strip().splitlines()
        clean = result.returncode == 0 or (result.returncode == 1 and len(lines) == 1
                                            and lines[0].startswith("fused_run: error: "))
        if not clean:
            failures.append((case, result.returncode, result.stderr[-300:]))
    assert not failures, failures
