"""Every Python example of README.md, extracted from the file and run on the CPU, so the examples cannot
drift from what the code does. Names an example takes from its surroundings (a policy model, a rollout's
advantages) and downloads (`from_pretrained`) are given tiny stand-ins."""
import os
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def python_examples():
    return re.findall(r"```python\n(.*?)```", open(README).read(), flags=re.S)


def tiny_causal_lm(*_, **kwargs):
    config = transformers.Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, vocab_size=1024, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).to(kwargs.get("dtype") or torch.float32)


def surroundings():
    """What the RL example takes from a training loop: a policy, its frozen reference, a batch and a rollout."""
    policy, reference = tiny_causal_lm(), tiny_causal_lm()
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1024, (2, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return dict(policy=policy, reference=reference, ids=ids, mask=mask,
                old_log_probs=-torch.rand(2, 11, generator=generator) * 5, advantages=torch.randn(2, 1, generator=generator),
                reward=lambda completions, **kwargs: [0.0] * len(completions), prompts=None)


class RecordingGRPOTrainer:
    """Stands in for TRL's GRPOTrainer in the TRL example: adds the head the trainer module adds (as TRL's
    __init__ does) to a tiny model, and trains nothing."""
    built = []

    def __init__(self, model, **kwargs):
        from trl.trainer import grpo_trainer
        self.model = tiny_causal_lm()
        grpo_trainer.add_fused_lm_head(self.model, temperature=1.0, outputs=("log_probs", "entropy"))
        RecordingGRPOTrainer.built.append(self)

    def train(self):
        pass


def test_readme_has_the_examples_it_promises():
    examples = python_examples()
    assert len(examples) >= 3
    assert any("fused_ops.fuse(" in e and "Trainer(" in e for e in examples)
    assert any("token_log_probs" in e for e in examples)
    assert any("trl_heads()" in e and "GRPOTrainer(" in e for e in examples)


@pytest.mark.parametrize("index", range(len(python_examples())))
def test_each_python_example_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", tiny_causal_lm)
    code = python_examples()[index]
    namespace = surroundings()
    if "GRPOTrainer(" in code:
        pytest.importorskip("trl")
        import trl
        monkeypatch.setattr(trl, "GRPOTrainer", RecordingGRPOTrainer)
        monkeypatch.setattr(trl, "GRPOConfig", dict)  # its bf16 default needs a GPU
    exec(compile(code, f"README.md example {index}", "exec"), namespace)
    if "fused_ops.fuse(" in code:
        assert "RMSNorm as one fused rms_norm kernel" in capsys.readouterr().out
        assert namespace["model"].fused_ops_report.counts()["lm_head_loss"] == 1
    if "token_log_probs" in code:
        assert torch.isfinite(namespace["loss"]) and namespace["policy"].lm_head.weight.grad is not None
    if "GRPOTrainer(" in code:  # the policy got this library's head and fuse()'s fusions
        model = RecordingGRPOTrainer.built[-1].model
        assert model.fused_ops_report.counts()["gated_mlp"] == 2
        ids = torch.randint(0, 1000, (2, 9))
        output = model(input_ids=ids, labels=ids, fused_lm_head=True)
        torch.testing.assert_close(output.log_probs, fused_ops_token_log_probs(model, ids))


def fused_ops_token_log_probs(model, ids):
    import fused_ops
    with torch.no_grad():
        return fused_ops.token_log_probs(model, ids)
