"""Under NUMBA_ENABLE_CUDASIM=1: TMA copies with box clipping, OOB fill and swizzle byte placement,
mbarrier phases and transaction bytes, the Pipeline, and hang diagnostics."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_reduce,
    bulk_wait_group,
    elect_one_sync,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_test_wait_parity,
    mbarrier_wait_parity,
    named_barrier_sync,
    shared_view,
    tma_load,
    tma_reduce,
    tma_store,
    vote_all,
    vote_any,
)
from numbatma.intrinsics._sim import SimulatedHang

RNG = np.random.default_rng()


@cuda.jit
def load_store(src, dst):
    tile = cuda.shared.array((8, 32), np.float32, alignment=1024)
    bar = cuda.shared.array(1, np.uint64)
    row, col = cuda.blockIdx.y * 8, cuda.blockIdx.x * 32
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (row, col), bar)
        mbarrier_wait_parity(bar, 0)
        tma_store(dst, (row, col), tile)
        bulk_commit_group()
        bulk_wait_group(0)


@pytest.mark.parametrize("swizzle", [0, 128])
def test_round_trip_with_partial_boxes(swizzle):
    host = RNG.standard_normal((20, 72)).astype(np.float32)  # views of 70 columns in rows of 72
    dst = np.full((20, 72), np.nan, np.float32)
    load_store[(3, 3), 4](numbatma.TensorMap(host[:, :70], (8, 32), swizzle=swizzle),
                          numbatma.TensorMap(dst[:, :70], (8, 32), swizzle=swizzle, allow_store_overhang=True))
    np.testing.assert_array_equal(dst[:, :70], host[:, :70])


@cuda.jit
def load_raw(src, out):
    buf = cuda.shared.array(256, np.float32, alignment=1024)
    bar = cuda.shared.array(1, np.uint64)
    cols = src.box[1]
    tile = shared_view(buf, 0, (8, cols))
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, 0), bar)
        mbarrier_wait_parity(bar, 0)
        for k in range(8 * cols):
            out[k] = buf[k]


@pytest.mark.parametrize("span", [32, 64, 128])
def test_swizzle_byte_placement(span):
    """Element (r, c) of the box lands at byte offset o ^ (((o >> 7) & (span/16 - 1)) << 4), o = dense
    offset of the element in the tile (the 16-byte chunk XOR the 128-byte row, modulo the span)."""
    cols = span // 4
    host = np.arange(8 * 64, dtype=np.float32).reshape(8, 64)
    out = np.zeros(8 * cols, np.float32)
    load_raw[1, 1](numbatma.TensorMap(host, (8, cols), swizzle=span), out)
    raw = out.view(np.uint8)
    expect = np.empty_like(raw)
    dense = host[:, :cols].reshape(-1).view(np.uint8)
    for o in range(dense.size):
        expect[o ^ (((o >> 7) & (span // 16 - 1)) << 4)] = dense[o]
    np.testing.assert_array_equal(raw, expect)


@cuda.jit
def oob_fill(src, out):
    tile = cuda.shared.array((4, 8), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (-2, -4), bar)
        mbarrier_wait_parity(bar, 0)
        for i in range(4):
            for j in range(8):
                out[i, j] = tile[i, j]


@pytest.mark.parametrize("fill", ["zero", "nan"])
def test_out_of_bounds_fill(fill):
    host = RNG.standard_normal((6, 8)).astype(np.float32)
    out = np.zeros((4, 8), np.float32)
    oob_fill[1, 1](numbatma.TensorMap(host, (4, 8), oob_fill=fill), out)
    expect = np.full((4, 8), np.nan if fill == "nan" else 0, np.float32)
    expect[2:, 4:] = host[:2, :4]
    np.testing.assert_array_equal(out, expect)


TR, TC, STAGES = 4, 16, 3


@cuda.jit
def ring_sums(src, sums, ntiles):
    ring = cuda.shared.array(0, np.float32, alignment=1024)
    partial = cuda.shared.array(32, np.float32)
    pipe = Pipeline(STAGES, 1, 32)
    if cuda.threadIdx.x // 32 == 0:
        if elect_one_sync():
            for t in range(ntiles):
                s = pipe.producer_acquire()
                pipe.load(shared_view(ring, s * TR * TC, (TR, TC)), src, (t * TR, 0))
                pipe.producer_commit()
    else:
        me = cuda.threadIdx.x - 32
        for t in range(ntiles):
            s = pipe.consumer_wait()
            tile = shared_view(ring, s * TR * TC, (TR, TC))
            acc = np.float32(0)
            for k in range(me, TR * TC, 32):
                acc += tile[k // TC, k % TC]
            partial[me] = acc
            pipe.consumer_release()
            named_barrier_sync(1, 32)
            if me == 0:
                total = np.float32(0)
                for j in range(32):
                    total += partial[j]
                sums[t] = total
            named_barrier_sync(1, 32)


def test_pipeline_rounds():
    ntiles = 7  # more tiles than stages: the ring wraps and the parities flip
    host = RNG.standard_normal((ntiles * TR, TC)).astype(np.float32)
    sums = np.full(ntiles, np.nan, np.float32)
    ring_sums[1, 64, 0, STAGES * TR * TC * 4](numbatma.TensorMap(host, (TR, TC)), sums, ntiles)
    np.testing.assert_allclose(sums, host.reshape(ntiles, -1).sum(axis=1), rtol=1e-5, atol=1e-5)


@cuda.jit
def wrong_parity(src):
    tile = cuda.shared.array((4, 16), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, 0), bar)
        mbarrier_wait_parity(bar, 0)
        mbarrier_wait_parity(bar, 1)  # phase 1 never completes: nobody arrives again


@cuda.jit
def short_tx(src):
    tile = cuda.shared.array((4, 16), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        mbarrier_arrive_expect_tx(bar, src.box_bytes + 16)  # 16 bytes more than the load delivers
        tma_load(tile, src, (0, 0), bar)
        mbarrier_wait_parity(bar, 0)


def test_hang_on_a_phase_nobody_completes():
    host = np.ones((4, 16), np.float32)
    with pytest.raises(SimulatedHang, match=r"parity 1.*phase 1"):
        wrong_parity[1, 1](numbatma.TensorMap(host, (4, 16)))


def test_hang_names_the_missing_transaction_bytes():
    host = np.ones((4, 16), np.float32)
    with pytest.raises(SimulatedHang, match="16 transaction bytes outstanding"):
        short_tx[1, 1](numbatma.TensorMap(host, (4, 16)))


@cuda.jit
def token_and_test(flags):
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 2)
        fence_mbarrier_init()
    cuda.syncthreads()
    mbarrier_arrive(bar)
    cuda.syncthreads()
    flags[cuda.threadIdx.x] = mbarrier_test_wait_parity(bar, 0)


def test_phase_completes_when_every_thread_arrived():
    flags = np.zeros(2, np.bool_)
    token_and_test[1, 2](flags)
    assert flags.tolist() == [True, True]


# -- one reduction semantics for tile reduces and bulk reduces ---------------------------------------------------
@cuda.jit
def tile_reduce_nan(kind, dst, new):
    tile = cuda.shared.array((4, 16), np.float16, alignment=128)
    t = cuda.threadIdx.x
    tile[t // 16, t % 16] = new[t]
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if t == 0:
        tma_reduce(kind, dst, (0, 0), tile)
        bulk_commit_group()
        bulk_wait_group(0)


@cuda.jit
def bulk_reduce_nan(kind, dst, new):
    tile = cuda.shared.array(64, np.float16, alignment=128)
    t = cuda.threadIdx.x
    tile[t] = new[t]
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if t == 0:
        bulk_reduce(kind, dst, tile)
        bulk_commit_group()
        bulk_wait_group(0)


@pytest.mark.parametrize("kind", ["min", "max"])
def test_tile_and_bulk_reduces_agree_on_nan_operands(kind):
    """tma_reduce and bulk_reduce share one element-wise reduction (_sim.reduce_elements): min/max of floats
    return the non-NaN operand (np.fmin / np.fmax; PTX min/max without .NaN - a GPU probe of NaN operands
    is still pending), NaN only when both are NaN."""
    nan = np.float16(np.nan)
    pairs = [(nan, 1.5), (-2.0, nan), (nan, nan), (3.0, -4.0), (-0.5, 0.25), (np.inf, nan), (nan, -np.inf),
             (7.0, 7.0)]
    old = np.array([pairs[i % len(pairs)][0] for i in range(64)], np.float16)
    new = np.array([pairs[i % len(pairs)][1] for i in range(64)], np.float16)
    tiled = old.reshape(4, 16).copy()
    tile_reduce_nan[1, 64](kind, numbatma.TensorMap(tiled, (4, 16)), new)
    flat = old.copy()
    bulk_reduce_nan[1, 64](kind, flat, new)
    want = (np.fmin if kind == "min" else np.fmax)(old, new)
    assert np.isnan(want).sum() == 64 // len(pairs)  # (only where both operands are NaN)
    np.testing.assert_array_equal(tiled.reshape(-1), want)
    np.testing.assert_array_equal(flat, want)


@cuda.jit
def votes(out):
    t = cuda.threadIdx.x
    out[0, t] = vote_any(t == 37)  # only warp 1 has lane 5 = thread 37
    out[1, t] = vote_all(t % 32 != 5)  # false in both warps
    out[2, t] = vote_all(t < 32)  # warp 0 only
    out[3, t] = vote_any(t % 2)  # an integer predicate: nonzero is true


def test_warp_votes():
    """vote_any / vote_all: the same answer in every lane of a warp, each warp on its own lanes."""
    out = cuda.to_device(np.full((4, 64), -1, np.int32))
    votes[1, 64](out)
    got = out.copy_to_host()
    warp0, warp1 = slice(0, 32), slice(32, 64)
    assert (got[0, warp0] == 0).all() and (got[0, warp1] == 1).all()
    assert (got[1] == 0).all()
    assert (got[2, warp0] == 1).all() and (got[2, warp1] == 0).all()
    assert (got[3] == 1).all()
