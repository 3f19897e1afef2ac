"""Kernels, case tables and the expected mapping shared by the thread-block cluster tests: tests/test_cluster_cpu.py
(compile checks), tests/sim/test_sim_cluster.py (the simulator runs them in clusters of one CTA) and
tests/test_gpu_cluster.py (GPU, compute capability 9.0+).

* ``k_ids``: every CTA writes its cluster special registers into ``out[its linear block index]``.
* ``k_dsmem``: distributed shared memory, u32 and f32: each CTA stores into and loads from the next CTA's
  (rank + 1) shared memory, then reads its own.
* ``k_remote_arrive``: remote mbarrier arrivals on CTA 0's barrier, carrying payloads into its slots.
* ``k_big_dynamic``: > 48 KiB of dynamic shared memory with a cluster launch, stored into across CTAs.

The kernels are plain functions (jitted by the tests) so that the CPU test compiles the very same code offline.
"""
import math

import numpy as np
from numba import cuda, types

from numbatma.intrinsics import (
    cluster_ctaid,
    cluster_ctarank,
    cluster_nctaid,
    cluster_nctarank,
    cluster_sync,
    clusterid,
    fence_mbarrier_init,
    ld_cluster_f32,
    ld_cluster_u32,
    mapa_barrier,
    mapa_shared,
    mbarrier_arrive_cluster,
    mbarrier_init,
    mbarrier_wait_parity_cluster,
    nclusterid,
    st_cluster_f32,
    st_cluster_u32,
)

POISON = 0xDEADBEEF
THREADS = 64  # threads per block in the DSMEM kernels
NIDS = 14  # ctarank, nctarank, cluster_ctaid xyz, cluster_nctaid xyz, clusterid xyz, nclusterid xyz
SLOTS = 8  # remote-arrive payload slots (>= the largest cluster)
DYN_WORDS = 100 * 1024 // 4  # 100 KiB of dynamic shared memory
DYN_PROBE = 32  # words written at the far end of the dynamic shared memory


# -- kernels ---------------------------------------------------------------------------------------------------
def k_ids(out):
    """Every CTA writes its cluster registers into out[its linear block index]."""
    b = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
    if cuda.threadIdx.x == 0:
        cx, cy, cz = cluster_ctaid()
        nx, ny, nz = cluster_nctaid()
        ix, iy, iz = clusterid()
        mx, my, mz = nclusterid()
        out[b, 0] = cluster_ctarank()
        out[b, 1] = cluster_nctarank()
        out[b, 2] = cx
        out[b, 3] = cy
        out[b, 4] = cz
        out[b, 5] = nx
        out[b, 6] = ny
        out[b, 7] = nz
        out[b, 8] = ix
        out[b, 9] = iy
        out[b, 10] = iz
        out[b, 11] = mx
        out[b, 12] = my
        out[b, 13] = mz


def k_dsmem(vals, pushed, pulled, pushed_f, pulled_f):
    """Each CTA stores into the next CTA's (rank + 1) shared memory and loads from it; then reads its own."""
    incoming = cuda.shared.array(THREADS, np.uint32)
    incoming_f = cuda.shared.array(THREADS, np.float32)
    mine = cuda.shared.array(THREADS, np.uint32)
    mine_f = cuda.shared.array(THREADS, np.float32)
    b = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
    t = cuda.threadIdx.x
    nxt = (cluster_ctarank() + 1) % cluster_nctarank()
    mine[t] = b * 1000 + t
    mine_f[t] = vals[b, t]
    cluster_sync()  # every CTA of the cluster has started (its shared memory exists) and wrote `mine`
    st_cluster_u32(mapa_shared(incoming, nxt) + 4 * t, b * 1000 + t)
    st_cluster_f32(mapa_shared(incoming_f, nxt) + 4 * t, vals[b, t])
    pulled[b, t] = ld_cluster_u32(mapa_shared(mine, nxt) + 4 * t)
    pulled_f[b, t] = ld_cluster_f32(mapa_shared(mine_f, nxt) + 4 * t)
    cluster_sync()  # the stores into `incoming` are visible; no CTA exits while another still reads it
    pushed[b, t] = incoming[t]
    pushed_f[b, t] = incoming_f[t]


def k_remote_arrive(self_arrives, payload, got):
    """Every CTA of rank > 0 (and rank 0 too when self_arrives) writes payload[b] into CTA 0's slot[rank], then
    arrives on CTA 0's barrier; CTA 0 waits for the phase and copies its slots out."""
    bar = cuda.shared.array(1, np.uint64)
    slots = cuda.shared.array(SLOTS, np.uint32)
    b = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
    r = cluster_ctarank()
    n = cluster_nctarank()
    if cuda.threadIdx.x == 0:
        if r == 0:
            mbarrier_init(bar, n - 1 + self_arrives)
            fence_mbarrier_init()
    cluster_sync()  # CTA 0's barrier is initialised before anyone arrives on it
    if cuda.threadIdx.x == 0 and (r != 0 or self_arrives != 0):
        st_cluster_u32(mapa_shared(slots, 0) + 4 * r, payload[b])
        mbarrier_arrive_cluster(mapa_barrier(bar, 0))
    if r == 0:
        mbarrier_wait_parity_cluster(bar, 0)
        if cuda.threadIdx.x < n:
            got[b, cuda.threadIdx.x] = slots[cuda.threadIdx.x]
    cluster_sync()  # CTA 0 stays alive until every remote store and arrival into it is done


def k_big_dynamic(pushed):
    """> 48 KiB of dynamic shared memory: store into the far end of the next CTA's buffer."""
    dyn = cuda.shared.array(0, np.uint32)
    b = cuda.blockIdx.x + cuda.gridDim.x * (cuda.blockIdx.y + cuda.gridDim.y * cuda.blockIdx.z)
    t = cuda.threadIdx.x
    nxt = (cluster_ctarank() + 1) % cluster_nctarank()
    cluster_sync()
    if t < DYN_PROBE:
        st_cluster_u32(mapa_shared(dyn, nxt) + 4 * (DYN_WORDS - DYN_PROBE + t), b * 1000 + t)
    cluster_sync()
    if t < DYN_PROBE:
        pushed[b, t] = dyn[DYN_WORDS - DYN_PROBE + t]


# -- the expected mapping -----------------------------------------------------------------------------------------
def blocks(grid):
    """(linear index, (bx, by, bz)) of every block of ``grid`` (x fastest)."""
    gx, gy, gz = grid
    for bz in range(gz):
        for by in range(gy):
            for bx in range(gx):
                yield bx + gx * (by + gy * bz), (bx, by, bz)


def expected_ids(grid, cluster):
    """What k_ids writes for a launch of ``grid`` blocks in clusters of ``cluster``."""
    out = np.zeros((math.prod(grid), NIDS), np.uint32)
    cx, cy, cz = cluster
    for b, idx in blocks(grid):
        ctaid = tuple(i % c for i, c in zip(idx, cluster))
        out[b] = (ctaid[0] + cx * (ctaid[1] + cy * ctaid[2]), cx * cy * cz, *ctaid, *cluster,
                  *(i // c for i, c in zip(idx, cluster)), *(g // c for g, c in zip(grid, cluster)))
    return out


def rank_neighbours(grid, cluster):
    """For each block: (linear index of the block of rank r - 1, of rank r + 1) in its cluster."""
    ids = expected_ids(grid, cluster)
    where = {}
    for b, _ in blocks(grid):
        where[(tuple(ids[b, 8:11]), int(ids[b, 0]))] = b
    n = math.prod(cluster)
    prev, nxt = {}, {}
    for b, _ in blocks(grid):
        key, r = tuple(ids[b, 8:11]), int(ids[b, 0])
        prev[b] = where[(key, (r - 1) % n)]
        nxt[b] = where[(key, (r + 1) % n)]
    return prev, nxt


def poisoned(shape, dtype=np.uint32):
    """A device array (a simulated one under NUMBA_ENABLE_CUDASIM=1) of ``shape`` filled with POISON (uint32) or
    NaN (float32)."""
    return cuda.to_device(np.full(shape, POISON if dtype == np.uint32 else np.nan, dtype))


CLUSTERS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (4, 1, 1), (2, 2, 1), (2, 1, 2), (1, 1, 4), (8, 1, 1)]
GRID = (8, 4, 4)


CLUSTERS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (4, 1, 1), (2, 2, 1), (2, 1, 2), (1, 1, 4), (8, 1, 1)]
GRID = (8, 4, 4)


# -- argument types of every kernel above, for the offline compile checks (tests/test_cluster_cpu.py) -------------
KERNEL_SIGNATURES = {
    "k_ids": (k_ids, (types.uint32[:, ::1],)),
    "k_dsmem": (k_dsmem, (types.float32[:, ::1], types.uint32[:, ::1], types.uint32[:, ::1], types.float32[:, ::1],
                          types.float32[:, ::1])),
    "k_remote_arrive": (k_remote_arrive, (types.int64, types.uint32[::1], types.uint32[:, ::1])),
    "k_big_dynamic": (k_big_dynamic, (types.uint32[:, ::1],)),
}
