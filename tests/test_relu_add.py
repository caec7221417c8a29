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


LAYOUTS = ["transposed", "sliced", "unaligned", "expanded", "mixed", "broadcast"]


def strided_operands(layout, dtype, device):
    """x and y as views that the CUDA vector paths cannot take (the general, strided kernels)."""
    base_x, base_y = random((67, 130), dtype, device), random((67, 130), dtype, device)
    if layout == "transposed":
        return base_x.t(), base_y.t()
    if layout == "sliced":
        return base_x[::2, 1::3], base_y[::2, 2::3]
    if layout == "unaligned":  # storage offset of one element: data pointer not 16-byte aligned
        return base_x.view(-1)[1:4097], base_y.view(-1)[3:4099]
    if layout == "expanded":
        return base_x[:, :1].expand(67, 130), base_y
    if layout == "mixed":
        return base_x, base_y.t().contiguous().t()
    return base_x, base_y[0]  # broadcast: y of one row


@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_inputs(device, dtype, layout):
    x, y = strided_operands(layout, dtype, device)
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


def packed_bits(passes):
    """A bool tensor as relu_add_with_mask packs it: bit e % 8 of byte e / 8 for element e (C order)."""
    flat = passes.reshape(-1).to(device="cpu", dtype=torch.int64)
    flat = torch.cat([flat, flat.new_zeros((-flat.numel()) % 8)]).view(-1, 8)
    return (flat << torch.arange(8)).sum(1).to(torch.uint8)


def with_specials(x):
    """x with NaN, ±inf and ±0 spread through it, where the mask's rule (not x <= 0) matters."""
    flat = x.reshape(-1)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0], dtype=x.dtype, device=x.device)
    positions = torch.arange(0, flat.numel(), 7, device=x.device)
    flat[positions] = specials[torch.arange(positions.numel(), device=x.device) % 5]
    return x


# Sizes around the CUDA kernels' paths: whole blocks (4096, 16×2048), vector slots with a partial last
# vector and bytes (1, 3, 1023, 4097, 40003), several warps and grid-stride rounds (64×1029).
@pytest.mark.parametrize("shape", [(1,), (3,), (1023,), (4097,), (40003,), (4096,), (16, 2048), (64, 1029),
                                   (3, 5, 7)])
def test_with_mask_values_and_bits(device, dtype, shape):
    x, y = with_specials(random(shape, dtype, device)), random(shape, dtype, device)
    out, mask = torch.ops.fused.relu_add_with_mask(x, y, 0.25)
    assert mask.dtype == torch.uint8 and mask.shape == ((x.numel() + 7) // 8,) and mask.device == x.device
    torch.testing.assert_close(out, torch.ops.fused.relu_add(x, y, 0.25), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(mask.cpu(), packed_bits(~(x <= 0)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_with_mask_strided_inputs(device, dtype, layout):
    x, y = strided_operands(layout, dtype, device)
    out, mask = torch.ops.fused.relu_add_with_mask(x, y, 0.5)
    assert_close_to_reference(out, reference(x, y, 0.5), dtype)
    assert torch.equal(mask.cpu(), packed_bits(x > 0))


@pytest.mark.parametrize("shape", [(1,), (1023,), (4097,), (40003,), (16, 2048), (64, 1029)])
@pytest.mark.parametrize("grad_layout", ["contiguous", "transposed", "expanded", "unaligned"])
def test_backward_masked_matches_backward_of_x(device, dtype, shape, grad_layout):
    x = with_specials(random(shape, dtype, device))
    _, mask = torch.ops.fused.relu_add_with_mask(x, x, 0.0)
    if grad_layout == "contiguous":
        grad = random(shape, dtype, device)
    elif grad_layout == "transposed":
        grad = random(tuple(reversed(shape)), dtype, device).permute(*reversed(range(len(shape))))
    elif grad_layout == "expanded":  # what out.sum().backward() passes
        grad = random((), dtype, device).expand(shape)
    else:
        grad = random((x.numel() + 1,), dtype, device)[1:].view(shape)
    grad_x = torch.ops.fused.relu_add_backward_masked(grad, mask)
    assert grad_x.shape == x.shape and grad_x.dtype == dtype and grad_x.is_contiguous()
    expected = torch.where(~(x <= 0), grad, torch.zeros((), dtype=dtype, device=device))
    assert torch.equal(grad_x, expected)
    assert torch.equal(grad_x, torch.ops.fused.relu_add_backward(grad.contiguous(), x))


def test_autograd_saves_the_bits_not_x(device, dtype):
    x = random((33, 17), dtype, device).requires_grad_(True)
    y = random((17,), dtype, device).requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = torch.ops.fused.relu_add(x, y, 0.5)
    assert [(t.dtype, tuple(t.shape)) for t in saved] == [(torch.uint8, ((33 * 17 + 7) // 8,))]
    assert torch.equal(saved[0].cpu(), packed_bits(x > 0))
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        torch.ops.fused.relu_add(x.detach(), y, 0.5)  # only y needs a gradient: nothing to save
    assert saved == []
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad, (x > 0).to(dtype))


def test_with_mask_gradients_and_double_backward(device):
    x = torch.randn(6, 5, dtype=torch.float64, device=device)
    x = (x + 0.1 * x.sign()).requires_grad_(True)
    y = torch.randn(5, dtype=torch.float64, device=device, requires_grad=True)
    function = lambda a, b: torch.ops.fused.relu_add_with_mask(a, b, 0.7)[0]  # noqa: E731
    assert torch.autograd.gradcheck(function, (x, y))
    assert torch.autograd.gradgradcheck(function, (x, y))
    out, mask = torch.ops.fused.relu_add_with_mask(x, y, 0.7)
    assert not mask.requires_grad
    grad = torch.randn(6, 5, dtype=torch.float64, device=device, requires_grad=True)
    masked = lambda g: torch.ops.fused.relu_add_backward_masked(g, mask)  # noqa: E731
    assert torch.autograd.gradcheck(masked, (grad,))
    assert torch.autograd.gradgradcheck(masked, (grad,))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_of_the_mask_ops(device, dtype, requires_grad):
    x = random((9, 17), dtype, device).requires_grad_(requires_grad)
    y = random((17,), dtype, device).requires_grad_(requires_grad)
    opcheck(torch.ops.fused.relu_add_with_mask.default, (x, y, 0.5))
    _, mask = torch.ops.fused.relu_add_with_mask(x.detach(), y.detach())
    grad = random((9, 17), dtype, device).requires_grad_(requires_grad)
    opcheck(torch.ops.fused.relu_add_backward_masked.default, (grad, mask))
