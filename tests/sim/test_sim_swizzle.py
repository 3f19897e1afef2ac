"""Under NUMBA_ENABLE_CUDASIM=1: swizzled tile views (numbatma.intrinsics.swizzle) against NumPy on fresh random
data with poisoned outputs - loads read back in logical order through the view and through swizzle_offset,
tiles written through the view and TMA-stored - for every swizzle, rows narrower than the span, 1- to 8-byte
elements, ranks 1-3; the simulator's hazard checks still see accesses through the view; misuse is reported in
the typer's words."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
)
from numbatma.intrinsics._sim import SimulatedMisuse
from numbatma.intrinsics.swizzle import swizzle_map, swizzle_offset, swizzled

import swizzle_kernels as K

RNG = np.random.default_rng()


@pytest.mark.parametrize("span, dtype, box", K.CASES, ids=K.IDS)
def test_load_then_read_through_the_view(span, dtype, box):
    got, raw, want = K.run_load(RNG, span, dtype, box)
    K.assert_same_bits(got, want)
    K.assert_same_bits(raw, want)  # the same through byte offsets and swizzle_offset


@pytest.mark.parametrize("span, dtype, box", K.CASES, ids=K.IDS)
def test_write_through_the_view_then_store(span, dtype, box):
    got, want = K.run_store(RNG, span, dtype, box)
    K.assert_same_bits(got, want)


def test_the_tile_holds_the_swizzled_image():
    """Writing logical values through the view puts them where swizzle_map says, i.e. not in logical order."""
    host = np.zeros((16, 8), np.float32)
    desc = numbatma.TensorMap(host, (16, 8), swizzle=64)
    shape = desc.shared_shape

    @cuda.jit
    def fill(desc, out):
        tile = cuda.shared.array(shape, np.float32, alignment=1024)
        view = swizzled(tile, desc)
        for k in range(cuda.threadIdx.x, 16 * 8, cuda.blockDim.x):
            view[k // 8, k % 8] = k
        cuda.syncthreads()
        for k in range(cuda.threadIdx.x, 16 * 16, cuda.blockDim.x):
            out[k // 16, k % 16] = tile[k // 16, k % 16]

    out = np.full(shape, -1, np.float32)
    fill[1, 32](desc, out)
    want = np.full(16 * 16, 0, np.float32)  # (bytes the view never writes stay as the simulator made them)
    want[swizzle_map(desc).reshape(-1)] = np.arange(16 * 8)
    np.testing.assert_array_equal(out.reshape(-1), want)
    assert not np.array_equal(out[:, :8], np.arange(128, dtype=np.float32).reshape(16, 8))


def test_swizzle_offset_is_the_formula():
    for span in (0, 32, 64, 128):
        for o in range(0, 4096, 3):
            want = o if not span else o ^ (((o >> 7) & (span // 16 - 1)) << 4)
            assert swizzle_offset(span, o) == want


# -- the hazard checks see the view's accesses ------------------------------------------------------------------
R, C = 8, 32


@cuda.jit
def read_early(src, out, wait):
    tile = cuda.shared.array((R, C), np.float32, alignment=1024)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, 0), bar)
    cuda.syncthreads()
    if wait:
        mbarrier_wait_parity(bar, 0)
    view = swizzled(tile, src)
    out[cuda.threadIdx.x] = view[cuda.threadIdx.x % R, 5]
    if not wait:
        mbarrier_wait_parity(bar, 0)


def test_reading_through_the_view_before_the_wait_is_reported():
    host = RNG.standard_normal((R, C)).astype(np.float32)
    desc = numbatma.TensorMap(host, (R, C), swizzle=128)
    out = np.zeros(4, np.float32)
    read_early[1, 4](desc, out, True)
    np.testing.assert_array_equal(out, host[np.arange(4) % R, 5])
    with pytest.raises(SimulatedMisuse, match=r"reads shared bytes .* of the tile the TMA load at .*before that copy "
                                              r"is known complete"):
        read_early[1, 4](desc, out, False)


@cuda.jit
def write_then_store(dst, fence):
    tile = cuda.shared.array((R, C), np.float32, alignment=1024)
    view = swizzled(tile, dst)
    for k in range(cuda.threadIdx.x, R * C, cuda.blockDim.x):
        view[k // C, k % C] = k
    if fence:
        fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        tma_store(dst, (0, 0), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def test_storing_view_writes_without_the_proxy_fence_is_reported():
    dst = np.zeros((R, C), np.float32)
    desc = numbatma.TensorMap(dst, (R, C), swizzle=128)
    write_then_store[1, 8](desc, True)
    np.testing.assert_array_equal(dst, np.arange(R * C, dtype=np.float32).reshape(R, C))
    with pytest.raises(SimulatedMisuse, match=r"tma_store from a shared tile that .*wrote .* without "
                                              r"fence_proxy_async_shared_cta"):
        write_then_store[1, 8](desc, False)


# -- misuse: the typer's words ------------------------------------------------------------------------------------
def _desc(box=(16, 8), swizzle=64, **kw):
    return numbatma.TensorMap(np.zeros((32, 32), np.float32), box, swizzle=swizzle, **kw)


@cuda.jit
def make_view(desc, kind, out):
    if kind == 0:
        tile = cuda.shared.array((16, 8), np.float32, alignment=1024)  # the box's bytes, not desc.shared_shape
        swizzled(tile, desc)
    elif kind == 1:
        tile = cuda.shared.array((16, 16), np.float64, alignment=1024)
        swizzled(tile, desc)
    elif kind == 2:
        swizzled(out, desc)  # global memory
    elif kind == 3:
        tile = cuda.shared.array((16, 16), np.float32, alignment=1024)
        view = swizzled(tile, desc)
        out[0] = view[1, 2, 3]
    elif kind == 4:
        tile = cuda.shared.array((16, 16), np.float32, alignment=1024)
        view = swizzled(tile, desc)
        out[0] = view[1, 8]  # column 8 of a box of 8 columns
    else:
        tile = cuda.shared.array((16, 16), np.float32, alignment=1024)
        out[0] = swizzled(tile, desc)[15, 7] + swizzled(tile, desc).shape[1]


@pytest.mark.parametrize("kind, error, message", [
    (0, SimulatedMisuse, r"swizzled: the shared tile has shape \(16, 8\) but one box of the descriptor occupies shape "
                         r"\(16, 16\); expected a tile of shape \(16, 16\) .*32-byte rows are narrower than the "
                         r"64-byte swizzle span"),
    (1, SimulatedMisuse, r"swizzled: the shared tile has dtype float64 but the descriptor moves float32 elements"),
    (2, SimulatedMisuse, r"swizzled: the tile must be a shared-memory array"),
    (3, SimulatedMisuse, r"swizzled view: the view of a rank-2 box \(16, 8\) takes 2 indices, view\[i0, c\]; got 3"),
    (4, IndexError, r"swizzled view: index \(1, 8\) is outside the box \(16, 8\)"),
])
def test_misuse_is_reported(kind, error, message):
    with pytest.raises(error, match=message):
        make_view[1, 1](_desc(), kind, np.zeros(1, np.float32))
    make_view[1, 1](_desc(), 5, np.zeros(1, np.float32))  # (the right way)


def test_unsupported_descriptors_are_reported():
    host = np.zeros((4, 8, 32), np.float32)
    strided = numbatma.TensorMap(host, (4, 8, 32), element_strides=(2, 1, 1))
    with pytest.raises(SimulatedMisuse, match=r"swizzled: the descriptor has element_strides \(2, 1, 1\); swizzled "
                                              r"views support element strides of 1 only"):
        swizzled(np.zeros(strided.shared_shape, np.float32).view(_sim_shared()), strided)
    interleaved = numbatma.TensorMap(host, (4, 8, 8), interleave=16)
    with pytest.raises(SimulatedMisuse, match=r"swizzled: the descriptor is interleaved \(interleave=16B\)"):
        swizzled(np.zeros((4, 8, 8), np.float32).view(_sim_shared()), interleaved)


def _sim_shared():
    from numbatma.intrinsics._sim import SharedArray

    return SharedArray
