"""GPU tests (marker ``gpu``): bulk (non-tensor) copies, bulk reductions, the L2 prefetch and the
block-cooperative memcpy_async against NumPy on fresh random data. Outputs are poisoned before every
launch, so an element nobody wrote fails the comparison.

The kernels are module-level (or built by module-level factories) so that tests/test_bulk_cpu.py can
compile every one of them for sm_90a offline."""
import numpy as np
import pytest
from numba import cuda

from numbatma.cluster import with_cluster
from numbatma.intrinsics import (
    bulk_commit_group,
    cluster_ctarank,
    cluster_sync,
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

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()


def random_bits(n, dtype):
    dtype = np.dtype(dtype)
    return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)


# -- global -> shared -> global, run-time sizes and offsets ---------------------------------------------
def round_trip_at(src, dst, src_off, dst_off, nbytes, prefetch):
    buf = cuda.shared.array(0, np.uint8, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        if prefetch:
            bulk_prefetch_l2_at(src, src_off, nbytes)
        mbarrier_arrive_expect_tx(bar, nbytes)
        bulk_load_at(buf, 0, src, src_off, nbytes, bar)
    cuda.syncthreads()
    mbarrier_wait_parity(bar, 0)
    # every thread checks the shared copy itself, byte by byte (the async proxy wrote it)
    for i in range(cuda.threadIdx.x, nbytes, cuda.blockDim.x):
        if buf[i] != src[src_off + i]:
            dst[0] = 0xEE  # spoils the comparison
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        bulk_store_at(dst, dst_off, buf, 0, nbytes)
        bulk_commit_group()
        bulk_wait_group(0)


round_trip_at_kernel = cuda.jit(round_trip_at)


@pytest.mark.parametrize("nbytes", [16, 48, 4112, 40976])
@pytest.mark.parametrize("prefetch", [False, True])
def test_round_trip_odd_sizes(nbytes, prefetch):
    src = rng.integers(0, 256, nbytes + 64, dtype=np.uint8)
    src_off, dst_off = 32, 48
    dst = cuda.to_device(np.full(nbytes + 96, 0xAB, np.uint8))
    round_trip_at_kernel[1, 128, 0, nbytes](cuda.to_device(src), dst, src_off, dst_off, nbytes, prefetch)
    want = np.full(nbytes + 96, 0xAB, np.uint8)
    want[dst_off:dst_off + nbytes] = src[src_off:src_off + nbytes]
    np.testing.assert_array_equal(dst.copy_to_host(), want)


# -- the whole-array forms on a 2-D float64 tile (its static shape gives the byte count) -----------------
ROWS, COLS = 5, 6  # 240 bytes


def tile_round_trip(src, dst, out):
    tile = cuda.shared.array((ROWS, COLS), np.float64, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        bulk_prefetch_l2(src, ROWS * COLS * 8)
        mbarrier_arrive_expect_tx(bar, ROWS * COLS * 8)
        bulk_load(tile, src, bar)
    cuda.syncthreads()
    mbarrier_wait_parity(bar, 0)
    if tid < ROWS * COLS:
        out[tid] = tile[tid // COLS, tid % COLS]
    cuda.syncthreads()
    if tid < ROWS:
        tile[tid, 0] = -tile[tid, 0]
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        bulk_store(dst, tile)
        bulk_commit_group()
        bulk_wait_group(0)


tile_round_trip_kernel = cuda.jit(tile_round_trip)


def test_whole_array_forms():
    src = rng.standard_normal((ROWS, COLS))
    dst = cuda.to_device(np.full((ROWS, COLS), np.nan))
    out = cuda.to_device(np.full(ROWS * COLS, np.nan))
    tile_round_trip_kernel[1, 32](cuda.to_device(src), dst, out)
    want = src.copy()
    want[:, 0] *= -1
    np.testing.assert_array_equal(dst.copy_to_host(), want)
    np.testing.assert_array_equal(out.copy_to_host(), src.reshape(-1))


# -- reductions: every operation and element type, one block and many blocks -----------------------------
N_RED = 40  # elements: 80 to 320 bytes


def make_reduce_kernel(op, dtype, indexed):
    def reduce_kernel(src, dst):
        tile = cuda.shared.array(N_RED, dtype, alignment=16)
        tid = cuda.threadIdx.x
        if tid < N_RED:
            tile[tid] = src[cuda.blockIdx.x, tid]
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if tid == 0:
            if indexed:
                bulk_reduce_at(op, dst, 0, tile, 0, N_RED * tile.itemsize)
            else:
                bulk_reduce(op, dst, tile)
            bulk_commit_group()
            bulk_wait_group_read(0)
            bulk_wait_group(0)

    return reduce_kernel


REDUCE_CASES = [(op, dt) for op, table in REDUCE_TYPES.items() for dt in table]


def reduce_operands(op, dtype, blocks):
    dtype = np.dtype(dtype)
    if dtype.kind == "f" and op == "add" and dtype != np.float16:
        return rng.standard_normal(N_RED).astype(dtype), rng.standard_normal((blocks, N_RED)).astype(dtype)
    if dtype.kind == "f":  # small integers: exact in float16, sums too
        return (rng.integers(-50, 50, N_RED).astype(dtype), rng.integers(-50, 50, (blocks, N_RED)).astype(dtype))
    if op in ("inc", "dec"):
        old = rng.integers(0, 10, N_RED).astype(dtype)
        new = rng.integers(0, 10, (blocks, N_RED)).astype(dtype)
        old[:4] = (0, 5, 9, 3)
        new[0, :4] = (4, 5, 3, 0)  # dec: old == 0, old == s, old > s, s == 0
        return old, new
    return random_bits(N_RED, dtype), random_bits(blocks * N_RED, dtype).reshape(blocks, N_RED)


def numpy_reduce(op, old, new):
    if op == "add":
        with np.errstate(over="ignore"):
            return (old + new).astype(old.dtype)
    if op == "inc":
        return np.where(old >= new, 0, old + 1).astype(old.dtype)
    if op == "dec":
        return np.where((old == 0) | (old > new), new, old - 1).astype(old.dtype)
    return {"min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
            "xor": np.bitwise_xor}[op](old, new)


@pytest.mark.parametrize("indexed", [False, True])
@pytest.mark.parametrize("op, dtype", REDUCE_CASES)
def test_reduce_one_block(op, dtype, indexed):
    old, new = reduce_operands(op, dtype, 1)
    dst = cuda.to_device(old)
    cuda.jit(make_reduce_kernel(op, dtype, indexed))[1, 64](cuda.to_device(new), dst)
    want = numpy_reduce(op, old, new[0])
    np.testing.assert_array_equal(dst.copy_to_host().view(f"u{old.itemsize}"), want.view(f"u{old.itemsize}"))


@pytest.mark.parametrize("op, dtype", [("add", "int32"), ("add", "uint64"), ("add", "int64"), ("min", "int32"),
                                       ("max", "uint64"), ("xor", "uint32"), ("or", "int64")])
def test_reduce_many_blocks_is_atomic(op, dtype):
    """96 blocks reduce into the same 40 elements: every contribution lands (element-wise atomic)."""
    blocks = 96
    old, new = reduce_operands(op, dtype, blocks)
    dst = cuda.to_device(old)
    cuda.jit(make_reduce_kernel(op, dtype, False))[blocks, 64](cuda.to_device(new), dst)
    want = old
    for b in range(blocks):
        want = numpy_reduce(op, want, new[b])
    np.testing.assert_array_equal(dst.copy_to_host(), want)


def test_reduce_float_add_many_blocks():
    """float64 add of small integers from 64 blocks: exact whatever the order."""
    blocks = 64
    old = rng.integers(-1000, 1000, N_RED).astype(np.float64)
    new = rng.integers(-1000, 1000, (blocks, N_RED)).astype(np.float64)
    dst = cuda.to_device(old)
    cuda.jit(make_reduce_kernel("add", "float64", False))[blocks, 64](cuda.to_device(new), dst)
    np.testing.assert_array_equal(dst.copy_to_host(), old + new.sum(axis=0))


# -- shared -> shared::cluster: within one CTA (own addresses) ---------------------------------------------
def cluster_copy_self(src, out, nbytes):
    a = cuda.shared.array(256, np.int32, alignment=16)
    b = cuda.shared.array(256, np.int32, alignment=16)
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


cluster_copy_self_kernel = cuda.jit(cluster_copy_self)


@pytest.mark.parametrize("nbytes", [16, 48, 1008])
def test_cluster_copy_within_the_cta(nbytes):
    src = rng.integers(-(2**31), 2**31 - 1, 256, dtype=np.int32)
    out = cuda.to_device(np.full(256, 12345, np.int32))
    # (an explicit cluster launch, even of one CTA: with a plain launch the copy faults on an H200,
    # scripts/probe_bulk_cluster_self.py)
    with_cluster(cluster_copy_self_kernel, (1, 1, 1))[1, 256](cuda.to_device(src), out, nbytes)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[:nbytes // 4], src[:nbytes // 4])
    np.testing.assert_array_equal(got[nbytes // 4:], -1)


def cluster_exchange(src, out):
    """Two CTAs of a cluster swap 1 KB: each copies its tile into its peer's buffer, completing on the
    peer's barrier."""
    a = cuda.shared.array(256, np.int32, alignment=16)
    b = cuda.shared.array(256, np.int32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    rank = cluster_ctarank()
    peer = rank ^ 1
    base = cuda.blockIdx.x * 256
    a[tid] = src[base + tid]
    b[tid] = -1
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    fence_proxy_async_shared_cta()
    cluster_sync()  # both barriers initialised, both tiles written
    if tid == 0:
        mbarrier_arrive_expect_tx(bar, 1024)  # the bytes the peer sends us
        bulk_copy_to_cluster(mapa_shared(b, peer), a, 1024, mapa_barrier(bar, peer))
    mbarrier_wait_parity(bar, 0)
    out[base + tid] = b[tid]
    cluster_sync()  # the peer has received our tile before we exit


cluster_exchange_kernel = cuda.jit(cluster_exchange)


def test_cluster_copy_between_ctas():
    blocks = 4
    src = rng.integers(-(2**31), 2**31 - 1, blocks * 256, dtype=np.int32)
    out = cuda.to_device(np.full(blocks * 256, 12345, np.int32))
    with_cluster(cluster_exchange_kernel, (2, 1, 1))[blocks, 256](cuda.to_device(src), out)
    want = src.reshape(blocks // 2, 2, 256)[:, ::-1].reshape(-1)
    np.testing.assert_array_equal(out.copy_to_host(), want)


# -- block-cooperative memcpy_async ------------------------------------------------------------------------
MC_ROWS, MC_COLS = 37, 40  # 5920 bytes of float32: 370 pieces over 128 threads (uneven shares)


def block_copy(src, out, mode, nbytes):
    tile = cuda.shared.array((MC_ROWS, MC_COLS), np.float32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
    nthreads = cuda.blockDim.x * cuda.blockDim.y
    if tid == 0:
        mbarrier_init(bar, nthreads)
        fence_mbarrier_init()
    for k in range(tid, MC_ROWS * MC_COLS, nthreads):
        tile[k // MC_COLS, k % MC_COLS] = -1.0
    cuda.syncthreads()
    for rnd in range(2):  # two rounds: the barrier's second phase, a second commit group
        if mode == 0:
            memcpy_async(tile, src[rnd], nbytes)
            cp_async_wait_all()
            cuda.syncthreads()
        else:
            memcpy_async_mbarrier(tile, src[rnd], nbytes, bar)
            mbarrier_wait_parity(bar, rnd & 1)
        for k in range(tid, MC_ROWS * MC_COLS, nthreads):
            out[rnd, k // MC_COLS, k % MC_COLS] = tile[k // MC_COLS, k % MC_COLS]
        cuda.syncthreads()  # everyone read the tile before the next round overwrites it


block_copy_kernel = cuda.jit(block_copy)


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("nbytes, block", [(MC_ROWS * MC_COLS * 4, (128, 1)), (1616, (32, 3)), (16, (64, 1))])
def test_memcpy_async(mode, nbytes, block):
    src = rng.standard_normal((2, MC_ROWS, MC_COLS)).astype(np.float32)
    out = cuda.to_device(np.full_like(src, np.nan))
    block_copy_kernel[1, block](cuda.to_device(src), out, mode, nbytes)
    got = out.copy_to_host().reshape(2, -1)
    n = nbytes // 4
    np.testing.assert_array_equal(got[0, :n], src[0].reshape(-1)[:n])
    np.testing.assert_array_equal(got[1, :n], src[1].reshape(-1)[:n])
    np.testing.assert_array_equal(got[0, n:], -1.0)
    np.testing.assert_array_equal(got[1, n:], -1.0)
