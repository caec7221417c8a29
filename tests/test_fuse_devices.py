"""fuse() and the GPU a model is on: where the CUDA kernels do not run (a build for other targets, or one
without CUDA kernels), nothing is swapped, the model computes what it did, and the report and warning say
why and how to rebuild; on the GPU in hand they run and fuse() swaps."""
import copy

import pytest
import torch

import fused_ops
from fused_ops.patching.swap import fused_kind

transformers = pytest.importorskip("transformers")

REASON = "the CUDA kernels, built for 10.0, do not run on a test GPU; rebuild fused_ops for it"


def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=101, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def test_a_gpu_the_kernels_do_not_run_on_leaves_every_module_alone(monkeypatch):
    stock = tiny_llama()
    candidates = len(fused_ops.fuse(copy.deepcopy(stock)).fused_ops_report.entries)
    monkeypatch.setattr(fused_ops.patching, "_why_the_kernels_do_not_run_on_its_gpus", lambda devices: REASON)
    model = copy.deepcopy(stock)
    with pytest.warns(UserWarning, match="do not run on a test GPU; rebuild fused_ops for it; LlamaForCausalLM "
                                         "returned unchanged"):
        assert fused_ops.fuse(model) is model
    assert not any(fused_kind(module) for module in model.modules())
    assert [type(module) for module in model.modules()] == [type(module) for module in stock.modules()]
    report = model.fused_ops_report
    assert len(report.entries) == candidates > 0 and not report.swapped
    assert {entry.detail for entry in report.entries} == {REASON}
    ids = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, stock(input_ids=ids).logits)


def test_only_the_model_gpus_are_asked(monkeypatch):
    """A model on the CPU asks about no GPU (so a CPU model is fused on a machine whose GPU the build lacks)."""
    asked = []
    monkeypatch.setattr(fused_ops.patching, "why_cuda_kernels_do_not_run_on", lambda index: asked.append(index))
    assert fused_ops.fuse(tiny_llama()).fused_ops_report.swapped
    assert asked == []


def test_asking_about_a_device_that_is_not_a_gpu_is_an_error():
    with pytest.raises(ValueError, match="why_cuda_kernels_do_not_run_on: expected a CUDA device, got cpu"):
        fused_ops.why_cuda_kernels_do_not_run_on("cpu")


@pytest.mark.cuda_only
def test_the_kernels_run_on_the_gpu_in_hand_and_fuse_swaps_there():
    assert fused_ops.cuda_kernels_run_on("cuda") and fused_ops.cuda_kernels_run_on(0)
    assert fused_ops.why_cuda_kernels_do_not_run_on(torch.device("cuda", 0)) is None
    model = fused_ops.fuse(tiny_llama().cuda())
    assert model.fused_ops_report.swapped and any(fused_kind(module) for module in model.modules())


@pytest.mark.cuda_only
def test_why_not_names_the_gpu_the_targets_and_the_rebuild(monkeypatch):
    major, minor = torch.cuda.get_device_capability(0)
    why_not = fused_ops._why_kernels_do_not_run_on_index
    rebuild = f"TORCH_CUDA_ARCH_LIST={major}.{minor} scripts/setup.sh"
    try:
        why_not.cache_clear()
        monkeypatch.setattr(fused_ops, "cuda_kernels_compiled", lambda: False)
        reason = fused_ops.why_cuda_kernels_do_not_run_on(0)
        assert "this build of fused_ops has no CUDA kernels" in reason and f"compute capability {major}.{minor}" in reason
        assert rebuild in reason
        monkeypatch.undo()

        why_not.cache_clear()

        def no_kernel_image(*args):
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device\nmore")
        monkeypatch.setattr(torch.ops.fused, "relu_add", no_kernel_image)
        reason = fused_ops.why_cuda_kernels_do_not_run_on(0)
        assert f"built for {' '.join(fused_ops.cuda_arch_list())}" in reason
        assert ": CUDA error: no kernel image is available for execution on the device; " in reason and rebuild in reason
        assert not fused_ops.cuda_kernels_run_on(0)
        with pytest.warns(UserWarning, match="no kernel image is available"):
            model = fused_ops.fuse(tiny_llama().cuda())
        assert not model.fused_ops_report.swapped
    finally:
        monkeypatch.undo()
        why_not.cache_clear()
    assert fused_ops.cuda_kernels_run_on(0)
