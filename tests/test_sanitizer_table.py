"""scripts/sanitizer_table.py: reports counted against the test that was running, tests against their op."""
import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "scripts")
sys.path.insert(0, SCRIPTS)
import sanitizer_table  # noqa: E402

MEMCHECK = """\
========= COMPUTE-SANITIZER
tests/test_properties.py::test_matches_reference_on_random_inputs[relu_add-cuda] PASSED [ 10%]
========= Invalid __global__ read of size 16 bytes
=========     at void fused_ops::cuda::silu_mul_kernel(...)+0x1f0
=========     by thread (3,0,0) in block (0,0,0)
tests/test_activations.py::test_values[cuda-silu_mul-float32] FAILED [ 20%]
tests/test_silu_mul_linear.py::test_values_and_gradients[cuda-float32-5x12-7-True] PASSED [ 30%]
tests/test_reliability.py::test_eight_threads_call_every_op PASSED [ 40%]
tests/test_rotary.py::test_values[cuda-float32-partial] PASSED [ 45%]
========= ERROR SUMMARY: 1 error
"""
RACECHECK = """\
tests/test_norms.py::test_rms_norm_values[cuda-bfloat16] PASSED [ 50%]
[gw1] [ 60%] PASSED tests/test_norms.py::test_add_rms_norm_values[cuda-bfloat16]
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_reports_go_to_the_running_test_and_tests_to_their_op(tmp_path):
    ops = sanitizer_table.op_names()
    assert "silu_mul_linear" in ops and "rms_norm" in ops and "rms_norm_backward" not in ops
    assert ops.index("silu_mul_linear") < ops.index("silu_mul")
    paths = [write(tmp_path, "sanitizer_memcheck.log", MEMCHECK), write(tmp_path, "sanitizer_racecheck_1of2.log", RACECHECK)]
    lines, by_tool, totals = sanitizer_table.table(paths, ops)
    memcheck = by_tool["memcheck"]
    assert memcheck["silu_mul"] == {"tests": 1, "failed": 1, "reports": 1, "passed": 0}
    assert memcheck["relu_add"]["reports"] == 0 and memcheck["relu_add"]["passed"] == 1
    assert memcheck["silu_mul_linear"]["tests"] == 1 and memcheck["all ops"]["tests"] == 1
    assert memcheck["rotary_embedding"]["tests"] == 1
    assert by_tool["racecheck"]["rms_norm"]["tests"] == 1 and by_tool["racecheck"]["add_rms_norm"]["tests"] == 1
    assert totals == {"memcheck": 1, "racecheck": 0}
    assert "| memcheck | silu_mul | 1 | 0 | 1 | 1 |" in lines


def test_a_test_run_again_counts_once_and_keeps_its_failure(tmp_path):
    first = "tests/test_norms.py::test_a[cuda-rms_norm] FAILED [ 50%]\ntests/test_norms.py::test_b[cuda-rms_norm] PASSED [ 99%]\n"
    again = ("tests/test_norms.py::test_a[cuda-rms_norm] PASSED [ 50%]\n========= Race reported\n"
             "tests/test_norms.py::test_b[cuda-rms_norm] PASSED [ 99%]\n")
    paths = [write(tmp_path, "sanitizer_racecheck_resumed-1.log", first), write(tmp_path, "sanitizer_racecheck_resumed-2.log", again)]
    lines, by_tool, totals = sanitizer_table.table(paths, sanitizer_table.op_names())
    assert by_tool["racecheck"]["rms_norm"] == {"tests": 2, "passed": 1, "failed": 1, "reports": 1}


@pytest.mark.parametrize("text, code", [(RACECHECK, 0), (MEMCHECK, 1)])
def test_exit_status_says_whether_the_run_is_clean(tmp_path, text, code):
    path = write(tmp_path, "sanitizer_racecheck.log" if code == 0 else "sanitizer_memcheck.log", text)
    table = tmp_path / "table.md"
    run = subprocess.run([sys.executable, os.path.join(SCRIPTS, "sanitizer_table.py"), path, "--markdown", str(table)],
                         capture_output=True, text=True)
    assert run.returncode == code, run.stdout + run.stderr
    assert table.read_text().startswith("| tool | op |")


def test_finished_lists_the_tests_one_tool_reached(tmp_path):
    """A resumed pass (gpu_check.sh's SANITIZER_RESUME) runs what these lists leave out."""
    paths = [write(tmp_path, "sanitizer_memcheck.log", MEMCHECK), write(tmp_path, "sanitizer_racecheck_1-of-2.log", RACECHECK),
             write(tmp_path, "sanitizer_racecheck_1-of-2_resumed-1.log", "tests/test_norms.py::test_c[cuda] FAILED [ 9%]\n")]
    assert sanitizer_table.finished_tests(paths, "racecheck") == {
        "tests/test_norms.py::test_rms_norm_values[cuda-bfloat16]", "tests/test_norms.py::test_add_rms_norm_values[cuda-bfloat16]",
        "tests/test_norms.py::test_c[cuda]"}
    assert len(sanitizer_table.finished_tests(paths, "memcheck")) == 5
    run = subprocess.run([sys.executable, os.path.join(SCRIPTS, "sanitizer_table.py"), *paths, "--finished", "synccheck"],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == ""
