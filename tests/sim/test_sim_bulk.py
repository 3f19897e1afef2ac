"""Under NUMBA_ENABLE_CUDASIM=1: bulk (non-tensor) copies, bulk reductions, the L2 prefetch and the
block-cooperative memcpy_async give NumPy's result; a size that is not a multiple of 16, a misaligned
address, a range past the array, reading before the wait and reusing a store's source too early are
reported."""
import numpy as np
import pytest
from numba import cuda

from numbatma.intrinsics import (
    bulk_commit_group,
    cluster_ctarank,
    bulk_wait_group,
    bulk_wait_group_read,
    cp_async_wait_all,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mapa_barrier,
    mapa_shared,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
)
from numbatma.intrinsics._sim import SimulatedMisuse
from numbatma.intrinsics.async_copy import memcpy_async, memcpy_async_mbarrier
from numbatma.intrinsics.bulk import (
    REDUCE_TYPES,
    bulk_copy_to_cluster,
    bulk_load,
    bulk_load_at,
    bulk_prefetch_l2,
    bulk_prefetch_l2_at,
    bulk_reduce,
    bulk_reduce_at,
    bulk_store,
    bulk_store_at,
)

RNG = np.random.default_rng()


# -- global -> shared -> global with run-time byte counts and offsets -------------------------------------
@cuda.jit
def round_trip_at(src, dst, src_off, dst_off, nbytes, wait, prefetch=False):
    buf = cuda.shared.array(0, np.uint8)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        if prefetch:
            bulk_prefetch_l2_at(src, src_off, nbytes)
        mbarrier_arrive_expect_tx(bar, nbytes)
        bulk_load_at(buf, 0, src, src_off, nbytes, bar)
        if wait:
            mbarrier_wait_parity(bar, 0)
        bulk_store_at(dst, dst_off, buf, 0, nbytes)
        bulk_commit_group()
        bulk_wait_group(0)


@pytest.mark.parametrize("nbytes", [16, 48, 4112])
def test_round_trip_odd_sizes(nbytes):
    src = RNG.integers(0, 256, nbytes + 64, dtype=np.uint8)
    dst = np.full(nbytes + 96, 0xAB, np.uint8)
    round_trip_at[1, 1, 0, nbytes](src, dst, 32, 48, nbytes, True, True)
    want = np.full_like(dst, 0xAB)
    want[48:48 + nbytes] = src[32:32 + nbytes]
    np.testing.assert_array_equal(dst, want)


def test_store_before_the_load_is_waited_for_is_reported():
    src = np.ones(64, np.uint8)
    with pytest.raises(SimulatedMisuse, match=r"bulk_store_at reads shared bytes .* of the bytes the bulk_load_at at "
                                              r".* before that copy is known complete"):
        round_trip_at[1, 1, 0, 64](src, np.zeros(64, np.uint8), 0, 0, 32, False)


@pytest.mark.parametrize("nbytes, src_off, dst_off, message", [
    (40, 0, 0, r"positive multiple of 16, got 40"),
    (0, 0, 0, r"positive multiple of 16, got 0"),
    (16, 8, 0, r"the source address is 8 bytes past a 16-byte boundary"),
    (16, 0, 4, r"the destination address is 4 bytes past a 16-byte boundary"),
    (64, 32, 0, r"64 bytes from element \(32,\) run 32 byte\(s\) past the end of the source"),
])
def test_misuse_of_sizes_and_alignment(nbytes, src_off, dst_off, message):
    with pytest.raises(SimulatedMisuse, match=message):
        round_trip_at[1, 1, 0, 128](np.ones(64, np.uint8), np.zeros(64, np.uint8), src_off, dst_off, nbytes, True)


# -- the whole-array forms, a 2-D tile, all threads read after the wait ----------------------------------------
ROWS, COLS = 3, 12  # 144 bytes of float32


@cuda.jit
def tile_round_trip(src, dst, out):
    tile = cuda.shared.array((ROWS, COLS), np.float32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        bulk_prefetch_l2(src, ROWS * COLS * 4)
        mbarrier_arrive_expect_tx(bar, ROWS * COLS * 4)
        bulk_load(tile, src, bar)
    cuda.syncthreads()  # (the barrier is initialised before anyone waits on it)
    mbarrier_wait_parity(bar, 0)
    out[tid] = tile[tid % ROWS, tid]
    cuda.syncthreads()
    if tid < ROWS:
        tile[tid, 0] = -tile[tid, 0]
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        bulk_store(dst, tile)
        bulk_commit_group()
        bulk_wait_group(0)


def test_whole_array_forms():
    src = RNG.standard_normal((ROWS, COLS)).astype(np.float32)
    dst = np.full((ROWS, COLS), np.nan, np.float32)
    out = np.full(COLS, np.nan, np.float32)
    tile_round_trip[1, COLS](src, dst, out)
    want = src.copy()
    want[:, 0] *= -1
    np.testing.assert_array_equal(dst, want)
    np.testing.assert_array_equal(out, src[np.arange(COLS) % ROWS, np.arange(COLS)])


# -- reductions -------------------------------------------------------------------------------------------
N_RED = 24  # elements of the reduced tile (48, 96 or 192 bytes)


def _operands(op, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        old = RNG.integers(-50, 50, N_RED).astype(dtype)  # exact in float16 too
        new = RNG.integers(-50, 50, N_RED).astype(dtype)
    elif op in ("inc", "dec"):
        old = RNG.integers(0, 10, N_RED).astype(dtype)
        new = RNG.integers(0, 10, N_RED).astype(dtype)
        old[:3] = (0, 5, 9)
        new[:3] = (4, 5, 3)  # dec: old == 0, old == new, old > new
    else:
        info = np.iinfo(dtype)
        old = RNG.integers(info.min, info.max, N_RED, dtype=dtype, endpoint=True)
        new = RNG.integers(info.min, info.max, N_RED, dtype=dtype, endpoint=True)
    return old, new


def _numpy_reduce(op, old, new):
    if op == "add":
        with np.errstate(over="ignore"):
            return old + new
    if op == "inc":
        return np.where(old >= new, 0, old + 1).astype(old.dtype)
    if op == "dec":
        return np.where((old == 0) | (old > new), new, old - 1).astype(old.dtype)
    return {"min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
            "xor": np.bitwise_xor}[op](old, new)


def _reduce_kernel(op, dtype, indexed):
    @cuda.jit
    def k(src, dst):
        tile = cuda.shared.array(N_RED, dtype, alignment=16)
        tid = cuda.threadIdx.x
        tile[tid] = src[tid]
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if tid == 0:
            if indexed:
                bulk_reduce_at(op, dst, 0, tile, 0, N_RED * tile.itemsize)
            else:
                bulk_reduce(op, dst, tile)
            bulk_commit_group()
            bulk_wait_group(0)

    return k


CASES = [(op, dt) for op, table in REDUCE_TYPES.items() for dt in table]


@pytest.mark.parametrize("op, dtype", CASES)
def test_reduce_matches_numpy(op, dtype):
    old, new = _operands(op, dtype)
    dst = old.copy()
    _reduce_kernel(op, dtype, indexed=(op in ("min", "and", "inc")))[1, N_RED](new, dst)
    np.testing.assert_array_equal(dst, _numpy_reduce(op, old, new))


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
@cuda.jit
def cluster_copy_self(src, out, nbytes):
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
        mbarrier_arrive_expect_tx(bar, nbytes)
        bulk_copy_to_cluster(b, a, nbytes, bar)
    mbarrier_wait_parity(bar, 0)
    out[tid] = b[tid]


def test_cluster_copy_within_the_cta():
    src = RNG.integers(-1000, 1000, 64).astype(np.int32)
    out = np.zeros(64, np.int32)
    cluster_copy_self[1, 64](src, out, 112)  # 28 elements
    np.testing.assert_array_equal(out[:28], src[:28])
    np.testing.assert_array_equal(out[28:], -1)


@pytest.mark.parametrize("nbytes, src_off, message", [
    (24, 0, r"bulk_prefetch_l2_at: the byte count must be a positive multiple of 16, got 24"),
    (16, 8, r"bulk_prefetch_l2_at: the prefetched array address is 8 bytes past a 16-byte boundary"),
    (64, 16, r"bulk_prefetch_l2_at: 64 bytes from element \(16,\) run 16 byte\(s\) past the end"),
])
def test_prefetch_checks_its_arguments(nbytes, src_off, message):
    with pytest.raises(SimulatedMisuse, match=message):
        round_trip_at[1, 1, 0, 64](np.ones(64, np.uint8), np.zeros(64, np.uint8), src_off, 0, nbytes, True, True)


# -- block-cooperative memcpy_async ------------------------------------------------------------------------
MC_ROWS, MC_COLS = 5, 24  # 480 bytes: 30 pieces of 16 bytes over 8 threads (uneven shares)


@cuda.jit
def block_copy(src, out, mode, nbytes):
    tile = cuda.shared.array((MC_ROWS, MC_COLS), np.float32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, cuda.blockDim.x)
        fence_mbarrier_init()
    for k in range(tid, MC_ROWS * MC_COLS, cuda.blockDim.x):
        tile[k // MC_COLS, k % MC_COLS] = -1.0
    cuda.syncthreads()
    if mode == 0:
        memcpy_async(tile, src, nbytes)
        cp_async_wait_all()
        cuda.syncthreads()
    elif mode == 1:
        memcpy_async_mbarrier(tile, src, nbytes, bar)
        mbarrier_wait_parity(bar, 0)
    else:  # reads without waiting
        memcpy_async(tile, src, nbytes)
    for k in range(tid, MC_ROWS * MC_COLS, cuda.blockDim.x):
        out[k // MC_COLS, k % MC_COLS] = tile[k // MC_COLS, k % MC_COLS]


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("nbytes", [480, 208])
def test_memcpy_async(mode, nbytes):
    src = RNG.standard_normal((MC_ROWS, MC_COLS)).astype(np.float32)
    out = np.full_like(src, np.nan)
    block_copy[1, 8](src, out, mode, nbytes)
    want = np.full(src.size, -1.0, np.float32)
    want[:nbytes // 4] = src.reshape(-1)[:nbytes // 4]
    np.testing.assert_array_equal(out.reshape(-1), want)


def test_memcpy_async_read_before_wait_is_reported():
    src = np.ones((MC_ROWS, MC_COLS), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"before that copy is known complete"):
        block_copy[1, 8](src, np.zeros_like(src), 2, 480)


def test_memcpy_async_size_not_multiple_of_16_is_reported():
    src = np.ones((MC_ROWS, MC_COLS), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"memcpy_async: nbytes must be a non-negative multiple of 16, got 40"):
        block_copy[1, 8](src, np.zeros_like(src), 0, 40)


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
