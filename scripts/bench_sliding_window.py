"""One layer's sliding-window causal attention, forward + backward, as transformers runs it past the window
(SDPA with the materialised mask) and as fuse()'s band-aware attention runs it: the flash kernel with its
window where the GPU takes it, and the banded SDPA calls that run elsewhere. Shapes of public checkpoints,
bf16; each variant's largest difference from the float32 masked call is printed beside its time.

    python scripts/bench_sliding_window.py [--steps 20]
"""
import argparse
import time

import torch

from fused_ops.patching.rules import sliding_window
from fused_ops.patching.rules.sliding_window import banded_attention, sliding_window_mask

# name: batch, heads, key-value heads, tokens, head dim, window
SHAPES = {
    "Phi-3-mini": (8, 32, 32, 2048, 96, 2047),
    "Gemma-3-1B": (8, 4, 1, 2048, 256, 512),
    "Mistral-7B-v0.1": (4, 32, 8, 4096, 128, 4096),
    "window 128": (8, 64, 8, 2048, 64, 128),
}


class Heads(torch.nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


def variants():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as attention

    def masked(module, query, key, value, window):
        mask = sliding_window_mask(window, query.shape[2], key.shape[2], query.device)
        return attention(module, query, key, value, mask.expand(query.shape[0], 1, *mask.shape))[0]

    def band_aware(module, query, key, value, window):
        return banded_attention(attention, module, query, key, value, window)[0]

    def banded_calls(module, query, key, value, window):
        flash_applies = sliding_window._flash_window_applies
        sliding_window._flash_window_applies = lambda *args: False
        try:
            return banded_attention(attention, module, query, key, value, window)[0]
        finally:
            sliding_window._flash_window_applies = flash_applies
    return {"masked (transformers)": masked, "fuse(): flash with window": band_aware, "fuse(): banded calls": banded_calls}


def milliseconds(function, inputs, cotangent, steps):
    for step in range(steps + 3):
        if step == 3:
            torch.cuda.synchronize()
            start = time.perf_counter()
        function(*inputs).backward(cotangent)
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    arguments = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    print("| shape | variant | forward + backward ms | largest difference from float32 |")
    print("| --- | --- | --- | --- |")
    for name, (batch, heads, kv_heads, length, head_dim, window) in SHAPES.items():
        generator = torch.Generator("cuda").manual_seed(0)
        query, key, value = (torch.randn(batch, h, length, head_dim, generator=generator, device="cuda",
                                         dtype=torch.bfloat16).requires_grad_() for h in (heads, kv_heads, kv_heads))
        module = Heads(heads // kv_heads)
        functions = variants()
        with torch.no_grad():
            want = functions["masked (transformers)"](module, query.float(), key.float(), value.float(), window)
        for variant, function in functions.items():
            with torch.no_grad():
                error = (function(module, query, key, value, window).float() - want).abs().max().item()
            time_ms = milliseconds(function, (module, query, key, value, window), torch.randn_like(want).bfloat16(),
                                   arguments.steps)
            print(f"| {name}: {batch} x {heads}/{kv_heads} x {length} x {head_dim}, window {window} | {variant} "
                  f"| {time_ms:.2f} | {error:.1e} |")


if __name__ == "__main__":
    main()
