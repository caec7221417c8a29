"""The norms' launch plan (ops/norms/cuda/launch_plan.cpp), read through the library's C entry point:
which path, block shape and kernel variant each shape takes, checked without a GPU. On a GPU,
tests/test_norms.py checks that the kernels the plan names are the ones that run."""
import ctypes

import pytest

import fused_ops


@pytest.fixture(scope="module")
def describe():
    function = ctypes.CDLL(fused_ops.library_path()).fused_ops_describe_norm_launch_plan
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.c_char_p] + [ctypes.c_int] * 5 + [
        ctypes.c_char_p, ctypes.c_int]

    def plan(rows, columns, dtype="bfloat16", weight_dtype=None, layer=False, backward=False, residual=False,
             vectorized=True, clusters=True):
        text = ctypes.create_string_buffer(512)
        length = function(rows, columns, dtype.encode(), (weight_dtype or dtype).encode(), layer, backward,
                          residual, vectorized, clusters, text, len(text))
        assert length == len(text.value) > 0
        return dict(field.split("=") for field in text.value.decode().split())
    return plan


def test_decode_row_runs_on_a_cluster(describe):
    # 8192 bf16 = 1024 packs: eight blocks of 128 threads, one pack each; the weight loads first.
    plan = describe(1, 8192)
    assert (plan["path"], plan["cluster_blocks"], plan["threads"], plan["packs_per_thread"], plan["weight_first"]) == (
        "cluster", "8", "128", "1", "1")
    assert describe(1, 8192, residual=True)["weight_first"] == "0"
    assert describe(1, 16384)["packs_per_thread"] == "2"


def test_without_cluster_code_decode_rows_take_wide_blocks(describe):
    plan = describe(1, 8192, clusters=False)
    assert (plan["path"], plan["threads"], plan["packs_per_thread"]) == ("cached", "1024", "1")
    # A residual that loads first reduces over half the warps: blocks of 512, two packs each.
    plan = describe(1, 8192, residual=True, clusters=False)
    assert (plan["threads"], plan["packs_per_thread"], plan["residual_loads_first"]) == ("512", "2", "1")


@pytest.mark.parametrize("rows, columns, clustered", [
    (32, 8192, True), (33, 8192, False), (16, 16384, True), (17, 16384, False), (32, 4096, True),
    (1, 2048, True), (4, 2048, False), (1, 1024, False), (1, 65536 + 8, False)])
def test_rows_on_clusters(describe, rows, columns, clustered):
    """Up to 32 rows of four to eight blocks of one pack per thread, 16 of two packs; rows of two or
    three blocks only alone; a row that one block covers, or longer than eight blocks, never."""
    for backward in (False, True):
        assert (describe(rows, columns, backward=backward)["path"] == "cluster") == clustered


def test_layer_norm_forward_without_residual_clusters_only_full_rows(describe):
    assert describe(1, 8192, layer=True)["path"] == "cluster"
    assert describe(1, 4096, layer=True)["path"] == "cached"
    assert describe(1, 4096, layer=True, residual=True)["path"] == "cluster"
    assert describe(1, 4096, layer=True, backward=True)["path"] == "cluster"


def test_many_rows_forward_blocks(describe):
    plan = describe(16384, 8192)
    assert (plan["path"], plan["threads"], plan["packs_per_thread"], plan["three_blocks"]) == ("cached", "256", "4", "0")
    # Rows of over 512 packs whose residual loads first take blocks of 512.
    plan = describe(16384, 8192, residual=True)
    assert (plan["threads"], plan["packs_per_thread"], plan["residual_loads_first"]) == ("512", "2", "1")
    # Four bf16 packs per thread in blocks of 512 with bf16 weights: the three-blocks-per-SM kernel.
    assert describe(4096, 16384)["three_blocks"] == "1"
    assert describe(4096, 16384, weight_dtype="float32")["three_blocks"] == "0"
    assert describe(4096, 16384, dtype="float16")["three_blocks"] == "0"
    assert describe(1000, 16384)["three_blocks"] == "0"
    # float32 packs never load the residual first.
    assert describe(16384, 8192, dtype="float32", residual=True)["residual_loads_first"] == "0"


def test_long_rows(describe):
    assert describe(1024, 65536)["path"] == "long_rows"
    assert describe(1024, 65536)["threads"] == "1024"
    plan = describe(1024, 65536, backward=True)
    assert (plan["path"], plan["row_statistics"], plan["weight_gradient_row_groups"]) == ("long_rows", "1", "16")
    # One element per pack (rows not 16-byte aligned): 4097 packs are past the cached rows' 2048.
    assert describe(8, 4097, dtype="float32", vectorized=False, clusters=False)["path"] == "long_rows"


def test_backward_decode_and_persistent_grid(describe):
    plan = describe(16, 8192, backward=True, clusters=False)
    assert (plan["path"], plan["row_statistics"], plan["weight_gradient_row_groups"]) == ("cached", "1", "4")
    assert describe(128, 16384, backward=True, clusters=False)["weight_gradient_row_groups"] == "8"
    assert describe(16, 8192, backward=True)["row_statistics"] == "1"  # a cluster per row, statistics stored
    assert describe(1, 8192, backward=True)["row_statistics"] == "0"  # one row writes the gradients itself
    plan = describe(600, 8192, backward=True)
    assert (plan["path"], plan["row_statistics"], plan["max_blocks_per_sm"]) == ("cached", "0", "4")
    assert (plan["threads"], plan["packs_per_thread"], plan["shared_sums"]) == ("256", "4", "0")  # RMS: registers
    assert describe(600, 8192, layer=True, backward=True)["shared_sums"] == "1"
    assert describe(600, 4096, backward=True)["shared_sums"] == "1"  # 512 packs
    assert describe(1, 8192, backward=True, clusters=False)["shared_sums"] == "0"  # one short row


@pytest.mark.parametrize("columns, dtype, threads_per_row", [
    (128, "bfloat16", "16"), (256, "bfloat16", "32"), (64, "bfloat16", "8"), (24, "bfloat16", "8"),
    (128, "float32", "32"), (96, "float32", "32"), (64, "float64", "32")])
@pytest.mark.parametrize("backward", [False, True])
def test_many_short_rows_take_groups_of_lanes(describe, columns, dtype, threads_per_row, backward):
    # Per-head norms: up to 32 packs a row, a group of lanes per row in blocks of 512.
    plan = describe(262144, columns, dtype=dtype, backward=backward)
    assert (plan["path"], plan["threads"], plan["threads_per_row"]) == ("short_rows", "512", threads_per_row)
    assert plan["max_blocks_per_sm"] == ("4" if backward else "0")


def test_short_rows_need_packs_and_more_than_decode_rows(describe):
    assert describe(128, 128)["path"] == "cached"  # decode
    assert describe(129, 128)["path"] == "short_rows"
    assert describe(4096, 264)["path"] == "cached"  # 33 packs
    assert describe(4096, 128, vectorized=False)["path"] == "cached"


def test_unknown_dtype_is_refused(describe):
    function = ctypes.CDLL(fused_ops.library_path()).fused_ops_describe_norm_launch_plan
    text = ctypes.create_string_buffer(64)
    assert function(ctypes.c_int64(1), ctypes.c_int64(8), b"int8", b"int8", 0, 0, 0, 1, 1, text, 64) == -1
