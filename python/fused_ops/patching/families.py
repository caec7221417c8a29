"""What each family is known to get, by `config.model_type`: the family test holds fuse() to these sets,
so a family that loses a fusion fails it. A new family is a row here and a row in the family test.
Where structure cannot tell a variant, the probe tells it (patching/probe.py), not this table."""

LLAMA_KIN = frozenset({"norm", "gated_mlp", "rotary", "residual_norm", "lm_head_loss", "causal_mask"})
# Llama-shaped, but a decoder layer with more norms than the Llama layer's two.
EXTRA_NORMS = frozenset({"norm", "gated_mlp", "rotary", "lm_head_loss", "causal_mask"})
# The experts' gate between transformers' grouped products is fused, not the products; the head adds the
# router's loss when it is asked for.
MOE = LLAMA_KIN - {"gated_mlp"} | {"experts_gate"}
# Attention that takes a sliding-window mask (the tiny configs have a window): band-aware, so that the base
# model can hand it the marker past the window.
WINDOW = frozenset({"sliding_window_attention"})

EXPECTED_FUSIONS = {
    "llama": LLAMA_KIN, "mistral": LLAMA_KIN | WINDOW, "ministral": LLAMA_KIN | WINDOW, "qwen2": LLAMA_KIN,
    "qwen3": LLAMA_KIN,
    "smollm3": LLAMA_KIN, "granite": LLAMA_KIN, "hunyuan_v1_dense": LLAMA_KIN,
    "glm4": LLAMA_KIN,
    "olmo2": EXTRA_NORMS, "olmo3": EXTRA_NORMS | WINDOW, "phi3": LLAMA_KIN | WINDOW, "exaone4": EXTRA_NORMS | WINDOW,
    "cohere": EXTRA_NORMS,
    # (1 + weight) norms; Gemma 2 and 3's four-norm layers fuse their pre-feedforward norm with the add.
    # gemma3: image-text
    "gemma": LLAMA_KIN, "gemma2": LLAMA_KIN | WINDOW, "gemma3_text": LLAMA_KIN | WINDOW, "gemma3": LLAMA_KIN,
    "nemotron": LLAMA_KIN - {"gated_mlp"},  # LayerNorm1P's (1 + weight); its MLP is relu², not gated
    "mixtral": MOE | WINDOW, "qwen3_moe": MOE | WINDOW,
    "hunyuan_v1_moe": MOE | {"gated_mlp"},
    # Its experts' gate is a clamped SwiGLU, interleaved, computed inside the experts ops; its eager attention
    # with sinks takes the causal markers.
    "gpt_oss": MOE | {"attention_sinks"},
    "granite_swa": LLAMA_KIN | {"attention_sinks"}, "granitemoe_swa": MOE - {"residual_norm"} | {"attention_sinks"},
    # Its experts clamp gate and up at swiglu_limit; its rotary is partial and interleaved, on one tensor at a
    # time; its layers mix their residual streams (hyper-connections).
    "deepseek_v4": frozenset({"norm", "lm_head_loss"}),
    # Gemma 3n and 4 rotate queries and keys in separate calls; their layers carry per-layer inputs.
    "gemma4_text": EXTRA_NORMS | WINDOW, "gemma4": EXTRA_NORMS, "gemma4_unified_text": EXTRA_NORMS | WINDOW,
    "gemma3n_text": EXTRA_NORMS - {"gated_mlp"} | WINDOW,  # its MLP sparsifies the gate's activations
    "falcon_h1": EXTRA_NORMS,  # the head's lm_head_multiplier is the loss's logit scale
    "bamba": EXTRA_NORMS,
    # Granite's MoE heads: the logits scaling, and the router loss request read from the config.
    "granitemoe": MOE - {"residual_norm"}, "granitemoeshared": MOE - {"residual_norm"},
    "granitemoehybrid": MOE - {"residual_norm", "rotary"},  # its default config uses no rotary embedding
    "lfm2_moe": MOE - {"residual_norm"},
    # The base model at the class's base_model_prefix (`transformer`, `gpt_neox`).
    "gpt2": frozenset({"norm", "bias_gelu", "lm_head_loss", "causal_mask"}),
    "gpt_neox": frozenset({"norm", "rotary", "lm_head_loss", "causal_mask"}),
    # GPT-J's rotary function, (tensor, sin, cos) with a table value per pair; its head hands the base model
    # none of its keyword arguments.
    "gptj": frozenset({"norm", "bias_gelu", "rotary", "lm_head_loss", "causal_mask"}),
    "codegen": frozenset({"norm", "bias_gelu", "rotary", "lm_head_loss", "causal_mask"}),
    # Heads whose output class has cross-attentions that their forward leaves empty.
    "bloom": frozenset({"norm", "lm_head_loss", "causal_mask"}),
    "mpt": frozenset({"norm", "lm_head_loss", "causal_mask"}),
    "falcon": frozenset({"norm", "rotary", "lm_head_loss", "causal_mask"}),
    # Image-text models: their language model's parts, and their vision tower's norms.
    "qwen2_vl": LLAMA_KIN, "qwen2_5_vl": LLAMA_KIN, "qwen3_vl": LLAMA_KIN, "qwen3_vl_moe": MOE,
    "glm4v": LLAMA_KIN, "glm4v_moe": LLAMA_KIN | {"experts_gate"}, "llava": LLAMA_KIN, "paligemma": LLAMA_KIN,
    "internvl": LLAMA_KIN, "smolvlm": LLAMA_KIN, "mistral3": LLAMA_KIN | WINDOW,
    "muse_glimmer": LLAMA_KIN | WINDOW,  # its head's output multiplier and softcap, from the text config
    # Hybrids of linear and full attention: the full attention layers' parts, and the linear attention's
    # gated norm, act(gate) * norm(x), as rms_norm + gated_mul.
    "qwen3_next": MOE | {"gated_mlp", "gated_norm"}, "qwen3_5": LLAMA_KIN | {"gated_norm"},
    "qwen3_5_text": LLAMA_KIN | {"gated_norm"}, "qwen3_5_moe": MOE | {"gated_mlp", "gated_norm"},
    "qwen3_5_moe_text": MOE | {"gated_mlp", "gated_norm"}, "olmo_hybrid": EXTRA_NORMS | {"gated_norm"},
    # Rotation by complex factors (apply_rotary_emb); Llama 4's layers have no Llama-shaped residual norm.
    "llama4_text": EXTRA_NORMS, "llama4": EXTRA_NORMS, "deepseek_v2": MOE | {"gated_mlp"},
    "mistral4": MOE | {"gated_mlp"}, "deepseek_v3": LLAMA_KIN,  # multi-head latent attention
    "mllama": EXTRA_NORMS,  # its layers take cross-attention arguments: no Llama-shaped residual norm
}
