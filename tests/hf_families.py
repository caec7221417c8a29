"""Tiny random-init Hugging Face causal LMs of every family transformers ships, for the fuse() tests.

Every model type of transformers' causal-LM mapping is built from its default config shrunk to a few
dozen units wide and two layers deep; nothing is downloaded. A family whose tiny model cannot be built
or cannot run a forward with labels is not a model fuse() can be tested on, and says why.
"""
import functools
import warnings

import torch

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=64, head_dim=16, moe_intermediate_size=32, projector_hidden_size=64,
            num_local_experts=4, num_experts=4, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
            sliding_window=16,
            # the same sizes under other families' names
            n_embd=64, n_layer=2, n_head=4, n_inner=96, n_positions=64, d_model=64, num_layers=2, ffn_dim=96,
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=96, decoder_ffn_dim=96, num_heads=4, d_ff=96, d_kv=16,
            # state-space layers of hybrid families
            mamba_d_state=16, mamba_n_heads=4, mamba_d_head=16, mamba_chunk_size=16, mamba_d_ssm=64,
            mamba_n_groups=1, chunk_size=16, state_size=16, ssm_state_size=16, n_groups=1, time_step_rank=8,
            # per-layer token embeddings (Gemma 3n, Gemma 4)
            hidden_size_per_layer_input=16, vocab_size_per_layer_input=128)
MAX_PARAMETERS = 8_000_000
# An image-text model's vision tower (and other towers beside its language model), under its families' names.
TINY_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                   patch_size=8, embed_dim=32, depth=1, num_heads=2, out_hidden_size=64, num_key_value_heads=2,
                   head_dim=16)
# An audio tower's sizes, under its families' names.
TINY_AUDIO = dict(d_model=32, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, output_dim=64)
# The top ids of the vocabulary, which a batch does not draw: the image and video placeholders'.
RESERVED_IDS = 8
# Families whose tiny model takes a minute a forward on the CPU (Python loops of linear attention):
# tested with the slow tests.
SLOW = {"kimi_linear"}
# Families whose default config needs more than TINY to build small: GPT-J's rotary dim within the head;
# multi-head latent attention's (DeepSeek and its kin) own head dims, one key-value head a query head;
# RoCBERT's pronunciation and shape embeddings; an attention layer among the two of the hybrids (Jamba,
# RecurrentGemma); Mamba-2's heads covering its expanded width; RWKV's attention width; Gemma 3's vision
# tower (its causal LM is the image-text model).
_LATENT_ATTENTION = dict(qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, qk_head_dim=24, head_dim=8,
                         kv_lora_rank=32, q_lora_rank=32, num_key_value_heads=4)
OVERRIDES = {
    "gptj": dict(rotary_dim=8), "codegen": dict(rotary_dim=8),
    **{family: _LATENT_ATTENTION for family in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "youtu", "axk2",
                                                "minicpm3", "glm4_moe_lite", "glm_moe_dsa", "hy_v4", "kimi_k25")},
    "axk1": dict(_LATENT_ATTENTION, n_group=1, topk_group=1),  # expert groups of the tiny expert count
    "mistral4": dict(_LATENT_ATTENTION, head_dim=16),  # its rotary is half of head_dim: qk_rope_head_dim
    "roc_bert": dict(pronunciation_embed_dim=16, pronunciation_vocab_size=32, shape_embed_dim=16, shape_vocab_size=32),
    "jamba": dict(attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "mamba2": dict(num_heads=8),
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"], mamba_n_heads=8),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=8),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "gemma3n_text": dict(layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0),
    "rwkv": dict(attention_hidden_size=64),
    # Qwen2-VL's vision hidden_size is the width its merger hands the language model.
    "qwen2_vl": dict(vision_config=dict(embed_dim=32, depth=1, num_heads=2, hidden_size=64, patch_size=8)),
    "gemma3": dict(mm_tokens_per_image=4, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                            num_attention_heads=2, image_size=32, patch_size=8)),
}


def causal_lm_model_types():
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    del transformers
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def image_text_model_types():
    """The image-text models (Qwen-VL, LLaVA, PaliGemma, ...) that are not also causal LMs: trained on text
    alone here, their vision towers built small."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
    return sorted(set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) - set(causal_lm_model_types()))


def model_class_of(model_type):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    return AutoModelForCausalLM if model_type in causal_lm_model_types() else AutoModelForImageTextToText


def _has(config, name):
    try:
        return hasattr(config, name)
    except Exception:  # a per-layer attribute read globally (Gemma 4's head_dim): it is there
        return True


# Families whose tiny model keeps the first layer and the first of another kind (Gemma 4's sliding and
# full attention layers differ in head size and rotary; the hybrids' first two layers are linear
# attention), not the first two.
ONE_LAYER_OF_EACH_KIND = {"gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text", "qwen3_next", "qwen3_5",
                          "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "olmo_hybrid"}


def _one_layer_of_each_kind(config, before):
    """Cut the per-layer lists and overrides of `config`, as `before` had them, to two layers: the first
    and the first of another kind; a layer's own sizes become twice the tiny ones."""
    layers, kinds = before["num_hidden_layers"], before["layer_types"]
    kept = (0, next(i for i, kind in enumerate(kinds) if kind != kinds[0]))
    for name, value in before.items():
        if isinstance(value, list) and len(value) == layers:
            setattr(config, name, [value[i] for i in kept])
    overrides = {int(layer): values for layer, values in (before.get("per_layer_config") or {}).items()}
    config.per_layer_config = {new: {name: 2 * TINY[name] if isinstance(TINY.get(name), int) else value
                                     for name, value in overrides[old].items()}
                               for new, old in enumerate(kept) if old in overrides}


def tiny_config(model_type):
    from transformers import AutoConfig
    config = AutoConfig.for_model(model_type)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for target in {id(config): config, id(text_config): text_config}.values():
        before = target.to_dict()
        if before.get("per_layer_config"):
            target.per_layer_config = None  # per-layer sizes for the layers kept come below
        if model_type in ONE_LAYER_OF_EACH_KIND and target is text_config:
            _one_layer_of_each_kind(target, before)
        for name, value in {**TINY, **OVERRIDES.get(model_type, {})}.items():
            if isinstance(value, dict):  # a sub-config's sizes (a multimodal model's vision tower)
                for sub_name, sub_value in value.items() if _has(target, name) else ():
                    setattr(getattr(target, name), sub_name, sub_value)
            else:
                _set_size(target, name, value)
        rope = getattr(target, "rope_parameters", None)
        if isinstance(rope, dict) and "mrope_section" in getattr(type(target), "ignore_keys_at_rope_validation", ()):
            # multimodal rotary: the rotated half of a tiny head, split in three
            half = int(TINY["head_dim"] * rope.get("partial_rotary_factor", 1.0)) // 2
            rope["mrope_section"] = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    vocab = getattr(text_config, "vocab_size", None)
    for target in {id(config): config, id(text_config): text_config}.values():
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(target, name, None)
            if isinstance(vocab, int) and isinstance(value, int) and value >= vocab:
                setattr(target, name, vocab - 1)
        # Image, video and audio placeholder tokens: distinct ids above those a batch draws.
        placeholders = [name for name in vars(target) if name.endswith(("_token_id", "_token_index"))
                        and name not in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")]
        for number, name in enumerate(sorted(placeholders)):
            value = getattr(target, name, None)
            if isinstance(vocab, int) and isinstance(value, int) and value >= vocab - RESERVED_IDS:
                setattr(target, name, vocab - 2 - number % (RESERVED_IDS - 2))
    # The towers and connectors beside the language model (vision, audio, Q-Former, perceiver), small too.
    for name, tower in list(vars(config).items()):
        if (name.endswith("_config") and name != "text_config" and hasattr(tower, "to_dict")
                and name not in OVERRIDES.get(model_type, {})):
            for size_name, value in {**TINY_TOWER, **({} if name == "vision_config" else TINY_AUDIO)}.items():
                _set_size(tower, size_name, value)
    return config


def _set_size(config, name, value):
    """Sets `config.name` to a tiny `value` where the config has it: per layer or per axis where it holds
    a list."""
    if not _has(config, name):
        return
    try:
        current = getattr(config, name, None)
        if isinstance(current, (list, tuple)) and isinstance(value, int):
            value = type(current)([value] * len(current))
        setattr(config, name, value)
    except Exception:  # a read-only property of that family's config
        pass


def build(model_type, seed=0):
    """A tiny float32 model of `model_type` on the CPU, in train mode, its norm weights drawn away from
    ones (a weight that is not applied would hide behind ones)."""
    model_class = model_class_of(model_type)
    config = tiny_config(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):  # sub-configs this does not shrink can leave a model far from tiny
            size = sum(p.numel() for p in model_class.from_config(config).parameters())
        if size > MAX_PARAMETERS:
            raise ValueError(f"its tiny config still has {size} parameters")
        torch.manual_seed(seed)
        model = model_class.from_config(config)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1:
                parameter.copy_(torch.rand(parameter.shape, generator=generator) * 0.5 + 0.25)
    return model.train()


@functools.lru_cache(maxsize=None)
def why_not_testable(model_type):
    """None where a tiny model of the family builds and runs a training step and an eval forward with
    labels; else why."""
    try:
        model = build(model_type)
        ids = batch(model)
        model(input_ids=ids, labels=ids).loss.backward()
        with torch.no_grad():
            model.eval()(input_ids=ids, labels=ids)
    except Exception as error:
        return f"{type(error).__name__}: {str(error)[:200]}"
    return None


class Logits(torch.nn.Module):
    """A causal LM's logits from token ids alone: the module torch.export is given."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def batch(model, seed=1):
    vocab = model.config.get_text_config().vocab_size
    if getattr(model.config, "vision_config", None) is not None:
        vocab -= RESERVED_IDS
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, 10), generator=generator)


# The families every part of which fuse() runs as fused ops (each with the parts it may leave).
FULLY_FUSED = ["llama", "mistral", "ministral", "qwen2", "qwen3", "smollm3", "granite", "glm4", "olmo2", "olmo3",
               "phi3", "gemma", "gemma2", "gemma3_text", "gemma3", "exaone4", "hunyuan_v1_dense", "nemotron", "mixtral",
               "qwen3_moe", "hunyuan_v1_moe", "gpt_oss", "gemma4_text", "gemma4", "gemma4_unified_text", "falcon_h1",
               "granitemoe", "granitemoeshared", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v",
               "glm4v_moe", "llava", "paligemma", "internvl", "smolvlm", "mistral3", "llama4_text", "llama4",
               "deepseek_v2", "deepseek_v3", "muse_glimmer", "mistral4", "qwen3_next", "qwen3_5_text", "qwen3_5",
               "qwen3_5_moe_text", "qwen3_5_moe", "olmo_hybrid", "gptj", "codegen", "falcon", "mllama"]

FUSED_OPS_OF_PART = {
    "norm": {"rms_norm", "add_rms_norm", "layer_norm", "add_layer_norm"},
    "gated_mlp": {"gated_mul_linear", "gated_mul", "silu_mul_linear", "silu_mul", "gelu_mul", "moe_expert_mlp"},
    "rotary": {"rotary_embedding"},
    "lm_head_loss": {"linear_cross_entropy", "linear_cross_entropy_with_gradients"},
}


def is_norm(module):
    return not module._modules and "norm" in type(module).__name__.lower()


def is_gated_norm(module):
    """A norm that takes a gate: its fused form is rms_norm and one gated_mul."""
    import inspect
    return is_norm(module) and list(inspect.signature(module.forward).parameters) == ["hidden_states", "gate"]


def is_gated_mlp(module):
    """A dense gated MLP, or the experts of a mixture whose products transformers groups around a gate."""
    children = set(module._modules)
    experts = callable(getattr(type(module), "_apply_gate", None)) and getattr(module, "has_gate", False)
    return {"gate_proj", "up_proj", "down_proj"} <= children or {"gate_up_proj", "down_proj"} <= children or experts


def fused_op_calls(function):
    """{op name: calls} of the torch.ops.fused forward ops that `function()` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = {}

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "fused":
                name = func._schema.name.split("::")[-1]
                calls[name] = calls.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    with Counter():
        function()
    return calls


def stock_part_calls(model, function):
    """{part: calls} of the stock model's norms, gated MLPs and rotary functions in `function()`, and
    the head + loss (one call); "gated_norm" counts the norms among them that take a gate."""
    import sys
    calls = {"norm": 0, "gated_norm": 0, "gated_mlp": 0, "rotary": 0, "lm_head_loss": 1}
    handles = []
    for module in model.modules():
        parts = (["norm"] + ["gated_norm"] * is_gated_norm(module) if is_norm(module)
                 else ["gated_mlp"] if is_gated_mlp(module) else [])
        for part in parts:
            def hook(*_, part=part):
                calls[part] += 1
            handles.append(module.register_forward_hook(hook))
    # Each modeling module of the model's classes (an image-text model's language model has its own).
    modelings = {sys.modules[type(module).__module__] for module in model.modules()}
    stock_rotaries = {(modeling, name): getattr(modeling, name) for modeling in modelings
                      for name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_emb")
                      if callable(getattr(modeling, name, None))}

    def counted(stock_rotary):
        def counted_rotary(*args, **kwargs):
            calls["rotary"] += 1
            return stock_rotary(*args, **kwargs)
        return counted_rotary
    for (modeling, name), stock_rotary in stock_rotaries.items():
        setattr(modeling, name, counted(stock_rotary))
    try:
        function()
    finally:
        for (modeling, name), stock_rotary in stock_rotaries.items():
            setattr(modeling, name, stock_rotary)
        for handle in handles:
            handle.remove()
    return calls


def assert_gradients_match_stock(fused, stock, rtol=1e-4, atol=1e-5, relative_atol=0.0, dtype=None):
    """Every parameter's gradient of the fused model against the stock model's (atol plus relative_atol
    times the largest stock gradient of that parameter)."""
    expected = dict(stock.named_parameters())
    grads = {name: parameter.grad for name, parameter in fused.named_parameters()}
    assert set(grads) == set(expected)
    for name, grad in grads.items():
        if expected[name].grad is None:  # unused in this forward (an image-text model's vision tower on text)
            assert grad is None, name
            continue
        assert dtype is None or grad.dtype == dtype, name
        largest = expected[name].grad.abs().max().item()
        torch.testing.assert_close(grad, expected[name].grad, rtol=rtol, atol=atol + relative_atol * largest, msg=name)
