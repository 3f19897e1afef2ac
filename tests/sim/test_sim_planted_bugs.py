"""Planted bugs (issue #11, section 1): each kernel below carries one classic synchronisation or operand bug
when ``bug`` is true and is its correct twin when it is false (the same kernel with the bug fixed). Every bug
must be reported every time, whatever order the simulated threads run in, and every twin must run clean
and give the right answer: each case runs RUNS times.

The kernels are tiny (one block of 32 threads, 4x16 float32 tiles) so the whole file stays fast."""
import re

import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_store,
    bulk_wait_group,
    bulk_wait_group_read,
    cp_async,
    cp_async_commit_group,
    cp_async_wait_group,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_wait_parity,
    tma_load,
    tma_reduce,
    tma_store,
)
from numbatma.intrinsics._sim import SimulatedHang, SimulatedMisuse, SimulatedTypingError

RUNS = 10
R, C = 4, 16  # a 4x16 float32 tile: 256 bytes
T = 32  # threads per block
HERE = r"test_sim_planted_bugs\.py:\d+"


def _tmap(host, box=(R, C), **kw):
    return numbatma.TensorMap(host, box, **kw)


def _src(rows=R, cols=C):
    return np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)


# == kernels ====================================================================================================
@cuda.jit
def store_tile(dst, bug):
    """Thread 0 stores a tile; bug 1: no commit, bug 2: commit but no wait before the block exits."""
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    tid = cuda.threadIdx.x
    if tid < R:
        for k in range(C):
            tile[tid, k] = tid * C + k
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        tma_store(dst, (0, 0), tile)
        if bug != 1:
            bulk_commit_group()
        if bug == 0:
            bulk_wait_group(0)


@cuda.jit
def bulk_store_tile(dst, bug):
    """A bulk store (no descriptor) whose group is never waited for (bug)."""
    tile = cuda.shared.array(64, np.float32, alignment=128)
    tid = cuda.threadIdx.x
    tile[tid] = tid
    tile[tid + 32] = tid + 32
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        bulk_store(dst, tile)
        bulk_commit_group()
        if not bug:
            bulk_wait_group(0)


@cuda.jit
def init_then_arrive(out, bug):
    """Thread 0 initialises a barrier that every thread arrives on; bug 1: no fence_mbarrier_init, bug 2: no
    block barrier between the initialisation and the other threads' use."""
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, T)
        if bug != 1:
            fence_mbarrier_init()
    if bug != 2:
        cuda.syncthreads()
    mbarrier_arrive(bar)
    mbarrier_wait_parity(bar, 0)
    out[tid] = 1


@cuda.jit
def load_and_sum(src, out, bug):
    """Thread 0 loads a tile; every thread sums row tid % R. bug 1: nobody waits; bug 2: the waits use the
    wrong parity; bug 3: expect_tx announces 64 bytes too many; bug 4: 64 too few."""
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid == 0:
        extra = 64 if bug == 3 else (-64 if bug == 4 else 0)
        mbarrier_arrive_expect_tx(bar, src.box_bytes + extra)
        tma_load(tile, src, (0, 0), bar)
    if bug != 1:
        mbarrier_wait_parity(bar, 1 if bug == 2 else 0)
    acc = np.float32(0)
    for k in range(C):
        acc += tile[tid % R, k]
    out[tid] = acc


@cuda.jit
def write_then_store(dst, bug):
    """Every writer fences before the block barrier that precedes the store; bug: nobody fences."""
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    tid = cuda.threadIdx.x
    if tid < R:
        for k in range(C):
            tile[tid, k] = tid * C + k
    if not bug:
        fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        tma_store(dst, (0, 0), tile)
        bulk_commit_group()
        bulk_wait_group(0)


@cuda.jit
def store_then_reuse(src, dst, bug):
    """Store a tile, then reuse it (bug 1: rewritten generically, bug 2: TMA-loaded again) without waiting for
    the store to have read it (bulk_wait_group_read + block barrier)."""
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    if tid < R:
        for k in range(C):
            tile[tid, k] = tid * C + k
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        tma_store(dst, (0, 0), tile)
        bulk_commit_group()
        if not bug:
            bulk_wait_group_read(0)
    cuda.syncthreads()
    if bug == 1 and tid < R:
        tile[tid, 0] = -1.0
    if tid == 0:
        if bug != 1:
            mbarrier_arrive_expect_tx(bar, src.box_bytes)
            tma_load(tile, src, (0, 0), bar)
            mbarrier_wait_parity(bar, 0)
        bulk_wait_group(0)


@cuda.jit
def reinit_barrier(out, bug):
    """A barrier re-initialised for a second use: after mbarrier_inval when its phase is complete (twin), or
    while its first phase is still in progress (bug)."""
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 2)
        mbarrier_arrive(bar)
        if not bug:
            mbarrier_arrive(bar)  # the phase completes
            mbarrier_wait_parity(bar, 0)
            mbarrier_inval(bar)
        mbarrier_init(bar, 1)
        mbarrier_arrive(bar)
        mbarrier_wait_parity(bar, 0)
        out[0] = 1


@cuda.jit
def pipelined_sum(src, out, bug):
    """One producer thread (32) streams ROUNDS tiles through a 1-stage pipeline to 32 consumer threads, which
    sum a row each. bug 1: the producer refills the stage without producer_acquire (and spins first, a slow
    producer); bug 2: the consumers never release (the producer waits forever); bug 3: Pipeline(1, 1, 1)
    although 32 consumer threads release each stage."""
    ring = cuda.shared.array((1, R, C), np.float32, alignment=128)
    pipe = Pipeline(1, 1, 1 if bug == 3 else T)
    tid = cuda.threadIdx.x
    if tid == T:
        for r in range(ROUNDS):
            if bug == 1:
                spin = 0
                for i in range(2000):
                    spin += i
                out[T] = spin
                if r == 0:
                    pipe.producer_acquire()
            else:
                pipe.producer_acquire()
            pipe.load(ring[0], src, (r * R, 0))
            pipe.producer_commit()
    else:
        acc = np.float32(0)
        for r in range(ROUNDS):
            s = pipe.consumer_wait()
            for k in range(C):
                acc += ring[s, tid % R, k]
            if bug != 2:
                pipe.consumer_release()
        out[tid] = acc


ROUNDS = 2


@cuda.jit
def warp_release_sum(src, out, bug):
    """One producer thread (32) streams ROUNDS tiles through a 1-stage pipeline to one consumer warp whose lane 0
    releases each stage for the whole warp (``Pipeline(1, 1, 1)``, as the attention kernels' warps do); bug: the
    lanes meet in a shuffle instead of ``cuda.syncwarp()`` before that release - every lane has read by then, but a
    shuffle orders no memory (PTX), so nothing orders the other lanes' reads before lane 0's release. (Without any
    meeting, a slow lane could instead still wait for the round the producer has refilled: a hang, not this
    report.)"""
    ring = cuda.shared.array((1, R, C), np.float32, alignment=128)
    pipe = Pipeline(1, 1, 1)
    tid = cuda.threadIdx.x
    if tid == T:
        for r in range(ROUNDS):
            pipe.producer_acquire()
            pipe.load(ring[0], src, (r * R, 0))
            pipe.producer_commit()
    else:
        acc = np.float32(0)
        for r in range(ROUNDS):
            s = pipe.consumer_wait()
            for k in range(C):
                acc += ring[s, tid % R, k]
            if bug:
                acc = cuda.shfl_sync(0xFFFFFFFF, acc, tid % 32)  # (its own value back: the lanes meet, nothing more)
            else:
                cuda.syncwarp()
            if tid == 0:
                pipe.consumer_release()
        out[tid] = acc


@cuda.jit
def cp_async_twice(src, out, bug):
    """Each thread copies 16 bytes with cp.async, all read a neighbour's bytes, then each copies new bytes over
    its own; bug: no block barrier between the neighbour's read and the refill."""
    buf = cuda.shared.array(128, np.float32, alignment=128)
    tid = cuda.threadIdx.x
    cp_async(buf, tid * 4, src, tid * 4, 16)
    cp_async_commit_group()
    cp_async_wait_group(0)
    cuda.syncthreads()
    first = buf[((tid + 1) % T) * 4]
    if not bug:
        cuda.syncthreads()
    cp_async(buf, tid * 4, src, 128 + tid * 4, 16)
    cp_async_commit_group()
    cp_async_wait_group(0)
    cuda.syncthreads()
    out[tid] = first + buf[((tid + 1) % T) * 4]


@cuda.jit
def load_at(src, out, col):
    """A tile load whose box starts at column ``col``."""
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid == 0:
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, col), bar)
    mbarrier_wait_parity(bar, 0)
    if tid < R:
        out[tid] = tile[tid, 0]


@cuda.jit
def reduce_at(dst, row):
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    tid = cuda.threadIdx.x
    if tid < R:
        for k in range(C):
            tile[tid, k] = 1.0
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        tma_reduce("add", dst, (row, 0), tile)
        bulk_commit_group()
        bulk_wait_group(0)


@cuda.jit
def load_operands(src, out, glob, bug):
    """A tile load with one bad operand: bug 1 a float64 tile, 2 one coordinate for a 2-D descriptor, 3 a
    tile that is not in shared memory (a kernel argument), 4 a float coordinate."""
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    wide = cuda.shared.array((R, C), np.float64, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid == 0:
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        if bug == 1:
            tma_load(wide, src, (0, 0), bar)
        elif bug == 2:
            tma_load(tile, src, (0,), bar)
        elif bug == 3:
            tma_load(glob, src, (0, 0), bar)
        elif bug == 4:
            tma_load(tile, src, (0, 0.0), bar)
        else:
            tma_load(tile, src, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    if tid < R:
        out[tid] = tile[tid, 1]


@cuda.jit
def swizzled_load(src, out, bug):
    """A 128-byte-swizzled tile load: the tile needs alignment 1024 (the swizzle repeat); bug: declared
    with 128."""
    good = cuda.shared.array((8, 32), np.float32, alignment=1024)
    poor = cuda.shared.array((8, 32), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    tile = poor if bug else good
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if tid == 0:
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    if tid < 8:
        out[tid] = tile[tid, 0]  # (chunk 0 of row r stays in place under the 128-byte swizzle... for row 0)


@cuda.jit
def pipeline_stages(out, stages):
    pipe = Pipeline(stages, 1, 1)
    out[cuda.threadIdx.x] = pipe.stages


# == the cases ====================================================================================================
def _run(kernel, threads, args):
    kernel[1, threads](*args)


def _check_twin(kernel, threads, make, verify):
    for _ in range(RUNS):
        args = make()
        _run(kernel, threads, args)
        verify(*args)


def _check_bug(kernel, threads, make, exc, pattern, variable):
    """Every run raises ``exc`` matching ``pattern``, and the report names the kernel's ``variable`` and a line of
    this file (the kernel's own: a report a user cannot place is not enough)."""
    for _ in range(RUNS):
        with pytest.raises(exc, match=pattern) as info:
            _run(kernel, threads, make())
        message = str(info.value)
        assert re.search(HERE, message), f"the report names no kernel line: {message}"
        assert f"'{variable}" in message, f"the report does not name {variable!r}: {message}"


def numbatma_array(tmap):
    """The host array behind a TensorMap built on a host array."""
    from numbatma.intrinsics.tma import host_array

    return host_array(tmap)


def _sum_rows(host):
    return np.array([host[t % R].sum() for t in range(T)], np.float32)


CASES = {}  # name -> (kernel, threads, make(bug), verify(args) for the twin, bug value, exception, regex)


def case(name, kernel, threads, make, verify, bug, exc, pattern):
    CASES[name] = (kernel, threads, make, verify, bug, exc, pattern)


# 1-2: stores in flight at exit
def _store_make(bug):
    return _tmap(np.zeros((R, C), np.float32)), bug


def _store_verify(dst, bug):
    np.testing.assert_array_equal(numbatma_array(dst), _src())


case("store_never_committed", store_tile, T, _store_make, _store_verify, 1, SimulatedMisuse,
     rf"thread \(0, 0, 0\) exits with the store issued at .*{HERE} \(from 'tile' \(declared at .*{HERE}\)\) still in flight: it was never committed")
case("store_never_waited", store_tile, T, _store_make, _store_verify, 2, SimulatedMisuse,
     rf"exits with the store issued at .*{HERE} \(from 'tile' \(declared at .*{HERE}\)\) still in flight: its bulk group was never waited for")


# 3: bulk store in flight at exit
def _bulk_make(bug):
    return cuda.to_device(np.zeros(64, np.float32)), bug


def _bulk_verify(dst, bug):
    np.testing.assert_array_equal(dst.copy_to_host(), np.arange(64, dtype=np.float32))


case("bulk_store_never_waited", bulk_store_tile, T, _bulk_make, _bulk_verify, 1, SimulatedMisuse,
     rf"exits with the store issued at .*{HERE} \(from 'tile' \(declared at .*{HERE}\)\) still in flight")


# 4-5: barrier used before its initialisation reached the thread
def _init_make(bug):
    return np.zeros(T, np.int32), bug


def _init_verify(out, bug):
    assert out.tolist() == [1] * T


case("init_without_fence", init_then_arrive, T, _init_make, _init_verify, 1, SimulatedMisuse,
     rf"thread \(\d+, 0, 0\) uses mbarrier 'bar' \(declared at .*{HERE}\) before its initialisation reached this "
     rf"thread: thread \(0, 0, 0\) initialised it at .*{HERE} .*has not executed fence_mbarrier_init")
case("init_without_block_barrier", init_then_arrive, T, _init_make, _init_verify, 2, SimulatedMisuse,
     rf"uses mbarrier 'bar' \(declared at .*{HERE}\) before its initialisation reached this thread")


# 6-9: loads, waits and transaction bytes
def _sum_make(bug):
    return _tmap(_src()), np.full(T, np.nan, np.float32), bug


def _sum_verify(src, out, bug):
    np.testing.assert_allclose(out, _sum_rows(_src()))


case("read_before_wait", load_and_sum, T, _sum_make, _sum_verify, 1, SimulatedMisuse,
     rf"reads shared bytes .* of the tile the TMA load at .*{HERE} fills .* before that copy is known complete: "
     r"it completes phase 0 \(parity 0\) of mbarrier 'bar'")
case("wrong_parity", load_and_sum, T, _sum_make, _sum_verify, 2, (SimulatedMisuse, SimulatedHang),
     # (a waiter that runs before the load completes returns at once and reads stale data; one that runs after it
     # waits for a phase nobody completes: both reports say wrong parity)
     rf"(mbarrier_wait_parity with parity 1 at .*{HERE}, returned for phase -1 - a wait on the parity of a "
     r"completed phase returns at once with stale data \(wrong parity\?\)|"
     r"with the parity of a phase it never saw \(wrong parity\? on the GPU a wait on the parity of a completed "
     r"phase returns at once, with stale data when it runs early\))")
case("expect_tx_too_large", load_and_sum, T, _sum_make, _sum_verify, 3, SimulatedHang,
     r"mbarrier 'bar' .*delivered 64 bytes fewer than expect_tx announced")
case("expect_tx_too_small", load_and_sum, T, _sum_make, _sum_verify, 4, SimulatedHang,
     r"mbarrier 'bar' .*delivered 64 bytes more than expect_tx announced")


# 10: store of generic writes without fence.proxy.async
case("store_without_proxy_fence", write_then_store, T, _store_make, _store_verify, 1, SimulatedMisuse,
     r"tma_store from a shared tile that (this thread|thread \(\d+, 0, 0\)) wrote .* without "
     r"fence_proxy_async_shared_cta")


# 11-12: a tile reused while a store still reads it
def _reuse_make(bug):
    return _tmap(_src() + 100), _tmap(np.zeros((R, C), np.float32)), bug


def _reuse_verify(src, dst, bug):
    np.testing.assert_array_equal(numbatma_array(dst), _src())


case("rewrite_before_store_read", store_then_reuse, T, _reuse_make, _reuse_verify, 1, SimulatedMisuse,
     rf"writes shared bytes .* of a tile that the TMA store issued at .*{HERE} .*may still be reading.*"
     r"bulk_wait_group_read")
case("reload_before_store_read", store_then_reuse, T, _reuse_make, _reuse_verify, 2, SimulatedMisuse,
     rf"the tile the TMA load at .*{HERE} fills .* overwrites shared bytes that the TMA store issued at "
     rf".*{HERE} .*may still be reading")


# 13: barrier re-initialised while in use (no inval after a completed phase)
def _reinit_make(bug):
    return np.zeros(1, np.int32), bug


def _reinit_verify(out, bug):
    assert out[0] == 1


case("reinit_before_inval", reinit_barrier, 1, _reinit_make, _reinit_verify, 1, SimulatedMisuse,
     r"mbarrier_init re-initialises mbarrier 'bar' .*\(got 1\).*while it is in use")


# 14-16: pipelines
def _pipe_make(bug):
    return _tmap(_src(ROUNDS * R)), np.full(T + 1, np.nan, np.float32), bug


def _pipe_verify(src, out, bug):
    host = _src(ROUNDS * R)
    want = np.array([sum(host[r * R + t % R].sum() for r in range(ROUNDS)) for t in range(T)], np.float32)
    np.testing.assert_allclose(out[:T], want)


case("refill_without_producer_acquire", pipelined_sum, T + 1, _pipe_make, _pipe_verify, 1, SimulatedMisuse,
     # (the producer spins first: a slow producer, which timing-based detection never caught)
     r"Pipeline.load: thread \(32, 0, 0\) refills stage 0 of pipeline 'pipe' .* for round 2 before it knows the "
     r"consumers released round 1.*producer_acquire")
case("missing_consumer_release", pipelined_sum, T + 1, _pipe_make, _pipe_verify, 2, SimulatedHang,
     rf"mbarrier_wait_parity\(empty barrier of stage 0 of pipeline 'pipe' \(declared at .*{HERE}\), parity 0\)")
case("pipeline_arrival_count", pipelined_sum, T + 1, _pipe_make, _pipe_verify, 3, (SimulatedMisuse, SimulatedHang),
     # (reported at the second release of a round; or as the refill of a stage a consumer still reads, after a
     # single release completed the round; or, when the phases ran ahead of consumers that had not waited yet,
     # in the hang report of those consumers - each names the count)
     r"(consumer_release: empty barrier of stage 0 of pipeline 'pipe' .* was created with consumer_arrivals=1 "
     r"\(Pipeline\(1, 1, 1\)\), but more threads arrive on it: .* is arrival #\d+ of that round|"
     r"the phases ran ahead of it: Pipeline\(1, 1, 1\) .*consumer_arrivals=1|"
     r"with no happens-before edge from that access to this copy.*Pipeline\(1, 1, 1\) expects "
     r"consumer_arrivals=1 release\(s\) per stage)")


case("warp_release_without_syncwarp", warp_release_sum, T + 1, _pipe_make, _pipe_verify, 1, SimulatedMisuse,
     # (lane 0's arrival releases lane 0's reads only; cuda.syncwarp orders the warp's before it, as bar.warp.sync
     # does on the GPU)
     r"refills shared bytes .* which thread \(\d+, 0, 0\) read .* with no happens-before edge from that access to "
     r"this copy")


# 17: cp.async refill racing a neighbour's read
def _cp_make(bug):
    return np.arange(256, dtype=np.float32), np.full(T, np.nan, np.float32), bug


def _cp_verify(src, out, bug):
    n = (np.arange(T) + 1) % T * 4
    np.testing.assert_array_equal(out, src[n] + src[128 + n])


case("cp_async_refill_without_barrier", cp_async_twice, T, _cp_make, _cp_verify, 1, SimulatedMisuse,
     rf"(cp_async at .*{HERE} copies.*which thread \(\d+, 0, 0\) read at .*{HERE} with no happens-before edge|"
     r"reads shared bytes .* the cp_async at .* before that copy is known complete)")


# 18-21: operands the GPU build refuses while typing (same words)
def _ops_make(bug):
    return _tmap(_src()), np.full(R, np.nan, np.float32), np.zeros((R, C), np.float32), bug


def _ops_verify(src, out, glob, bug):
    np.testing.assert_array_equal(out, _src()[:, 1])


case("tile_dtype", load_operands, T, _ops_make, _ops_verify, 1, SimulatedTypingError,
     r"tma_load: the shared tile has dtype float64 but the descriptor moves float32 elements")
case("coordinate_count", load_operands, T, _ops_make, _ops_verify, 2, SimulatedTypingError,
     r"tma_load: the descriptor has rank 2 \(box \(4, 16\)\) but 1 coordinates were given")
case("tile_not_shared", load_operands, T, _ops_make, _ops_verify, 3, SimulatedTypingError,
     r"tma_load: the shared-memory tile must be a shared-memory array \(from cuda.shared.array\); got "
     r"array\(float32, 2d, C\), which is not known to live in shared memory")
case("float_coordinate", load_operands, T, _ops_make, _ops_verify, 4, SimulatedTypingError,
     r"tma_load: every coordinate must be an integer, got float64")


# 22: swizzle alignment
def _swz_make(bug):
    return (_tmap(_src(8, 32), (8, 32), swizzle=128), np.full(8, np.nan, np.float32), bug)


def _swz_verify(src, out, bug):
    assert out[0] == 0.0


case("swizzle_alignment", swizzled_load, T, _swz_make, _swz_verify, 1, SimulatedMisuse,
     rf"tma_load at .*{HERE}: the shared tile 'poor' \(declared at .*{HERE}\) is at an address that is not a "
     r"multiple of 1024 bytes \(the repeat of its 128-byte swizzle\).*declared with alignment=128")


# 23: pipeline stage range
def _stages_make(bug):
    return np.zeros(T, np.int64), 0 if bug else 1


def _stages_verify(out, stages):
    assert out.tolist() == [1] * T


case("pipeline_stage_range", pipeline_stages, T, _stages_make, _stages_verify, 1, SimulatedTypingError,
     r"Pipeline: the number of stages must be in 1\.\.64, got 0")


# The kernel variable each report must name ('bars[i]' for a barrier taken with mbarrier_ref(bars, i); a tile by
# its array; a descriptor operand by its argument's name; a pipeline by its variable).
VARIABLES = {
    "store_never_committed": "tile", "store_never_waited": "tile", "bulk_store_never_waited": "tile",
    "init_without_fence": "bar", "init_without_block_barrier": "bar", "read_before_wait": "tile",
    "wrong_parity": "bar", "expect_tx_too_large": "bar", "expect_tx_too_small": "bar",
    "store_without_proxy_fence": "tile", "rewrite_before_store_read": "tile", "reload_before_store_read": "tile",
    "reinit_before_inval": "bar", "refill_without_producer_acquire": "pipe", "missing_consumer_release": "pipe",
    "pipeline_arrival_count": "pipe", "cp_async_refill_without_barrier": "buf", "tile_dtype": "wide",
    "coordinate_count": "src", "tile_not_shared": "glob", "float_coordinate": "src", "swizzle_alignment": "poor",
    "pipeline_stage_range": "pipe", "warp_release_without_syncwarp": "ring",
}


def test_every_case_names_a_variable():
    assert set(VARIABLES) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_planted_bug_is_reported_every_time(name):
    kernel, threads, make, verify, bug, exc, pattern = CASES[name]
    _check_bug(kernel, threads, lambda: make(bug), exc, pattern, VARIABLES[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_twin_runs_clean_and_correct(name):
    kernel, threads, make, verify, bug, exc, pattern = CASES[name]
    _check_twin(kernel, threads, lambda: make(0), verify)


# 24: the innermost start coordinate of a load must be a whole number of 16 bytes (CUDA_ERROR_ILLEGAL_INSTRUCTION
# on an H100 for float32 columns 1, 3, 6, 30, -3; 0, 4, -4 work)
@pytest.mark.parametrize("col", [1, 3, 6, 30, -3])
def test_unaligned_inner_coordinate_is_reported(col):
    host = _src(R, 64)
    for _ in range(RUNS // 4):
        with pytest.raises(SimulatedMisuse, match=rf"tma_load at .*{HERE}: the innermost start coordinate of "
                                                  rf"\(0, {col}\) is {col} elements of 4 bytes = {col * 4} bytes, not "
                                                  r"a multiple of 16 bytes.*CUDA_ERROR_ILLEGAL_INSTRUCTION"):
            load_at[1, T](_tmap(host), np.zeros(R, np.float32), col)


@pytest.mark.parametrize("col", [0, 4, -4])
def test_aligned_inner_coordinate_loads(col):
    host = _src(R, 64)
    for _ in range(RUNS // 4):
        out = np.full(R, np.nan, np.float32)
        load_at[1, T](_tmap(host), out, col)
        np.testing.assert_array_equal(out, host[:, col] if col >= 0 else np.zeros(R, np.float32))


# 25: negative tile-reduce coordinates (an illegal-instruction error on the GPU)
def test_negative_reduce_coordinate_is_reported():
    for _ in range(RUNS):
        with pytest.raises(SimulatedMisuse, match=r"tma_reduce: coordinates \(-1, 0\) are negative"):
            reduce_at[1, T](_tmap(np.zeros((2 * R, C), np.float32)), -1)


def test_reduce_at_a_valid_coordinate():
    for _ in range(RUNS):
        dst = np.zeros((2 * R, C), np.float32)
        reduce_at[1, T](_tmap(dst), R)
        np.testing.assert_array_equal(dst, np.r_[np.zeros((R, C)), np.ones((R, C))].astype(np.float32))


def test_enough_planted_bugs():
    assert len(CASES) + 2 >= 20
