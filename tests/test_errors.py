"""Bad input raises a RuntimeError naming the op, the argument and what was expected."""
import subprocess
import sys
import textwrap

import pytest
import torch

import fused_ops  # noqa: F401
from conftest import assert_bad_input_rejected


def bad_relu_add_inputs(device):
    """(description, args, message fragment) for each bad input the op rejects."""
    f32 = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    cases = [
        ("y would broadcast x to a larger shape", (f32(4), f32(3, 4)),
         "fused::relu_add: expected y of shape [3, 4] to broadcast to the shape of x [4]"),
        ("shapes that do not broadcast", (f32(4, 5), f32(4)), "expected y of shape [4] to broadcast"),
        ("dtype mismatch", (f32(4), f32(4).double()),
         "fused::relu_add: expected y to have the same dtype as x (Float), but got Double"),
        ("integer dtype", (torch.ones(4, dtype=torch.int32, device=device),) * 2,
         "fused::relu_add: expected x to be float64, float32, float16 or bfloat16, but got Int"),
        ("bool dtype", (torch.ones(4, dtype=torch.bool, device=device),) * 2,
         "expected x to be float64, float32, float16 or bfloat16, but got Bool"),
    ]
    if device == "cuda":
        cases.append(("device mismatch", (f32(4), torch.randn(4)),
                      "fused::relu_add: expected y to be on the same device as x (cuda:0), but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(6))
@pytest.mark.absent(lambda device, case: case >= len(bad_relu_add_inputs(device)))
def test_relu_add_bad_inputs(device, case):
    cases = bad_relu_add_inputs(device)
    assert_bad_input_rejected([(lambda args=args: torch.ops.fused.relu_add(*args), message)
                               for _, args, message in cases], case)
    description, args, message = cases[case]
    if description != "device mismatch":  # the Meta kernel (torch.compile, export) agrees
        with pytest.raises(RuntimeError) as meta_error:
            torch.ops.fused.relu_add(*[a.to("meta") for a in args])
        assert message in str(meta_error.value)


def test_relu_add_backward_bad_inputs(device):
    with pytest.raises(RuntimeError, match="fused::relu_add_backward: expected x to have the shape of grad"):
        torch.ops.fused.relu_add_backward(torch.randn(3, 4, device=device), torch.randn(4, device=device))


def bad_relu_add_mask_inputs(device):
    """(call, message fragment) for relu_add_with_mask and relu_add_backward_masked."""
    grad = torch.randn(3, 7, device=device)
    mask = lambda size, dtype=torch.uint8, on=device: torch.zeros(size, dtype=dtype, device=on)  # noqa: E731
    cases = [
        (lambda: torch.ops.fused.relu_add_with_mask(torch.randn(4, device=device), torch.randn(3, 4, device=device)),
         "fused::relu_add_with_mask: expected y of shape [3, 4] to broadcast to the shape of x [4]"),
        (lambda: torch.ops.fused.relu_add_backward_masked(grad, mask(3, torch.int32)),
         "fused::relu_add_backward_masked: expected mask to be uint8 (the mask relu_add_with_mask returns), but got Int"),
        (lambda: torch.ops.fused.relu_add_backward_masked(grad, mask(4)),
         "fused::relu_add_backward_masked: expected mask to be 1-D of (grad.numel() + 7) / 8 = 3 bytes"),
        (lambda: torch.ops.fused.relu_add_backward_masked(grad, mask((3, 1))), "expected mask to be 1-D of"),
        (lambda: torch.ops.fused.relu_add_backward_masked(grad.long(), mask(3)),
         "fused::relu_add_backward_masked: expected grad to be float64, float32, float16 or bfloat16, but got Long"),
    ]
    if device == "cuda":
        cases.append((lambda: torch.ops.fused.relu_add_backward_masked(grad, mask(3, on="cpu")),
                      "fused::relu_add_backward_masked: expected mask to be on the same device as grad (cuda:0), "
                      "but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(6))
@pytest.mark.absent(lambda device, case: case >= len(bad_relu_add_mask_inputs(device)))
def test_relu_add_mask_bad_inputs(device, case):
    assert_bad_input_rejected(bad_relu_add_mask_inputs(device), case)


def test_bad_inputs_never_crash_the_process(device):
    script = textwrap.dedent(f"""
        import torch, fused_ops
        import test_activations, test_errors, test_norms
        calls = [lambda args=args: torch.ops.fused.relu_add(*args)
                 for _, args, _ in test_errors.bad_relu_add_inputs({device!r})]
        calls += [call for call, _ in test_errors.bad_relu_add_mask_inputs({device!r})]
        calls += [call for call, _ in test_activations.bad_activation_inputs({device!r})]
        calls += [call for call, _ in test_norms.bad_norm_inputs({device!r})]
        rejected = 0
        for call in calls:
            try:
                call()
            except RuntimeError:
                rejected += 1
        print(rejected, len(calls))
    """)
    import os
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__))
    assert result.returncode == 0, result.stderr
    rejected, total = result.stdout.split()
    assert rejected == total
