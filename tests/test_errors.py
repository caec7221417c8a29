"""Bad input raises a RuntimeError naming the op, the argument and what was expected."""
import subprocess
import sys
import textwrap

import pytest
import torch

import fused_ops  # noqa: F401
from conftest import assert_bad_input_rejected
from op_specs import OPS, random


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
        ("x is None", (None, f32(4)), "fused::relu_add: expected x to be a tensor, but got None (an undefined tensor)"),
        ("y is None", (f32(4), None), "fused::relu_add: expected y to be a tensor, but got None"),
    ]
    if device == "cuda":
        cases.append(("device mismatch", (f32(4), torch.randn(4)),
                      "fused::relu_add: expected y to be on the same device as x (cuda:0), but got cpu"))
    return cases


@pytest.mark.parametrize("case", range(8))
@pytest.mark.absent(lambda device, case: case >= len(bad_relu_add_inputs(device)))
def test_relu_add_bad_inputs(device, case):
    cases = bad_relu_add_inputs(device)
    assert_bad_input_rejected([(lambda args=args: torch.ops.fused.relu_add(*args), message)
                               for _, args, message in cases], case)
    description, args, message = cases[case]
    if description != "device mismatch":  # the Meta kernel (torch.compile, export) agrees
        with pytest.raises(RuntimeError) as meta_error:
            torch.ops.fused.relu_add(*[a if a is None else a.to("meta") for a in args])
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


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("spec", OPS, ids=lambda spec: spec.name)
def test_a_tensor_argument_given_as_none_is_named(device, spec, requires_grad):
    """None for any tensor argument of any op: the op names the argument (one shared check,
    registration/checks.cpp), also when the other inputs need gradients. An op given no tensor at all
    (silu_mul(None)) cannot be dispatched: torch's dispatcher says so before any op code runs."""
    shapes = spec.input_shapes([4, 8])
    inputs = []
    for index, shape in enumerate(shapes):
        tensor = spec.special_input(index, shapes, torch.float32, device)
        if tensor is None:
            tensor = random(shape, torch.float32, device).requires_grad_(requires_grad and spec.takes_grad(index))
        inputs.append(tensor)
    arguments = spec.op._schema.arguments
    required = [index for index, argument in enumerate(arguments[:len(inputs)]) if str(argument.type) == "Tensor"]
    assert required
    for index in required:
        if len(inputs) == 1:
            with pytest.raises(NotImplementedError, match="There were no tensor arguments to this function"):
                spec.call([None])
            continue
        with pytest.raises(RuntimeError) as error:
            spec.call(inputs[:index] + [None] + inputs[index + 1:])
        assert (f"fused::{spec.name}: expected {arguments[index].name} to be a tensor, but got None (an undefined "
                "tensor)") in str(error.value)


def test_errors_with_gradients_name_the_op_called(device):
    """With inputs that need gradients the ops run internal ops (relu_add_with_mask,
    linear_cross_entropy_with_gradients); their errors name the op the user called."""
    x = torch.randn(4, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"^fused::relu_add: expected y to have the same dtype as x") as error:
        fused_ops.relu_add(x, torch.randn(4, device=device, dtype=torch.float64))
    assert "relu_add_with_mask" not in str(error.value)
    hidden = torch.randn(3, 8, device=device, requires_grad=True)
    weight = torch.randn(5, 8, device=device, requires_grad=True)
    for target, message in [(torch.zeros(2, dtype=torch.long, device=device),
                             r"^fused::linear_cross_entropy: expected target of input's leading shape \[3\]"),
                            (torch.tensor([0, 5, 1], device=device),
                             r"^fused::linear_cross_entropy: expected target values in \[0, 5\)")]:
        with pytest.raises(RuntimeError, match=message) as error:
            fused_ops.linear_cross_entropy(hidden, weight, target)
        assert "with_gradients" not in str(error.value)
