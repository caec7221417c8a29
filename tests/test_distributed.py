"""The ops under torch.distributed, in processes this test spawns (gloo on CPU; NCCL where enough GPUs
are visible): every op on DTensors of every placement against the op on the full tensor, a placement
the ops cannot run locally redistributed, a tensor-parallel + sequence-parallel + FSDP2 training step
against the same model on one process, eagerly and compiled, and a fused Hugging Face model under FSDP2
and compiled under DDP (its graph split at the buckets) against the stock model on one process. The work of each process is in
tests/distributed_workers.py."""
import fcntl
import importlib.util
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.multiprocessing

import distributed_workers
from op_specs import OPS

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")


def spawn(world, device, checks):
    """Runs each (check, args) of `checks` (distributed_workers.<check>(device, *args)) in turn in `world`
    new processes of one group; returns the ids of the checks that finished and the error that stopped
    the rest (None where none did)."""
    with tempfile.TemporaryDirectory() as directory:
        finished = os.path.join(directory, "finished")
        open(finished, "w").close()
        error = None
        try:
            torch.multiprocessing.spawn(distributed_workers.run, nprocs=world, join=True,
                                        args=(world, os.path.join(directory, "rendezvous"), device, checks, finished))
        except Exception as exception:  # noqa: BLE001  (raised again by the check's own spawn)
            error = exception
        with open(finished) as file:
            return set(file.read().splitlines()), error


@pytest.fixture
def run_check(tmp_path_factory):
    """run_check(world, device, check, *args) makes one check of CHECKS. Every check of `world` processes
    runs in one spawn shared by the whole test run (a process group's start and each process's imports
    cost more than most checks), made on first use by whichever pytest-xdist worker needs it first (the
    others wait for it); a check that spawn did not finish (an earlier one failed) runs in a spawn of its
    own, which raises the check's own error."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # seen by every worker of the run

    def run(world, device, check, *args):
        assert (check, args) in CHECKS[world], f"{check}{args} is not in CHECKS[{world}]"
        outcome = shared / f"distributed-{world}-{device}-finished"
        with open(f"{outcome}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not outcome.exists():
                finished, _ = spawn(world, device, CHECKS[world])
                outcome.write_text("\n".join(sorted(finished)))
            finished = set(outcome.read_text().splitlines())
        if distributed_workers.check_id(check, args) in finished:
            return
        _, error = spawn(world, device, [(check, args)])
        if error is not None:
            raise error
    return run


def devices(world):
    """gloo on CPU; NCCL where `world` GPUs are visible (not collected otherwise)."""
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= world
    return ["cpu"] + (["cuda"] if has_gpus else [])


# Ops on rows of one width; rotary_embedding (q, k and the tables shard differently) and
# linear_cross_entropy (a loss over the rows) have their own tests.
ROW_OPS = [spec.name for spec in OPS if spec.family not in ("rotary", "cross_entropy")]

# Every check the tests below make, by the number of processes it takes.
CHECKS = {
    2: [("ops_on_dtensors", ((2,), ROW_OPS)),
        ("unsupported_placement_is_redistributed", ()),
        ("training_step_matches_one_process", ((1, 2), None)),
        ("training_step_matches_one_process", ((1, 2), "aot_eager")),
        ("rotary_on_dtensors", ()),
        ("linear_cross_entropy_on_dtensors", ()),
        ("linear_log_probs_on_dtensors", ()),
        ("moe_experts_on_dtensors", ()),
        ("attention_with_sinks_on_dtensors", ()),
        ("silu_mul_linear_on_dtensors", ()),
        ("norm_weight_forms_on_dtensors", ()),
        ("relu_add_backward_on_dtensors", ())]
       + ([("fused_hugging_face_model_under_fsdp2", (None,)), ("fused_hugging_face_model_under_fsdp2", ("aot_eager",)),
           ("fused_hugging_face_model_compiled_under_ddp", ()),
           ("token_log_probs_under_fsdp2", ("fsdp2",)), ("token_log_probs_under_fsdp2", ("ddp",))]
          if importlib.util.find_spec("transformers") else []),
    4: [("ops_on_dtensors", ((2, 2), ROW_OPS)),
        ("training_step_matches_one_process", ((2, 2), None)),
        ("training_step_matches_one_process", ((2, 2), "aot_eager"))],
}


@pytest.mark.parametrize("device", devices(2))
def test_every_op_on_dtensors_of_two_processes(run_check, device):
    run_check(2, device, "ops_on_dtensors", (2,), ROW_OPS)


@pytest.mark.slow  # the two-process mesh of the test above runs every op by default
@pytest.mark.parametrize("device", devices(4))
def test_every_op_on_dtensors_of_a_two_by_two_mesh(run_check, device):
    run_check(4, device, "ops_on_dtensors", (2, 2), ROW_OPS)


@pytest.mark.parametrize("device", devices(2))
def test_a_placement_the_op_cannot_run_locally_is_redistributed(run_check, device):
    run_check(2, device, "unsupported_placement_is_redistributed")


@pytest.mark.parametrize("device", devices(2))
@pytest.mark.parametrize("compile_backend", [None, "aot_eager"], ids=["eager", "compiled"])
def test_tensor_and_sequence_parallel_step_of_two_processes(run_check, device, compile_backend):
    run_check(2, device, "training_step_matches_one_process", (1, 2), compile_backend)


@pytest.mark.parametrize("device", devices(4))
@pytest.mark.parametrize("compile_backend", [None, "aot_eager"], ids=["eager", "compiled"])
def test_tensor_sequence_and_fsdp2_step_of_four_processes(run_check, device, compile_backend):
    run_check(4, device, "training_step_matches_one_process", (2, 2), compile_backend)


@pytest.mark.parametrize("device", devices(2))
def test_rotary_embedding_on_dtensors(run_check, device):
    run_check(2, device, "rotary_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_linear_cross_entropy_on_dtensors(run_check, device):
    run_check(2, device, "linear_cross_entropy_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_linear_log_probs_on_dtensors(run_check, device):
    run_check(2, device, "linear_log_probs_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_moe_experts_on_dtensors(run_check, device):
    run_check(2, device, "moe_experts_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_attention_with_sinks_on_dtensors(run_check, device):
    run_check(2, device, "attention_with_sinks_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_silu_mul_linear_on_dtensors(run_check, device):
    run_check(2, device, "silu_mul_linear_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_norm_weight_forms_on_dtensors(run_check, device):
    run_check(2, device, "norm_weight_forms_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_relu_add_backward_on_dtensors(run_check, device):
    run_check(2, device, "relu_add_backward_on_dtensors")


def test_every_op_has_a_sharding_rule():
    """Forward and backward ops alike: every schema of the `fused` namespace has a DTensor rule once
    DTensor is imported."""
    from torch.distributed.tensor import DTensor
    registered = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    names = sorted({schema.name.split("::")[1] for schema in torch._C._jit_get_all_schemas()
                    if schema.name.startswith("fused::")})
    assert len(names) >= 16
    missing = [name for name in names if getattr(torch.ops.fused, name).default not in registered]
    assert not missing, missing


@pytest.mark.parametrize("order", ["fused_ops_first", "dtensor_first"])
def test_rules_load_with_dtensor_only(order):
    """`import fused_ops` leaves torch.distributed.tensor unimported; the rules register when it is
    imported, before or after fused_ops."""
    if order == "fused_ops_first":
        code = ("import sys, fused_ops\n"
                "assert 'torch.distributed.tensor' not in sys.modules\n"
                "import torch.distributed.tensor\n")
    else:
        code = "import torch.distributed.tensor, fused_ops\n"
    code += ("import torch\n"
             "from torch.distributed.tensor import DTensor\n"
             "assert torch.ops.fused.rms_norm.default in DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("device", devices(2))
@pytest.mark.parametrize("compile_backend", [None, "aot_eager"], ids=["eager", "compiled"])
def test_fused_hugging_face_model_under_fsdp2_trains_like_one_process(run_check, device, compile_backend):
    pytest.importorskip("transformers")
    run_check(2, device, "fused_hugging_face_model_under_fsdp2", compile_backend)


@pytest.mark.parametrize("device", devices(2))
def test_fused_hugging_face_model_compiled_under_ddp_trains_like_one_process(run_check, device):
    pytest.importorskip("transformers")
    run_check(2, device, "fused_hugging_face_model_compiled_under_ddp")


@pytest.mark.parametrize("device", devices(2))
@pytest.mark.parametrize("wrapper", ["fsdp2", "ddp"])
def test_token_log_probs_of_a_sharded_model_matches_one_process(run_check, device, wrapper):
    pytest.importorskip("transformers")
    run_check(2, device, "token_log_probs_under_fsdp2", wrapper)
