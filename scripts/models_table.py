"""Writes docs/models.md: what fuse() swaps and leaves alone in a tiny model of every causal-LM and
image-text family transformers ships (the same models the family test checks), and why.

    python scripts/models_table.py [--out docs/models.md] [--families llama qwen3 ...]
"""
import argparse
import collections
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import hf_families  # noqa: E402

import fused_ops  # noqa: E402

KINDS = ["norm", "gated_norm", "gated_mlp", "experts_gate", "bias_gelu", "rotary", "residual_norm", "lm_head_loss", "causal_mask",
         "sliding_window_attention"]

HEADER = """# Models

What `fused_ops.fuse(model)` does to a tiny random-init model of every causal-LM and image-text family in
transformers {version} (image-text models trained on text, their vision towers built small): how many
modules of each kind it swapped, out of the candidates it found (`swapped/found`), and why it left the
others alone. Every family here, fused or not, gives the stock model's loss and
gradients in the family test (`tests/test_fuse_families.py`). A candidate is swapped only where the
probe proves the fused forward computes what the module computes; "not proven" lines say what differed.
Drawn by `python scripts/models_table.py` from the same models the test builds.

"""


def family_row(model_type):
    reason = hf_families.why_not_testable(model_type)
    if reason is not None:
        return None, reason
    model = hf_families.build(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused_ops.fuse(model)
    return model.fused_ops_report, None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "models.md"))
    parser.add_argument("--families", nargs="*")
    arguments = parser.parse_args()
    import transformers
    torch.set_num_threads(1)
    rows, left_alone, not_built = [], collections.defaultdict(set), []
    families = hf_families.causal_lm_model_types() + hf_families.image_text_model_types()
    for model_type in arguments.families or families:
        report, reason = family_row(model_type)
        if report is None:
            not_built.append((model_type, reason))
            continue
        found = collections.Counter(entry.kind for entry in report.entries)
        swapped = report.counts()
        cells = [f"{swapped[kind]}/{found[kind]}" if found[kind] else "" for kind in KINDS]
        rows.append(f"| {model_type} | " + " | ".join(cells) + " |")
        for entry in report.left_alone:
            left_alone[(entry.kind, entry.module_class, entry.summary or entry.detail)].add(model_type)
        print(model_type, dict(swapped), flush=True)
    lines = [HEADER.format(version=transformers.__version__),
             "| family | " + " | ".join(KINDS) + " |", "|" + " --- |" * (len(KINDS) + 1), *rows, "",
             "## Left alone, and why", "", "| kind | module | families | reason |", "| --- | --- | --- | --- |"]
    for (kind, module_class, detail), families in sorted(left_alone.items()):
        detail = detail.replace("|", "\\|").replace("\n", " ")
        row = f"| {kind} | {module_class} | {', '.join(sorted(families))} | "
        room = max(80, 198 - len(row))  # a table line of about 200 characters, the reason cut to fit
        lines.append(row + (detail if len(detail) <= room else detail[:room - 1] + "…") + " |")
    lines += ["", "## Families whose tiny model does not build or run", "",
              "| family | error |", "| --- | --- |"]
    lines += [f"| {model_type} | {reason.replace('|', '/')[:180 - len(model_type)]} |" for model_type, reason in not_built]
    with open(arguments.out, "w") as out:
        out.write("\n".join(lines) + "\n")
    print(f"{len(rows)} families fused or checked, {len(not_built)} not built; wrote {arguments.out}")


if __name__ == "__main__":
    main()
