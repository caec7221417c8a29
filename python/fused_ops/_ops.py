"""Typed wrappers over `torch.ops.fused.*` (same semantics, docstrings and type hints)."""
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

# Bound once: calling the overload skips the packet's overload resolution on every call.
_relu_add = torch.ops.fused.relu_add.default
_bias_gelu = torch.ops.fused.bias_gelu.default
_silu_mul = torch.ops.fused.silu_mul.default
_silu_mul_linear = torch.ops.fused.silu_mul_linear.default
_gelu_mul = torch.ops.fused.gelu_mul.default
_gated_mul = torch.ops.fused.gated_mul.default
_gated_mul_linear = torch.ops.fused.gated_mul_linear.default
_rms_norm = torch.ops.fused.rms_norm.default
_add_rms_norm = torch.ops.fused.add_rms_norm.default
_layer_norm = torch.ops.fused.layer_norm.default
_add_layer_norm = torch.ops.fused.add_layer_norm.default
_rotary_embedding = torch.ops.fused.rotary_embedding.default
_linear_cross_entropy = torch.ops.fused.linear_cross_entropy.default
_linear_log_probs = torch.ops.fused.linear_log_probs.default
_moe_permute = torch.ops.fused.moe_permute.default
_moe_expert_mlp = torch.ops.fused.moe_expert_mlp.default
_moe_unpermute = torch.ops.fused.moe_unpermute.default
_attention_with_sinks = torch.ops.fused.attention_with_sinks.default


def relu_add(x: Tensor, y: Tensor, bias: float = 0.0) -> Tensor:
    """`relu(x) + y + bias` in one pass; `y` broadcasts to `x`'s shape.

    Same values as the eager composite (half types computed in float32 and rounded once),
    differentiable in `x` and `y`.
    """
    return _relu_add(x, y, bias)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """`gelu(x + bias, approximate=approximate)`; `bias` is 1-D of size `x.size(-1)`.

    `approximate` is "none" (erf) or "tanh". Differentiable in `x` and `bias`.
    """
    return _bias_gelu(x, bias, approximate)


def silu_mul(x: Tensor) -> Tensor:
    """`silu(x[..., :d]) * x[..., d:]` for `x` of shape `[..., 2d]` (SwiGLU gate-up layout)."""
    return _silu_mul(x)


def silu_mul_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """`F.linear(silu_mul(x), weight, bias)` for `x` [..., 2d] and `weight` [n, d] (a SwiGLU MLP's
    down projection). Its autograd node saves `x`, not the [..., d] activation, which the backward
    recomputes: one pass over `x` for the activation's memory between forward and backward.
    Differentiable in `x`, `weight` and `bias`.
    """
    return _silu_mul_linear(x, weight, bias)


def gelu_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """`gelu(x[..., :d], approximate) * x[..., d:]` for `x` of shape `[..., 2d]` (GeGLU)."""
    return _gelu_mul(x, approximate)


def gated_mul(gate: Tensor, up: Tensor, activation: str = "silu") -> Tensor:
    """`act(gate) * up` for `gate` and `up` of one shape `[..., d]`, dtype and device (a gated MLP whose
    gate and up projections are two tensors; any strides, e.g. the halves of one gate/up output).

    `activation` is "silu" (SwiGLU), "gelu" (erf GELU, GeGLU) or "gelu_tanh" (`F.gelu(approximate="tanh")`).
    Differentiable in `gate` and `up`.
    """
    return _gated_mul(gate, up, activation)


def gated_mul_linear(gate: Tensor, up: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                     activation: str = "silu") -> Tensor:
    """`F.linear(gated_mul(gate, up, activation), weight, bias)` for `gate`, `up` [..., d] and `weight`
    [n, d] (a gated MLP's down projection). Its autograd node saves `gate` and `up`, not the [..., d]
    activation, which the backward recomputes. Differentiable in `gate`, `up`, `weight` and `bias`.
    """
    return _gated_mul_linear(gate, up, weight, bias, activation)


def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float = 1e-6, offset: float = 0.0) -> Tensor:
    """`x * rsqrt(mean(x**2, -1) + eps) * (offset + weight)` over the last dim, statistics in float32.

    `weight` is 1-D of size `x.size(-1)`, with x's dtype or float32 for float16/bfloat16 `x`, or None
    (no weight: `offset` must be 0). `offset + weight` and the product are taken in float32 and rounded
    once to x's dtype (Gemma's RMSNorm is `offset=1.0`). Differentiable in `x` and `weight`.
    """
    return _rms_norm(x, weight, eps, offset)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float = 1e-6,
                 offset: float = 0.0) -> Tuple[Tensor, Tensor]:
    """`h = x + residual` (in x's dtype); returns `(rms_norm(h, weight, eps, offset), h)`.

    Differentiable in `x`, `residual` and `weight` through either output or both.
    """
    return _add_rms_norm(x, residual, weight, eps, offset)


def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor] = None, eps: float = 1e-5,
               offset: float = 0.0) -> Tensor:
    """`(x - mean) * rsqrt(var + eps) * (offset + weight) + bias` over the last dim, statistics in float32.

    `weight` None means no weight (`offset` must be 0; OLMo's LayerNorm); Nemotron's LayerNorm1P is
    `offset=1.0`. Differentiable in `x`, `weight` and `bias`.
    """
    return _layer_norm(x, weight, bias, eps, offset)


def add_layer_norm(x: Tensor, residual: Tensor, weight: Optional[Tensor], bias: Optional[Tensor] = None,
                   eps: float = 1e-5, offset: float = 0.0) -> Tuple[Tensor, Tensor]:
    """`h = x + residual` (in x's dtype); returns `(layer_norm(h, weight, bias, eps, offset), h)`."""
    return _add_layer_norm(x, residual, weight, bias, eps, offset)


def rotary_embedding(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1,
                     interleaved: bool = False) -> Tuple[Tensor, Tensor]:
    """RoPE on queries and keys: the values of Hugging Face's `apply_rotary_pos_emb(q, k, cos, sin,
    unsqueeze_dim)`, `x * cos + rotate_half(x) * sin`, in one pass over q and one over k.

    q, k: [B, H, S, D] (unsqueeze_dim=1) or [B, S, H, D] (unsqueeze_dim=2); k may have fewer heads (GQA);
    any strides, e.g. views into one fused qkv projection. cos, sin: [B or 1, S, R] or [S, R] with R even
    and at most D, of q's dtype (or float32 for a 16-bit q): only the first R dims of each head rotate (partial rotary), the
    rest pass through. `interleaved=True` rotates GPT-J's pairs (x[2i], x[2i + 1]) instead of
    (x[j], x[j + R/2]). Differentiable in q and k; cos and sin must not require grad. From a Hugging Face
    attention layer: `q, k = fused_ops.rotary_embedding(q, k, *position_embeddings)`.
    """
    return _rotary_embedding(q, k, cos, sin, unsqueeze_dim, interleaved)


def linear_cross_entropy(input: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None,
                         ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
                         softcap: float = 0.0) -> Tensor:
    """`F.cross_entropy(F.linear(input, weight, bias), target, ignore_index=..., label_smoothing=...,
    reduction=...)` without the [N, V] logits in memory: the LM head and its loss in one call.

    input [..., H] (rows), weight [V, H] as nn.Linear stores it, bias [V] or None, all of one dtype
    (float32, float16, bfloat16 or float64); target int64 of input's leading shape with values in
    [0, V) or `ignore_index`. `softcap > 0` caps the logits first: `softcap * tanh(z / softcap)` (Gemma 2).
    The loss is float32 (float64 for float64 input): a scalar for "mean" and "sum", target's shape for
    "none". "mean" averages over the rows not ignored and is 0 when all are ignored (torch gives NaN).
    Differentiable in input, weight and bias, for every reduction (no double backward). With "mean" and
    "sum" the gradients are computed in the forward, so one backward per forward.
    """
    return _linear_cross_entropy(input, weight, target, bias, ignore_index, label_smoothing, reduction, softcap)


def linear_log_probs(input: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None, *,
                     temperature: float = 1.0, ignore_index: int = -100, return_entropy: bool = False,
                     logit_scale: float = 1.0, softcap: float = 0.0) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Per-token log-probabilities (and entropy) of an LM head without the [N, V] logits in memory:
    with `y = F.linear(input, weight, bias) * logit_scale`, `z = softcap * tanh(y / softcap) / temperature`
    (`z = y / temperature` for softcap 0), `log_softmax(z).gather(-1, target)` and, with
    `return_entropy`, `-(softmax(z) * log_softmax(z)).sum(-1)`. `logit_scale` and `softcap` are the
    model's own (Cohere's `logit_scale`, Granite's `1 / logits_scaling`, Gemma 2's
    `final_logit_softcapping`): `fused_ops.token_log_probs` takes them from the model.

    input [..., H] (the final hidden states), weight [V, H] as nn.Linear stores it (`lm_head.weight`),
    bias [V] or None, all of one dtype (float32, float16, bfloat16 or float64); target int64 of input's
    leading shape with values in [0, V) or `ignore_index`; temperature > 0, logit_scale finite and not 0,
    softcap >= 0. Both results are float32
    (float64 for float64 input) of target's shape and 0 on ignored rows. Returns `log_probs`, or
    `(log_probs, entropy)` with `return_entropy=True`. Differentiable in input, weight and bias through
    both results with any per-token weights (advantages, ratios, KL terms); the backward recomputes the
    logits chunk by chunk (no double backward).
    """
    log_probs, entropy = _linear_log_probs(input, weight, target, bias, temperature, ignore_index, return_entropy,
                                           logit_scale, softcap)
    return (log_probs, entropy) if return_entropy else log_probs


def moe_permute(top_k_index: Tensor, num_experts: int) -> Tuple[Tensor, Tensor]:
    """The routed pairs of a mixture of experts sorted by expert: for `top_k_index` [T, top_k] (pair
    `p = t * top_k + j` goes to expert `top_k_index[t, j]`), `order` [T * top_k] int64 (the pairs by expert,
    stable; ids outside [0, num_experts), as expert parallelism marks foreign experts, last) and `offsets`
    [num_experts] int32 (each expert's end in `order`, as torch's grouped products take them). No host sync.
    """
    return _moe_permute(top_k_index, num_experts)


def moe_expert_mlp(hidden_states: Tensor, order: Tensor, offsets: Tensor, routing_weights: Tensor,
                   gate_up_weight: Tensor, down_weight: Tensor, gate_up_bias: Optional[Tensor] = None,
                   down_bias: Optional[Tensor] = None, activation: str = "silu", transposed: bool = False,
                   interleaved: bool = False, alpha: float = 1.702, limit: float = 7.0,
                   recompute: bool = True) -> Tensor:
    """The experts' gated MLPs on the routed pairs, in `order`'s order ([T * top_k, H]): row s, for pair
    `p = order[s]` of token `t = p // top_k` and expert e, is `routing_weights[t, j] * down_e(act(gate_e(x)) *
    up_e(x))` with `x = hidden_states[t]`; 0 for a pair of no expert. `gate_up_weight` [E, 2I, H] holds
    `[gate; up]` and `down_weight` [E, H, I] (`transposed`: [E, H, 2I] and [E, I, H], as transformers'
    `is_transposed` experts store them), gate and up as its halves or, `interleaved`, as columns 2i and 2i + 1;
    biases [E, 2I] and [E, H]; activation 'silu', 'gelu', 'gelu_tanh' (`act(gate) * up`) or 'swiglu_oai'
    (gpt-oss's `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)` for `g = clamp(gate, max=limit)`).
    Its autograd node saves only its inputs: the backward gathers the rows again and recomputes the gate/up
    product and the activation. `recompute=False` keeps the gate/up product too ([T * top_k, 2I]: 0.22x of what
    transformers' grouped products keep at Qwen3-30B-A3B's shape) and skips that product in the backward.
    Differentiable in the hidden states, routing weights, weights and biases.
    """
    return _moe_expert_mlp(hidden_states, order, offsets, routing_weights, gate_up_weight, down_weight,
                           gate_up_bias, down_bias, activation, transposed, interleaved, alpha, limit, recompute)


def moe_unpermute(rows: Tensor, order: Tensor, offsets: Tensor, top_k: int,
                  routing_weights: Optional[Tensor] = None) -> Tensor:
    """[T, H] of `rows`' dtype: each token's `top_k` rows of `rows` [T * top_k, H] (in `order`'s order) summed
    in a fixed order in float32, each times its routing weight where `routing_weights` [T, top_k] is given;
    pairs of no expert add nothing. Deterministic (no atomics). Differentiable in `rows` and
    `routing_weights`.
    """
    return _moe_unpermute(rows, order, offsets, top_k, routing_weights)


def moe_experts(hidden_states: Tensor, top_k_index: Tensor, routing_weights: Tensor, gate_up_weight: Tensor,
                down_weight: Tensor, gate_up_bias: Optional[Tensor] = None, down_bias: Optional[Tensor] = None,
                activation: str = "silu", transposed: bool = False, interleaved: bool = False, alpha: float = 1.702,
                limit: float = 7.0, recompute: bool = True) -> Tensor:
    """A mixture of experts' routed experts, [T, H] of `hidden_states`' dtype: for each token the sum over its
    `top_k` experts of `routing_weights[t, j] * expert(hidden_states[t])` (moe_permute, moe_expert_mlp,
    moe_unpermute). What the backward keeps: the hidden states and the routing, nothing of size
    [T * top_k, ...]; with `recompute=False` also the gate/up product (moe_expert_mlp)."""
    order, offsets = _moe_permute(top_k_index, gate_up_weight.shape[0])
    rows = _moe_expert_mlp(hidden_states, order, offsets, routing_weights, gate_up_weight, down_weight,
                           gate_up_bias, down_bias, activation, transposed, interleaved, alpha, limit, recompute)
    return _moe_unpermute(rows, order, offsets, top_k_index.shape[-1], None).to(hidden_states.dtype)


def attention_with_sinks(query: Tensor, key: Tensor, value: Tensor, sinks: Tensor, scale: float,
                         window: int = 0) -> Tensor:
    """Causal attention with a learned sink logit per query head (gpt-oss): each query's softmax runs over the
    keys it sees and `sinks[h]`, whose value row is zero, so `softmax(q k^T * scale) v * sigmoid(lse - sinks[h])`
    with `lse` the log-sum-exp of the query's scaled scores. `window > 0`: each query sees its `window` latest
    keys (itself included); 0: every earlier key.

    query [B, S, Hq, D], key and value [B, S, Hkv, D] with Hq a multiple of Hkv (GQA), sinks [Hq]; the output
    is [B, S, Hq, D] of query's dtype. On Ampere and Hopper GPUs, float16 and bfloat16 heads of a size up to 256
    (192 on Ampere but the A100) and a multiple of 8 run torch's flash kernels (the sink rescales their output,
    and their backward serves the gradients) unless SDPA's flash backend is off; elsewhere ATen's math in float32. Its autograd node keeps the inputs, the output and the log-sum-exp, no
    [S, S] scores. Differentiable in query, key, value and sinks.
    """
    return _attention_with_sinks(query, key, value, sinks, scale, window)[0]
