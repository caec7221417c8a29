// Every schema of the `fused` namespace. Kernels are registered per dispatch key in the
// neighbouring files; the math lives in ops/<op>/.
#include <torch/library.h>

TORCH_LIBRARY(fused, m) {
  const std::vector<at::Tag> tags = {at::Tag::pt2_compliant_tag};
  // relu(x) + y + bias; y broadcasts to x's shape.
  m.def("relu_add(Tensor x, Tensor y, float bias=0.0) -> Tensor", tags);
  // grad where relu passed x through, else 0 (the gradient of relu_add w.r.t. x).
  m.def("relu_add_backward(Tensor grad, Tensor x) -> Tensor", tags);
  // relu_add, and where relu passed x through as one bit per element (bit e % 8 of byte e / 8 for
  // element e of x in C order): what autograd saves for the backward instead of x.
  m.def("relu_add_with_mask(Tensor x, Tensor y, float bias=0.0) -> (Tensor out, Tensor mask)", tags);
  // grad where mask's bit is set, else 0: relu_add_backward from relu_add_with_mask's mask.
  m.def("relu_add_backward_masked(Tensor grad, Tensor mask) -> Tensor", tags);
  // gelu(x + bias, approximate); bias [H] broadcasts over x [..., H]; approximate 'none' or 'tanh'.
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate='none') -> Tensor", tags);
  // grad_x = grad * gelu'(x + bias); grad_bias = grad_x summed over the leading dims.
  m.def("bias_gelu_backward(Tensor grad, Tensor x, Tensor bias, str approximate='none') "
        "-> (Tensor grad_x, Tensor grad_bias)", tags);
  // silu(x[..., :d]) * x[..., d:] for x [..., 2d] (SwiGLU).
  m.def("silu_mul(Tensor x) -> Tensor", tags);
  // The gradient of silu_mul w.r.t. x, shaped like x.
  m.def("silu_mul_backward(Tensor grad, Tensor x) -> Tensor", tags);
  // F.linear(silu_mul(x), weight, bias) for x [..., 2d], weight [n, d], bias [n]: a SwiGLU MLP's down
  // projection whose autograd node saves x, not the activation (recomputed by the backward).
  m.def("silu_mul_linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor", tags);
  // The gradients of silu_mul_linear where output_mask says (x, weight, bias); the others are undefined.
  m.def("silu_mul_linear_backward(Tensor grad, Tensor x, Tensor weight, bool[3] output_mask) -> "
        "(Tensor grad_x, Tensor grad_weight, Tensor grad_bias)",
        tags);
  // gelu(x[..., :d], approximate) * x[..., d:] for x [..., 2d] (GeGLU).
  m.def("gelu_mul(Tensor x, str approximate='none') -> Tensor", tags);
  // The gradient of gelu_mul w.r.t. x, shaped like x.
  m.def("gelu_mul_backward(Tensor grad, Tensor x, str approximate='none') -> Tensor", tags);
  // act(gate) * up for gate and up of one shape [..., d], any strides; activation 'silu', 'gelu' (erf)
  // or 'gelu_tanh' (a gated MLP whose gate and up projections are two tensors).
  m.def("gated_mul(Tensor gate, Tensor up, str activation='silu') -> Tensor", tags);
  // The gradients of gated_mul w.r.t. gate and up, shaped like them.
  m.def("gated_mul_backward(Tensor grad, Tensor gate, Tensor up, str activation='silu') -> "
        "(Tensor grad_gate, Tensor grad_up)",
        tags);
  // F.linear(gated_mul(gate, up, activation), weight, bias) for gate and up [..., d], weight [n, d], bias
  // [n]: a gated MLP's down projection whose autograd node saves gate and up, not the activation.
  m.def("gated_mul_linear(Tensor gate, Tensor up, Tensor weight, Tensor? bias=None, str activation='silu') "
        "-> Tensor",
        tags);
  // The gradients of gated_mul_linear where output_mask says (gate, up, weight, bias); the others are empty.
  m.def("gated_mul_linear_backward(Tensor grad, Tensor gate, Tensor up, Tensor weight, str activation, "
        "bool[4] output_mask) -> (Tensor grad_gate, Tensor grad_up, Tensor grad_weight, Tensor grad_bias)",
        tags);
  // Norms over the last dim, statistics in float32; weight (and bias) [H] may be float32 for 16-bit x.
  // w = offset + weight in float32 (Gemma's RMSNorm 1 + weight), or 1 with weight None (offset 0).
  // x · rsqrt(mean(x²) + eps) · w.
  m.def("rms_norm(Tensor x, Tensor? weight, float eps=1e-6, float offset=0.0) -> Tensor", tags);
  // h = x + residual (in x's dtype); (rms_norm(h, weight, eps, offset), h).
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps=1e-6, float offset=0.0) -> "
        "(Tensor out, Tensor residual_out)",
        tags);
  // Gradients of rms_norm(x) given grad of its output, plus grad_residual (the gradient that reaches
  // h through add_rms_norm's residual_out) added to grad_x; grad_weight [H] also for weight None (x's
  // dtype: the gradient a unit weight gets).
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor? weight, float eps, Tensor? grad_residual=None, "
        "float offset=0.0) -> (Tensor grad_x, Tensor grad_weight)",
        tags);
  // (x - mean) · rsqrt(var + eps) · w + bias.
  m.def("layer_norm(Tensor x, Tensor? weight, Tensor? bias=None, float eps=1e-5, float offset=0.0) -> Tensor", tags);
  // h = x + residual (in x's dtype); (layer_norm(h, weight, bias, eps, offset), h).
  m.def("add_layer_norm(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, float eps=1e-5, float offset=0.0) "
        "-> (Tensor out, Tensor residual_out)",
        tags);
  // Gradients of layer_norm(x), grad_residual added to grad_x and grad_weight as for rms_norm_backward.
  m.def("layer_norm_backward(Tensor grad, Tensor x, Tensor? weight, float eps, Tensor? grad_residual=None, "
        "float offset=0.0) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)",
        tags);
  // RoPE on q and k (Hugging Face's apply_rotary_pos_emb): x * cos + rotate(x) * sin over the first
  // cos.size(-1) dims of each head; q, k [B, H, S, D] (unsqueeze_dim=1) or [B, S, H, D] (2); cos, sin
  // [B or 1, S, R] or [S, R]; interleaved: GPT-J's pairs (2i, 2i + 1) instead of (j, j + R/2).
  m.def("rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, bool interleaved=False) "
        "-> (Tensor q_out, Tensor k_out)",
        tags);
  // The gradients of q and k: the transposed rotation of grad_q and grad_k.
  m.def("rotary_embedding_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin, int unsqueeze_dim=1, "
        "bool interleaved=False) -> (Tensor grad_q, Tensor grad_k)",
        tags);
  // F.cross_entropy(input @ weight.T + bias, target, ...) without the [N, V] logits in memory; input
  // [..., H], weight [V, H], target int64 of input's leading shape; softcap > 0 caps the logits first
  // (softcap * tanh(z / softcap)). A float32 loss (float64 for float64 input): [] or, for 'none',
  // target's shape. 'mean' over no rows (all ignored) is 0.
  m.def("linear_cross_entropy(Tensor input, Tensor weight, Tensor target, Tensor? bias=None, int ignore_index=-100, "
        "float label_smoothing=0.0, str reduction=\"mean\", float softcap=0.0) -> Tensor",
        tags);
  // The loss and, where output_mask says (input, weight, bias), its gradients for grad_output = 1,
  // computed in the same pass (what autograd calls for the mean and the sum); the others are empty.
  m.def("linear_cross_entropy_with_gradients(Tensor input, Tensor weight, Tensor target, Tensor? bias, "
        "int ignore_index, float label_smoothing, str reduction, float softcap, bool[3] output_mask) -> "
        "(Tensor loss, Tensor grad_input, Tensor grad_weight, Tensor grad_bias)",
        tags);
  // The gradients for grad_loss (of the loss's shape), the logits recomputed chunk by chunk.
  m.def("linear_cross_entropy_backward(Tensor grad_loss, Tensor input, Tensor weight, Tensor target, Tensor? bias, "
        "int ignore_index, float label_smoothing, str reduction, float softcap, bool[3] output_mask) -> "
        "(Tensor grad_input, Tensor grad_weight, Tensor grad_bias)",
        tags);
  // Per row of input [..., H] with y = (input @ weight.T + bias) * logit_scale, c = softcap * tanh(y /
  // softcap) (c = y for softcap 0) and z = c / temperature: log_softmax(z)[target] and, with
  // return_entropy, -sum(softmax(z) * log_softmax(z)) (else an empty [0] tensor), float32 (float64 for
  // float64 input) of target's shape, 0 on ignored rows; no [N, V] logits in memory.
  m.def("linear_log_probs(Tensor input, Tensor weight, Tensor target, Tensor? bias=None, float temperature=1.0, "
        "int ignore_index=-100, bool return_entropy=False, float logit_scale=1.0, float softcap=0.0) -> "
        "(Tensor log_probs, Tensor entropy)",
        tags);
  // linear_log_probs and each row's log-sum-exp of z (the output dtype, of target's shape), which its
  // backward takes: what the autograd kernel runs. kept_logits [..., K] (input's leading dims and dtype,
  // K = kept_classes, 0 to V) holds input @ weight[:K].T + bias[:K], which the backward then does not
  // recompute; the autograd kernel asks for the plan's count (ops/cross_entropy/launch_plan.h) where a
  // gradient is recorded.
  m.def("linear_log_probs_with_log_sum_exp(Tensor input, Tensor weight, Tensor target, Tensor? bias, "
        "float temperature, int ignore_index, bool return_entropy, float logit_scale, float softcap, "
        "SymInt kept_classes=0) -> (Tensor log_probs, Tensor entropy, Tensor log_sum_exp, Tensor kept_logits)",
        tags);
  // The gradients where output_mask says (input, weight, bias) for the gradients of the log-probabilities
  // and the entropy (target's shape; None: zero), the logits recomputed chunk by chunk of classes; the
  // others empty. log_sum_exp and entropy: the forward's (None: computed again, one more product);
  // kept_logits: the forward's (None or [..., 0]: every class's logits recomputed).
  m.def("linear_log_probs_backward(Tensor? grad_log_probs, Tensor? grad_entropy, Tensor input, Tensor weight, "
        "Tensor target, Tensor? bias, float temperature, int ignore_index, bool[3] output_mask, "
        "float logit_scale=1.0, float softcap=0.0, Tensor? log_sum_exp=None, Tensor? entropy=None, "
        "Tensor? kept_logits=None) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)",
        tags);
  // Mixture-of-experts experts (ops/moe/moe.h has the math). The pairs p = t * top_k + j of top_k_index [T, top_k]
  // sorted by expert (stable; ids outside [0, num_experts) last): order [T * top_k] int64 and offsets
  // [num_experts] int32, each expert's end in that order.
  m.def("moe_permute(Tensor top_k_index, int num_experts) -> (Tensor order, Tensor offsets)", tags);
  // rows [T * top_k, H] in order's order: routing weight x the gated MLP of expert e on its pair's token,
  // act(x W_gate^T + b) * (x W_up^T + b) then W_down^T + b, for gate_up_weight [E, 2I, H] ([gate; up], or
  // interleaved columns) and down_weight [E, H, I] (transposed: [E, H, 2I] and [E, I, H]); activation 'silu',
  // 'gelu', 'gelu_tanh' or 'swiglu_oai' (gpt-oss: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g =
  // clamp(gate, max=limit)); 0 for pairs of no expert. Its autograd node saves the inputs alone; the backward
  // recomputes the gathered rows, the gate/up product and the activation. recompute=False: the node keeps the
  // gate/up product [T * top_k, 2I] too (from moe_expert_mlp_keeping_gate_up), and the backward takes it.
  m.def("moe_expert_mlp(Tensor hidden_states, Tensor order, Tensor offsets, Tensor routing_weights, "
        "Tensor gate_up_weight, Tensor down_weight, Tensor? gate_up_bias=None, Tensor? down_bias=None, "
        "str activation='silu', bool transposed=False, bool interleaved=False, float alpha=1.702, float limit=7.0, "
        "bool recompute=True) -> Tensor",
        tags);
  // moe_expert_mlp's rows and its gate/up product (bias added; 0 for pairs of no expert).
  m.def("moe_expert_mlp_keeping_gate_up(Tensor hidden_states, Tensor order, Tensor offsets, Tensor routing_weights, "
        "Tensor gate_up_weight, Tensor down_weight, Tensor? gate_up_bias, Tensor? down_bias, str activation, "
        "bool transposed, bool interleaved, float alpha, float limit) -> (Tensor rows, Tensor gate_up)",
        tags);
  // The gradients where output_mask says (hidden_states, routing_weights, gate_up_weight, down_weight,
  // gate_up_bias, down_bias); the others are empty. gate_up: the forward's kept gate/up product, or None
  // (recomputed).
  m.def("moe_expert_mlp_backward(Tensor grad, Tensor hidden_states, Tensor order, Tensor offsets, "
        "Tensor routing_weights, Tensor gate_up_weight, Tensor down_weight, Tensor? gate_up_bias, Tensor? down_bias, "
        "str activation, bool transposed, bool interleaved, float alpha, float limit, bool[6] output_mask, "
        "Tensor? gate_up=None) -> "
        "(Tensor grad_hidden_states, "
        "Tensor grad_routing_weights, Tensor grad_gate_up_weight, Tensor grad_down_weight, Tensor grad_gate_up_bias, "
        "Tensor grad_down_bias)",
        tags);
  // out [T, H] of rows' dtype: each token's top_k rows (at their place in order) summed in a fixed order, each
  // times its routing weight where routing_weights [T, top_k] is given; pairs of no expert add nothing.
  m.def("moe_unpermute(Tensor rows, Tensor order, Tensor offsets, int top_k, Tensor? routing_weights=None) -> Tensor",
        tags);
  // The gradients of moe_unpermute where output_mask says (rows, routing_weights); rows are needed only for
  // the routing weights' gradient.
  m.def("moe_unpermute_backward(Tensor grad, Tensor? rows, Tensor order, Tensor offsets, int top_k, "
        "Tensor? routing_weights, bool[2] output_mask) -> (Tensor grad_rows, Tensor grad_routing_weights)",
        tags);
  // Causal attention with a sink logit per query head (gpt-oss): output = softmax(q k^T * scale) v * s, s =
  // sigmoid(log_sum_exp - sinks[h]); query [B, S, Hq, D], key and value [B, S, Hkv, D]; window > 0: the latest
  // `window` keys only. log_sum_exp [B, Hq, S] (float32) is the scores' own, without the sink.
  m.def("attention_with_sinks(Tensor query, Tensor key, Tensor value, Tensor sinks, float scale, int window=0) -> "
        "(Tensor output, Tensor log_sum_exp)",
        tags);
  m.def("attention_with_sinks_backward(Tensor grad_output, Tensor query, Tensor key, Tensor value, Tensor sinks, "
        "Tensor output, Tensor log_sum_exp, float scale, int window) -> (Tensor grad_query, Tensor grad_key, "
        "Tensor grad_value, Tensor grad_sinks)",
        tags);
}
