"""TRL's GRPOTrainer and RLOOTrainer with this library's head (fused_ops.rl.trl_heads) in place of TRL's
chunked one, and fuse()'s layer fusions on the policy and the reference model: two steps on a tiny model match
stock TRL's losses, gradients and parameters."""
import pytest
import torch

import fused_ops
import fused_ops.rl

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
import hf_families  # noqa: E402

VOCAB = 64


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0", pad_token=f"w{VOCAB - 1}",
                                                eos_token=f"w{VOCAB - 2}")


def even_tokens(completions, completion_ids, **kwargs):
    """A reward that tells completions apart: the share of even token ids."""
    return [sum(1 for token in ids if token % 2 == 0) / max(1, len(ids)) for ids in completion_ids]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny Qwen3 and its tokenizer saved where TRL loads the policy and the reference model from."""
    path = tmp_path_factory.mktemp("tiny_qwen3")
    config = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=64, pad_token_id=VOCAB - 1, eos_token_id=VOCAB - 2,
                                      bos_token_id=None)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    word_tokenizer().save_pretrained(path)
    return str(path)


class GradientRecorder(transformers.TrainerCallback):
    """Each step's gradients, as the optimizer is about to take them."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None})


def train(trainer_name, saved_model, output_dir, ours):
    """Two steps. Plain SGD: AdamW's first step moves a weight whose gradient is rounding noise by the whole
    learning rate, where the two heads' last bits differ."""
    prompts = [" ".join(f"w{(7 * row + 3 * i) % (VOCAB - 2)}" for i in range(5)) for row in range(8)]
    data = datasets.Dataset.from_dict({"prompt": prompts})
    config_class, trainer_class = ((trl.GRPOConfig, trl.GRPOTrainer) if trainer_name == "grpo"
                                   else (trl.RLOOConfig, trl.RLOOTrainer))
    config = config_class(output_dir=output_dir, report_to="none", per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=6, max_steps=2, logging_steps=1, beta=0.04, bf16=False, seed=0,
                          temperature=0.9, learning_rate=0.1, optim="sgd", save_strategy="no", use_cpu=True)
    build = lambda: trainer_class(model=saved_model, reward_funcs=even_tokens, args=config, train_dataset=data,  # noqa: E731
                                  processing_class=word_tokenizer())
    if ours:
        with fused_ops.rl.trl_heads():
            trainer = build()
    else:
        trainer = build()
    recorder = GradientRecorder()
    trainer.add_callback(recorder)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer, losses, recorder.steps


@pytest.mark.parametrize("trainer_name", ["grpo", "rloo"])
def test_two_steps_match_stock_trl(trainer_name, saved_model, tmp_path, monkeypatch):
    calls = []
    op = fused_ops.rl._ops.linear_log_probs
    monkeypatch.setattr(fused_ops.rl._ops, "linear_log_probs", lambda *a, **k: calls.append(1) or op(*a, **k))
    stock, want, want_gradients = train(trainer_name, saved_model, str(tmp_path / "stock"), ours=False)
    calls.clear()
    fused, got, gradients = train(trainer_name, saved_model, str(tmp_path / "fused"), ours=True)
    assert calls, "the trainer did not run linear_log_probs"
    for model in (fused.model, fused.ref_model):
        assert model is not None and model.fused_ops_report.counts()["gated_mlp"] == 2
    assert len(got) == len(want) == 2
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    assert len(gradients) == len(want_gradients) == 2
    for step, (grads, want_grads) in enumerate(zip(gradients, want_gradients)):
        assert grads.keys() == want_grads.keys() and len(grads) > 0
        for name, grad in grads.items():
            largest = want_grads[name].abs().max().item()
            torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=1e-6 + 1e-4 * largest,
                                       msg=lambda message: f"step {step}, {name}: {message}")
    stock_parameters = dict(stock.model.named_parameters())
    for name, parameter in fused.model.named_parameters():
        torch.testing.assert_close(parameter, stock_parameters[name], rtol=1e-4, atol=1e-6,
                                   msg=lambda message: f"{name}: {message}")


def test_the_trainer_modules_are_restored_after_the_block():
    from trl.trainer import grpo_trainer, rloo_trainer
    before = grpo_trainer.add_fused_lm_head, rloo_trainer.add_fused_lm_head
    with fused_ops.rl.trl_heads():
        assert grpo_trainer.add_fused_lm_head is not before[0]
    assert (grpo_trainer.add_fused_lm_head, rloo_trainer.add_fused_lm_head) == before


def test_statistics_only_trl_computes_fall_back_to_its_head_with_a_warning():
    model = hf_families.build("llama")
    with pytest.warns(UserWarning, match="TRL's own fused head is used .* computed by TRL's head only"):
        fused_ops.rl.add_fused_lm_head(model, outputs=("log_probs", "is_top1"))
    ids = hf_families.batch(model)
    output = model(input_ids=ids, labels=ids, fused_lm_head=True)
    assert output.is_top1 is not None
