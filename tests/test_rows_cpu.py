"""CPU: RowSum and Softmax plans build from descriptors of fake device arrays (no GPU), pick their modes,
compile to PTX and link for sm_90a / sm_100a offline with TMA in the SASS, and reject bad arguments with
clear TensorMapErrors."""
import re

import ml_dtypes
import numpy as np
import pytest

from numbatma import TensorMapError, compile as nbc
from numbatma.kernels import RowSum, Softmax

from fakes import FakeCudaArray

BF16 = ml_dtypes.bfloat16  # typestr "<V2" (np.dtype("<V2") would be raw bytes, "|V2", which numbatma refuses)


def arrays(shape, out_shape=None, dtype=np.float32, out_dtype=None):
    x = FakeCudaArray(shape, dtype, ptr=1 << 20)
    out = FakeCudaArray(shape if out_shape is None else out_shape, dtype if out_dtype is None else out_dtype,
                        ptr=1 << 34)
    return x, out


def build(cls, shape, dtype=np.float32, **options):
    out_shape = shape[:-1] if cls is RowSum else shape
    return cls(*arrays(shape, out_shape, dtype), **options)


def compiled(plan, arch="sm_90a"):
    ptx = nbc.compile_ptx(plan.kernel.py_func, plan.argtypes(), arch)
    return ptx, nbc.sass(nbc.link_cubin(ptx, arch, max_registers=getattr(plan, "max_registers", None)))


def check_code(ptx, sass, stores):
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx
    assert "UTMALDG.2D" in sass
    assert ("UTMASTG.2D" in sass) == stores
    assert not re.search(r"\.f64\b", ptx), "float64 arithmetic crept in (a float literal?)"
    assert ".local" not in ptx and "STL" not in sass, "local memory (spills or a local array)"


# -- plans ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, shape, mode",
    [
        (RowSum, (4096, 4), "rows"),
        (RowSum, (1000, 1000), "rows"),
        (RowSum, (64, 16384), "chunked"),
        (Softmax, (4096, 4), "rows"),
        (Softmax, (1000, 1000), "rows"),
        (Softmax, (64, 16384), "rows"),  # 64 KiB rows still fit, three stages
        (Softmax, (8, 65536), "chunked"),  # 256 KiB rows do not
    ],
)
def test_mode_and_shared_memory_budget(cls, shape, mode):
    c = build(cls, shape).config
    assert c.mode == mode
    assert c.smem_bytes <= 227 * 1024 - 2048  # room for the static part (barriers, alignment)
    assert c.stages >= 2
    assert c.box_cols <= 256 and c.box_rows <= 256 and c.box_cols * 4 % 16 == 0
    assert c.slot * 4 % 128 == 0  # every box slot starts 128-byte aligned
    assert c.rows_per_stage % (32 * c.warps // c.threads_per_row) == 0


def test_leading_dimensions_fold_into_rows():
    p = build(RowSum, (2, 3, 64))
    assert (p.rows, p.n) == (6, 64)
    s = build(Softmax, (5, 7, 1000))
    assert (s.rows, s.n) == (35, 1000) and s.x_map.shape == (35, 1000)


def test_padded_rows_are_described_in_place():
    x = FakeCudaArray((100, 1000), np.float32, strides=(4096, 4))
    out = FakeCudaArray((100, 1000), np.float32, strides=(4096, 4), ptr=1 << 34)
    p = Softmax(x, out)
    assert p.x_map.strides == (4096, 4) and p.out_map.strides == (4096, 4)


def test_empty_arrays_plan_nothing():
    assert build(Softmax, (0, 16)).kernel is None
    assert build(RowSum, (0, 16)).kernel is None


def test_tuning_options_reach_the_plan():
    c = build(Softmax, (1000, 1000), stages=2, warps=4, threads_per_row=16, rows_per_stage=16, store_lag=1).config
    assert (c.stages, c.warps, c.threads_per_row, c.rows_per_stage, c.store_lag) == (2, 4, 16, 16, 1)
    c = build(RowSum, (64, 16384), chunk_boxes=2, ctas_per_sm=2).config
    assert c.col_boxes == 2 and c.stages == 4 and c.smem_bytes <= 227 * 1024 // 2
    with pytest.raises(TensorMapError, match="needs 262144 bytes of shared memory; at most"):
        build(RowSum, (64, 16384), chunk_boxes=32)


# -- compilation -----------------------------------------------------------------------------------------
KERNELS = {
    "rowsum-rows": (RowSum, (1000, 1000), np.float32, {}),
    "rowsum-small-rows": (RowSum, (4096, 4), np.float32, {}),
    "rowsum-chunked": (RowSum, (64, 16384), np.float32, {}),
    "softmax-rows-warp": (Softmax, (1000, 1000), np.float32, {}),
    "softmax-rows-block": (Softmax, (64, 16384), np.float32, {}),
    "softmax-chunked": (Softmax, (8, 65536), np.float32, {}),
    "softmax-rows-fp16": (Softmax, (100, 4096), np.float16, {}),
    "rowsum-bf16": (RowSum, (100, 2048), BF16, {}),
    "softmax-chunked-bf16": (Softmax, (4, 100000), BF16, {}),
    "softmax-rows-4k": (Softmax, (65536, 4096), np.float32, {}),
    "softmax-rows-16k": (Softmax, (16384, 16384), np.float32, {}),
    "softmax-rows-16k-loops": (Softmax, (16384, 16384), np.float32, dict(registers=False)),
    "softmax-rows-20k-one-stage": (Softmax, (20, 20000), np.float32, dict(mode="rows", stages=1)),
    "softmax-rows-odd-bf16": (Softmax, (100, 3000), BF16, {}),
    "softmax-rows-4k-2ctas": (Softmax, (65536, 4096), np.float32, dict(ctas_per_sm=2, stages=2)),
}


# (the register path's checks of test_softmax_rows_keep_the_row_in_registers, made on these kernels' one compile)
ROW_IN_REGISTERS = ("softmax-rows-4k", "softmax-rows-16k")


@pytest.mark.parametrize("name", list(KERNELS))
def test_kernels_compile_and_link_for_sm90a(name):
    cls, shape, dtype, options = KERNELS[name]
    plan = build(cls, shape, dtype, **options)
    ptx, sass = compiled(plan)
    check_code(ptx, sass, stores=cls is Softmax)
    if name in ROW_IN_REGISTERS:
        check_row_in_registers(plan, sass, shape)


@pytest.mark.parametrize(
    "shape, warps, tpr",
    [((1000, 4), 8, 4), ((1000, 1000), 8, 32), ((100, 2048), 8, 64), ((65536, 4096), 8, 128),
     ((16384, 16384), 8, 256), ((4, 100000), 8, 256)],
)
def test_softmax_defaults_by_row_length(shape, warps, tpr):
    c = build(Softmax, shape).config
    assert (c.warps, c.threads_per_row) == (warps, tpr)


def check_row_in_registers(plan, sass, shape):
    assert plan.max_registers <= 16384 // (32 * -(-plan.threads // 128))  # the busiest register quadrant
    per_thread = -(-shape[-1] // plan.config.threads_per_row)
    assert sass.count("MUFU.EX2") >= per_thread


@pytest.mark.parametrize("shape", [(129, 4096), (333, 1000), (100, 3000)])
def test_softmax_rows_keep_the_row_in_registers(shape):
    """Rows mode's register path: every element loaded once, one exp each (unrolled: 32 MUFU.EX2 for
    32 elements per thread), no spills under the register cap that lets the CTA launch. (Also checked on
    (65536, 4096) and (16384, 16384): ROW_IN_REGISTERS, with their compile above.)"""
    plan = build(Softmax, shape)
    ptx, sass = compiled(plan)
    check_code(ptx, sass, stores=True)
    check_row_in_registers(plan, sass, shape)


@pytest.mark.parametrize("name", ["rowsum-chunked", "softmax-rows-block"])
def test_kernels_link_for_sm100a(name):
    cls, shape, dtype, options = KERNELS[name]
    check_code(*compiled(build(cls, shape, dtype, **options), "sm_100a"), stores=cls is Softmax)


# -- validation ------------------------------------------------------------------------------------------
def test_row_sum_rejects_wrong_out_shape():
    with pytest.raises(TensorMapError, match=r"RowSum: out is a float32 array with shape \(999,\).*\(1000,\)"):
        RowSum(*arrays((1000, 64), (999,)))


def test_softmax_rejects_wrong_out_shape():
    with pytest.raises(TensorMapError, match="Softmax: out is a float32 array with shape .*same shape and dtype"):
        Softmax(*arrays((1000, 64), (1000, 32)))


@pytest.mark.parametrize("cls", [RowSum, Softmax])
def test_dtype_mismatch(cls):
    shape = (100, 64)
    x, out = arrays(shape, shape[:-1] if cls is RowSum else shape, np.float32, np.float16)
    with pytest.raises(TensorMapError, match="out is a float16 array"):
        cls(x, out)


@pytest.mark.parametrize("cls", [RowSum, Softmax])
def test_unsupported_dtype(cls):
    with pytest.raises(TensorMapError, match="float64 .*supported dtypes: float32, float16, bfloat16"):
        build(cls, (100, 64), np.float64)


def test_rows_must_start_on_16_byte_boundaries():
    with pytest.raises(TensorMapError, match=r"n=1001 a multiple of 4 .*Pad the rows to 1004"):
        build(Softmax, (10, 1001))


def test_softmax_rows_mode_names_the_row_length_limit():
    with pytest.raises(TensorMapError, match=r"mode='rows' keeps whole rows .*n=100000 float32.*Rows of up to about"):
        build(Softmax, (4, 100000), mode="rows")
    # the default picks the chunked two-pass kernel for such rows instead
    assert build(Softmax, (4, 100000)).config.mode == "chunked"


def test_leading_dimensions_that_do_not_fold():
    x = FakeCudaArray((4, 6, 64), np.float32, strides=(64 * 4 * 8, 64 * 4, 4))  # every other 6-row plane
    out = FakeCudaArray((4, 6), np.float32, ptr=1 << 34)
    with pytest.raises(TensorMapError, match="leading dimensions cannot be folded"):
        RowSum(x, out)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(stages=0), "stages must be an integer in 1..32"),
        (dict(warps=17), "warps .* must be an integer in 1..16"),
        (dict(threads_per_row=3), "threads_per_row must be a power of two"),
        (dict(mode="fast"), "mode must be 'auto', 'rows' or 'chunked'"),
        (dict(store_lag=4), "store_lag must be in 0..min"),
        (dict(rows_per_stage=5), "rows_per_stage=5 must be a multiple of 8"),
    ],
)
def test_bad_options(options, message):
    with pytest.raises(TensorMapError, match=message):
        build(Softmax, (1000, 1000), **options)


def test_a_single_row_may_have_any_length():
    p = build(Softmax, (1, 1004))
    assert p.x_map.shape == (1, 1004) and p.x_map.strides[0] % 16 == 0
    assert build(RowSum, (4001,)).rows == 1  # RowSum writes with ordinary stores: any length
    odd = build(Softmax, (1, 1001))  # TMA stores for the first 1000 elements, an ordinary store for the last
    assert odd.out_map.shape == (1, 1000) and odd.out_store.tail_cols == 1
