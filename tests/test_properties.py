"""Property tests: random shapes (0-d to 5-d, sizes 0 to thousands), dtypes, strides, storage
offsets, broadcasting and option values, forward and backward against a float64 reference.

Seeded and bounded: FUSED_OPS_HYPOTHESIS_EXAMPLES examples per op and device (default 300;
scripts/gpu_check.sh raises it on the GPU)."""
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEVICES, DTYPES, TOLERANCE
from op_specs import OPS, as_outputs, strided

EXAMPLES = int(os.environ.get("FUSED_OPS_HYPOTHESIS_EXAMPLES", "300"))
MAX_ELEMENTS = 12000
LAYOUTS = ["contiguous", "offset", "stepped", "transposed"]


@st.composite
def cases(draw, spec):
    dims = draw(st.integers(spec.min_dims, 5))
    leading = draw(st.lists(st.integers(0, 6), min_size=max(dims - 1, 0), max_size=max(dims - 1, 0)))
    last = [draw(st.one_of(st.integers(0, 9), st.integers(10, 3000)))] if dims else []
    shape = leading + last
    numel = math.prod(shape)
    if numel > MAX_ELEMENTS:  # shrink the last dim to keep the example small
        shape[-1] = max(1, MAX_ELEMENTS // max(1, math.prod(shape[:-1])))
    input_shapes = spec.input_shapes(shape)
    for index in spec.broadcasts:  # drop leading dims and set others to 1
        dropped = draw(st.integers(0, len(input_shapes[index])))
        kept = input_shapes[index][dropped:]
        input_shapes[index] = [1 if draw(st.booleans()) else size for size in kept]
    options = {}
    for name, values in spec.options.items():
        options[name] = draw(st.floats(*values, allow_nan=False) if isinstance(values, tuple)
                             else st.sampled_from(values))
    return {
        "shapes": input_shapes,
        "layouts": [draw(st.sampled_from(LAYOUTS)) for _ in input_shapes],
        "dtype": draw(st.sampled_from(DTYPES)),
        "options": options,
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def check_case(spec, device, case):
    dtype = case["dtype"]
    generator = torch.Generator().manual_seed(case["seed"])
    inputs = []
    for index, (shape, layout) in enumerate(zip(case["shapes"], case["layouts"])):
        tensor = spec.special_input(index, case["shapes"], dtype, device, generator)
        tensor = strided(shape, dtype, device, layout, generator) if tensor is None else tensor
        inputs.append(tensor.requires_grad_(spec.takes_grad(index)))
    outs = as_outputs(spec.call(inputs, **case["options"]))
    inputs64 = [t.detach().double().requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in inputs]
    expected = as_outputs(spec.reference(*inputs64, **case["options"]))
    tolerance = TOLERANCE[dtype] * 4
    value_tolerance = tolerance * spec.value_scale(inputs64, **case["options"])
    for out, want in zip(outs, expected, strict=True):
        assert out.shape == want.shape and out.dtype == spec.output_dtype(dtype)
        torch.testing.assert_close(out.double(), want, rtol=tolerance, atol=value_tolerance, equal_nan=True)

    grad_outs = [torch.randn(out.shape, generator=generator).to(dtype=out.dtype, device=device) for out in outs]
    leaves = [t for t in inputs if t.requires_grad]
    leaves64 = [t for t in inputs64 if t.requires_grad]
    grads = torch.autograd.grad(outs, leaves, grad_outs, allow_unused=True)
    expected_grads = torch.autograd.grad(expected, leaves64, [g.double() for g in grad_outs], allow_unused=True)
    conditioning = spec.gradient_scale(inputs64, **case["options"])
    for grad, want, tensor in zip(grads, expected_grads, leaves):
        if want is None:
            continue
        assert grad is not None and grad.shape == tensor.shape and grad.dtype == tensor.dtype
        # Gradients of broadcast inputs are sums; rounding grows with the number of terms.
        terms = max(1, outs[0].numel() // max(1, tensor.numel()))
        scale = tolerance * math.sqrt(terms)
        torch.testing.assert_close(grad.double(), want, rtol=scale, atol=scale * conditioning, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", OPS, ids=[spec.name for spec in OPS])
def test_matches_reference_on_random_inputs(spec, device):
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases(spec))
    def run(case):
        check_case(spec, device, case)

    run()
