"""GPU (compute capability 9.0+): thread-block clusters launched with ``numbatma.with_cluster`` and compiled with
``numbatma.cluster_kernel``: the cluster special registers match the mapping from blockIdx; distributed shared
memory (stores into and loads from a neighbour CTA's shared memory, u32 and f32); remote mbarrier arrivals;
a grid that is not a whole number of clusters is refused before launch; > 48 KiB of dynamic shared memory with
a cluster launch.

The kernels are plain functions (jitted in the tests) so that tests/test_cluster_cpu.py compiles the same code
offline and tests/sim/test_sim_cluster.py runs it (clusters of one CTA) in the simulator."""
import math

import numpy as np
import pytest
from numba import cuda

from numbatma.cluster import cluster_kernel, with_cluster
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

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng()
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
    return cuda.to_device(np.full(shape, POISON if dtype == np.uint32 else np.nan, dtype))


CLUSTERS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (4, 1, 1), (2, 2, 1), (2, 1, 2), (1, 1, 4), (8, 1, 1)]
GRID = (8, 4, 4)


# -- tests --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cluster", CLUSTERS)
def test_cluster_registers_match_block_index(cluster):
    out = poisoned((math.prod(GRID), NIDS))
    with_cluster(cuda.jit(k_ids), cluster)[GRID, 32](out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, expected_ids(GRID, cluster))


def test_plain_launch_is_a_cluster_of_one():
    out = poisoned((math.prod(GRID), NIDS))
    cuda.jit(k_ids)[GRID, 32](out)
    np.testing.assert_array_equal(out.copy_to_host(), expected_ids(GRID, (1, 1, 1)))


@pytest.mark.parametrize("cluster", [(2, 1, 1), (2, 2, 1)])
def test_compile_time_cluster_shape(cluster):
    kernel = cluster_kernel(cluster)(cuda.jit(k_ids))
    out = poisoned((math.prod(GRID), NIDS))
    kernel[GRID, 32](out)  # a plain launch runs in the compiled-in clusters
    np.testing.assert_array_equal(out.copy_to_host(), expected_ids(GRID, cluster))
    out = poisoned((math.prod(GRID), NIDS))
    with_cluster(kernel, cluster)[GRID, 32](out)
    np.testing.assert_array_equal(out.copy_to_host(), expected_ids(GRID, cluster))
    with pytest.raises(ValueError, match="compiled for clusters of shape"):
        with_cluster(kernel, (4, 1, 1))
    with pytest.raises(ValueError, match="not a whole number of clusters"):
        kernel[(3, 4, 4), 32](out)


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1), (2, 2, 1), (8, 1, 1)])
def test_distributed_shared_memory_ring(cluster):
    grid = (8, 2, 1)
    nblocks = math.prod(grid)
    vals = RNG.standard_normal((nblocks, THREADS)).astype(np.float32)
    pushed, pulled = poisoned((nblocks, THREADS)), poisoned((nblocks, THREADS))
    pushed_f, pulled_f = poisoned((nblocks, THREADS), np.float32), poisoned((nblocks, THREADS), np.float32)
    with_cluster(cuda.jit(k_dsmem), cluster)[grid, THREADS](cuda.to_device(vals), pushed, pulled, pushed_f,
                                                             pulled_f)
    prev, nxt = rank_neighbours(grid, cluster)
    t = np.arange(THREADS)
    want_pushed = np.stack([prev[b] * 1000 + t for b in range(nblocks)]).astype(np.uint32)
    want_pulled = np.stack([nxt[b] * 1000 + t for b in range(nblocks)]).astype(np.uint32)
    np.testing.assert_array_equal(pushed.copy_to_host(), want_pushed)
    np.testing.assert_array_equal(pulled.copy_to_host(), want_pulled)
    np.testing.assert_array_equal(pushed_f.copy_to_host(), vals[[prev[b] for b in range(nblocks)]])
    np.testing.assert_array_equal(pulled_f.copy_to_host(), vals[[nxt[b] for b in range(nblocks)]])


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1), (2, 2, 1)])
@pytest.mark.parametrize("self_arrives", [0, 1])
def test_remote_mbarrier_arrivals(cluster, self_arrives):
    grid = (8, 2, 1)
    nblocks, n = math.prod(grid), math.prod(cluster)
    payload = RNG.integers(0, 2**32, nblocks, dtype=np.uint32)
    got = poisoned((nblocks, SLOTS))
    with_cluster(cuda.jit(k_remote_arrive), cluster)[grid, 64](self_arrives, cuda.to_device(payload), got)
    got = got.copy_to_host()
    ids = expected_ids(grid, cluster)
    checked = 0
    for b, _ in blocks(grid):
        if ids[b, 0] != 0:
            assert (got[b] == POISON).all()  # only rank 0 writes
            continue
        members = {int(ids[o, 0]): o for o, _ in blocks(grid) if tuple(ids[o, 8:11]) == tuple(ids[b, 8:11])}
        for r in range(1 if not self_arrives else 0, n):
            assert got[b, r] == payload[members[r]], (b, r)
            checked += 1
        assert (got[b, n:] == POISON).all()
    assert checked == (nblocks // n) * (n - 1 + self_arrives)


def test_grid_not_divisible_raises_before_launch():
    out = poisoned((64, NIDS))
    kernel = cuda.jit(k_ids)
    with pytest.raises(ValueError, match=r"grid \(3, 1, 1\).*clusters of shape \(2, 1, 1\)"):
        with_cluster(kernel, (2, 1, 1))[3, 32](out)
    with pytest.raises(ValueError, match=r"along y"):
        with_cluster(kernel, (1, 2, 1))[(4, 3), 32](out)
    assert (out.copy_to_host() == POISON).all()


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1)])
def test_cluster_launch_with_more_than_48k_dynamic_shared_memory(cluster):
    grid = (8, 1, 1)
    pushed = poisoned((8, DYN_PROBE))
    kernel = cuda.jit(k_big_dynamic)
    with_cluster(kernel, cluster)[grid, 64, 0, DYN_WORDS * 4](pushed)
    prev, _ = rank_neighbours(grid, cluster)
    t = np.arange(DYN_PROBE)
    want = np.stack([prev[b] * 1000 + t for b in range(8)]).astype(np.uint32)
    np.testing.assert_array_equal(pushed.copy_to_host(), want)
