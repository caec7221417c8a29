"""Train a small Llama-style model built from fused_ops.nn with tensor, sequence and data parallelism
(FSDP2) for a few steps on random tokens; prints the loss and tokens/s.

    torchrun --nproc-per-node N scripts/train_distributed.py [--tp T] [--steps 10] [--compile]

N processes form a (N / T) x T mesh: FSDP2 (`fully_shard`) over the first dim, tensor parallelism over
the second (`parallelize_module`: attention and MLP projections column- then row-wise, the norms
sequence parallel on Shard(1), so the fused norms run on DTensors sharded along the sequence). Backend:
NCCL on GPUs (NVLink multicast off), gloo on CPU. The model and its parallelisation are importable
(tests/test_distributed.py checks one step against the same model on one process).
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

import fused_ops


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        batch, sequence = x.shape[0], x.shape[1]

        def heads(projection):  # [batch, heads on this rank, sequence, head_dim]
            return projection(x).view(batch, sequence, -1, self.head_dim).transpose(1, 2)
        q, k, v = heads(self.q), heads(self.k), heads(self.v)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(batch, sequence, -1))


def rotate(x, cos, sin):
    """RoPE (rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    """SwiGLU: silu_mul of the gate and up projections, then the down projection."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(fused_ops.silu_mul(torch.cat([self.gate(x), self.up(x)], dim=-1)))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attention_norm = fused_ops.nn.RMSNorm(dim)
        self.attention = Attention(dim, heads)
        self.mlp_norm = fused_ops.nn.AddRMSNorm(dim)  # the residual add and the norm in one op
        self.mlp = MLP(dim, hidden)

    def forward(self, x, cos, sin):
        normed, h = self.mlp_norm(self.attention(self.attention_norm(x), cos, sin), x)
        return h + self.mlp(normed)


class TinyLlama(nn.Module):
    def __init__(self, vocab=128, dim=64, heads=4, hidden=128, layers=2, max_sequence=64):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = fused_ops.nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        frequencies = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).double() / head_dim))
        angles = torch.outer(torch.arange(max_sequence).double(), frequencies)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        sequence = tokens.shape[1]
        cos = self.cos[:sequence].to(self.head.weight.dtype)
        sin = self.sin[:sequence].to(self.head.weight.dtype)
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


def loss_of(model, tokens):
    """Next-token cross entropy, mean over the tokens."""
    logits = model(tokens[:, :-1])
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # 16-bit logits: the loss in float32
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def parallelize(model, mesh, compile_blocks=False, compile_backend="inductor"):
    """Tensor + sequence parallelism over mesh["tp"], then FSDP2 over mesh["dp"]. Blocks are compiled
    (torch.compile) after the tensor-parallel plan and before FSDP2 when `compile_blocks`."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    class SequenceParallelInputs(SequenceParallel):
        """SequenceParallel for a module of several sequence-sharded inputs (AddRMSNorm(x, residual))."""

        @staticmethod
        def _prepare_input_fn(sequence_sharding, module, inputs, device_mesh):
            return tuple(SequenceParallel._prepare_input_fn(sequence_sharding, module, (tensor,), device_mesh)
                         for tensor in inputs)

    # The residual stream stays a DTensor sharded along the sequence (Shard(1)) from the embedding on.
    tp_mesh = mesh["tp"]
    parallelize_module(model, tp_mesh, {
        "embedding": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention.q": ColwiseParallel(input_layouts=Shard(1)),
            "attention.k": ColwiseParallel(input_layouts=Shard(1)),
            "attention.v": ColwiseParallel(input_layouts=Shard(1)),
            "attention.o": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "mlp_norm": SequenceParallelInputs(),
            "mlp.gate": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.up": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        })
    for index, block in enumerate(model.layers):
        if compile_blocks:
            block = torch.compile(block, backend=compile_backend, fullgraph=True)
            model.layers[index] = block
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def dp_batch(tokens, mesh):
    """This data-parallel rank's rows of the global batch."""
    dp = mesh["dp"]
    rows = tokens.shape[0] // dp.size()
    return tokens[dp.get_local_rank() * rows:(dp.get_local_rank() + 1) * rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: every process)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--sequence", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="torch.compile each block")
    args = parser.parse_args()

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cpu"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        device = "cuda"
    tp = args.tp or world
    mesh = init_device_mesh(device, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    dtype = torch.bfloat16 if cuda else torch.float32

    torch.manual_seed(0)
    model = TinyLlama(vocab=1024, dim=args.dim, heads=max(args.dim // 64, tp), hidden=4 * args.dim,
                      layers=args.layers, max_sequence=args.sequence).to(device=device, dtype=dtype)
    model = parallelize(model, mesh, compile_blocks=args.compile)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    tokens_per_step = args.batch * args.sequence
    start = None
    for step in range(args.steps):
        tokens = torch.randint(0, 1024, (args.batch, args.sequence + 1), generator=generator).to(device)
        loss = loss_of(model, dp_batch(tokens, mesh))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reported = loss.detach().clone()
        dist.all_reduce(reported)
        if cuda:
            torch.cuda.synchronize()
        if step == 0:
            start = time.perf_counter()  # the first step compiles and warms up
        if rank == 0:
            print(f"step {step}: loss {reported.item() / world:.4f}", flush=True)
    if rank == 0 and args.steps > 1:
        elapsed = time.perf_counter() - start
        print(f"{world} processes (dp {world // tp} x tp {tp}), {device}, {dtype}: "
              f"{tokens_per_step * (args.steps - 1) / elapsed:.0f} tokens/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
