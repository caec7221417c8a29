"""relu_add on every dtype and device: values, layouts, broadcasting, gradients, errors."""
import pytest
import torch
from torch.library import opcheck

import fused_ops
from conftest import assert_close_to_reference


def reference(x, y, bias):
    return torch.relu(x.double()) + y.double() + bias


def random(shape, dtype, device):
    return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)


# (4096,) and (16, 2048): whole blocks of 16-byte vectors cover them exactly in every dtype (on CUDA
# the kernel without loop or bounds check).
@pytest.mark.parametrize("shape", [(1,), (3,), (1023,), (4097,), (3, 5, 7), (64, 129), (2, 3, 4, 5, 6),
                                   (4096,), (16, 2048)])
def test_values(device, dtype, shape):
    x, y = random(shape, dtype, device), random(shape, dtype, device)
    out = torch.ops.fused.relu_add(x, y, 0.25)
    assert out.dtype == dtype and out.device == x.device and out.shape == x.shape
    assert_close_to_reference(out, reference(x, y, 0.25), dtype)


def test_default_bias_and_wrapper(device, dtype):
    x, y = random((37,), dtype, device), random((37,), dtype, device)
    assert_close_to_reference(torch.ops.fused.relu_add(x, y), reference(x, y, 0.0), dtype)
    assert_close_to_reference(fused_ops.relu_add(x, y, bias=-1.5), reference(x, y, -1.5), dtype)
    module = fused_ops.nn.ReLUAdd(bias=2.0)
    assert_close_to_reference(module(x, y), reference(x, y, 2.0), dtype)


def test_empty_and_zero_dim(device, dtype):
    empty = torch.empty((0, 4), dtype=dtype, device=device)
    assert torch.ops.fused.relu_add(empty, empty, 1.0).shape == (0, 4)
    assert torch.ops.fused.relu_add(empty, random((4,), dtype, device)).shape == (0, 4)
    x, y = random((), dtype, device), random((), dtype, device)
    out = torch.ops.fused.relu_add(x, y, 0.5)
    assert out.shape == ()
    assert_close_to_reference(out, reference(x, y, 0.5), dtype)


@pytest.mark.parametrize("layout", ["transposed", "sliced", "unaligned", "expanded", "mixed"])
def test_strided_inputs(device, dtype, layout):
    base_x, base_y = random((67, 130), dtype, device), random((67, 130), dtype, device)
    if layout == "transposed":
        x, y = base_x.t(), base_y.t()
    elif layout == "sliced":
        x, y = base_x[::2, 1::3], base_y[::2, 2::3]
    elif layout == "unaligned":  # storage offset of one element: data pointer not 16-byte aligned
        x, y = base_x.view(-1)[1:4097], base_y.view(-1)[3:4099]
    elif layout == "expanded":
        x, y = base_x[:, :1].expand(67, 130), base_y
    else:
        x, y = base_x, base_y.t().contiguous().t()
    out = torch.ops.fused.relu_add(x, y, 0.5)
    assert out.is_contiguous()
    assert_close_to_reference(out, reference(x, y, 0.5), dtype)


@pytest.mark.parametrize("x_shape,y_shape", [
    ((16, 33), (33,)), ((16, 33), (1, 33)), ((16, 33), (16, 1)), ((16, 33), ()),
    ((4, 5, 6), (5, 1)), ((4, 5, 6), (4, 1, 6)), ((7, 9), (1,)),
])
def test_broadcasting(device, dtype, x_shape, y_shape):
    x, y = random(x_shape, dtype, device), random(y_shape, dtype, device)
    out = torch.ops.fused.relu_add(x, y, -0.5)
    assert out.shape == x.shape
    assert_close_to_reference(out, reference(x, y, -0.5), dtype)


def test_nan_and_inf_follow_eager(device, dtype):
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -1.0])
    x = specials.repeat_interleave(7).to(dtype=dtype, device=device)
    y = specials.repeat(7).to(dtype=dtype, device=device)
    out = torch.ops.fused.relu_add(x, y, 0.0)
    eager = torch.relu(x.double()) + y.double()
    torch.testing.assert_close(out.double(), eager, equal_nan=True, rtol=0, atol=0)
    x.requires_grad_(True)
    grad = torch.ops.fused.relu_add(x, y.detach()).sum()
    (grad_x,) = torch.autograd.grad(grad, x)
    eager_x = x.detach().double().requires_grad_(True)
    (eager_grad_x,) = torch.autograd.grad((torch.relu(eager_x) + y.double()).sum(), eager_x)
    torch.testing.assert_close(grad_x.double(), eager_grad_x, rtol=0, atol=0)


@pytest.mark.parametrize("x_shape,y_shape", [((33, 17), (33, 17)), ((33, 17), (17,)), ((5, 4, 3), (4, 1)),
                                             ((8, 2048), (8, 2048))])
def test_gradients(device, dtype, x_shape, y_shape):
    x = random(x_shape, dtype, device).requires_grad_(True)
    y = random(y_shape, dtype, device).requires_grad_(True)
    grad_out = random(x_shape, dtype, device)
    out = torch.ops.fused.relu_add(x, y, 0.3)
    grad_x, grad_y = torch.autograd.grad(out, (x, y), grad_out)
    assert grad_x.dtype == dtype and grad_y.shape == y.shape
    x64 = x.detach().double().requires_grad_(True)
    y64 = y.detach().double().requires_grad_(True)
    ref_x, ref_y = torch.autograd.grad(reference(x64, y64, 0.3), (x64, y64), grad_out.double())
    assert_close_to_reference(grad_x, ref_x, dtype)
    # grad_y sums grad_out over the broadcast dims in the input dtype, as eager does.
    assert_close_to_reference(grad_y, ref_y, dtype, scale=4.0)


def test_gradient_of_one_input_only(device):
    x = torch.randn(8, 8, device=device, requires_grad=True)
    y = torch.randn(8, device=device)
    (grad_x,) = torch.autograd.grad(torch.ops.fused.relu_add(x, y).sum(), x)
    assert torch.equal(grad_x, (x > 0).float())
    x = torch.randn(8, 8, device=device)
    y.requires_grad_(True)
    (grad_y,) = torch.autograd.grad(torch.ops.fused.relu_add(x, y).sum(), y)
    assert torch.equal(grad_y, torch.full((8,), 8.0, device=device))


def test_gradcheck_and_gradgradcheck(device):
    # Keep x away from 0, where relu has no derivative for finite differences to find.
    x = torch.randn(6, 5, dtype=torch.float64, device=device)
    x = (x + 0.1 * x.sign()).requires_grad_(True)
    y = torch.randn(5, dtype=torch.float64, device=device, requires_grad=True)
    function = lambda a, b: torch.ops.fused.relu_add(a, b, 0.7)  # noqa: E731
    assert torch.autograd.gradcheck(function, (x, y))
    assert torch.autograd.gradgradcheck(function, (x, y))
    grad = torch.randn(6, 5, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.fused.relu_add_backward, (grad, x))
    assert torch.autograd.gradgradcheck(torch.ops.fused.relu_add_backward, (grad, x))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(device, dtype, requires_grad):
    x = random((9, 17), dtype, device).requires_grad_(requires_grad)
    y = random((17,), dtype, device).requires_grad_(requires_grad)
    opcheck(torch.ops.fused.relu_add.default, (x, y, 0.5))
    opcheck(torch.ops.fused.relu_add.default, (x, y))
    grad = random((9, 17), dtype, device).requires_grad_(requires_grad)
    opcheck(torch.ops.fused.relu_add_backward.default, (grad, x.detach()))


def test_inputs_are_not_mutated(device):
    x, y = torch.randn(100, device=device), torch.randn(100, device=device)
    x_copy, y_copy = x.clone(), y.clone()
    torch.ops.fused.relu_add(x, y, 1.0)
    assert torch.equal(x, x_copy) and torch.equal(y, y_copy)
