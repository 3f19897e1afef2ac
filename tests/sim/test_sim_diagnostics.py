"""Under NUMBA_ENABLE_CUDASIM=1: deliberately broken kernels get the diagnostic that names their bug
(missing wait, wrong parity, wrong byte count, missing proxy fence, reuse of a tile a store still reads,
re-initialising a busy barrier, cp.async read before its wait, a store whose 16-byte row completion runs
past the array); the correct version of each kernel runs clean and gives the right answer."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    cp_async,
    cp_async_commit_group,
    cp_async_mbarrier_arrive_noinc,
    cp_async_wait_group,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_ref,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
)
from numbatma.intrinsics._sim import SimulatedHang, SimulatedMisuse

RNG = np.random.default_rng()
R, C = 4, 16


def _desc(host, box=(R, C)):
    return numbatma.TensorMap(host, box)


# -- reading a tile before its load is known complete -----------------------------------------------------
@cuda.jit
def sum_tile(src, out, wait, parity, thread0_waits_only):
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, 0), bar)
    cuda.syncthreads()
    if wait and (tid == 0 or not thread0_waits_only):
        mbarrier_wait_parity(bar, parity)
    if thread0_waits_only:
        cuda.syncthreads()  # the waiting thread's knowledge passes to the block
    acc = np.float32(0)
    for k in range(C):
        acc += tile[tid, k]
    out[tid] = acc


@pytest.mark.parametrize("thread0_waits_only", [False, True])
def test_correct_waits_read_the_tile(thread0_waits_only):
    host = RNG.standard_normal((R, C)).astype(np.float32)
    out = np.full(R, np.nan, np.float32)
    sum_tile[1, R](_desc(host), out, True, 0, thread0_waits_only)
    np.testing.assert_allclose(out, host.sum(axis=1), rtol=1e-5, atol=1e-5)  # (float32 sums of 16 values)


def test_reading_before_the_wait_is_reported():
    host = np.ones((R, C), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"reads shared bytes .* of the tile the TMA load at .*"
                                              r"before that copy is known complete: it completes phase 0 "
                                              r"\(parity 0\).*has not waited for that phase"):
        sum_tile[1, R](_desc(host), np.zeros(R, np.float32), False, 0, False)


@cuda.jit
def read_after_wrong_parity(src, out):
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 2)  # the load's phase also waits for a second arrival (thread 1, below)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, 0), bar)
    cuda.syncthreads()
    mbarrier_wait_parity(bar, 1)  # phase 0 (parity 0) is running: parity 1 names the phase before it
    out[tid] = tile[tid, 0]
    if tid == 1:
        mbarrier_arrive(bar)


def test_wrong_parity_reports_stale_data():
    """A wait on parity 1 while phase 0 runs returns at once (it names the phase before): reading then
    would see stale bytes on the GPU."""
    host = np.ones((R, C), np.float32)
    with pytest.raises(SimulatedMisuse, match=r"mbarrier_wait_parity with parity 1 at .*returned for phase -1.*"
                                              r"wrong parity"):
        read_after_wrong_parity[1, R](_desc(host), np.zeros(R, np.float32))


# -- transaction bytes --------------------------------------------------------------------------------
@cuda.jit
def load_with_expect(src, extra):
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        mbarrier_arrive_expect_tx(bar, src.box_bytes + extra)
        tma_load(tile, src, (0, 0), bar)
        mbarrier_wait_parity(bar, 0)


@pytest.mark.parametrize("extra, message", [
    (64, r"delivered 64 bytes fewer than expect_tx announced"),
    (-64, r"delivered 64 bytes more than expect_tx announced"),
])
def test_expect_tx_that_differs_from_the_bytes_delivered(extra, message):
    with pytest.raises(SimulatedHang, match=message):
        load_with_expect[1, 1](_desc(np.ones((R, C), np.float32)), extra)


def test_expect_tx_equal_to_the_box_completes():
    load_with_expect[1, 1](_desc(np.ones((R, C), np.float32)), 0)


# -- stores: proxy fence and reuse of a tile a store still reads ----------------------------------------------
@cuda.jit
def write_and_store(dst, value, fence, rewrite, wait_read):
    tile = cuda.shared.array((R, C), np.float32, alignment=128)
    tid = cuda.threadIdx.x
    for k in range(C):
        tile[tid, k] = value + tid * C + k
    if fence:
        fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if tid == 0:
        tma_store(dst, (0, 0), tile)
        bulk_commit_group()
        if wait_read:
            bulk_wait_group_read(0)
    cuda.syncthreads()
    if rewrite:
        tile[tid, 0] = -1.0
    if tid == 0:
        bulk_wait_group(0)


def test_fenced_store_writes_the_tile():
    out = np.full((R, C), np.nan, np.float32)
    write_and_store[1, R](_desc(out), 10.0, True, True, True)
    np.testing.assert_array_equal(out, 10.0 + np.arange(R * C, dtype=np.float32).reshape(R, C))


def test_store_without_proxy_fence_is_reported():
    with pytest.raises(SimulatedMisuse, match=r"tma_store from a shared tile that (this thread|thread \(\d+, 0, 0\)) "
                                              r"wrote .* without fence_proxy_async_shared_cta"):
        write_and_store[1, R](_desc(np.zeros((R, C), np.float32)), 1.0, False, False, False)


def test_rewriting_a_tile_a_store_still_reads_is_reported():
    with pytest.raises(SimulatedMisuse, match=r"writes shared bytes .* of a tile that the TMA store issued at .* "
                                              r"may still be reading.*bulk_wait_group_read"):
        write_and_store[1, R](_desc(np.zeros((R, C), np.float32)), 1.0, True, True, False)


# -- barrier lifetime -------------------------------------------------------------------------------------
@cuda.jit
def reinit_busy():
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 2)
        mbarrier_arrive(bar)  # one of two arrivals: the phase is in progress
        mbarrier_init(bar, 1)


def test_reinitialising_a_barrier_in_use_is_reported():
    with pytest.raises(SimulatedMisuse, match=r"re-initialises .* \(got 1\) .*, while it is in use"):
        reinit_busy[1, 1]()


# -- LDGSTS ---------------------------------------------------------------------------------------------------
@cuda.jit
def ldgsts_copy(src, out, how):
    buf = cuda.shared.array(64, np.float32)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 16)
        fence_mbarrier_init()
    cuda.syncthreads()
    cp_async(buf, tid * 4, src, tid * 4, 16)
    cp_async_commit_group()
    if how == 1:
        cp_async_wait_group(0)
        cuda.syncthreads()  # the other threads' copies: after their wait and a block barrier
    elif how == 2:
        cp_async_mbarrier_arrive_noinc(bar)
        mbarrier_wait_parity(bar, 0)
    out[tid] = buf[(tid * 4 + 5) % 64]


@pytest.mark.parametrize("how", [1, 2])
def test_cp_async_waited_for(how):
    src = RNG.standard_normal(64).astype(np.float32)
    out = np.full(16, np.nan, np.float32)
    ldgsts_copy[1, 16](src, out, how)
    np.testing.assert_array_equal(out, src[(np.arange(16) * 4 + 5) % 64])


def test_cp_async_read_before_its_wait_is_reported():
    with pytest.raises(SimulatedMisuse, match=r"reads shared bytes .* cp_async at .*cp_async_wait_group"):
        ldgsts_copy[1, 16](np.ones(64, np.float32), np.zeros(16, np.float32), 0)


# -- the 16-byte completion of clipped rows -----------------------------------------------------------------------
@cuda.jit
def store_rows(dst, col):
    tile = cuda.shared.array((2, 8), np.float32, alignment=128)
    if cuda.threadIdx.x == 0:
        for k in range(16):
            tile[k // 8, k % 8] = 100 + k
        fence_proxy_async_shared_cta()
        tma_store(dst, (0, col), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def test_store_through_an_overhanging_descriptor_is_refused():
    """Rows of 6 float32 (24 bytes) in an allocation with rows of 8: a store reaching the row end would also
    write columns 6 and 7, outside the view. Refused as on the GPU (there: a typing error), every time,
    whatever the coordinates."""
    base = np.zeros((2, 8), np.float32)
    for col in (0, 8):
        with pytest.raises(SimulatedMisuse, match=r"tma_store: the destination's rows are 6 float32 elements = 24 "
                                                  r"bytes, not a multiple of 16 bytes; .* writes the 8 bytes \(2 "
                                                  r"elements\) after it.*allow_store_overhang=True"):
            store_rows[1, 1](numbatma.TensorMap(base[:, :6], (2, 8)), col)
    assert not base.any()


def test_store_overhang_lands_in_the_row_padding():
    """With allow_store_overhang=True the store of the box at column 0 writes columns 6 and 7 too (the hardware
    completes each row to 16 bytes), within the padding."""
    base = np.zeros((2, 8), np.float32)
    store_rows[1, 1](numbatma.TensorMap(base[:, :6], (2, 8), allow_store_overhang=True), 0)
    np.testing.assert_array_equal(base, 100 + np.arange(16, dtype=np.float32).reshape(2, 8))


def test_store_overhang_past_the_array_is_reported():
    base = np.zeros(6, np.float32)  # one row of 24 bytes: 8 more would land past the array
    with pytest.raises(SimulatedMisuse, match=r"completes the clipped rows to 16 bytes and would write 8 byte"):
        store_rows[1, 1](numbatma.TensorMap(base.reshape(1, 6), (2, 8), allow_store_overhang=True), 0)


def test_a_barrier_taken_through_mbarrier_ref_is_named_by_its_array_and_index():
    """A hang on element 1 of a barrier array names it the way the kernel spells it: 'bars[1]' and the line that
    declared ``bars``."""
    import inspect

    @cuda.jit
    def kernel(out):
        bars = cuda.shared.array(2, np.uint64)
        if cuda.threadIdx.x == 0:
            mbarrier_init(mbarrier_ref(bars, 0), 1)
            mbarrier_init(mbarrier_ref(bars, 1), 2)  # two arrivals expected, one comes
            fence_mbarrier_init()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_arrive(mbarrier_ref(bars, 1))
        mbarrier_wait_parity(mbarrier_ref(bars, 1), 0)
        out[cuda.threadIdx.x] = 1

    lines, first = inspect.getsourcelines(kernel.py_func)
    declared = first + next(i for i, text in enumerate(lines) if "bars = cuda.shared.array" in text)
    with pytest.raises(SimulatedHang, match=rf"'bars\[1\]' \(declared at .*test_sim_diagnostics.py:{declared}\)"):
        kernel[1, 2](np.zeros(2, np.int32))


# -- a failing thread: the launch ends only once every thread of the block has -----------------------------
@cuda.jit(device=True)
def _count_up(n):
    s = 0
    for i in range(n):
        s += i % 3
    return s


@cuda.jit
def thread0_fails(out, n):
    t = cuda.threadIdx.x
    if t == 0:
        out[out.shape[0]] = 1.0  # (out of bounds: an IndexError in the simulator)
    out[t] = _count_up(n)  # (the other threads are inside a device function when thread 0 fails)


@cuda.jit
def each_thread_counts(out, n):
    out[cuda.threadIdx.x] = _count_up(n)


def test_a_failed_launch_leaves_no_thread_running():
    """When one simulated thread raises, the launch raises its exception only after the block's other threads
    have ended (numbatma's block manager joins them; upstream's leaves them running): a thread of a failed launch
    still inside a device function swapped that function's ``cuda`` global to ``None`` under the next launch's
    threads ("'NoneType' object has no attribute 'shared'", once in CI). The next launch then runs clean."""
    import threading

    out = np.zeros(32, np.float32)
    with pytest.raises(IndexError):
        thread0_fails[1, 32](out, 20000)
    alive = [t for t in threading.enumerate() if type(t).__name__ == "BlockThread" and t.is_alive()]
    assert not alive, f"{len(alive)} simulated threads of the failed launch still running"
    good = np.zeros(32, np.float32)
    each_thread_counts[1, 32](good, 30)
    assert (good == sum(i % 3 for i in range(30))).all()
