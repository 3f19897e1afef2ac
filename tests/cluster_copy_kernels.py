"""Kernels, case tables and NumPy references shared by the cluster-wide copy tests (TMA multicast, the mask
helpers, st.async, red.async): tests/test_cluster_copy_cpu.py (compile checks for sm_90a),
tests/sim/test_sim_cluster_copy.py (the simulator runs them in clusters of one CTA) and
tests/test_gpu_cluster_copy.py (GPU, compute capability 9.0+).

* ``multicast_leader``: CTA ``issuer`` of each cluster multicasts the cluster's tile to the CTAs of a mask.
* ``make_multicast_slices(n)``: each of the ``n`` CTAs multicasts its slice; every CTA receives the whole tile.
* ``mask_geometry``: the mask helpers next to the cluster registers.
* ``make_stas_ring(dtype, vec)``: every CTA st.async-es into its right neighbour (scalar, .v2, .v4).
* ``all_to_all``: every CTA st.async-es one value into every other CTA (one barrier counts them all).
* ``make_red(op, dtype)``: every CTA red.async-es into every other CTA's counters.

Every kernel ends with ``cluster_sync()``: no CTA exits while another may still write into its shared
memory. The kernels are plain functions (jitted by the tests), so the CPU test compiles the very same code
(``kernel_signatures``).
"""
import numpy as np
from numba import cuda, types

from numbatma.cluster import with_cluster  # (numbatma.with_cluster)
from numbatma import TensorMap
from numbatma.intrinsics.cluster import (
    cluster_ctaid,
    cluster_ctarank,
    cluster_nctaid,
    cluster_nctarank,
    cluster_sync,
    clusterid,
    mapa_barrier,
    mapa_shared,
)
from numbatma.intrinsics.cluster_copy import (
    cluster_mask,
    cluster_mask_all,
    cluster_mask_column,
    cluster_mask_row,
    red_async,
    st_async,
    tma_load_multicast,
)
from numbatma.intrinsics.fence import fence_mbarrier_init
from numbatma.intrinsics.mbarrier import mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait_parity
from numbatma.intrinsics.smem import shared_view

R, C = 32, 32  # the multicast tile: 32 x 32 float32 = 4 KiB
THREADS = 128


def launch(kernel, cluster, grid, block, *args):
    """``kernel[grid, block](*args)`` in clusters of ``cluster``, then wait for it."""
    with_cluster(kernel, cluster)[grid, block](*args)
    cuda.synchronize()


# -- TMA multicast: one CTA issues, the CTAs named in the mask receive --------------------------------------------
def multicast_leader(desc, out, issuer, mask_bits):
    """CTA ``issuer`` of each cluster multicasts the cluster's tile (rows ``clusterid().x * R``) to the CTAs
    of ``mask_bits`` (0: ``cluster_mask_all()``); every receiving CTA writes the tile to ``out[blockIdx.x]``."""
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    rank = cluster_ctarank()
    mask = cluster_mask_all() if mask_bits == 0 else np.uint32(mask_bits)
    receives = (mask >> rank) & 1
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        if receives:
            mbarrier_arrive_expect_tx(bar, desc.box_bytes)
    cluster_sync()  # every CTA's barrier is initialised and expects the bytes before anyone multicasts
    if tid == 0 and rank == issuer:
        tma_load_multicast(tile, desc, (clusterid()[0] * R, 0), bar, mask)
    if receives:
        mbarrier_wait_parity(bar, 0)
        for i in range(tid, R * C, cuda.blockDim.x):
            out[cuda.blockIdx.x, i // C, i % C] = tile[i // C, i % C]
    cluster_sync()


def make_multicast_slices(n):
    """Each of the ``n`` CTAs of a cluster multicasts its slice of ``R // n`` rows to all of them: every CTA
    receives the whole tile from ``n`` loads completing on its one barrier."""
    rows = R // n

    def multicast_slices(desc, out):
        tile = cuda.shared.array((R, C), np.float32, alignment=128)
        bar = cuda.shared.array(1, np.uint64)
        tid = cuda.threadIdx.x
        rank = cluster_ctarank()
        if tid == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, n * desc.box_bytes)
        cluster_sync()
        if tid == 0:
            part = shared_view(tile, rank * rows * C, (rows, C))
            tma_load_multicast(part, desc, (clusterid()[0] * R + rank * rows, 0), bar, cluster_mask_all())
        mbarrier_wait_parity(bar, 0)
        for i in range(tid, R * C, cuda.blockDim.x):
            out[cuda.blockIdx.x, i // C, i % C] = tile[i // C, i % C]
        cluster_sync()

    return multicast_slices


SLICE_COUNTS = (1, 2, 4)  # make_multicast_slices: clusters of 2 and 4 on the GPU, of 1 in the simulator


# -- mask helpers vs the cluster geometry -----------------------------------------------------------------------
def mask_geometry(out):
    b = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
    if cuda.threadIdx.x == 0:
        x, y, z = cluster_ctaid()
        out[b, 0] = cluster_ctarank()
        out[b, 1] = x + 16 * y + 256 * z
        out[b, 2] = cluster_mask_all()
        out[b, 3] = cluster_mask_row()
        out[b, 4] = cluster_mask_column()
        out[b, 5] = cluster_mask(cluster_ctarank())
        nx, ny, nz = cluster_nctaid()
        out[b, 6] = nx + 16 * ny + 256 * nz
    cluster_sync()


def expected_mask_geometry(grid, cluster):
    """What ``mask_geometry`` writes for a launch of ``grid`` blocks in clusters of ``cluster`` (NumPy)."""
    nx, ny, nz = cluster
    nblocks = int(np.prod(grid))
    want = np.zeros((nblocks, 7), np.uint32)
    for bz in range(grid[2]):
        for by in range(grid[1]):
            for bx in range(grid[0]):
                b = bx + grid[0] * (by + grid[1] * bz)
                x, y, z = bx % nx, by % ny, bz % nz
                rank = x + nx * (y + ny * z)
                row = sum(1 << (i + nx * (y + ny * z)) for i in range(nx))
                col = sum(1 << (x + nx * (j + ny * z)) for j in range(ny))
                want[b] = (rank, x + 16 * y + 256 * z, (1 << (nx * ny * nz)) - 1, row, col, 1 << rank,
                           nx + 16 * ny + 256 * nz)
    return want


# -- st.async: every CTA stores into its right neighbour ------------------------------------------------------
STAS_THREADS = 64


def make_stas_ring(dtype, vec):
    """Thread t of CTA r stores elements [t*vec, (t+1)*vec) of its block's slice of ``src`` into the shared
    buffer of CTA (r + 1) % n with one st.async (scalar, .v2 or .v4), completing on that CTA's barrier; each
    CTA waits for its ``STAS_THREADS * vec`` elements and writes them to its slice of ``out``."""
    dtype = np.dtype(dtype)
    n_el = STAS_THREADS * vec
    itemsize = dtype.itemsize
    nbytes = n_el * itemsize
    nb_dtype = {"int32": np.int32, "uint32": np.uint32, "float32": np.float32, "int64": np.int64,
                "uint64": np.uint64, "float64": np.float64}[dtype.name]

    def prologue(buf, bar):
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, nbytes)
        cluster_sync()
        right = (cluster_ctarank() + 1) % cluster_nctarank()
        tid = cuda.threadIdx.x
        return (mapa_shared(buf, right) + tid * (vec * itemsize), mapa_barrier(bar, right),
                cuda.blockIdx.x * n_el + tid * vec)

    def epilogue(buf, bar, out):
        mbarrier_wait_parity(bar, 0)
        for j in range(vec):
            i = cuda.threadIdx.x * vec + j
            out[cuda.blockIdx.x * n_el + i] = buf[i]
        cluster_sync()

    prologue = cuda.jit(device=True)(prologue)
    epilogue = cuda.jit(device=True)(epilogue)

    def stas1(src, out):
        buf = cuda.shared.array(n_el, nb_dtype, alignment=16)
        bar = cuda.shared.array(1, np.uint64)
        addr, rbar, k = prologue(buf, bar)
        st_async(addr, src[k], rbar)
        epilogue(buf, bar, out)

    def stas2(src, out):
        buf = cuda.shared.array(n_el, nb_dtype, alignment=16)
        bar = cuda.shared.array(1, np.uint64)
        addr, rbar, k = prologue(buf, bar)
        st_async(addr, (src[k], src[k + 1]), rbar)
        epilogue(buf, bar, out)

    def stas4(src, out):
        buf = cuda.shared.array(n_el, nb_dtype, alignment=16)
        bar = cuda.shared.array(1, np.uint64)
        addr, rbar, k = prologue(buf, bar)
        st_async(addr, (src[k], src[k + 1], src[k + 2], src[k + 3]), rbar)
        epilogue(buf, bar, out)

    return {1: stas1, 2: stas2, 4: stas4}[vec]


STAS_FORMS = [("int32", 1), ("uint32", 2), ("float32", 4), ("int32", 4), ("float32", 1), ("int64", 1),
              ("uint64", 2), ("float64", 1), ("float64", 2), ("float32", 2)]


# -- data --------------------------------------------------------------------------------------------------------
def random_values(rng, shape, dtype):
    """Random ``dtype`` values over the whole integer range (floats: standard normal)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def poison(shape, dtype):
    """An output array of ``shape`` no correct result fills: NaN, or a third of the integer maximum."""
    dtype = np.dtype(dtype)
    return np.full(shape, np.nan if dtype.kind == "f" else np.iinfo(dtype).max // 3, dtype)


# -- st.async from every CTA into every other CTA --------------------------------------------------------------
SLOTS = 8


def all_to_all(src, out):
    """Every CTA s stores ``src[cluster base + s]`` into slot s of every other CTA of its cluster (thread t
    sends to CTA t): each barrier counts ``(n - 1) * 4`` bytes from ``n - 1`` senders. A CTA's own slot
    keeps the -1 it wrote."""
    buf = cuda.shared.array(SLOTS, np.int32)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    rank = cluster_ctarank()
    n = cluster_nctarank()
    if tid < SLOTS:
        buf[tid] = -1
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, (n - 1) * 4)
    cluster_sync()
    if tid < n and tid != rank:
        st_async(mapa_shared(buf, tid) + 4 * rank, src[cuda.blockIdx.x], mapa_barrier(bar, tid))
    mbarrier_wait_parity(bar, 0)
    if tid < SLOTS:
        out[cuda.blockIdx.x, tid] = buf[tid]
    cluster_sync()


# -- red.async: every CTA reduces into every other CTA's counters ------------------------------------------------
COUNTERS = 8
RED_THREADS = 64
RED_CASES = [("add", "uint32"), ("add", "int32"), ("add", "uint64"), ("min", "uint32"), ("min", "int32"),
             ("max", "uint32"), ("max", "int32"), ("and", "uint32"), ("or", "int32"), ("xor", "uint32"),
             ("inc", "uint32"), ("dec", "uint32")]


def make_red(op, dtype):
    """Counters ``cnt[k]`` of every CTA start at ``init[block, k]``; thread t of every other CTA of the
    cluster applies ``op`` with ``vals[its block, t]`` to counter ``t % COUNTERS`` (one red.async per target
    CTA, completing ``itemsize`` bytes each on the target's barrier)."""
    dtype = np.dtype(dtype)
    itemsize = dtype.itemsize
    nb_dtype = {"int32": np.int32, "uint32": np.uint32, "uint64": np.uint64}[dtype.name]

    def red(init, vals, out):
        cnt = cuda.shared.array(COUNTERS, nb_dtype, alignment=8)
        bar = cuda.shared.array(1, np.uint64)
        tid = cuda.threadIdx.x
        rank = cluster_ctarank()
        n = cluster_nctarank()
        if tid < COUNTERS:
            cnt[tid] = init[cuda.blockIdx.x, tid]
        if tid == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, (n - 1) * RED_THREADS * itemsize)
        cluster_sync()
        v = vals[cuda.blockIdx.x, tid]
        for d in range(1, n):
            target = (rank + d) % n
            red_async(op, mapa_shared(cnt, target) + (tid % COUNTERS) * itemsize, v, mapa_barrier(bar, target))
        mbarrier_wait_parity(bar, 0)
        if tid < COUNTERS:
            out[cuda.blockIdx.x, tid] = cnt[tid]
        cluster_sync()

    return red


INC_DEC_BOUND = 37


def red_reference(op, dtype, init, vals):
    """What every CTA's counters hold after the other CTAs' reductions (each counter: the values of the
    threads t with t % COUNTERS == k of every other CTA)."""
    contributions = vals.reshape(-1, COUNTERS)  # one CTA: rows of COUNTERS threads
    if op in ("inc", "dec"):
        out = init.copy()
        for k in range(COUNTERS):
            x = int(init[k])
            for b in vals[k::COUNTERS]:
                if op == "inc":
                    x = 0 if x >= int(b) else x + 1
                else:
                    x = int(b) if (x == 0 or x > int(b)) else x - 1
            out[k] = x
        return out
    if op == "add":
        return (init.astype(np.uint64) + contributions.astype(np.uint64).sum(axis=0, dtype=np.uint64)).astype(dtype)
    ufunc = {"min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
             "xor": np.bitwise_xor}[op]
    return ufunc(init, ufunc.reduce(contributions, axis=0)).astype(dtype)


# -- offline compilation of every kernel above (tests/test_cluster_copy_cpu.py) ----------------------------------
def kernel_signatures(fake_array):
    """(python function, argument types) of every kernel of this file, for ``numbatma.compile.compile_ptx``;
    ``fake_array(shape, dtype)`` stands in for a device array (tests/fakes.py)."""
    tile = TensorMap(fake_array((3 * R, C), np.float32), (R, C)).numba_type
    sigs = [(multicast_leader, (tile, types.float32[:, :, ::1], types.int64, types.int64)),
            (mask_geometry, (types.uint32[:, ::1],)),
            (all_to_all, (types.int32[::1], types.int32[:, ::1]))]
    for n in SLICE_COUNTS:
        part = TensorMap(fake_array((3 * R, C), np.float32), (R // n, C)).numba_type
        sigs.append((make_multicast_slices(n), (part, types.float32[:, :, ::1])))
    for dtype, vec in STAS_FORMS:
        arr = np.zeros(1, dtype)  # (an example value stands for its type)
        sigs.append((make_stas_ring(dtype, vec), (arr, arr)))
    for op, dtype in RED_CASES:
        arr = np.zeros((1, 1), dtype)
        sigs.append((make_red(op, dtype), (arr, arr, arr)))
    return sigs
