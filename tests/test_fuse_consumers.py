"""fuse() as the tools that wrap and inspect a model see it: the stock forward's signature, docstring and name;
transformers' Trainer with default arguments, TRL's SFTTrainer and accelerate's prepare, each with the stock
numbers; every keyword the stock head + loss honours; and a report in a user's words that warns of a failed
probe once, whole."""
import copy
import functools
import inspect
import warnings

import pytest
import torch

import fused_ops

transformers = pytest.importorskip("transformers")
import hf_families  # noqa: E402
from hf_families import assert_gradients_match_stock, fused_op_calls  # noqa: E402

LOSS_OPS = ("linear_cross_entropy", "linear_cross_entropy_with_gradients")


@functools.lru_cache(maxsize=None)
def _stock_and_fused(model_type):
    stock = hf_families.build(model_type)
    config = stock.config.get_text_config()
    if len(getattr(config, "layer_types", None) or ()) > config.num_hidden_layers:  # as save_pretrained checks
        config.layer_types = config.layer_types[:config.num_hidden_layers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = fused_ops.fuse(copy.deepcopy(stock))
    return stock, fused


def stock_and_fused(model_type):
    """Fresh copies of a tiny stock model of `model_type` and of it fused (fused once per process)."""
    stock, fused = _stock_and_fused(model_type)
    return copy.deepcopy(stock), copy.deepcopy(fused)


def test_fused_forwards_keep_the_stock_signature_docstring_and_name():
    stock, fused = stock_and_fused("llama")
    for (name, want), got in zip(stock.named_modules(), fused.modules()):
        if type(got) is type(want):
            continue
        assert inspect.signature(got.forward) == inspect.signature(want.forward), name
        assert type(got).forward.__doc__ == type(want).forward.__doc__, name
        assert type(got).forward.__name__ == "forward", name
    assert transformers.utils.find_labels(type(fused)) == ["labels"]
    assert fused.main_input_name == stock.main_input_name == "input_ids"
    ids = hf_families.batch(stock)[:, :4]
    for model in (stock, fused):
        model.eval()
    want = stock.generate(ids, max_new_tokens=3, do_sample=False)
    torch.testing.assert_close(fused.generate(ids, max_new_tokens=3, do_sample=False), want)
    with pytest.raises(ValueError, match="not used by the model"):
        fused.generate(ids, max_new_tokens=1, not_a_model_argument=1)


class _Examples(torch.utils.data.Dataset):
    """Token ids and labels, and a column the model does not take (Trainer must drop it)."""

    def __init__(self, vocab, count=16, length=12, seed=3):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        labels = self.ids[index].clone()
        labels[:2] = -100
        return {"input_ids": self.ids[index], "labels": labels, "example_id": index}


def _train_evaluate_predict(model, data, output_dir):
    trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(output_dir=str(output_dir)),
                                   train_dataset=data, eval_dataset=data)
    calls = fused_op_calls(trainer.train)
    training_loss = trainer.state.log_history[-1]["train_loss"]
    metrics = trainer.evaluate()
    predictions = trainer.predict(data).predictions
    logits = predictions[0] if isinstance(predictions, tuple) else predictions
    return calls, training_loss, metrics, torch.as_tensor(logits)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text", "qwen3_moe", "gpt_oss"])
def test_trainer_with_default_arguments_trains_evaluates_and_predicts_as_stock(model_type, tmp_path):
    """Trainer keeps the columns the stock forward takes (and drops the others), finds the labels, and gives
    the stock training loss, parameters, eval_loss and logits; the fused head + loss ran in training."""
    stock, fused = stock_and_fused(model_type)
    data = _Examples(hf_families.batch(stock).max().item() + 1)
    _, want_loss, want_metrics, want_logits = _train_evaluate_predict(stock, data, tmp_path / "stock")
    calls, got_loss, got_metrics, got_logits = _train_evaluate_predict(fused, data, tmp_path / "fused")
    assert any(calls.get(op) for op in LOSS_OPS), calls
    assert model_type != "gpt_oss" or calls.get("attention_with_sinks"), calls
    assert got_loss == pytest.approx(want_loss, rel=1e-4)
    assert "eval_loss" in got_metrics and got_metrics["eval_loss"] == pytest.approx(want_metrics["eval_loss"], rel=1e-4)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)
    stock_parameters = dict(stock.named_parameters())
    for name, parameter in fused.named_parameters():
        torch.testing.assert_close(parameter, stock_parameters[name], rtol=1e-3, atol=1e-6, msg=name)


def _word_tokenizer(vocab):
    from tokenizers import Tokenizer, models
    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="w0"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="w0", pad_token=f"w{vocab - 1}",
                                                eos_token=f"w{vocab - 2}")


def test_trl_sft_trainer_trains_a_fused_model_as_stock(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    stock, fused = stock_and_fused("llama")
    vocab = stock.config.vocab_size
    generator = torch.Generator().manual_seed(5)
    rows = torch.randint(0, vocab - 2, (16, 12), generator=generator).tolist()
    data = datasets.Dataset.from_dict({"input_ids": rows})
    results = []
    for model, name in ((stock, "stock"), (fused, "fused")):
        config = trl.SFTConfig(output_dir=str(tmp_path / name), report_to="none", num_train_epochs=1,
                               per_device_train_batch_size=4, logging_steps=1, max_length=None, bf16=False)
        trainer = trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=_word_tokenizer(vocab))
        trainer.train()
        results.append([entry["loss"] for entry in trainer.state.log_history if "loss" in entry])
    want, got = results
    assert len(got) == len(want) == 4
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    stock_parameters = dict(stock.named_parameters())
    for name, parameter in fused.named_parameters():
        torch.testing.assert_close(parameter, stock_parameters[name], rtol=1e-3, atol=1e-6, msg=name)


def test_accelerate_prepare_after_fuse():
    accelerate = pytest.importorskip("accelerate")
    stock, fused = stock_and_fused("qwen3")
    prepared = [accelerate.Accelerator(cpu=True).prepare(model) for model in (stock, fused)]
    assert inspect.signature(prepared[1].forward) == inspect.signature(prepared[0].forward)
    ids = hf_families.batch(stock)
    want, got = (model(input_ids=ids, labels=ids) for model in prepared)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-4, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    assert_gradients_match_stock(fused, stock, rtol=1e-3, atol=1e-6)


def _same_step(stock, fused, fused_loss_runs, *args, **kwargs):
    """The stock model's output (loss, or its absence, and a tuple's structure) and gradients, and whether the
    fused head + loss ran."""
    outputs = []
    for model in (stock, fused):
        model.zero_grad(set_to_none=True)
        outputs.append(model(*args, **kwargs))
    want, got = outputs
    want_loss = want[0] if isinstance(want, tuple) else want.loss
    got_loss = got[0] if isinstance(got, tuple) else got.loss
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)  # the logits, in their place
    if want_loss is None or (isinstance(want, tuple) and want_loss.dim() > 0):
        assert got_loss is None or (isinstance(want, tuple) and got_loss.dim() > 0)
        return
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-6)
    want_loss.backward()
    got_loss.backward()
    assert_gradients_match_stock(fused, stock, rtol=1e-3, atol=1e-6)
    calls = fused_op_calls(lambda: fused(*args, **kwargs))
    assert any(calls.get(op) for op in LOSS_OPS) == fused_loss_runs, calls


def test_every_loss_keyword_of_the_stock_head_is_honoured():
    stock, fused = stock_and_fused("llama")
    ids = hf_families.batch(stock)
    labels = ids.clone()
    labels[0, :3] = -1
    _same_step(stock, fused, True, input_ids=ids, labels=labels, ignore_index=-1)
    _same_step(stock, fused, True, input_ids=ids, labels=ids, ignore_index=int(ids[1, 4]))
    _same_step(stock, fused, True, input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(11))
    shifted = torch.roll(ids, 1, dims=1)
    _same_step(stock, fused, True, input_ids=ids, labels=ids, shift_labels=shifted)
    _same_step(stock, fused, False, input_ids=ids, shift_labels=shifted)  # no labels: no loss in either
    _same_step(stock, fused, True, input_ids=ids, labels=ids, logits_to_keep=ids.shape[1])
    _same_step(stock, fused, False, input_ids=ids, labels=ids, return_dict=False)  # (loss, logits, ...)


def _smoothed_loss(logits, labels, vocab_size, **kwargs):
    logits = logits[:, :-1].reshape(-1, vocab_size).float()
    return torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1), label_smoothing=0.1)


def test_a_loss_function_or_type_set_after_fuse_is_the_one_used():
    stock, fused = stock_and_fused("llama")
    ids = hf_families.batch(stock)
    for model in (stock, fused):
        model.loss_function = _smoothed_loss
    _same_step(stock, fused, False, input_ids=ids, labels=ids)
    stock, fused = stock_and_fused("llama")
    for model in (stock, fused):
        model.loss_type = "ForMaskedLM"
    _same_step(stock, fused, False, input_ids=ids, labels=ids)


def test_torch_rms_norm_with_its_default_epsilon_is_fused():
    torch.manual_seed(0)
    stock = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.RMSNorm(32))
    fused = fused_ops.fuse(copy.deepcopy(stock))
    (entry,) = [e for e in fused.fused_ops_report.entries if e.kind == "norm"]
    assert entry.swapped, fused.fused_ops_report
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        x = torch.randn(5, 24, dtype=dtype) * 1e-3  # near the epsilon, where it shows
        want, got = stock.to(dtype)(x), fused.to(dtype)(x)
        calls = fused_op_calls(lambda: fused(x))
        assert calls.get("rms_norm") == 1, calls
        torch.testing.assert_close(got, want, rtol=1e-5 if dtype != torch.bfloat16 else 1e-2, atol=1e-6)
    for model in (stock, fused):
        model[1].eps = 0.5  # an epsilon set after fuse(): the stock forward's to use
    x = torch.randn(5, 24, dtype=torch.bfloat16)
    assert not fused_op_calls(lambda: fused(x))
    torch.testing.assert_close(fused(x), stock(x))


def test_a_failing_probe_is_one_whole_warning_and_the_report_speaks_plainly(monkeypatch, capsys):
    stock = hf_families.build("llama")
    monkeypatch.setenv("FUSED_OPS_LOGITS_CHUNK_MB", "512MB")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = fused_ops.fuse(copy.deepcopy(stock), verbose=True)
    messages = [str(w.message) for w in caught if "FUSED_OPS_LOGITS_CHUNK_MB" in str(w.message)]
    assert len(messages) == 1 and "512MB" in messages[0], [str(w.message) for w in caught]
    (head,) = [e for e in fused.fused_ops_report.entries if e.kind == "lm_head_loss"]
    assert not head.swapped and head.summary.count("FUSED_OPS_LOGITS_CHUNK_MB") == 1, head.summary
    printed = capsys.readouterr().out
    assert "kwargs_to_base" not in printed and "RMSNorm as one fused rms_norm kernel" in printed, printed
    assert "kwargs_to_base" in fused.fused_ops_report.details()
    monkeypatch.delenv("FUSED_OPS_LOGITS_CHUNK_MB")
    ids = hf_families.batch(stock)
    torch.testing.assert_close(fused(input_ids=ids, labels=ids).loss, stock(input_ids=ids, labels=ids).loss)
