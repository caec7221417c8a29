import functools
import os
import re

import pytest
import torch

import fused_ops  # noqa: F401  (registers torch.ops.fused.*)

# CUDA cases are collected only where they can run: a machine without a GPU reports no skips for them.
CUDA_AVAILABLE = torch.cuda.is_available() and fused_ops.cuda_kernels_compiled()
DEVICES = ["cpu", "cuda"] if CUDA_AVAILABLE else ["cpu"]
# Slow tests (huge tensors, long determinism runs) run where FUSED_OPS_SLOW=1 (scripts/gpu_check.sh).
RUN_SLOW = os.environ.get("FUSED_OPS_SLOW") == "1"
# Under pytest-xdist (scripts/test.sh runs two workers) each worker takes its share of the cores
# instead of one intra-op thread per core each.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda_only: runs only on CUDA (not collected without a GPU; its CPU "
                                       "cases are never collected)")
    config.addinivalue_line("markers", "slow: minutes per test; collected only with FUSED_OPS_SLOW=1")
    config.addinivalue_line("markers", "absent(predicate): parameter combinations that do not exist, left out "
                                       "of collection (predicate(**params) is true); give a named function "
                                       "through pytest.mark.absent.with_args")
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]

# Tolerance of one op's result against a float64 reference computed from the same inputs:
# the op computes in float32 (float64 for float64) and rounds once.
TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
}


def _runs_here(item):
    """False for a case that cannot run on this machine or does not exist: cuda_only tests without a
    GPU or on the CPU device, slow tests without FUSED_OPS_SLOW=1, and combinations a test declares
    absent with `pytest.mark.absent(lambda **params: ...)` (called with the test's parameters)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if item.get_closest_marker("cuda_only") and (not CUDA_AVAILABLE or params.get("device") == "cpu"):
        return False
    if item.get_closest_marker("slow") and not RUN_SLOW:
        return False
    return not any(marker.args[0](**params) for marker in item.iter_markers("absent"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Leaves out what cannot run here (_runs_here). FUSED_OPS_TEST_SHARD=k/n then keeps every n-th
    test from the k-th on, so a run too long for one sitting (the GPU suite, compute-sanitizer over
    every op: scripts/gpu_check.sh) splits into n runs."""
    left_out = [item for item in items if not _runs_here(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if _runs_here(item)]
    shard = os.environ.get("FUSED_OPS_TEST_SHARD")
    if not shard:
        return
    try:
        index, count = (int(part) for part in shard.split("/"))
    except ValueError:
        index, count = 0, 0
    if not 1 <= index <= count:
        raise pytest.UsageError(f"FUSED_OPS_TEST_SHARD={shard}: expected k/n with 1 <= k <= n")
    in_shard = [position % count == index - 1 for position in range(len(items))]
    config.hook.pytest_deselected(items=[item for item, keep in zip(items, in_shard) if not keep])
    items[:] = [item for item, keep in zip(items, in_shard) if keep]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def dtype(request):
    return request.param


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_close_to_reference(actual, reference, dtype, scale=1.0):
    """`actual` (any dtype) against a float64 reference, with the tolerance of `dtype`."""
    tolerance = TOLERANCE[dtype] * scale
    torch.testing.assert_close(actual.double().cpu(), reference.double().cpu(),
                               rtol=tolerance, atol=tolerance, equal_nan=True)


def assert_same_gradients(output, expected_output, inputs, **tolerances):
    """The gradients of sum(output) and of sum(expected_output) w.r.t. `inputs` agree."""
    grads = torch.autograd.grad(output.sum(), inputs)
    expected = torch.autograd.grad(expected_output.sum(), inputs)
    for grad, want in zip(grads, expected):
        torch.testing.assert_close(grad, want, **tolerances)


def assert_bad_input_rejected(cases, case):
    """Case number `case` of a list of (call, message fragment): the call raises a RuntimeError
    containing the message."""
    call, message = cases[case]
    with pytest.raises(RuntimeError) as error:
        call()
    assert message in str(error.value)


@functools.lru_cache(maxsize=None)
def library_runs_sm90_code():
    """Whether this GPU runs the library's kernels as code for sm_90 or newer, which the thread-block
    clusters and early launches need (runs_sm90_code in ops/common/cuda_device.cuh asks the CUDA
    runtime): a GPU from Hopper on, and a build target from 9.0 up to the GPU's own, as machine code
    of the GPU's major version or as PTX. A build for 8.0 alone runs its PTX there, without them."""
    if not torch.cuda.is_available() or not fused_ops.cuda_kernels_compiled():
        return False
    major, minor = torch.cuda.get_device_capability()
    for arch in fused_ops.cuda_arch_list():
        target = re.match(r"(\d+)\.(\d+)", arch)
        if target is None:
            continue
        target_major, target_minor = int(target[1]), int(target[2])
        if 9 <= target_major and (target_major, target_minor) <= (major, minor) and (
                arch.endswith("+PTX") or target_major == major):
            return True
    return False


def cuda_kernels_run_by(step):
    """Names of the CUDA kernels that step() launches (profiler), to check which path a shape takes.
    Skips the test where the profiler records no kernels at all: under compute-sanitizer CUPTI cannot
    subscribe (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED), and every list would come back empty."""
    if not profiler_records_cuda_kernels():
        pytest.skip("the profiler records no CUDA kernels here (compute-sanitizer holds CUPTI)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        step()
        torch.cuda.synchronize()
    return [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@functools.lru_cache(maxsize=None)
def profiler_records_cuda_kernels():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    return any(event.device_type == torch.autograd.DeviceType.CUDA for event in profile.events())
