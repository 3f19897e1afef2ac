"""Under NUMBA_ENABLE_CUDASIM=1: bulk (non-tensor) copies, bulk reductions, the L2 prefetch and the
block-cooperative memcpy_async give NumPy's result; a size that is not a multiple of 16, a misaligned
address, a range past the array, reading before the wait and reusing a store's source too early are
reported.

The kernels and runners are those of the GPU tests (tests/bulk_kernels.py); the kernels defined here exist only
to break a rule the simulator reports."""
import numpy as np
import pytest
from numba import cuda

from numbatma.cluster import with_cluster
from numbatma.intrinsics import (
    bulk_commit_group,
    cluster_ctarank,
    bulk_wait_group,
    bulk_wait_group_read,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mapa_barrier,
    mapa_shared,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
)
from numbatma.intrinsics._sim import SimulatedMisuse
from numbatma.intrinsics.async_copy import memcpy_async
from numbatma.intrinsics.bulk import bulk_copy_to_cluster, bulk_load_at, bulk_reduce, bulk_store, bulk_store_at

import bulk_kernels as K

RNG = np.random.default_rng()


# -- global -> shared -> global with run-time byte counts and offsets -------------------------------------
@pytest.mark.parametrize("nbytes", K.ROUND_TRIP_SIZES[:3])
@pytest.mark.parametrize("prefetch", [False, True])
def test_round_trip_odd_sizes(nbytes, prefetch):
    got, want = K.run_round_trip(RNG, nbytes, prefetch)
    np.testing.assert_array_equal(got, want)


@cuda.jit
def store_before_the_wait(src, dst, nbytes):
    buf = cuda.shared.array(0, np.uint8)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, nbytes)
        bulk_load_at(buf, 0, src, 0, nbytes, bar)
        bulk_store_at(dst, 0, buf, 0, nbytes)  # (no mbarrier_wait_parity before it)
        bulk_commit_group()
        bulk_wait_group(0)


def test_store_before_the_load_is_waited_for_is_reported():
    src = np.ones(64, np.uint8)
    with pytest.raises(SimulatedMisuse, match=r"bulk_store_at reads shared bytes .* of the bytes the bulk_load_at at "
                                              r".* before that copy is known complete"):
        store_before_the_wait[1, 1, 0, 64](src, np.zeros(64, np.uint8), 32)


@pytest.mark.parametrize("nbytes, src_off, dst_off, message", [
    (40, 0, 0, r"positive multiple of 16, got 40"),
    (0, 0, 0, r"positive multiple of 16, got 0"),
    (16, 8, 0, r"the source address is 8 bytes past a 16-byte boundary"),
    (16, 0, 4, r"the destination address is 4 bytes past a 16-byte boundary"),
    (64, 32, 0, r"64 bytes from element \(32,\) run 32 byte\(s\) past the end of the source"),
])
def test_misuse_of_sizes_and_alignment(nbytes, src_off, dst_off, message):
    with pytest.raises(SimulatedMisuse, match=message):
        K.round_trip_at_kernel[1, 1, 0, 128](np.ones(64, np.uint8), np.zeros(64, np.uint8), src_off, dst_off,
                                             nbytes, False)


@pytest.mark.parametrize("nbytes, src_off, message", [
    (24, 0, r"bulk_prefetch_l2_at: the byte count must be a positive multiple of 16, got 24"),
    (16, 8, r"bulk_prefetch_l2_at: the prefetched array address is 8 bytes past a 16-byte boundary"),
    (64, 16, r"bulk_prefetch_l2_at: 64 bytes from element \(16,\) run 16 byte\(s\) past the end"),
])
def test_prefetch_checks_its_arguments(nbytes, src_off, message):
    with pytest.raises(SimulatedMisuse, match=message):
        K.round_trip_at_kernel[1, 1, 0, 64](np.ones(64, np.uint8), np.zeros(64, np.uint8), src_off, 0, nbytes, True)


# -- the whole-array forms, a 2-D tile, all threads read after the wait ----------------------------------------
@pytest.mark.parametrize("rows, cols, dtype", K.TILE_CASES)
def test_whole_array_forms(rows, cols, dtype):
    dst, out, src = K.run_tile_round_trip(RNG, rows, cols, dtype)
    want = src.copy()
    want[:, 0] *= -1
    np.testing.assert_array_equal(dst, want)
    np.testing.assert_array_equal(out, src.reshape(-1))


# -- reductions -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("op, dtype", K.REDUCE_CASES)
def test_reduce_matches_numpy(op, dtype, indexed):
    got, want = K.run_reduce(RNG, op, dtype, indexed, 1)
    u = f"u{want.itemsize}"
    np.testing.assert_array_equal(got.view(u), want.view(u))


@pytest.mark.parametrize("op, dtype", K.MANY_BLOCK_CASES)
def test_reduce_from_several_blocks(op, dtype):
    got, want = K.run_reduce(RNG, op, dtype, False, 3)
    np.testing.assert_array_equal(got, want)


def test_reduce_float_add_from_several_blocks():
    got, want = K.run_float_add(RNG, 3)
    np.testing.assert_array_equal(got, want)


# -- the store's source may be reused only after bulk_wait_group_read ------------------------------------------
@cuda.jit
def reuse_source(dst, wait_read):
    tile = cuda.shared.array(16, np.int32, alignment=16)
    tid = cuda.threadIdx.x
    tile[tid] = tid
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        bulk_reduce("add", dst, tile)
        bulk_commit_group()
        if wait_read:
            bulk_wait_group_read(0)
    cuda.syncthreads()
    tile[tid] = 100
    if tid == 0:
        bulk_wait_group(0)


def test_reusing_the_source_before_the_read_completes_is_reported():
    with pytest.raises(SimulatedMisuse, match=r"may still be reading.*bulk_wait_group_read"):
        reuse_source[1, 16](np.zeros(16, np.int32), False)
    dst = np.ones(16, np.int32)
    reuse_source[1, 16](dst, True)
    np.testing.assert_array_equal(dst, 1 + np.arange(16))


@cuda.jit
def unfenced_store(dst):
    tile = cuda.shared.array(16, np.int32, alignment=16)
    tile[cuda.threadIdx.x] = 7
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        bulk_store(dst, tile)
        bulk_commit_group()
        bulk_wait_group(0)


def test_store_of_unfenced_writes_is_reported():
    with pytest.raises(SimulatedMisuse, match=r"bulk_store from a shared tile that .* without "
                                              r"fence_proxy_async_shared_cta"):
        unfenced_store[1, 16](np.zeros(16, np.int32))


# -- shared -> shared::cluster within the one CTA of a simulated cluster -------------------------------------
@pytest.mark.parametrize("nbytes", K.CLUSTER_SELF_SIZES + [112])
@pytest.mark.parametrize("plain", [True, False])
def test_cluster_copy_within_the_cta(nbytes, plain):
    got, src = K.run_cluster_copy_self(RNG, nbytes, plain=plain)
    np.testing.assert_array_equal(got[:nbytes // 4], src[:nbytes // 4])
    np.testing.assert_array_equal(got[nbytes // 4:], -1)


def test_cluster_copy_between_ctas_is_not_simulated():
    src = np.zeros(512, np.int32)
    with pytest.raises(NotImplementedError, match=r"clusters of \(2, 1, 1\) CTAs cannot run"):
        with_cluster(K.cluster_exchange_kernel, (2, 1, 1))[2, 256](src, np.zeros_like(src))


# -- block-cooperative memcpy_async ------------------------------------------------------------------------
MC_ROWS, MC_COLS = K.MEMCPY_SMALL  # 480 bytes: 30 pieces of 16 bytes over 8 threads (uneven shares)
MEMCPY_CASES = [(MC_ROWS, MC_COLS, 480, (8, 1)), (MC_ROWS, MC_COLS, 208, (8, 1))] + [
    (K.MC_ROWS, K.MC_COLS, nbytes, block) for nbytes, block in K.MEMCPY_CASES]


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("rows, cols, nbytes, block", MEMCPY_CASES)
def test_memcpy_async(mode, rows, cols, nbytes, block):
    got, src = K.run_block_copy(RNG, mode, nbytes, block, rows, cols)
    n = nbytes // 4
    for rnd in range(2):
        want = np.full(rows * cols, -1.0, np.float32)
        want[:n] = src[rnd].reshape(-1)[:n]
        np.testing.assert_array_equal(got[rnd], want)


@cuda.jit
def memcpy_read_before_the_wait(src, out, nbytes):
    tile = cuda.shared.array((MC_ROWS, MC_COLS), np.float32, alignment=16)
    tid = cuda.threadIdx.x
    for k in range(tid, MC_ROWS * MC_COLS, cuda.blockDim.x):
        tile[k // MC_COLS, k % MC_COLS] = -1.0
    cuda.syncthreads()
    memcpy_async(tile, src, nbytes)  # (no cp_async_wait_all before the reads)
    for k in range(tid, MC_ROWS * MC_COLS, cuda.blockDim.x):
        out[k // MC_COLS, k % MC_COLS] = tile[k // MC_COLS, k % MC_COLS]


def test_memcpy_async_read_before_wait_is_reported():
    src = np.ones((MC_ROWS, MC_COLS), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"before that copy is known complete"):
        memcpy_read_before_the_wait[1, 8](src, np.zeros_like(src), 480)


def test_memcpy_async_size_not_multiple_of_16_is_reported():
    src = np.ones((2, MC_ROWS, MC_COLS), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"memcpy_async: nbytes must be a non-negative multiple of 16, got 40"):
        K.block_copy_kernel(MC_ROWS, MC_COLS)[1, 8](src, np.zeros_like(src), 0, 40)


# -- the same through shared::cluster addresses (mapa_shared / mapa_barrier of the CTA's own rank) ---------
@cuda.jit
def cluster_copy_mapped(src, out, nbytes, offset):
    a = cuda.shared.array(64, np.int32, alignment=16)
    b = cuda.shared.array(64, np.int32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    a[tid] = src[tid]
    b[tid] = -1
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        rank = cluster_ctarank()
        mbarrier_arrive_expect_tx(bar, nbytes)
        bulk_copy_to_cluster(mapa_shared(b, rank) + offset, a, nbytes, mapa_barrier(bar, rank))
    mbarrier_wait_parity(bar, 0)
    out[tid] = b[tid]


def test_cluster_copy_through_mapped_addresses():
    src = RNG.integers(-1000, 1000, 64).astype(np.int32)
    out = np.zeros(64, np.int32)
    cluster_copy_mapped[1, 64](src, out, 64, 32)  # 16 elements into b[8:24]
    want = np.full(64, -1, np.int32)
    want[8:24] = src[:16]
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("nbytes, offset, message", [
    (64, 8, r"is not 16-byte aligned"),
    (64, 224, r"64 bytes from address .* run 32 byte\(s\) past the end of shared array 'b'"),
    (48, 4096, r"not inside a shared array translated with mapa_shared"),
])
def test_cluster_copy_misuse(nbytes, offset, message):
    with pytest.raises(SimulatedMisuse, match=message):
        cluster_copy_mapped[1, 1](np.zeros(64, np.int32), np.zeros(64, np.int32), nbytes, offset)
