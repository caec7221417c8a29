"""Benchmark the policy update of a GRPO step: TRL with its own fused head against TRL with fused_ops
(fuse() on the policy and the reference model, and this library's head), in one run on one GPU.

A Qwen3-1.7B-shaped policy and reference model (random init, bf16, tied embeddings, --layers of its 28),
one prompt's --completions completions of --completion-length tokens after a --prompt-length-token prompt,
given (no generation). Each step is what GRPOTrainer.compute_loss does with them: the reference model's
per-token log-probabilities (no gradient), the policy's log-probabilities and entropy through the model's
`fused_lm_head=True` forward (the head each side adds with its add_fused_lm_head), TRL's clipped-ratio loss
with the k3 KL term (beta 0.04) averaged over the completion tokens, the backward and an AdamW step. For each
side: the median step time (CUDA events) and the peak memory allocated; the two sides' losses of the first
step must agree. Rows go to OUT/bench_grpo.json.

    python scripts/bench_grpo.py [--layers 28] [--completions 8] [--completion-length 1024] [--steps 6]
"""
import argparse
import copy
import json
import os
import statistics
import sys
from datetime import date

import torch

import fused_ops
import fused_ops.rl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import source_commit  # noqa: E402

BETA = 0.04
EPSILON = 0.2
TEMPERATURE = 1.0


def qwen3_1_7b_config(layers):
    import transformers
    return transformers.Qwen3Config(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                    num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=8,
                                    head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True,
                                    rms_norm_eps=1e-6, rope_theta=1000000.0)


def grpo_loss(policy, reference, ids, mask, labels, advantages, completion_length):
    """GRPOTrainer.compute_loss on given completions, one iteration per generation (old = current)."""
    with torch.no_grad():
        reference_log_probs = reference(input_ids=ids, attention_mask=mask, labels=labels,
                                        fused_lm_head=True).log_probs[:, -completion_length:]
    output = policy(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    log_probs = output.log_probs[:, -completion_length:]
    ratio = torch.exp(log_probs - log_probs.detach())
    clipped = torch.clamp(ratio, 1 - EPSILON, 1 + EPSILON)
    per_token = -torch.min(ratio * advantages[:, None], clipped * advantages[:, None])
    difference = reference_log_probs - log_probs
    per_token = per_token + BETA * (torch.exp(difference) - difference - 1)
    completion_mask = mask[:, -completion_length:].to(per_token.dtype)
    return (per_token * completion_mask).sum() / completion_mask.sum().clamp(min=1)


def measure(policy, reference, batch, steps):
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    times, losses = [], []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for step in range(steps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = grpo_loss(policy, reference, *batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        losses.append(loss.item())
        if step > 0:  # the first step allocates the optimizer's state and warms the kernels
            times.append(start.elapsed_time(end))
    return {"step_ms": statistics.median(times), "peak_gb": torch.cuda.max_memory_allocated() / 2**30,
            "first_loss": losses[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--completion-length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="bench_out")
    args = parser.parse_args()
    import transformers
    from trl.trainer.utils import add_fused_lm_head as trl_add_fused_lm_head

    torch.manual_seed(0)
    with torch.device("cuda"):
        base = transformers.AutoModelForCausalLM.from_config(qwen3_1_7b_config(args.layers), dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    length = args.prompt_length + args.completion_length
    ids = torch.randint(0, 151000, (args.completions, length), generator=generator).cuda()
    mask = torch.ones_like(ids)
    mask[: args.completions // 2, -(args.completion_length // 4):] = 0  # completions that ended early: padding
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-args.completion_length] = -100
    advantages = torch.randn(args.completions, generator=generator).cuda()
    batch = (ids, mask, labels, advantages, args.completion_length)

    results = {}
    for side in ("trl", "fused_ops"):
        policy, reference = copy.deepcopy(base).train(), copy.deepcopy(base).eval()
        for model in (policy, reference):
            model.config.use_cache = False
            if side == "trl":
                trl_add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
            else:
                fused_ops.rl.add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
        results[side] = measure(policy, reference, batch, args.steps)
        print(side, results[side], file=sys.stderr)
        del policy, reference
        torch.cuda.empty_cache()
    trl_side, ours = results["trl"], results["fused_ops"]
    assert abs(trl_side["first_loss"] - ours["first_loss"]) <= 1e-3 * max(1.0, abs(trl_side["first_loss"])), results
    result = {"date": date.today().isoformat(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "commit": source_commit(), "layers": args.layers, "completions": args.completions,
              "prompt_length": args.prompt_length, "completion_length": args.completion_length, "results": results,
              "speedup": trl_side["step_ms"] / ours["step_ms"], "memory_ratio": ours["peak_gb"] / trl_side["peak_gb"]}
    print(f"{result['device']}, torch {result['torch']}: GRPO update, Qwen3-1.7B shape, {args.layers} layers, "
          f"{args.completions} x ({args.prompt_length} + {args.completion_length}) tokens: TRL "
          f"{trl_side['step_ms']:.1f} ms / {trl_side['peak_gb']:.2f} GB, fused_ops {ours['step_ms']:.1f} ms / "
          f"{ours['peak_gb']:.2f} GB: {result['speedup']:.3f}x faster at {result['memory_ratio']:.3f}x the memory")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_grpo.json"), "w") as file:
        json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
