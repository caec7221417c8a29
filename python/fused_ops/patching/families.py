"""What structure cannot tell, by `config.model_type`: the fusions a family is known to get (the family
test holds fuse() to them). A new family is a row here and a row in the family test."""

LLAMA_KIN = {"norm", "gated_mlp", "rotary", "residual_norm", "lm_head_loss", "causal_mask"}

# model_type -> the kinds every such model gets.
EXPECTED_FUSIONS = {
    "llama": LLAMA_KIN,
    "mistral": LLAMA_KIN,
    "qwen2": LLAMA_KIN,
    "qwen3": LLAMA_KIN,
}
