"""Kernels for the GPU debug-mode tests (tests/test_debug_cpu.py, tests/test_gpu_debug.py): a representative
kernel (TMA load + mbarrier wait + Pipeline) and one planted bug per debug-mode check. Run as a script
(``python tests/debug_kernels.py CASE``) it launches one case on the GPU, for a fresh process per trap."""
import sys

import numpy as np
from numba import cuda, types

import numbatma
from numbatma import TensorMap
from numbatma.intrinsics import (
    Pipeline,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_ref,
    mbarrier_wait,
    mbarrier_arrive,
    mbarrier_wait_parity,
    tma_load,
    tma_store,
    bulk_commit_group,
    bulk_wait_group,
    fence_proxy_async_shared_cta,
    shared_view,
)

ROWS, COLS = 64, 64
BOX = (16, 32)
STAGES = 2


def representative(src, dst, out):
    """One TMA load completing on a plain barrier (mbarrier_wait_parity), a token wait, a 2-stage Pipeline
    (producer_acquire / load / producer_commit, consumer_wait / consumer_release), a TMA store. 64 threads:
    thread 32 produces, threads 0-31 consume."""
    tile = cuda.shared.array(BOX, np.float32, alignment=128)
    ring = cuda.shared.array((STAGES, BOX[0], BOX[1]), np.float32, alignment=128)
    bars = cuda.shared.array(2, np.uint64)
    bar = mbarrier_ref(bars, 1)
    pipe = Pipeline(STAGES, 1, 32)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 1)
        mbarrier_init(bar, 64)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bars, src.box_bytes)
        tma_load(tile, src, (BOX[0], BOX[1]), bars)
    mbarrier_wait_parity(bars, 0)
    token = mbarrier_arrive(bar)
    mbarrier_wait(bar, token)
    if cuda.threadIdx.x == 32:
        for t in range(4):
            s = pipe.producer_acquire()
            pipe.load(ring[s], src, (t * BOX[0], 0))
            pipe.producer_commit()
    elif cuda.threadIdx.x < 32:
        acc = np.float32(0)
        for t in range(4):
            s = pipe.consumer_wait()
            acc += ring[s, t, cuda.threadIdx.x]
            pipe.consumer_release()
        out[cuda.threadIdx.x] = acc + tile[0, cuda.threadIdx.x]
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        tma_store(dst, (0, 0), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def representative_types():
    """Kernel argument types of ``representative`` (no GPU needed)."""
    from fakes import FakeCudaArray

    src = TensorMap(FakeCudaArray((ROWS, COLS), np.float32), BOX)
    return (src.numba_type, src.numba_type, types.float32[:])


# -- planted bugs (each traps in a debug build) ------------------------------------------------------------
def hang(src, out):
    """The barrier expects 16 bytes more than the TMA load delivers: the wait never completes."""
    tile = cuda.shared.array(BOX, np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, src.box_bytes + 16)
        tma_load(tile, src, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    out[cuda.threadIdx.x] = tile[0, cuda.threadIdx.x]


def bad_coordinate(src, out, col):
    """A float32 load whose innermost start coordinate ``col`` (1) is 4 bytes from a 16-byte boundary."""
    tile = cuda.shared.array(BOX, np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, col), bar)
    mbarrier_wait_parity(bar, 0)
    out[cuda.threadIdx.x] = tile[0, cuda.threadIdx.x]


def missing_commit(src, out):
    """The producer loads a stage but never commits it (producer_commit missing): consumer_wait never returns."""
    ring = cuda.shared.array((STAGES, BOX[0], BOX[1]), np.float32, alignment=128)
    pipe = Pipeline(STAGES, 1, 32)
    if cuda.threadIdx.x == 32:
        s = pipe.producer_acquire()
        pipe.load(ring[s], src, (0, 0))
    elif cuda.threadIdx.x < 32:
        s = pipe.consumer_wait()
        out[cuda.threadIdx.x] = ring[s, 0, cuda.threadIdx.x]
        pipe.consumer_release()


def misaligned_tile(src, out, offset):
    """A tile carved out of dynamic shared memory at ``offset`` elements (8: 32 bytes), not 128-byte aligned."""
    dyn = cuda.shared.array(0, np.float32, alignment=1024)
    bar = cuda.shared.array(1, np.uint64)
    tile = shared_view(dyn, offset, BOX)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (0, 0), bar)
    mbarrier_wait_parity(bar, 0)
    out[cuda.threadIdx.x] = tile[0, cuda.threadIdx.x]


def wide_coordinate(src, out, row):
    """An int64 row coordinate beyond 32 bits (2**32 would silently become row 0)."""
    tile = cuda.shared.array(BOX, np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bar, src.box_bytes)
        tma_load(tile, src, (row, 0), bar)
    mbarrier_wait_parity(bar, 0)
    out[cuda.threadIdx.x] = tile[0, cuda.threadIdx.x]


# -- the GPU runner: python tests/debug_kernels.py CASE (one case per process: a trap ends the context) ------
def _flush_c_stdout():
    """Device printf writes through the C library's stdout, which is block-buffered on a pipe."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass


def run(case):
    rng = np.random.default_rng(0)
    host = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    src_array = cuda.to_device(host)
    src = TensorMap(src_array, BOX)
    out = cuda.to_device(np.full(64, np.nan, np.float32))
    if case == "ok":
        dst_array = cuda.to_device(np.zeros((ROWS, COLS), np.float32))
        dst = TensorMap(dst_array, BOX)
        cuda.jit(representative)[1, 64](src, dst, out)
        cuda.synchronize()
        got = out.copy_to_host()[:32]
        lanes = np.arange(32)
        want = sum(host[t * BOX[0] + t, lanes] for t in range(4)) + host[BOX[0], BOX[1] + lanes]
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (got, want)
        stored = dst_array.copy_to_host()
        assert np.array_equal(stored[:BOX[0], :BOX[1]], host[BOX[0]:2 * BOX[0], BOX[1]:2 * BOX[1]])
        print("DEBUG-CASE-OK results correct", flush=True)
        return
    launches = {
        "hang": lambda: cuda.jit(hang)[1, 32](src, out),
        "coordinate": lambda: cuda.jit(bad_coordinate)[1, 32](src, out, np.int32(1)),
        "missing_commit": lambda: cuda.jit(missing_commit)[1, 64](src, out),
        "misaligned_tile": lambda: cuda.jit(misaligned_tile)[1, 32, 0, 4096](src, out, np.int32(8)),
        "wide_coordinate": lambda: cuda.jit(wide_coordinate)[1, 32](src, out, np.int64(1 << 32)),
    }
    try:
        launches[case]()
        cuda.synchronize()
    except Exception as exc:  # the trap: the launch (or the synchronisation after it) fails
        _flush_c_stdout()
        print(f"DEBUG-CASE-LAUNCH-FAILED {type(exc).__name__}: {exc}", flush=True)
        return
    _flush_c_stdout()
    print("DEBUG-CASE-NO-ERROR", flush=True)


if __name__ == "__main__":
    print(f"numbatma debug mode: {numbatma.debug.ENABLED}, timeout {numbatma.debug.TIMEOUT_MS} ms", flush=True)
    run(sys.argv[1])
    _flush_c_stdout()
