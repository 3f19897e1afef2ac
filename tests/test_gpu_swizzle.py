"""GPU (marker ``gpu``): swizzled tile views on the hardware, against NumPy on fresh random data with poisoned
outputs. The kernels are those of tests/swizzle_kernels.py (the simulator runs the same ones:
tests/sim/test_sim_swizzle.py):

* a TMA load with each swizzle (32/64/128 bytes, or none), read back in logical order through
  ``swizzled(tile, desc)[i, ..., c]`` and through ``swizzle_offset`` on a flat view of the tile, must equal the
  box (zeros where it hangs over the array);
* a tile written in logical order through the view (fence, block barrier) and TMA-stored must land as written.

Cases cover rows narrower than the swizzle span (each takes a whole span), 1- to 8-byte elements, ranks 1-3
and boxes clipped by the array's edges."""
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
from numbatma.intrinsics.swizzle import swizzle_map, swizzled

import swizzle_kernels as K

pytestmark = pytest.mark.gpu
RNG = np.random.default_rng()


@pytest.mark.parametrize("span, dtype, box", K.CASES, ids=K.IDS)
def test_load_then_read_through_the_view(span, dtype, box):
    got, raw, want = K.run_load(RNG, span, dtype, box)
    K.assert_same_bits(got, want)
    K.assert_same_bits(raw, want)


@pytest.mark.parametrize("span, dtype, box", K.CASES, ids=K.IDS)
def test_write_through_the_view_then_store(span, dtype, box):
    got, want = K.run_store(RNG, span, dtype, box)
    K.assert_same_bits(got, want)


@pytest.mark.parametrize("span, box", [(32, (8, 8)), (64, (16, 8)), (128, (8, 32)), (128, (8, 16))])
def test_the_hardware_image_is_swizzle_map(span, box):
    """After a TMA load, the raw tile (read as a plain array) holds element (r, c) of the box at
    ``swizzle_map(desc)[r, c]``; the view and the raw tile agree."""
    host = RNG.standard_normal((box[0], box[1])).astype(np.float32)
    desc = numbatma.TensorMap(cuda.to_device(host), box, swizzle=span)
    shape = desc.shared_shape
    total = int(np.prod(shape))
    rows, cols = shape

    @cuda.jit
    def image(src, raw):
        tile = cuda.shared.array(shape, np.float32, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        for k in range(cuda.threadIdx.x, total, cuda.blockDim.x):
            tile[k // cols, k % cols] = np.float32(np.nan)  # (bytes the load leaves alone)
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            tma_load(tile, src, (0, 0), bar)
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        for k in range(cuda.threadIdx.x, total, cuda.blockDim.x):
            raw[k] = tile[k // cols, k % cols]

    d_raw = cuda.to_device(np.zeros(total, np.float32))
    image[1, 128](desc, d_raw)
    raw = d_raw.copy_to_host()
    np.testing.assert_array_equal(raw[swizzle_map(desc)], host)
    written = np.zeros(total, bool)
    written[swizzle_map(desc).reshape(-1)] = True
    assert np.isnan(raw[~written]).all()  # padding of narrow rows: never written


def test_round_trip_through_two_views():
    """Load a 64B-swizzled float16 tile (rows of exactly the span), transpose it through views into the tile of
    a 128B-swizzled descriptor (64-byte rows: each takes a whole span), store that: the destination holds the
    transposed array."""
    n = 32
    host = RNG.standard_normal((2 * n, 2 * n)).astype(np.float16)
    src = numbatma.TensorMap(cuda.to_device(host), (n, n), swizzle=64)
    out = cuda.to_device(np.full((2 * n, 2 * n), np.nan, np.float16))
    dst = numbatma.TensorMap(out, (n, n), swizzle=128)
    shape_a, shape_b = src.shared_shape, dst.shared_shape
    assert shape_a == (n, n) and shape_b == (n, 64)

    @cuda.jit
    def transpose(src, dst):
        a = cuda.shared.array(shape_a, np.float16, alignment=1024)
        b = cuda.shared.array(shape_b, np.float16, alignment=1024)
        bar = cuda.shared.array(1, np.uint64)
        r0, c0 = cuda.blockIdx.y * n, cuda.blockIdx.x * n
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            tma_load(a, src, (r0, c0), bar)
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        va = swizzled(a, src)
        vb = swizzled(b, dst)
        for k in range(cuda.threadIdx.x, n * n, cuda.blockDim.x):
            vb[k % n, k // n] = va[k // n, k % n]
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            tma_store(dst, (c0, r0), b)
            bulk_commit_group()
            bulk_wait_group(0)

    transpose[(2, 2), 128](src, dst)
    np.testing.assert_array_equal(out.copy_to_host().view(np.uint16), np.ascontiguousarray(host.T).view(np.uint16))
