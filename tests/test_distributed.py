"""The ops under torch.distributed, in processes this test spawns (gloo on CPU; NCCL where enough GPUs
are visible): every op on DTensors of every placement against the op on the full tensor, a placement
the ops cannot run locally redistributed, and a tensor-parallel + sequence-parallel + FSDP2 training
step against the same model on one process, eagerly and compiled. The work of each process is in
tests/distributed_workers.py."""
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


def spawn(world, device, check, *args):
    """Runs distributed_workers.<check>(device, *args) in `world` new processes of one group."""
    with tempfile.TemporaryDirectory() as directory:
        rendezvous = os.path.join(directory, "rendezvous")
        torch.multiprocessing.spawn(distributed_workers.run, args=(world, rendezvous, device, check, args),
                                    nprocs=world, join=True)


def devices(world):
    """gloo on CPU; NCCL where `world` GPUs are visible (not collected otherwise)."""
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= world
    return ["cpu"] + (["cuda"] if has_gpus else [])


# Ops on rows of one width; rotary_embedding (q, k and the tables shard differently) and
# linear_cross_entropy (a loss over the rows) have their own tests.
ROW_OPS = [spec.name for spec in OPS if spec.family not in ("rotary", "cross_entropy")]


@pytest.mark.parametrize("device", devices(2))
def test_every_op_on_dtensors_of_two_processes(device):
    spawn(2, device, "ops_on_dtensors", (2,), ROW_OPS)


@pytest.mark.parametrize("device", devices(4))
def test_every_op_on_dtensors_of_a_two_by_two_mesh(device):
    spawn(4, device, "ops_on_dtensors", (2, 2), ROW_OPS)


@pytest.mark.parametrize("device", devices(2))
def test_a_placement_the_op_cannot_run_locally_is_redistributed(device):
    spawn(2, device, "unsupported_placement_is_redistributed")


@pytest.mark.parametrize("device", devices(2))
@pytest.mark.parametrize("compile_backend", [None, "aot_eager"], ids=["eager", "compiled"])
def test_tensor_and_sequence_parallel_step_of_two_processes(device, compile_backend):
    spawn(2, device, "training_step_matches_one_process", (1, 2), compile_backend)


@pytest.mark.parametrize("device", devices(4))
@pytest.mark.parametrize("compile_backend", [None, "aot_eager"], ids=["eager", "compiled"])
def test_tensor_sequence_and_fsdp2_step_of_four_processes(device, compile_backend):
    spawn(4, device, "training_step_matches_one_process", (2, 2), compile_backend)


@pytest.mark.parametrize("device", devices(2))
def test_rotary_embedding_on_dtensors(device):
    spawn(2, device, "rotary_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_linear_cross_entropy_on_dtensors(device):
    spawn(2, device, "linear_cross_entropy_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_linear_log_probs_on_dtensors(device):
    spawn(2, device, "linear_log_probs_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_silu_mul_linear_on_dtensors(device):
    spawn(2, device, "silu_mul_linear_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_norm_weight_forms_on_dtensors(device):
    spawn(2, device, "norm_weight_forms_on_dtensors")


@pytest.mark.parametrize("device", devices(2))
def test_relu_add_backward_on_dtensors(device):
    spawn(2, device, "relu_add_backward_on_dtensors")


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
def test_fused_hugging_face_model_under_fsdp2_trains_like_one_process(device):
    pytest.importorskip("transformers")
    spawn(2, device, "fused_hugging_face_model_under_fsdp2")
