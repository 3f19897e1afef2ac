"""Kernels, runners and NumPy references shared by the bulk-copy tests (non-tensor bulk copies, bulk
reductions, the L2 prefetch, the block-cooperative memcpy_async): tests/test_bulk_cpu.py (compile checks for
sm_90a), tests/sim/test_sim_bulk.py (simulator) and tests/test_gpu_bulk.py (GPU).

* ``round_trip_at``: global -> shared -> global with run-time byte counts and offsets (``bulk_load_at`` /
  ``bulk_store_at``, optionally ``bulk_prefetch_l2_at`` first); every thread checks the shared copy byte by
  byte after the wait.
* ``make_tile_round_trip(rows, cols, dtype)``: the whole-array forms (``bulk_load`` / ``bulk_store`` /
  ``bulk_prefetch_l2``) on a 2-D tile whose static shape gives the byte count.
* ``make_reduce_kernel(op, dtype, indexed)``: block ``b`` reduces row ``b`` of ``src`` into ``dst`` with
  ``bulk_reduce`` (or ``bulk_reduce_at``).
* ``cluster_copy_self`` / ``cluster_exchange``: ``bulk_copy_to_cluster`` within one CTA, and between the two
  CTAs of a cluster (GPU only: the simulator runs clusters of one CTA).
* ``make_block_copy(rows, cols)``: ``memcpy_async`` / ``memcpy_async_mbarrier`` over the whole block, two
  rounds (the barrier's second phase, a second commit group).

The runners (``run_*``) build fresh random data, poison the outputs (so an element nobody wrote fails the
comparison), launch through ``cuda.to_device`` (a device array on the GPU, a simulated one under
NUMBA_ENABLE_CUDASIM=1) and return what the kernel wrote with the NumPy reference.
"""
import functools

import numpy as np
from numba import cuda, types

from numbatma.cluster import with_cluster
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    cluster_ctarank,
    cluster_sync,
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


def random_bits(rng, n, dtype):
    """``n`` elements of ``dtype`` with uniformly random bits."""
    dtype = np.dtype(dtype)
    return rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8).view(dtype)


# -- global -> shared -> global, run-time sizes and offsets ---------------------------------------------
ROUND_TRIP_SIZES = [16, 48, 4112, 40976]  # (bytes: the simulator takes the first three)
ROUND_TRIP_THREADS = 128


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


def run_round_trip(rng, nbytes, prefetch, src_off=32, dst_off=48):
    """Copy ``nbytes`` from ``src[src_off:]`` to ``dst[dst_off:]`` (``dst`` poisoned with 0xAB): (got, want)."""
    src = rng.integers(0, 256, nbytes + 64, dtype=np.uint8)
    dst = cuda.to_device(np.full(nbytes + 96, 0xAB, np.uint8))
    round_trip_at_kernel[1, ROUND_TRIP_THREADS, 0, nbytes](cuda.to_device(src), dst, src_off, dst_off, nbytes,
                                                           prefetch)
    want = np.full(nbytes + 96, 0xAB, np.uint8)
    want[dst_off:dst_off + nbytes] = src[src_off:src_off + nbytes]
    return dst.copy_to_host(), want


# -- the whole-array forms on a 2-D tile (its static shape gives the byte count) ---------------------------------
ROWS, COLS = 5, 6  # float64: 240 bytes (the GPU test's tile)
TILE_CASES = [(ROWS, COLS, "float64"), (3, 12, "float32")]  # (rows, cols, dtype): 240 and 144 bytes


@functools.lru_cache(maxsize=None)
def make_tile_round_trip(rows, cols, dtype):
    """``kernel[1, threads](src, dst, out)`` (threads >= rows * cols): load the (rows, cols) tile of ``src``,
    every thread copies its element to ``out[tid]``, negate column 0, store the tile to ``dst``."""
    tdtype = np.dtype(dtype).type
    nbytes = rows * cols * np.dtype(dtype).itemsize

    def tile_round_trip(src, dst, out):
        tile = cuda.shared.array((rows, cols), tdtype, alignment=16)
        bar = cuda.shared.array(1, np.uint64)
        tid = cuda.threadIdx.x
        if tid == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            bulk_prefetch_l2(src, nbytes)
            mbarrier_arrive_expect_tx(bar, nbytes)
            bulk_load(tile, src, bar)
        cuda.syncthreads()
        mbarrier_wait_parity(bar, 0)
        if tid < rows * cols:
            out[tid] = tile[tid // cols, tid % cols]
        cuda.syncthreads()
        if tid < rows:
            tile[tid, 0] = -tile[tid, 0]
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if tid == 0:
            bulk_store(dst, tile)
            bulk_commit_group()
            bulk_wait_group(0)

    return tile_round_trip


tile_round_trip = make_tile_round_trip(ROWS, COLS, "float64")


@functools.lru_cache(maxsize=None)
def tile_round_trip_kernel(rows=ROWS, cols=COLS, dtype="float64"):
    return cuda.jit(make_tile_round_trip(rows, cols, dtype))


def run_tile_round_trip(rng, rows=ROWS, cols=COLS, dtype="float64"):
    """(dst, out, src): ``dst`` should be ``src`` with column 0 negated, ``out`` ``src`` flattened."""
    src = rng.standard_normal((rows, cols)).astype(dtype)
    dst = cuda.to_device(np.full((rows, cols), np.nan, dtype))
    out = cuda.to_device(np.full(rows * cols, np.nan, dtype))
    threads = 32 * -(-rows * cols // 32)
    tile_round_trip_kernel(rows, cols, dtype)[1, threads](cuda.to_device(src), dst, out)
    return dst.copy_to_host(), out.copy_to_host(), src


# -- reductions: every operation and element type, one block and many blocks -----------------------------
N_RED = 40  # elements: 80 to 320 bytes
RED_THREADS = 64
REDUCE_CASES = [(op, dt) for op, table in REDUCE_TYPES.items() for dt in table]
MANY_BLOCK_CASES = [("add", "int32"), ("add", "uint64"), ("add", "int64"), ("min", "int32"), ("max", "uint64"),
                    ("xor", "uint32"), ("or", "int64")]


def make_reduce_kernel(op, dtype, indexed):
    """``kernel[blocks, threads >= N_RED](src (blocks, N_RED), dst (N_RED,))``: block ``b`` reduces ``src[b]``
    into ``dst`` (``bulk_reduce``, or ``bulk_reduce_at`` when ``indexed``)."""
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


@functools.lru_cache(maxsize=None)
def reduce_kernel(op, dtype, indexed):
    return cuda.jit(make_reduce_kernel(op, dtype, indexed))


def reduce_operands(rng, op, dtype, blocks):
    """(old (N_RED,), new (blocks, N_RED)) for ``op`` on ``dtype``: results exact whatever the order."""
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
    return random_bits(rng, N_RED, dtype), random_bits(rng, blocks * N_RED, dtype).reshape(blocks, N_RED)


def numpy_reduce(op, old, new):
    """``old <op> new`` as PTX defines the reductions."""
    if op == "add":
        with np.errstate(over="ignore"):
            return (old + new).astype(old.dtype)
    if op == "inc":
        return np.where(old >= new, 0, old + 1).astype(old.dtype)
    if op == "dec":
        return np.where((old == 0) | (old > new), new, old - 1).astype(old.dtype)
    return {"min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
            "xor": np.bitwise_xor}[op](old, new)


def run_reduce(rng, op, dtype, indexed, blocks):
    """``blocks`` blocks reduce into the same ``N_RED`` elements: (got, want), the blocks applied in order."""
    old, new = reduce_operands(rng, op, dtype, blocks)
    dst = cuda.to_device(old)
    reduce_kernel(op, dtype, indexed)[blocks, RED_THREADS](cuda.to_device(new), dst)
    want = old
    for b in range(blocks):
        want = numpy_reduce(op, want, new[b])
    return dst.copy_to_host(), want


def run_float_add(rng, blocks):
    """float64 add of small integers from ``blocks`` blocks (exact whatever the order): (got, want)."""
    old = rng.integers(-1000, 1000, N_RED).astype(np.float64)
    new = rng.integers(-1000, 1000, (blocks, N_RED)).astype(np.float64)
    dst = cuda.to_device(old)
    reduce_kernel("add", "float64", False)[blocks, RED_THREADS](cuda.to_device(new), dst)
    return dst.copy_to_host(), old + new.sum(axis=0)


# -- shared -> shared::cluster: within one CTA (own addresses) ---------------------------------------------
CLUSTER_WORDS = 256  # int32 elements of each buffer; also the threads of the block
CLUSTER_SELF_SIZES = [16, 48, 1008]


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


def run_cluster_copy_self(rng, nbytes, plain=False):
    """(got, src): ``got[:nbytes // 4]`` should be ``src[:nbytes // 4]``, the rest -1. The launch is a cluster
    of one CTA (with a plain launch the copy faults on an H200, scripts/probe_bulk_cluster_self.py); ``plain``
    launches without one (the simulator)."""
    src = rng.integers(-(2**31), 2**31 - 1, CLUSTER_WORDS, dtype=np.int32)
    out = cuda.to_device(np.full(CLUSTER_WORDS, 12345, np.int32))
    kernel = cluster_copy_self_kernel if plain else with_cluster(cluster_copy_self_kernel, (1, 1, 1))
    kernel[1, CLUSTER_WORDS](cuda.to_device(src), out, nbytes)
    return out.copy_to_host(), src


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


# -- block-cooperative memcpy_async ------------------------------------------------------------------------
MC_ROWS, MC_COLS = 37, 40  # 5920 bytes of float32: 370 pieces over 128 threads (uneven shares)
# (nbytes, block) of the GPU test's tile; the simulator adds a small tile (5 x 24: 30 pieces over 8 threads)
MEMCPY_CASES = [(MC_ROWS * MC_COLS * 4, (128, 1)), (1616, (32, 3)), (16, (64, 1))]
MEMCPY_SMALL = (5, 24)


@functools.lru_cache(maxsize=None)
def make_block_copy(rows, cols):
    """``kernel[1, block](src (2, rows, cols), out (2, rows, cols), mode, nbytes)``: two rounds of copying the
    first ``nbytes`` of ``src[round]`` over a tile of -1 (mode 0: ``memcpy_async`` + ``cp_async_wait_all``;
    mode 1: ``memcpy_async_mbarrier``), each round's tile written to ``out[round]``."""
    def block_copy(src, out, mode, nbytes):
        tile = cuda.shared.array((rows, cols), np.float32, alignment=16)
        bar = cuda.shared.array(1, np.uint64)
        tid = cuda.threadIdx.x + cuda.blockDim.x * cuda.threadIdx.y
        nthreads = cuda.blockDim.x * cuda.blockDim.y
        if tid == 0:
            mbarrier_init(bar, nthreads)
            fence_mbarrier_init()
        for k in range(tid, rows * cols, nthreads):
            tile[k // cols, k % cols] = -1.0
        cuda.syncthreads()
        for rnd in range(2):  # two rounds: the barrier's second phase, a second commit group
            if mode == 0:
                memcpy_async(tile, src[rnd], nbytes)
                cp_async_wait_all()
                cuda.syncthreads()
            else:
                memcpy_async_mbarrier(tile, src[rnd], nbytes, bar)
                mbarrier_wait_parity(bar, rnd & 1)
            for k in range(tid, rows * cols, nthreads):
                out[rnd, k // cols, k % cols] = tile[k // cols, k % cols]
            cuda.syncthreads()  # everyone read the tile before the next round overwrites it

    return block_copy


block_copy = make_block_copy(MC_ROWS, MC_COLS)


@functools.lru_cache(maxsize=None)
def block_copy_kernel(rows=MC_ROWS, cols=MC_COLS):
    return cuda.jit(make_block_copy(rows, cols))


def run_block_copy(rng, mode, nbytes, block, rows=MC_ROWS, cols=MC_COLS):
    """(got (2, rows * cols), src (2, rows, cols)): each round's first ``nbytes // 4`` elements copied, the
    rest -1."""
    src = rng.standard_normal((2, rows, cols)).astype(np.float32)
    out = cuda.to_device(np.full_like(src, np.nan))
    block_copy_kernel(rows, cols)[1, block](cuda.to_device(src), out, mode, nbytes)
    return out.copy_to_host().reshape(2, -1), src


# -- argument types of every kernel above, for the offline compile checks (tests/test_bulk_cpu.py) ---------------
I64 = types.int64
KERNEL_SIGNATURES = {
    "round_trip_at": (round_trip_at, (types.uint8[::1], types.uint8[::1], I64, I64, I64, types.boolean)),
    **{f"tile_round_trip {r}x{c} {dt}": (make_tile_round_trip(r, c, dt),
                                         (getattr(types, dt)[:, ::1], getattr(types, dt)[:, ::1],
                                          getattr(types, dt)[::1]))
       for r, c, dt in TILE_CASES},
    "cluster_copy_self": (cluster_copy_self, (types.int32[::1], types.int32[::1], I64)),
    "cluster_exchange": (cluster_exchange, (types.int32[::1], types.int32[::1])),
    **{f"block_copy {r}x{c}": (make_block_copy(r, c), (types.float32[:, :, ::1], types.float32[:, :, ::1], I64, I64))
       for r, c in [(MC_ROWS, MC_COLS), MEMCPY_SMALL]},
}
REDUCE_SIGNATURE = {dt: (getattr(types, dt)[:, ::1], getattr(types, dt)[::1]) for _, dt in REDUCE_CASES}
