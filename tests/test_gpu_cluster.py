"""GPU (compute capability 9.0+): thread-block clusters launched with ``numbatma.with_cluster`` and compiled with
``numbatma.cluster_kernel``: the cluster special registers match the mapping from blockIdx; distributed shared
memory (stores into and loads from a neighbour CTA's shared memory, u32 and f32); remote mbarrier arrivals;
a grid that is not a whole number of clusters is refused before launch; > 48 KiB of dynamic shared memory with
a cluster launch.

The kernels are in tests/cluster_kernels.py (plain functions, jitted in the tests), shared with
tests/test_cluster_cpu.py, which compiles the same code offline, and tests/sim/test_sim_cluster.py, which runs it
(clusters of one CTA) in the simulator."""
import math

import numpy as np
import pytest
from numba import cuda

from numbatma.cluster import cluster_kernel, with_cluster

import cluster_kernels as K

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng()


# -- tests --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cluster", K.CLUSTERS)
def test_cluster_registers_match_block_index(cluster):
    out = K.poisoned((math.prod(K.GRID), K.NIDS))
    with_cluster(cuda.jit(K.k_ids), cluster)[K.GRID, 32](out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, K.expected_ids(K.GRID, cluster))


def test_plain_launch_is_a_cluster_of_one():
    out = K.poisoned((math.prod(K.GRID), K.NIDS))
    cuda.jit(K.k_ids)[K.GRID, 32](out)
    np.testing.assert_array_equal(out.copy_to_host(), K.expected_ids(K.GRID, (1, 1, 1)))


@pytest.mark.parametrize("cluster", [(2, 1, 1), (2, 2, 1)])
def test_compile_time_cluster_shape(cluster):
    kernel = cluster_kernel(cluster)(cuda.jit(K.k_ids))
    out = K.poisoned((math.prod(K.GRID), K.NIDS))
    kernel[K.GRID, 32](out)  # a plain launch runs in the compiled-in clusters
    np.testing.assert_array_equal(out.copy_to_host(), K.expected_ids(K.GRID, cluster))
    out = K.poisoned((math.prod(K.GRID), K.NIDS))
    with_cluster(kernel, cluster)[K.GRID, 32](out)
    np.testing.assert_array_equal(out.copy_to_host(), K.expected_ids(K.GRID, cluster))
    with pytest.raises(ValueError, match="compiled for clusters of shape"):
        with_cluster(kernel, (4, 1, 1))
    with pytest.raises(ValueError, match="not a whole number of clusters"):
        kernel[(3, 4, 4), 32](out)


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1), (2, 2, 1), (8, 1, 1)])
def test_distributed_shared_memory_ring(cluster):
    grid = (8, 2, 1)
    nblocks = math.prod(grid)
    vals = RNG.standard_normal((nblocks, K.THREADS)).astype(np.float32)
    pushed, pulled = K.poisoned((nblocks, K.THREADS)), K.poisoned((nblocks, K.THREADS))
    pushed_f, pulled_f = K.poisoned((nblocks, K.THREADS), np.float32), K.poisoned((nblocks, K.THREADS), np.float32)
    with_cluster(cuda.jit(K.k_dsmem), cluster)[grid, K.THREADS](cuda.to_device(vals), pushed, pulled, pushed_f,
                                                               pulled_f)
    prev, nxt = K.rank_neighbours(grid, cluster)
    t = np.arange(K.THREADS)
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
    got = K.poisoned((nblocks, K.SLOTS))
    with_cluster(cuda.jit(K.k_remote_arrive), cluster)[grid, 64](self_arrives, cuda.to_device(payload), got)
    got = got.copy_to_host()
    ids = K.expected_ids(grid, cluster)
    checked = 0
    for b, _ in K.blocks(grid):
        if ids[b, 0] != 0:
            assert (got[b] == K.POISON).all()  # only rank 0 writes
            continue
        members = {int(ids[o, 0]): o for o, _ in K.blocks(grid) if tuple(ids[o, 8:11]) == tuple(ids[b, 8:11])}
        for r in range(1 if not self_arrives else 0, n):
            assert got[b, r] == payload[members[r]], (b, r)
            checked += 1
        assert (got[b, n:] == K.POISON).all()
    assert checked == (nblocks // n) * (n - 1 + self_arrives)


def test_grid_not_divisible_raises_before_launch():
    out = K.poisoned((64, K.NIDS))
    kernel = cuda.jit(K.k_ids)
    with pytest.raises(ValueError, match=r"grid \(3, 1, 1\).*clusters of shape \(2, 1, 1\)"):
        with_cluster(kernel, (2, 1, 1))[3, 32](out)
    with pytest.raises(ValueError, match=r"along y"):
        with_cluster(kernel, (1, 2, 1))[(4, 3), 32](out)
    assert (out.copy_to_host() == K.POISON).all()


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1)])
def test_cluster_launch_with_more_than_48k_dynamic_shared_memory(cluster):
    grid = (8, 1, 1)
    pushed = K.poisoned((8, K.DYN_PROBE))
    kernel = cuda.jit(K.k_big_dynamic)
    with_cluster(kernel, cluster)[grid, 64, 0, K.DYN_WORDS * 4](pushed)
    prev, _ = K.rank_neighbours(grid, cluster)
    t = np.arange(K.DYN_PROBE)
    want = np.stack([prev[b] * 1000 + t for b in range(8)]).astype(np.uint32)
    np.testing.assert_array_equal(pushed.copy_to_host(), want)
