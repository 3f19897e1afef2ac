"""CPU tests of im2col mode: Im2colTensorMap validation (errors in the user's terms, before any driver call),
the PTX of tma_load_im2col for ranks 3-5, linking for every target, the SASS (UTMALDG.<r>D.IM2COL), typing
errors, by-value descriptor passing, and that the GPU tests' kernels compile for sm_90a."""
import re

import numpy as np
import pytest
from numba import cuda, types

from numbatma import TensorMap, TensorMapError, compile as nbc
from numbatma._numba_internals import _prepare_numbatma_arg
from numbatma.im2col import Im2colTensorMap
from numbatma.intrinsics import (
    all_ptx,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
    tma_load_im2col,
)
from numbatma.intrinsics._asm import TARGETS

from fakes import FakeCudaArray
from im2col_kernels import CASES, case_params, load_kernel

SHAPES = {3: (2, 20, 16), 4: (2, 5, 6, 16), 5: (2, 3, 4, 5, 16)}


def desc_of(rank, **kw):
    kw.setdefault("channels_per_pixel", 16)
    kw.setdefault("pixels_per_column", 32)
    return Im2colTensorMap(FakeCudaArray(SHAPES[rank], np.float32), **kw)


def signature(desc, dtype=types.float32):
    r = desc.rank
    return (desc.numba_type, types.UniTuple(types.int64, r), types.UniTuple(types.int64, r - 2), dtype[:, :])


# -- host: facts and validation -------------------------------------------------------------------------------
def test_facts_and_driver_order():
    d = desc_of(4, pixel_box_lower_corner=(-1, -2), pixel_box_upper_corner=(-3, -4), element_strides=(1, 2, 3, 1))
    assert d.shared_shape == (32, 16) and d.box_bytes == 32 * 16 * 4
    assert d.bounding_box == ((-1, 5 - 1 - 3), (-2, 6 - 1 - 4))
    a = d._driver_args()
    assert a["dims"] == (16, 6, 5, 2) and a["lower"] == (-2, -1) and a["upper"] == (-4, -3)
    assert a["element_strides"] == (1, 3, 2, 1) and a["strides"] == (64, 384, 1920)
    assert isinstance(d, TensorMap)
    t = d.numba_type
    assert (t.rank, t.pixels_per_column, t.channels_per_pixel, t.box_bytes) == (4, 32, 16, 2048)
    # corners and strides live in the descriptor only: same kernel type
    assert desc_of(4).numba_type == t


def test_swizzle_padding_of_narrow_rows():
    d = desc_of(4, channels_per_pixel=16, swizzle="128B")  # 64-byte rows under a 128-byte swizzle
    assert d.shared_shape == (32, 32) and d.box_bytes == 32 * 16 * 4 and d.shared_alignment == 1024


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Im2colTensorMap(FakeCudaArray((8, 16), np.float32), channels_per_pixel=16, pixels_per_column=8),
         "rank 2; im2col descriptors describe rank 3 to 5"),
        (lambda: desc_of(4, pixel_box_lower_corner=(-1,)), r"pixel_box_lower_corner \(-1,\) has 1 entries but the "
                                                           r"NHWC array has 2 spatial dimensions \(H, W\)"),
        (lambda: desc_of(4, pixel_box_upper_corner=(0, 128)), r"has 128 along W; for a rank-4 \(NHWC\) array each "
                                                              r"corner offset must be in -128..127"),
        (lambda: desc_of(5, pixel_box_lower_corner=(-17, 0, 0)), "must be in -16..15"),
        (lambda: desc_of(3, pixel_box_lower_corner=-40000), "must be in -32768..32767"),
        (lambda: desc_of(4, pixel_box_lower_corner=(0, 3), pixel_box_upper_corner=(0, -3)),
         "bounding box is empty along W"),
        (lambda: desc_of(4, channels_per_pixel=6), "24 bytes; TMA needs a multiple of 16 bytes"),
        (lambda: desc_of(4, channels_per_pixel=512), r"channels_per_pixel is 512; it must be in 1..256"),
        (lambda: desc_of(4, pixels_per_column=0), r"pixels_per_column is 0; it must be in 1..1024"),
        (lambda: desc_of(4, pixels_per_column=2048), "it must be in 1..1024"),
        (lambda: desc_of(4, pixels_per_column=2.5), "pixels_per_column must be an integer"),
        (lambda: desc_of(4, element_strides=(2, 1, 1, 1)), "step of 2 along N"),
        (lambda: desc_of(4, element_strides=(1, 1, 1, 2)), "step of 2 along C"),
        (lambda: desc_of(4, element_strides=(1, 9, 1, 1)), "has 9 along H"),
        (lambda: desc_of(4, element_strides=(1, 1, 1)), "has 3 entries but the NHWC array has 4 dimensions"),
        (lambda: desc_of(4, channels_per_pixel=16, swizzle="32B"), "wider than the 32-byte span of swizzle=B32"),
        (lambda: Im2colTensorMap(FakeCudaArray((1, 4, 4, 16), np.int32), channels_per_pixel=16, pixels_per_column=8,
                                 oob_fill="nan"), "Im2colTensorMap: oob_fill=NAN needs a floating-point dtype"),
        (lambda: Im2colTensorMap(FakeCudaArray((1, 4, 4, 18), np.float32), channels_per_pixel=4, pixels_per_column=8),
         "Im2colTensorMap: row stride of the float32 array with shape \\(1, 4, 4, 18\\) is 72 bytes"),
        (lambda: Im2colTensorMap(FakeCudaArray((1, 4, 4, 16), np.float32, ptr=(1 << 20) + 4), channels_per_pixel=16,
                                 pixels_per_column=8), "not 16-byte aligned"),
        (lambda: Im2colTensorMap(FakeCudaArray((1, 4, 4, 16), np.complex64), channels_per_pixel=4,
                                 pixels_per_column=8), "has no TMA data type"),
    ],
)
def test_validation_errors(make, message):
    with pytest.raises(TensorMapError, match=message):
        make()


# -- device: PTX, targets, SASS ------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=TARGETS)
def compiled(request):
    ptx = {r: nbc.compile_ptx(load_kernel(desc_of(r).shared_shape), signature(desc_of(r)), arch=request.param)
           for r in (3, 4, 5)}
    return request.param, ptx


def test_ptx_has_the_instruction(compiled):
    _, ptx = compiled
    for r, text in ptx.items():
        coords = ", ".join([r"%r\d+"] * r)
        offs = ", ".join([r"%rs\d+"] * (r - 2))
        pattern = (rf"cp\.async\.bulk\.tensor\.{r}d\.shared::cluster\.global\.im2col\.mbarrier::complete_tx::bytes "
                   rf"\[%r\d+\], \[%rd\d+, \{{{coords}\}}\], \[%r\d+\], \{{{offs}\}};")
        assert re.search(pattern, text), f"rank {r}: im2col load missing"
        assert re.search(r"\.param \.align 128 \.b8 \S+_param_0\[128\]", text)  # descriptor by value


def test_links_and_sass_for_every_target(compiled):
    arch, ptx = compiled
    for r, text in ptx.items():
        cubin = nbc.link_cubin(text, arch)  # raises on a ptxas error
        assert len(cubin) > 0
        if arch == "sm_90a":
            assert f"UTMALDG.{r}D.IM2COL" in nbc.sass(cubin)


def test_all_ptx_lists_the_ranks():
    names = [n for n in all_ptx() if n.startswith("tma_load_im2col")]
    assert names == [f"tma_load_im2col(rank={r})" for r in (3, 4, 5)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_test_kernels_compile(name):
    case = CASES[name]
    p = case_params(case)
    d = Im2colTensorMap(FakeCudaArray(case["shape"], case["dtype"]), **p["kwargs"])
    ptx = nbc.compile_ptx(load_kernel(d.shared_shape, case["dtype"]), signature(d, getattr(types, case["dtype"])))
    assert ".im2col." in ptx


def test_constant_attributes():
    def k(desc, out):
        out[0] = desc.box_bytes
        out[1] = desc.pixels_per_column
        out[2] = desc.channels_per_pixel
        out[3] = desc.rank
        out[4] = desc.shared_shape[1]

    ptx = nbc.compile_ptx(k, (desc_of(5, pixels_per_column=24).numba_type, types.int64[:]))
    for v in (24 * 16 * 4, 24, 16, 5):
        assert re.search(rf"mov\.u64\s+%rd\d+, {v};|st\.global\.u64\s+\[%rd\d+(\+\d+)?\], {v};", ptx), v


# -- typing errors ------------------------------------------------------------------------------------------
def _kernel(tile_shape, dtype=np.float32, coords=(0, 0, 0, 0), offsets=(0, 0), shared=True):
    def k(desc, arr):
        tile = cuda.shared.array(tile_shape, dtype, alignment=128) if shared else arr
        bar = cuda.shared.array(1, np.uint64)
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, desc.box_bytes)
        tma_load_im2col(tile, desc, coords, offsets, bar)
        mbarrier_wait_parity(bar, 0)

    return k


@pytest.mark.parametrize(
    "kernel, desc, message",
    [
        (_kernel((32, 16)), TensorMap(FakeCudaArray((2, 5, 6, 16), np.float32), (1, 2, 4, 16)).numba_type,
         "tma_load_im2col: the descriptor is a tiled TensorMap"),
        (_kernel((16, 16)), None, r"holds 1024 bytes but one im2col load of the descriptor occupies 2048 bytes"),
        (_kernel((32, 16), np.int32), None, "the shared tile has dtype int32 but the descriptor moves float32"),
        (_kernel((32, 16), coords=(0, 0, 0)), None, r"coords must have 4 entries \(n, h, w, c\), got 3"),
        (_kernel((32, 16), offsets=(0,)), None, r"offsets must have 2 entries \(h, w\), got 1"),
        (_kernel((32, 16), offsets=(0, 1.5)), None, "every entry of offsets must be an integer"),
        (_kernel((32, 16), shared=False), None, "must be a shared-memory array"),
    ],
)
def test_typing_errors(kernel, desc, message):
    desc = desc if desc is not None else desc_of(4).numba_type
    with pytest.raises(Exception, match=message) as info:
        nbc.compile_ptx(kernel, (desc, types.float32[:, ::1]))
    assert type(info.value).__name__ == "TypingError", info.value


def test_tile_mode_ops_reject_an_im2col_descriptor():
    def k(desc, arr):
        tile = cuda.shared.array((32, 16), np.float32, alignment=128)
        bar = cuda.shared.array(1, np.uint64)
        tma_load(tile, desc, (0, 0, 0, 0), bar)

    with pytest.raises(Exception, match="the descriptor operand must be a numbatma.TensorMap") as info:
        nbc.compile_ptx(k, (desc_of(4).numba_type, types.float32[:, ::1]))
    assert type(info.value).__name__ == "TypingError", info.value


def test_launch_passes_the_descriptor_by_value():
    d = desc_of(4)
    sentinel = object()
    d._descriptor = sentinel  # (what the first launch encodes; no driver here)
    args = []
    assert _prepare_numbatma_arg(d.numba_type, d, args) and args == [sentinel]
