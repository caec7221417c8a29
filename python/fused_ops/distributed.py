"""DTensor sharding rules for every `torch.ops.fused` op, forward and backward.

A rule lists the input placements an op runs on locally, with no communication, and the placements
its outputs then have. An input placement no rule lists is redistributed by DTensor to the cheapest
one a rule lists (for example `silu_mul` on a tensor sharded on its last dim, which the op splits in
halves, is gathered on that dim first).

- Elementwise and activation ops follow their input's sharding on any dim; the gated ops
  (`silu_mul`, `gelu_mul`) on any dim but the last. `bias_gelu`'s bias follows x's last dim.
  `silu_mul_linear` runs on rows sharded likewise with the weight replicated, or on a replicated x with
  the weight (and bias) sharded on its output rows; its weight and bias gradients come out `Partial`.
  `gated_mul` (gate and up two tensors) follows gate and up sharded alike on any dim, the last too.
  `gated_mul_linear` runs as `silu_mul_linear` does, and also row parallel: gate and up sharded on their
  last dim with the weight sharded on its input columns and no bias, the output then `Partial`.
- Norms run on rows sharded on any dim but the normalised one (sequence parallel: `Shard(1)`), with
  weight and bias replicated; their weight and bias gradients come out `Partial` (a sum over the rows
  each rank holds).
- `rotary_embedding` runs on q and k sharded alike on the batch, the heads or the sequence (cos and sin
  then sharded on their batch, replicated, or sharded on their sequence dim), never on the head dim.
- `linear_cross_entropy` runs on input rows (and target) sharded on any leading dim with the weight and
  bias replicated when the reduction is 'sum' (the loss comes out `Partial`) or 'none' (sharded like
  the target); the mean divides by the count of rows not ignored over all ranks, so it runs
  replicated. Its gradient ops give the input's gradient sharded like the input and the weight's and
  bias's `Partial`.
- `linear_log_probs` runs on input rows (and target) sharded on any leading dim with the weight and bias
  replicated: both results (and `linear_log_probs_with_log_sum_exp`'s log-sum-exp) come out sharded like the
  target. Its backward takes the results' gradients and the forward's log-sum-exp and entropy sharded so and
  gives the input's gradient sharded like the input and the weight's and bias's `Partial`.
- The experts' ops (`moe_permute`, `moe_expert_mlp`, `moe_expert_mlp_keeping_gate_up` and their gradients) run
  replicated: their rows hold pairs of tokens and experts in an order computed over the whole batch, and an
  expert's weights are read whole. Experts sharded over a mesh are gathered to each rank for them.
  `moe_unpermute` and its gradient also run on rows sharded on the hidden dim (the routing replicated), the
  routing weights' gradient then `Partial`.
- `attention_with_sinks` and its backward run on query, key and value (and the gradients) sharded alike on the
  batch, or on the heads with the sinks sharded with them (the key heads, fewer under GQA, split as evenly);
  the log-sum-exp follows on its batch or heads dim. The sinks' gradient is `Partial` over batch shards.
- `relu_add_with_mask`'s bit mask holds x's elements in C order, so it shards only where x's local
  shards are whole bytes of the mask: x sharded on dim 0 with rows of a multiple of 8 elements,
  evenly over the mesh.

The rules register when `torch.distributed.tensor` is first imported (or at `import fused_ops` if it
already was), so a process that never uses DTensor pays nothing; `register_sharding_rules()` does it
at once.
"""
import functools

import torch

__all__ = ["register_sharding_rules"]


def _normalized(dim, ndim):
    return dim + ndim if dim < 0 else dim


def _placements():
    from torch.distributed.tensor import Partial, Replicate, Shard
    return Partial, Replicate, Shard


def _row_dims(x):
    """Every dim of x but the last (the normalised, or gated, one)."""
    return range(max(x.ndim - 1, 0))


def _elementwise_rules(x, inputs, outputs=1):
    """All inputs shaped like x (or None): replicated, or sharded on any one dim of x alike."""
    _, Replicate, Shard = _placements()

    def like_x(placement):
        return [placement if spec is not None else None for spec in inputs]
    rules = [([Replicate()] * outputs, like_x(Replicate()))]
    rules += [([Shard(d)] * outputs, like_x(Shard(d))) for d in range(x.ndim)]
    return rules


def _relu_add_rules(x, y, bias=0.0):
    _, Replicate, Shard = _placements()
    rules = [([Replicate()], [Replicate(), Replicate(), None])]
    leading = x.ndim - y.ndim
    for d in range(x.ndim):
        y_dim = d - leading
        # y broadcasts along dims it lacks or holds once: there it stays whole on every rank.
        y_placement = Shard(y_dim) if y_dim >= 0 and y.shape[y_dim] == x.shape[d] else Replicate()
        rules.append(([Shard(d)], [Shard(d), y_placement, None]))
    return rules


def _mask_shards_evenly(x):
    """Whether x sharded on dim 0 over its mesh gives each rank whole, equal bytes of the bit mask."""
    if x.ndim == 0 or x.shape[0] == 0:
        return False
    row = 1
    for size in x.shape[1:]:
        row *= size
    ranks = x.mesh.size()
    return x.shape[0] % ranks == 0 and (x.shape[0] // ranks * row) % 8 == 0


def _relu_add_with_mask_rules(x, y, bias=0.0):
    _, Replicate, Shard = _placements()
    rules = [([Replicate(), Replicate()], [Replicate(), Replicate(), None])]
    if _mask_shards_evenly(x):
        y_placement = Shard(0) if y.ndim == x.ndim and y.shape[0] == x.shape[0] else Replicate()
        rules.append(([Shard(0), Shard(0)], [Shard(0), y_placement, None]))
    return rules


def _relu_add_backward_masked_rules(grad, mask):
    _, Replicate, Shard = _placements()
    rules = [([Replicate()], [Replicate(), Replicate()])]
    if _mask_shards_evenly(grad):
        rules.append(([Shard(0)], [Shard(0), Shard(0)]))
    return rules


def _bias_gelu_rules(x, bias, approximate="none"):
    _, Replicate, Shard = _placements()
    rules = [([Replicate()], [Replicate(), Replicate(), None])]
    rules += [([Shard(d)], [Shard(d), Replicate(), None]) for d in _row_dims(x)]
    rules.append(([Shard(x.ndim - 1)], [Shard(x.ndim - 1), Shard(0), None]))
    return rules


def _bias_gelu_backward_rules(grad, x, bias, approximate="none"):
    Partial, Replicate, Shard = _placements()
    rules = [([Replicate(), Replicate()], [Replicate(), Replicate(), Replicate(), None])]
    rules += [([Shard(d), Partial()], [Shard(d), Shard(d), Replicate(), None]) for d in _row_dims(x)]
    last = x.ndim - 1
    rules.append(([Shard(last), Shard(0)], [Shard(last), Shard(last), Shard(0), None]))
    return rules


def _gated_rules(*tensors, options=0):
    """silu_mul / gelu_mul and their backward: rows sharded on any dim but the gated last one."""
    _, Replicate, Shard = _placements()
    x = tensors[-1]
    rules = [([Replicate()], [Replicate()] * len(tensors) + [None] * options)]
    rules += [([Shard(d)], [Shard(d)] * len(tensors) + [None] * options) for d in _row_dims(x)]
    return rules


def _silu_mul_linear_rules(x, weight, bias=None):
    """Rows sharded on any dim but the gated last one with the weight replicated, or the weight's output
    rows sharded (column parallel: the output sharded on its last dim) with x replicated."""
    _, Replicate, Shard = _placements()
    has_bias = bias is not None
    rules = [([Replicate()], [Replicate(), Replicate(), Replicate() if has_bias else None])]
    rules += [([Shard(d)], [Shard(d), Replicate(), Replicate() if has_bias else None]) for d in _row_dims(x)]
    rules.append(([Shard(x.ndim - 1)], [Replicate(), Shard(0), Shard(0) if has_bias else None]))
    return rules


def _silu_mul_linear_backward_rules(grad, x, weight, output_mask):
    """Rows sharded alike in grad and x: x's gradient sharded so, the weight's and bias's Partial;
    gradients not asked for are empty, replicated."""
    Partial, Replicate, Shard = _placements()

    def outputs(grad_x, parameter_gradient):
        return [placement if asked else Replicate()
                for placement, asked in zip((grad_x, parameter_gradient, parameter_gradient), output_mask)]
    rules = [(outputs(Replicate(), Replicate()), [Replicate(), Replicate(), Replicate(), None])]
    rules += [(outputs(Shard(d), Partial()), [Shard(d), Shard(d), Replicate(), None]) for d in _row_dims(x)]
    return rules


def _gated_mul_linear_rules(gate, up, weight, bias=None, activation="silu"):
    """Rows sharded on any dim but the last with the weight replicated; column parallel (weight and bias
    sharded on the output rows, gate and up replicated); row parallel without a bias (gate and up sharded
    on their last dim, the weight on its input columns: each rank's product is a partial sum)."""
    Partial, Replicate, Shard = _placements()
    has_bias = bias is not None
    rules = [([Replicate()], [Replicate(), Replicate(), Replicate(), Replicate() if has_bias else None, None])]
    rules += [([Shard(d)], [Shard(d), Shard(d), Replicate(), Replicate() if has_bias else None, None])
              for d in _row_dims(gate)]
    rules.append(([Shard(gate.ndim - 1)], [Replicate(), Replicate(), Shard(0), Shard(0) if has_bias else None, None]))
    if not has_bias and gate.ndim >= 1:
        last = gate.ndim - 1
        rules.append(([Partial()], [Shard(last), Shard(last), Shard(1), None, None]))
    return rules


def _gated_mul_linear_backward_rules(grad, gate, up, weight, activation, output_mask):
    """Rows sharded alike in grad, gate and up: their gradients sharded so, the weight's and bias's Partial;
    row parallel: gate, up and their gradients sharded on the last dim, the weight's on its input columns,
    the bias's replicated. Gradients not asked for are empty, replicated."""
    Partial, Replicate, Shard = _placements()

    def outputs(gate_up, weight_gradient, bias_gradient):
        return [placement if asked else Replicate()
                for placement, asked in zip((gate_up, gate_up, weight_gradient, bias_gradient), output_mask)]
    rules = [(outputs(Replicate(), Replicate(), Replicate()),
              [Replicate(), Replicate(), Replicate(), Replicate(), None, None])]
    rules += [(outputs(Shard(d), Partial(), Partial()), [Shard(d), Shard(d), Shard(d), Replicate(), None, None])
              for d in _row_dims(gate)]
    last = gate.ndim - 1
    rules.append((outputs(Shard(last), Shard(1), Replicate()),
                  [Replicate(), Shard(last), Shard(last), Shard(1), None, None]))
    return rules


def _norm_rules(x, *others, outputs, gradients=0):
    """A norm: `others` are its residual-like inputs (sharded like x; None where absent) followed by
    its parameters (replicated; None where absent, a weight of None too) as (spec, is_parameter) pairs;
    non-tensor arguments (eps, offset) are None. Rows shard on any dim but the last; parameter gradients
    come out Partial (also the unit weight's of a backward called with weight None)."""
    Partial, Replicate, Shard = _placements()

    def inputs(row_placement, parameter_placement):
        placements = [row_placement]
        for spec, is_parameter in others:
            if spec is None:
                placements.append(None)
            else:
                placements.append(parameter_placement if is_parameter else row_placement)
        return placements
    rules = [([Replicate()] * (outputs + gradients), inputs(Replicate(), Replicate()))]
    for d in _row_dims(x):
        rules.append(([Shard(d)] * outputs + [Partial()] * gradients, inputs(Shard(d), Replicate())))
    return rules


def _rotary_rules(q, k, cos, sin, unsqueeze_dim=1, interleaved=False):
    """q and k (or grad_q and grad_k) sharded alike on batch, heads or sequence; D stays whole."""
    _, Replicate, Shard = _placements()
    heads = unsqueeze_dim + 4 if unsqueeze_dim < 0 else unsqueeze_dim
    sequence = 2 if heads == 1 else 1
    rules = [([Replicate(), Replicate()], [Replicate()] * 4 + [None, None])]
    table_batch = Shard(0) if cos.ndim == 3 and cos.shape[0] == q.shape[0] and q.shape[0] > 1 else Replicate()
    table_sequence = Shard(cos.ndim - 2)
    for dim, table in ((0, table_batch), (heads, Replicate()), (sequence, table_sequence)):
        rules.append(([Shard(dim), Shard(dim)], [Shard(dim), Shard(dim), table, table, None, None]))
    return rules


def _linear_cross_entropy_rules(input, bias, reduction, output_mask=None, grad_loss=None):
    """linear_cross_entropy (output_mask None: the loss alone), its with_gradients op (the loss and three
    gradients) or its backward (grad_loss given: three gradients). Rows shard on a leading dim for
    'sum' and 'none' (the mean's count spans every rank); gradients not asked for are empty, replicated."""
    Partial, Replicate, Shard = _placements()
    gradients = output_mask is not None

    def rule(row, loss, grad_input, parameter_gradient):
        wanted = list(output_mask) if gradients else []
        outputs = [] if grad_loss is not None else [loss]
        outputs += [placement if asked else Replicate()
                    for placement, asked in zip((grad_input, parameter_gradient, parameter_gradient), wanted)]
        arguments = [row, Replicate(), row, Replicate() if bias is not None else None, None, None, None, None]
        if gradients:
            arguments.append(None)
        if grad_loss is not None:
            arguments.insert(0, row if reduction == "none" else Replicate())
        return outputs, arguments
    rules = [rule(Replicate(), Replicate(), Replicate(), Replicate())]
    if reduction in ("sum", "none"):
        for d in range(input.ndim - 1):
            rules.append(rule(Shard(d), Shard(d) if reduction == "none" else Partial(), Shard(d), Partial()))
    return rules


def _linear_log_probs_rules(input, bias, return_entropy=False, output_mask=None, gradients=None,
                            log_sum_exp=False, statistics=(None, None, None)):
    """linear_log_probs (output_mask None: the two results, and with `log_sum_exp` the log-sum-exp third and
    the kept logits fourth) or its backward (`gradients`: the specs of grad_log_probs and grad_entropy,
    `statistics` those of the forward's log_sum_exp, entropy and kept logits, None where absent). Rows shard
    on a leading dim with the head replicated (the kept logits [..., K], K perhaps 0, shard like them); the
    entropy not asked for is an empty tensor, replicated; so are gradients not asked for."""
    Partial, Replicate, Shard = _placements()
    head = [Replicate(), None if bias is None else Replicate()]

    def rule(row, parameter_gradient):
        if output_mask is None:
            outputs = [row, row if return_entropy else Replicate()]
            if log_sum_exp:
                outputs += [row, row]
            return outputs, [row, head[0], row, head[1], None, None, None, None, None] + ([None] if log_sum_exp else [])
        outputs = [placement if asked else Replicate()
                   for placement, asked in zip((row, parameter_gradient, parameter_gradient), output_mask)]
        grads = [None if spec is None else row for spec in gradients]
        saved = [None if spec is None else row for spec in statistics]
        return outputs, grads + [row, head[0], row, head[1], None, None, None, None, None] + saved
    rules = [rule(Replicate(), Replicate())]
    rules += [rule(Shard(d), Partial()) for d in range(input.ndim - 1)]
    return rules


def _replicated(*arguments, outputs=1):
    """Every tensor argument (a DTensor's spec; None or a plain value otherwise) and every output replicated."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    _, Replicate, _ = _placements()
    return [([Replicate()] * outputs, [Replicate() if isinstance(a, DTensorSpec) else None for a in arguments])]


def _moe_unpermute_rules(rows, order, offsets, top_k, routing_weights=None, grad=None, output_mask=None):
    """moe_unpermute (grad None) or its backward: replicated, or the rows (and grad) sharded on the hidden dim."""
    Partial, Replicate, Shard = _placements()
    weights = None if routing_weights is None else Replicate()
    if grad is None:
        rules = _replicated(rows, order, offsets, top_k, routing_weights)
        return rules + [([Shard(1)], [Shard(1), Replicate(), Replicate(), None, weights])]
    rules = _replicated(grad, rows, order, offsets, top_k, routing_weights, output_mask, outputs=2)
    rows_placement = None if rows is None else Shard(1)
    outputs = [Shard(1) if output_mask[0] else Replicate(),
               Partial() if output_mask[1] and routing_weights is not None else Replicate()]
    return rules + [(outputs, [Shard(1), rows_placement, Replicate(), Replicate(), None, weights, None])]


def _attention_with_sinks_rules(query, key, value, sinks, scale, window=0, grad=None):
    """attention_with_sinks (grad None: output and log-sum-exp) or its backward (grad, then the forward's
    arguments, its output and log-sum-exp: four gradients): on batch or head shards."""
    Partial, Replicate, Shard = _placements()

    def rule(rows, sinks_placement, log_sum_exp, sinks_gradient):
        tensors = [rows, rows, rows, sinks_placement]
        if grad is None:
            return [rows, log_sum_exp], tensors + [None, None]
        return [rows, rows, rows, sinks_gradient], [rows] + tensors + [rows, log_sum_exp, None, None]
    return [rule(Replicate(), Replicate(), Replicate(), Replicate()),
            rule(Shard(0), Replicate(), Shard(0), Partial()),
            rule(Shard(2), Shard(0), Shard(1), Shard(0))]


def _tensor(spec):
    return spec, False


def _parameter(spec):
    return spec, True


def _non_tensor():
    return None, False


def register_sharding_rules():
    """Register every op's rules with DTensor (once; later calls do nothing)."""
    _register_once()


@functools.lru_cache(maxsize=None)
def _register_once():
    from torch.distributed.tensor.experimental import register_sharding

    ops = torch.ops.fused

    def rule(op):
        return register_sharding(op.default)

    rule(ops.relu_add)(_relu_add_rules)
    rule(ops.relu_add_backward)(lambda grad, x: _elementwise_rules(x, [grad, x]))
    rule(ops.relu_add_with_mask)(_relu_add_with_mask_rules)
    rule(ops.relu_add_backward_masked)(_relu_add_backward_masked_rules)
    rule(ops.bias_gelu)(_bias_gelu_rules)
    rule(ops.bias_gelu_backward)(_bias_gelu_backward_rules)
    rule(ops.silu_mul)(lambda x: _gated_rules(x))
    rule(ops.silu_mul_backward)(lambda grad, x: _gated_rules(grad, x))
    rule(ops.silu_mul_linear)(_silu_mul_linear_rules)
    rule(ops.silu_mul_linear_backward)(_silu_mul_linear_backward_rules)
    rule(ops.gelu_mul)(lambda x, approximate="none": _gated_rules(x, options=1))
    rule(ops.gelu_mul_backward)(lambda grad, x, approximate="none": _gated_rules(grad, x, options=1))
    rule(ops.gated_mul)(lambda gate, up, activation="silu": _elementwise_rules(gate, [gate, up, None]))
    rule(ops.gated_mul_backward)(
        lambda grad, gate, up, activation="silu": _elementwise_rules(gate, [grad, gate, up, None], outputs=2))
    rule(ops.gated_mul_linear)(_gated_mul_linear_rules)
    rule(ops.gated_mul_linear_backward)(_gated_mul_linear_backward_rules)
    rule(ops.rms_norm)(lambda x, weight, eps=1e-6, offset=0.0: _norm_rules(
        x, _parameter(weight), _non_tensor(), _non_tensor(), outputs=1))
    rule(ops.add_rms_norm)(lambda x, residual, weight, eps=1e-6, offset=0.0: _norm_rules(
        x, _tensor(residual), _parameter(weight), _non_tensor(), _non_tensor(), outputs=2))
    rule(ops.rms_norm_backward)(lambda grad, x, weight, eps, grad_residual=None, offset=0.0: _norm_rules(
        grad, _tensor(x), _parameter(weight), _non_tensor(), _tensor(grad_residual), _non_tensor(), outputs=1,
        gradients=1))
    rule(ops.layer_norm)(lambda x, weight, bias=None, eps=1e-5, offset=0.0: _norm_rules(
        x, _parameter(weight), _parameter(bias), _non_tensor(), _non_tensor(), outputs=1))
    rule(ops.add_layer_norm)(lambda x, residual, weight, bias=None, eps=1e-5, offset=0.0: _norm_rules(
        x, _tensor(residual), _parameter(weight), _parameter(bias), _non_tensor(), _non_tensor(), outputs=2))
    rule(ops.layer_norm_backward)(lambda grad, x, weight, eps, grad_residual=None, offset=0.0: _norm_rules(
        grad, _tensor(x), _parameter(weight), _non_tensor(), _tensor(grad_residual), _non_tensor(), outputs=1,
        gradients=2))
    rule(ops.rotary_embedding)(_rotary_rules)
    rule(ops.rotary_embedding_backward)(_rotary_rules)
    rule(ops.linear_cross_entropy)(
        lambda input, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0, reduction="mean",
        softcap=0.0: _linear_cross_entropy_rules(input, bias, reduction))
    rule(ops.linear_cross_entropy_with_gradients)(
        lambda input, weight, target, bias, ignore_index, label_smoothing, reduction, softcap, output_mask:
        _linear_cross_entropy_rules(input, bias, reduction, output_mask))
    rule(ops.linear_cross_entropy_backward)(
        lambda grad_loss, input, weight, target, bias, ignore_index, label_smoothing, reduction, softcap, output_mask:
        _linear_cross_entropy_rules(input, bias, reduction, output_mask, grad_loss))
    rule(ops.linear_log_probs)(
        lambda input, weight, target, bias=None, temperature=1.0, ignore_index=-100, return_entropy=False,
        logit_scale=1.0, softcap=0.0: _linear_log_probs_rules(input, bias, return_entropy))
    rule(ops.linear_log_probs_with_log_sum_exp)(
        lambda input, weight, target, bias, temperature, ignore_index, return_entropy, logit_scale, softcap,
        kept_classes=0: _linear_log_probs_rules(input, bias, return_entropy, log_sum_exp=True))
    rule(ops.linear_log_probs_backward)(
        lambda grad_log_probs, grad_entropy, input, weight, target, bias, temperature, ignore_index, output_mask,
        logit_scale=1.0, softcap=0.0, log_sum_exp=None, entropy=None, kept_logits=None: _linear_log_probs_rules(
            input, bias, output_mask=output_mask, gradients=(grad_log_probs, grad_entropy),
            statistics=(log_sum_exp, entropy, kept_logits)))
    rule(ops.moe_permute)(lambda top_k_index, num_experts: _replicated(top_k_index, num_experts, outputs=2))
    rule(ops.moe_expert_mlp)(lambda *arguments: _replicated(*arguments))
    rule(ops.moe_expert_mlp_keeping_gate_up)(lambda *arguments: _replicated(*arguments, outputs=2))
    rule(ops.moe_expert_mlp_backward)(lambda *arguments: _replicated(*arguments, outputs=6))
    rule(ops.moe_unpermute)(_moe_unpermute_rules)
    rule(ops.attention_with_sinks)(_attention_with_sinks_rules)
    rule(ops.attention_with_sinks_backward)(
        lambda grad, query, key, value, sinks, output, log_sum_exp, scale, window: _attention_with_sinks_rules(
            query, key, value, sinks, scale, window, grad=grad))
    rule(ops.moe_unpermute_backward)(
        lambda grad, rows, order, offsets, top_k, routing_weights, output_mask: _moe_unpermute_rules(
            rows, order, offsets, top_k, routing_weights, grad=grad, output_mask=output_mask))
    return True
