"""relu_add through TorchScript, torch.compile and torch.export."""
import warnings

import pytest
import torch

import fused_ops
from conftest import assert_same_gradients


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.relu_add = fused_ops.nn.ReLUAdd(bias=0.5)

    def forward(self, x, y):
        return self.relu_add(x, y) * 2.0


def composite(x, y):
    return (torch.relu(x) + y + 0.5) * 2.0


def inputs(device, requires_grad=False):
    x = torch.randn(8, 16, device=device, requires_grad=requires_grad)
    y = torch.randn(16, device=device, requires_grad=requires_grad)
    return x, y


def jit(kind, model, example):
    with warnings.catch_warnings():  # TorchScript is deprecated upstream from torch 2.11
        warnings.simplefilter("ignore")
        return torch.jit.script(model) if kind == "script" else torch.jit.trace(model, example)


@pytest.mark.parametrize("kind", ["script", "trace"])
def test_torchscript_save_load_with_backward(device, kind, tmp_path):
    x, y = inputs(device)
    scripted = jit(kind, Model(), (x, y))
    path = tmp_path / f"{kind}.pt"
    scripted.save(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.jit.load(str(path), map_location=device)
    assert "fused::relu_add" in str(loaded.graph) or "fused::relu_add" in str(loaded.inlined_graph)
    x.requires_grad_(True)
    y.requires_grad_(True)
    out = loaded(x, y)
    torch.testing.assert_close(out, composite(x, y))
    assert_same_gradients(out, composite(x, y), (x, y))


def test_scripted_function():
    @torch.jit.script
    def scripted(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.fused.relu_add(x, y, 1.0) + torch.ops.fused.relu_add(y, x)

    x, y = torch.randn(10), torch.randn(10)
    expected = torch.relu(x) + y + 1.0 + torch.relu(y) + x
    torch.testing.assert_close(scripted(x, y), expected)


def test_compile_fullgraph_dynamic_forward_and_backward(device):
    torch._dynamo.reset()
    compiled = torch.compile(Model(), fullgraph=True, dynamic=True)
    for rows in (8, 13):  # a second shape reuses the dynamic graph
        x = torch.randn(rows, 16, device=device, requires_grad=True)
        y = torch.randn(16, device=device, requires_grad=True)
        out = compiled(x, y)
        torch.testing.assert_close(out, composite(x, y))
        assert_same_gradients(out, composite(x, y), (x, y))


def test_compiled_training_graphs_save_the_bits(device):
    """AOTAutograd traces the C++ autograd kernel: the forward graph runs relu_add_with_mask, the
    backward relu_add_backward_masked, and what passes between them is the uint8 mask, not x."""
    torch._dynamo.reset()
    graphs = {}

    def capture(name):
        def compiler(graph_module, example_inputs):
            graphs[name] = graph_module
            return graph_module.forward
        return compiler

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def boxed(name):
        return lambda graph_module, example_inputs: make_boxed_func(capture(name)(graph_module, example_inputs))

    backend = aot_autograd(fw_compiler=boxed("forward"), bw_compiler=boxed("backward"))
    compiled = torch.compile(Model(), backend=backend, fullgraph=True)
    x, y = inputs(device, requires_grad=True)
    out = compiled(x, y)
    assert_same_gradients(out, composite(x, y), (x, y))
    forward_targets = [node.target for node in graphs["forward"].graph.nodes if node.op == "call_function"]
    backward_targets = [node.target for node in graphs["backward"].graph.nodes if node.op == "call_function"]
    assert torch.ops.fused.relu_add_with_mask.default in forward_targets
    assert torch.ops.fused.relu_add_backward_masked.default in backward_targets
    saved = [node for node in graphs["backward"].graph.nodes if node.op == "placeholder"]
    saved_dtypes = sorted(str(node.meta["val"].dtype) for node in saved if "tangents" not in node.name)
    assert saved_dtypes == ["torch.uint8"]


def test_export_keeps_one_node(device):
    x, y = inputs(device)
    batch = torch.export.Dim("batch")
    exported = torch.export.export(Model(), (x, y), dynamic_shapes=({0: batch}, None))
    targets = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert targets.count(torch.ops.fused.relu_add.default) == 1
    x2 = torch.randn(5, 16, device=device)
    torch.testing.assert_close(exported.module()(x2, y), composite(x2, y))
