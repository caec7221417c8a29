"""What each process of tests/test_distributed.py runs (an importable module: spawned processes import
their target by name). Every check compares against the same computation on full tensors in the same
process, in float64."""
import os
import sys

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(rank, world, rendezvous, device, checks, finished):
    """Entry point of one spawned process: join the group (rendezvous through the file `rendezvous`),
    run each (check, args) of `checks` in turn, rank 0 appending each finished check's name to the file
    `finished`, leave. A check that fails ends the process (and spawn ends the others)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    import fused_ops  # noqa: F401  (registers the ops; the sharding rules join with DTensor)
    for check, args in checks:
        globals()[check](device, *args)
        dist.barrier()
        if rank == 0:
            with open(finished, "a") as file:
                file.write(check_id(check, args) + "\n")
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: after a clean finish, a gloo process that used DTensor
    # aborts there now and then ("terminate called without an active exception") in torch's own
    # static destructors, which would fail a passing test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def check_id(check, args):
    """One line naming a check and its arguments."""
    return f"{check}{args!r}".replace("\n", " ")


# ---- every op on DTensors

def _case_inputs(spec, shape, device, generator):
    return [torch.randn(input_shape, generator=generator, dtype=torch.float64).to(device)
            for input_shape in spec.input_shapes(list(shape))]


def _placements_for(spec, inputs, mesh, dims):
    """One placement per mesh dim for each input: inputs shaped like the first are sharded on `dims`
    (None: replicated), the others (bias, weight: 1-D) replicated."""
    from torch.distributed.tensor import Replicate, Shard
    x = inputs[0]
    result = []
    for tensor in inputs:
        if dims is None or tensor.shape != x.shape:
            result.append([Replicate()] * mesh.ndim)
        else:
            result.append([Shard(d) for d in dims])
    return result


def ops_on_dtensors(device, mesh_shape, op_names):
    """Each op of the registry on DTensors of every placement of its inputs, against the op on the full
    tensors: forward values, then gradients through every output. The placements the op's rule runs
    locally must come out sharded as the input was (no redistribution); the others are redistributed
    by DTensor and still give the full-tensor result."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from op_specs import OPS_BY_NAME, as_outputs

    mesh = init_device_mesh(device, mesh_shape)
    shape = (4 * mesh.size(), 6, 8)  # every dim divisible where it is sharded (two mesh dims: 2 x 2)
    for name in op_names:
        spec = OPS_BY_NAME[name]
        options = {option: values[0] for option, values in spec.options.items()}  # first choice, or range start
        generator = torch.Generator().manual_seed(0)
        inputs = _case_inputs(spec, shape, device, generator)
        full = [t.clone().requires_grad_(True) for t in inputs]
        expected = as_outputs(spec.fused(*full, **options))
        grad_outputs = [torch.randn(out.shape, generator=generator, dtype=torch.float64).to(device)
                        for out in expected]
        expected_grads = torch.autograd.grad(expected, full, grad_outputs)
        ndim = inputs[0].ndim
        # Replicated; each dim alone on a 1-D mesh; pairs of dims on a 2-D mesh.
        if mesh.ndim == 1:
            layouts = [None] + [(d,) for d in range(ndim)]
        else:
            layouts = [None] + [(a, b) for a in range(ndim) for b in range(ndim)]
        for dims in layouts:
            placements = _placements_for(spec, inputs, mesh, dims)
            sharded = [distribute_tensor(t, mesh, p).requires_grad_(True) for t, p in zip(inputs, placements)]
            with torch.no_grad():
                outputs = as_outputs(spec.fused(*sharded, **options))
            for out, want in zip(outputs, expected):
                assert isinstance(out, DTensor), (name, dims)
                torch.testing.assert_close(out.full_tensor(), want.detach(), rtol=1e-12, atol=1e-12,
                                           msg=lambda m: f"{name} on {placements}: {m}")
            if dims is not None and all(runs_locally(spec, d, ndim) for d in dims):
                for out in outputs:
                    assert list(out.placements) == [Shard(d) for d in dims], (name, dims, out.placements)
            outputs = as_outputs(spec.fused(*sharded, **options))
            grads = torch.autograd.grad(
                outputs, sharded, [distribute_tensor(g, mesh, out.placements) for g, out in zip(grad_outputs, outputs)])
            for grad, want in zip(grads, expected_grads):
                torch.testing.assert_close(grad.full_tensor(), want, rtol=1e-10, atol=1e-10,
                                           msg=lambda m: f"{name} gradient on {placements}: {m}")


def norm_weight_forms_on_dtensors(device):
    """The norms with a weight offset and with weight None on rows sharded on each leading dim (weight and
    bias replicated), and the backward ops given weight None: values and gradients against the full tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from op_specs import OPS_BY_NAME, NormCase

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    shape = (2 * mesh.size(), 6, 8)
    for name in ("rms_norm", "add_rms_norm", "layer_norm", "add_layer_norm"):
        for weight_form in ("one_plus_weight", "none"):
            case = NormCase(OPS_BY_NAME[name], bias="layer" in name, weight_form=weight_form)
            torch.manual_seed(0)
            inputs = [t.to(device) for t in case.inputs(shape, torch.float64, "cpu")]
            full = [t.clone().requires_grad_(True) for t in inputs]
            expected = case.fused(*full)
            grad_outputs = [torch.randn(out.shape, dtype=torch.float64).to(device) for out in expected]
            expected_grads = torch.autograd.grad(expected, full, grad_outputs)
            for dim in (0, 1):
                sharded = [distribute_tensor(t, mesh, [Shard(dim)] if t.dim() == 3 else [Replicate()])
                           .requires_grad_(True) for t in inputs]
                outputs = case.fused(*sharded)
                for out, want in zip(outputs, expected, strict=True):
                    assert list(out.placements) == [Shard(dim)], (name, weight_form, out.placements)
                    torch.testing.assert_close(out.full_tensor(), want.detach(), rtol=1e-12, atol=1e-12)
                grads = torch.autograd.grad(outputs, sharded, [distribute_tensor(g, mesh, [Shard(dim)])
                                                               for g in grad_outputs])
                for grad, want in zip(grads, expected_grads, strict=True):
                    torch.testing.assert_close(grad.full_tensor(), want, rtol=1e-10, atol=1e-10)
    grad, x = torch.randn(shape, dtype=torch.float64).to(device), torch.randn(shape, dtype=torch.float64).to(device)
    for backward in (torch.ops.fused.rms_norm_backward, torch.ops.fused.layer_norm_backward):
        expected = backward(grad, x, None, 1e-5)
        results = backward(distribute_tensor(grad, mesh, [Shard(0)]), distribute_tensor(x, mesh, [Shard(0)]), None,
                           1e-5)
        for result, want in zip(results, expected, strict=True):
            torch.testing.assert_close(result.full_tensor(), want, rtol=1e-10, atol=1e-10)


def relu_add_backward_on_dtensors(device):
    """relu_add_backward(grad, x), which autograd does not call (it keeps a bit mask instead of x), on
    DTensors sharded on each dim."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh(device, (dist.get_world_size(),))
    generator = torch.Generator().manual_seed(0)
    grad, x = (torch.randn(4, 6, 8, generator=generator, dtype=torch.float64).to(device) for _ in range(2))
    expected = torch.ops.fused.relu_add_backward(grad, x)
    for dim in range(3):
        out = torch.ops.fused.relu_add_backward(distribute_tensor(grad, mesh, [Shard(dim)]),
                                                distribute_tensor(x, mesh, [Shard(dim)]))
        assert list(out.placements) == [Shard(dim)]
        torch.testing.assert_close(out.full_tensor(), expected, rtol=0, atol=0)


def rotary_on_dtensors(device):
    """rotary_embedding on q and k sharded alike on batch, heads or sequence (cos and sin as the rule
    wants them), and on the head dim (redistributed), against the full tensors: values and gradients."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import fused_ops
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    ranks = dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2 * ranks, 2 * ranks, 3 * ranks, 8, generator=generator, dtype=torch.float64).to(device)
    k = torch.randn(2 * ranks, ranks, 3 * ranks, 8, generator=generator, dtype=torch.float64).to(device)
    cos = torch.randn(2 * ranks, 3 * ranks, 4, generator=generator, dtype=torch.float64).to(device)
    sin = torch.randn(2 * ranks, 3 * ranks, 4, generator=generator, dtype=torch.float64).to(device)
    grads = [torch.randn(t.shape, generator=generator, dtype=torch.float64).to(device) for t in (q, k)]
    leaves = [t.clone().requires_grad_(True) for t in (q, k)]
    expected = fused_ops.rotary_embedding(*leaves, cos, sin)
    expected_grads = torch.autograd.grad(expected, leaves, grads)
    for dim, table, local in ((0, Shard(0), True), (1, Replicate(), True), (2, Shard(1), True), (3, Replicate(), False)):
        sharded = [distribute_tensor(t, mesh, [Shard(dim)]).requires_grad_(True) for t in (q, k)]
        outs = fused_ops.rotary_embedding(*sharded, distribute_tensor(cos, mesh, [table]),
                                          distribute_tensor(sin, mesh, [table]))
        for out, want in zip(outs, expected):
            if local:
                assert list(out.placements) == [Shard(dim)], (dim, out.placements)
            torch.testing.assert_close(out.full_tensor(), want.detach(), rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(outs, sharded, [distribute_tensor(g, mesh, out.placements)
                                                  for g, out in zip(grads, outs)])
        for grad, want in zip(got, expected_grads):
            torch.testing.assert_close(grad.full_tensor(), want, rtol=1e-12, atol=1e-12)


def linear_cross_entropy_on_dtensors(device):
    """linear_cross_entropy on rows sharded on each leading dim with the head replicated: 'sum' gives a
    Partial loss and 'none' a sharded one, with no communication; 'mean' is redistributed. Values and
    the gradients of input, weight and bias against the full tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import fused_ops
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    ranks = dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2 * ranks, 3 * ranks, 8, generator=generator, dtype=torch.float64).to(device)
    weight = torch.randn(11, 8, generator=generator, dtype=torch.float64).to(device)
    bias = torch.randn(11, generator=generator, dtype=torch.float64).to(device)
    target = torch.randint(0, 11, (2 * ranks, 3 * ranks), generator=generator)
    target[0, 1] = -100
    target = target.to(device)
    for reduction in ("sum", "none", "mean"):
        leaves = [t.clone().requires_grad_(True) for t in (x, weight, bias)]
        expected = fused_ops.linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], reduction=reduction)
        grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64).to(device)
        expected_grads = torch.autograd.grad(expected, leaves, grad)
        for dim in (0, 1):
            inputs = [distribute_tensor(x, mesh, [Shard(dim)]).requires_grad_(True),
                      distribute_tensor(weight, mesh, [Replicate()]).requires_grad_(True),
                      distribute_tensor(bias, mesh, [Replicate()]).requires_grad_(True)]
            loss = fused_ops.linear_cross_entropy(inputs[0], inputs[1], distribute_tensor(target, mesh, [Shard(dim)]),
                                                  inputs[2], reduction=reduction)
            if reduction != "mean":
                assert list(loss.placements) == [Shard(dim) if reduction == "none" else Partial()], loss.placements
            torch.testing.assert_close(loss.full_tensor(), expected.detach(), rtol=1e-12, atol=1e-12)
            got = torch.autograd.grad(loss, inputs, distribute_tensor(grad, mesh, loss.placements)
                                      if reduction == "none" else distribute_tensor(grad, mesh, [Replicate()]))
            for value, want in zip(got, expected_grads):
                torch.testing.assert_close(value.full_tensor(), want, rtol=1e-10, atol=1e-10)


def linear_log_probs_on_dtensors(device):
    """linear_log_probs (a logit scale and a softcap) on rows sharded on each leading dim with the head
    replicated: both results come out sharded like the target, with no communication, with and without the
    forward's kept logits. Values and the gradients of input, weight and bias through both results against the
    full tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import fused_ops
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    ranks = dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2 * ranks, 3 * ranks, 8, generator=generator, dtype=torch.float64).to(device)
    weight = torch.randn(11, 8, generator=generator, dtype=torch.float64).to(device)
    bias = torch.randn(11, generator=generator, dtype=torch.float64).to(device)
    target = torch.randint(0, 11, (2 * ranks, 3 * ranks), generator=generator)
    target[0, 1] = -100
    target = target.to(device)
    leaves = [t.clone().requires_grad_(True) for t in (x, weight, bias)]
    head = dict(temperature=0.7, return_entropy=True, logit_scale=0.5, softcap=3.0)
    expected = fused_ops.linear_log_probs(leaves[0], leaves[1], target, leaves[2], **head)
    grads = [torch.randn(target.shape, generator=generator, dtype=torch.float64).to(device) for _ in range(2)]
    expected_grads = torch.autograd.grad(expected, leaves, grads)
    # Without kept logits, and with every class's kept (sharded like the rows).
    for kept, dim in ((kept, dim) for kept in ("0", "256") for dim in (0, 1)):
        os.environ["FUSED_OPS_KEPT_CLASSES"] = kept
        inputs = [distribute_tensor(x, mesh, [Shard(dim)]).requires_grad_(True),
                  distribute_tensor(weight, mesh, [Replicate()]).requires_grad_(True),
                  distribute_tensor(bias, mesh, [Replicate()]).requires_grad_(True)]
        outs = fused_ops.linear_log_probs(inputs[0], inputs[1], distribute_tensor(target, mesh, [Shard(dim)]),
                                          inputs[2], **head)
        for out, want in zip(outs, expected):
            assert list(out.placements) == [Shard(dim)], out.placements
            torch.testing.assert_close(out.full_tensor(), want.detach(), rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(outs, inputs, [distribute_tensor(g, mesh, [Shard(dim)]) for g in grads])
        for value, want in zip(got, expected_grads):
            torch.testing.assert_close(value.full_tensor(), want, rtol=1e-10, atol=1e-10)
    os.environ.pop("FUSED_OPS_KEPT_CLASSES")


def moe_experts_on_dtensors(device):
    """The experts' ops with the experts' weights sharded by expert (Shard(0)) and the tokens replicated: the
    rules gather the weights and the result is the full computation's, values and every gradient; the weighted
    un-permute on rows sharded on the hidden dim stays sharded so, the routing weights' gradient Partial."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import fused_ops
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    ranks = dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    experts, tokens, hidden, top_k = 2 * ranks, 7, 8, 2
    x = torch.randn(tokens, hidden, generator=generator, dtype=torch.float64).to(device)
    index = torch.randint(0, experts, (tokens, top_k), generator=generator).to(device)
    weights = torch.rand(tokens, top_k, generator=generator, dtype=torch.float64).to(device)
    gate_up = torch.randn(experts, 8, hidden, generator=generator, dtype=torch.float64).to(device)
    down = torch.randn(experts, hidden, 4, generator=generator, dtype=torch.float64).to(device)
    leaves = [t.clone().requires_grad_(True) for t in (x, weights, gate_up, down)]
    expected = fused_ops.moe_experts(leaves[0], index, *leaves[1:])
    grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64).to(device)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    placements = [[Replicate()], [Replicate()], [Shard(0)], [Shard(0)]]
    for recompute in (True, False):  # False: the kept gate/up product goes through the rules too
        inputs = [distribute_tensor(t, mesh, p).requires_grad_(True)
                  for t, p in zip((x, weights, gate_up, down), placements)]
        out = fused_ops.moe_experts(inputs[0], distribute_tensor(index, mesh, [Replicate()]), *inputs[1:],
                                    recompute=recompute)
        torch.testing.assert_close(out.full_tensor(), expected.detach(), rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(out, inputs, distribute_tensor(grad, mesh, [Replicate()]))
        for value, want in zip(got, expected_grads):
            torch.testing.assert_close(value.full_tensor(), want, rtol=1e-10, atol=1e-10)
    order, offsets = fused_ops.moe_permute(index, experts)
    rows = torch.randn(tokens * top_k, 2 * ranks, generator=generator, dtype=torch.float64).to(device)
    rows_leaf, weights_leaf = rows.clone().requires_grad_(True), weights.clone().requires_grad_(True)
    expected = fused_ops.moe_unpermute(rows_leaf, order, offsets, top_k, weights_leaf)
    grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64).to(device)
    expected_grads = torch.autograd.grad(expected, (rows_leaf, weights_leaf), grad)
    sharded = [distribute_tensor(rows, mesh, [Shard(1)]).requires_grad_(True),
               distribute_tensor(weights, mesh, [Replicate()]).requires_grad_(True)]
    replicated = [distribute_tensor(t, mesh, [Replicate()]) for t in (order, offsets)]
    out = fused_ops.moe_unpermute(sharded[0], *replicated, top_k, sharded[1])
    assert list(out.placements) == [Shard(1)], out.placements
    torch.testing.assert_close(out.full_tensor(), expected.detach(), rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(out, sharded, distribute_tensor(grad, mesh, [Shard(1)]))
    assert list(got[0].placements) == [Shard(1)] and isinstance(got[1].placements[0], (Partial, Replicate))
    for value, want in zip(got, expected_grads):
        torch.testing.assert_close(value.full_tensor(), want, rtol=1e-10, atol=1e-10)


def attention_with_sinks_on_dtensors(device):
    """attention_with_sinks on query, key and value sharded alike on the batch (sinks replicated) and on the heads
    (sinks sharded with them): outputs sharded so, with no communication, and values and gradients against the
    full tensors; the sinks' gradient over batch shards Partial."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    import fused_ops
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    ranks = dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    shapes = [(2 * ranks, 7, 4 * ranks, 8), (2 * ranks, 7, 2 * ranks, 8), (2 * ranks, 7, 2 * ranks, 8), (4 * ranks,)]
    full = [torch.randn(shape, generator=generator, dtype=torch.float64).to(device) for shape in shapes]
    leaves = [t.clone().requires_grad_(True) for t in full]
    expected = fused_ops.attention_with_sinks(*leaves, 0.3, 3)
    grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64).to(device)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    for rows, sinks in ((Shard(0), Replicate()), (Shard(2), Shard(0))):
        inputs = [distribute_tensor(t, mesh, [rows if t.dim() == 4 else sinks]).requires_grad_(True) for t in full]
        out = fused_ops.attention_with_sinks(*inputs, 0.3, 3)
        assert list(out.placements) == [rows], out.placements
        torch.testing.assert_close(out.full_tensor(), expected.detach(), rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(out, inputs, distribute_tensor(grad, mesh, [rows]))
        assert isinstance(got[3].placements[0], (Partial, Replicate) if rows == Shard(0) else Shard), got[3].placements
        for value, want in zip(got, expected_grads):
            torch.testing.assert_close(value.full_tensor(), want, rtol=1e-10, atol=1e-10)


def silu_mul_linear_on_dtensors(device):
    """silu_mul_linear on rows sharded on each leading dim (weight replicated) and on a replicated x
    with the weight sharded on its output rows: the placements its rules give, with no communication,
    and values and gradients against the full tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    import fused_ops
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    ranks = dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2 * ranks, 3 * ranks, 8, generator=generator, dtype=torch.float64).to(device)
    weight = torch.randn(5 * ranks, 4, generator=generator, dtype=torch.float64).to(device)
    bias = torch.randn(5 * ranks, generator=generator, dtype=torch.float64).to(device)
    leaves = [t.clone().requires_grad_(True) for t in (x, weight, bias)]
    expected = fused_ops.silu_mul_linear(*leaves)
    grad = torch.randn(expected.shape, generator=generator, dtype=torch.float64).to(device)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    layouts = [([Shard(0)], [Replicate()], [Shard(0)]), ([Shard(1)], [Replicate()], [Shard(1)]),
               ([Replicate()], [Shard(0)], [Shard(2)])]
    for x_placement, weight_placement, out_placement in layouts:
        inputs = [distribute_tensor(x, mesh, x_placement).requires_grad_(True),
                  distribute_tensor(weight, mesh, weight_placement).requires_grad_(True),
                  distribute_tensor(bias, mesh, weight_placement).requires_grad_(True)]
        out = fused_ops.silu_mul_linear(*inputs)
        assert list(out.placements) == out_placement, out.placements
        torch.testing.assert_close(out.full_tensor(), expected.detach(), rtol=1e-12, atol=1e-12)
        got = torch.autograd.grad(out, inputs, distribute_tensor(grad, mesh, out.placements))
        for value, want in zip(got, expected_grads):
            torch.testing.assert_close(value.full_tensor(), want, rtol=1e-10, atol=1e-10)


def runs_locally(spec, dim, ndim):
    """Whether the op's rule runs x sharded on `dim` with no communication: every dim for the
    elementwise ops, bias_gelu and gated_mul, every dim but the last for the ops that split or reduce it."""
    if spec.name in ("relu_add", "bias_gelu", "gated_mul"):
        return True
    return dim != ndim - 1


def unsupported_placement_is_redistributed(device):
    """silu_mul of x sharded on the dim it splits in halves: DTensor gathers that dim first (the local
    halves would pair the wrong elements), and the result is the full-tensor one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import fused_ops
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    x = torch.randn(4, 2 * 8 * dist.get_world_size(), generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64).to(device)
    out = fused_ops.silu_mul(distribute_tensor(x, mesh, [Shard(1)]))
    assert list(out.placements) != [Shard(1)], out.placements  # gathered first, not halved locally
    torch.testing.assert_close(out.full_tensor(), fused_ops.silu_mul(x), rtol=0, atol=0)


# ---- the TP + SP + FSDP2 training step

def training_step_matches_one_process(device, mesh_shape, compile_backend):
    """One step of scripts/train_distributed.py's model, parallelised over a (dp, tp) mesh, against the
    same model on the full batch in this process: loss and every parameter's gradient."""
    from torch.distributed.device_mesh import init_device_mesh

    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import train_distributed as train

    mesh = init_device_mesh(device, mesh_shape, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    reference = train.TinyLlama(vocab=96, dim=32, heads=4, hidden=64, layers=2, max_sequence=16)
    reference = reference.to(device=device, dtype=torch.float64)
    model = train.TinyLlama(vocab=96, dim=32, heads=4, hidden=64, layers=2, max_sequence=16)
    model = model.to(device=device, dtype=torch.float64)
    model.load_state_dict(reference.state_dict())
    model = train.parallelize(model, mesh, compile_blocks=compile_backend is not None,
                              compile_backend=compile_backend or "inductor")
    tokens = torch.randint(0, 96, (4, 17), generator=torch.Generator().manual_seed(1)).to(device)

    expected_loss = train.loss_of(reference, tokens)
    expected_loss.backward()
    loss = train.loss_of(model, train.dp_batch(tokens, mesh))
    loss.backward()
    global_loss = loss.detach().clone()
    dist.all_reduce(global_loss)  # every tp rank of a dp group holds its group's loss
    torch.testing.assert_close(global_loss / dist.get_world_size(), expected_loss.detach(), rtol=1e-10, atol=1e-12)
    expected_grads = dict(reference.named_parameters())
    checked = 0
    for name, parameter in model.named_parameters():
        name = name.replace("_orig_mod.", "")
        grad = parameter.grad.full_tensor()
        torch.testing.assert_close(grad, expected_grads[name].grad, rtol=1e-9, atol=1e-11, msg=lambda m: f"{name}: {m}")
        checked += 1
    assert checked == len(expected_grads)


# ---- a fused Hugging Face model under FSDP2 and under DDP

def _tiny_llama_and_fused(device, hidden):
    """A tiny Llama of width `hidden` and a fused copy of it."""
    import copy

    import transformers

    import fused_ops

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 3 // 2, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                      max_position_embeddings=64)
    reference = transformers.LlamaForCausalLM(config).to(device)
    model = fused_ops.fuse(copy.deepcopy(reference))
    assert model.fused_ops_report.counts()["gated_mlp"] == 2
    return reference, model


def _steps_match_one_process(reference, model, call, full_gradient):
    """Two steps of `call` (the distributed model) on this process's half of a batch against `reference`
    on the whole batch: the loss, every gradient (`full_gradient` of the local one) and the loss after one
    optimizer step. The step is SGD with momentum (its state is sharded as AdamW's is): AdamW's first step
    divides each gradient by its own magnitude plus eps, so a gradient of rounding-noise size (the halves
    and the whole batch add in different orders) moves its weight by up to the learning rate, and the next
    step's gradients differ past the tolerances."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-1, momentum=0.9) for m in (reference, model)]
    device = next(reference.parameters()).device
    tokens = torch.randint(0, 101, (4, 12), generator=torch.Generator().manual_seed(1)).to(device)
    local = tokens.chunk(dist.get_world_size())[dist.get_rank()]
    for step in range(2):
        expected = reference(input_ids=tokens, labels=tokens).loss
        loss = call(input_ids=local, labels=local).loss
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)  # equal token counts per process: the mean of the means
        torch.testing.assert_close(global_loss / dist.get_world_size(), expected.detach(), rtol=1e-5, atol=1e-6)
        expected.backward()
        loss.backward()
        expected_grads = dict(reference.named_parameters())
        for name, parameter in model.named_parameters():
            torch.testing.assert_close(full_gradient(parameter.grad), expected_grads[name].grad, rtol=1e-4,
                                       atol=1e-6, msg=lambda m: f"step {step}, {name}: {m}")
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()


def fused_hugging_face_model_under_fsdp2(device, compile_backend=None):
    """A tiny Llama after fused_ops.fuse(), fully_shard per decoder layer and at the root, over the
    processes' halves of a batch, against the stock model on the whole batch in this process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    reference, model = _tiny_llama_and_fused(device, 64)
    mesh = init_device_mesh(device, (dist.get_world_size(),))  # without one, a visible GPU takes the shards
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
        if compile_backend is not None:  # each sharded layer compiled, its norms recomputed in the backward
            layer.compile(backend=compile_backend, fullgraph=True)
    fully_shard(model, mesh=mesh)
    _steps_match_one_process(reference, model, model, lambda gradient: gradient.full_tensor())


def fused_hugging_face_model_compiled_under_ddp(device):
    """A tiny Llama after fused_ops.fuse(), in DistributedDataParallel with 1 MB buckets, compiled whole:
    Dynamo's DDP optimizer splits the graph at the buckets, each piece with the layers' norm-recompute
    regions it holds, and the processes' halves of a batch train as the stock model on the whole batch."""
    from torch._dynamo.backends.debugging import aot_eager

    reference, model = _tiny_llama_and_fused(device, 256)
    regions = []
    checkpoint = torch.ops.higher_order.tag_activation_checkpoint

    def backend(graph, example_inputs):  # aot_eager, counting the pieces and their regions
        regions.append(sum(node.target is checkpoint for node in graph.graph.nodes))
        return aot_eager(graph, example_inputs)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    _steps_match_one_process(reference, model, torch.compile(ddp, backend=backend), lambda gradient: gradient)
    assert len(regions) > 1 and sum(regions) == 4, regions  # split; two regions in each of the two layers


def token_log_probs_under_fsdp2(device, wrapper):
    """fused_ops.token_log_probs of a tiny fused Llama under FSDP2 (`wrapper` "fsdp2": fully_shard per
    layer and at the root) or DDP ("ddp"), over the processes' halves of a batch: the weighted loss of
    the log-probabilities and entropy and every gradient match the stock logits' on the whole batch in
    one process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import fused_ops.rl

    reference, model = _tiny_llama_and_fused(device, 64)
    if wrapper == "fsdp2":
        mesh = init_device_mesh(device, (dist.get_world_size(),))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        call, full_gradient = model, lambda gradient: gradient.full_tensor()
    else:
        call, full_gradient = torch.nn.parallel.DistributedDataParallel(model), lambda gradient: gradient
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 101, (4, 12), generator=generator).to(device)
    mask = torch.ones_like(tokens)
    mask[1, :4] = 0
    weights = torch.randn(4, 11, generator=generator).to(device)
    logits = reference(input_ids=tokens, attention_mask=mask).logits[:, :-1] / 0.7
    log_p = torch.log_softmax(logits.float(), -1)
    expected = log_p.gather(-1, tokens[:, 1:, None]).squeeze(-1) * mask[:, 1:]
    entropy = -(log_p.exp() * log_p).sum(-1) * mask[:, 1:]
    ((weights * (expected - 0.1 * entropy)).sum() / tokens.numel()).backward()
    rows = tokens.chunk(dist.get_world_size())[dist.get_rank()]
    local = slice(dist.get_rank() * rows.shape[0], (dist.get_rank() + 1) * rows.shape[0])
    log_probs, local_entropy = fused_ops.rl.token_log_probs(call, rows, mask[local], temperature=0.7,
                                                            return_entropy=True)
    torch.testing.assert_close(log_probs, expected[local].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(local_entropy, entropy[local].detach(), rtol=1e-5, atol=1e-5)
    # FSDP2 and DDP average the processes' gradients: each process's loss is over its share of the tokens.
    ((weights[local] * (log_probs - 0.1 * local_entropy)).sum() / rows.numel()).backward()
    expected_grads = dict(reference.named_parameters())
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(full_gradient(parameter.grad), expected_grads[name].grad, rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
