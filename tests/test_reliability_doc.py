"""Every bad-input row of docs/reliability.md is a case the tests raise, and the other way round."""
import os
import re

import torch

from test_activations import bad_activation_inputs
from test_attention import bad_attention_inputs
from test_gated_mul import bad_gated_mul_inputs
from test_errors import bad_relu_add_inputs, bad_relu_add_mask_inputs
from test_linear_cross_entropy import bad_linear_cross_entropy_inputs
from test_linear_log_probs import bad_linear_log_probs_inputs
from test_moe import bad_moe_inputs
from test_norms import bad_norm_inputs
from test_rotary import bad_rotary_inputs
from test_silu_mul_linear import bad_silu_mul_linear_inputs

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "reliability.md")


def documented_messages():
    text = open(DOC).read()
    section = text.split("## Bad input and the error it raises")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line.split("|")[-2]]
    return {re.search(r"`(.*)`", row.split("|")[-2]).group(1): "CUDA only" in row for row in rows}


def messages_raised_by_tests(device):
    messages = {message for _, _, message in bad_relu_add_inputs(device)}
    messages |= {message for _, message in bad_relu_add_mask_inputs(device)}
    messages |= {message for _, message in bad_activation_inputs(device)}
    messages |= {message for _, message in bad_norm_inputs(device)}
    messages |= {message for _, message in bad_rotary_inputs(device)}
    messages |= {message for _, message in bad_linear_cross_entropy_inputs(device)}
    messages |= {message for _, message in bad_linear_log_probs_inputs(device)}
    messages |= {message for _, message in bad_silu_mul_linear_inputs(device)}
    messages |= {message for _, message in bad_gated_mul_inputs(device)}
    messages |= {message for _, message in bad_moe_inputs(device)}
    messages |= {message for _, message in bad_attention_inputs(device)}
    messages.add("fused::relu_add_backward: expected x to have the shape of grad")  # test_errors
    return messages


def test_every_documented_row_is_tested_and_every_test_documented():
    documented = documented_messages()
    assert len(documented) >= 19
    tested = messages_raised_by_tests("cpu")
    if torch.cuda.is_available():
        tested |= messages_raised_by_tests("cuda")
    for message, cuda_only in documented.items():
        if cuda_only and not torch.cuda.is_available():
            continue
        assert message in tested, f"documented but not tested: {message}"
    for message in tested:
        assert message in documented, f"tested but not documented: {message}"
