"""GPU: the Pipeline API under real producer/consumer concurrency, LDGSTS, warp-level operations, and the
streaming kernels (StreamCopy, Axpy) against NumPy on fresh random data with poisoned outputs."""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma import TensorMap
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    cp_async,
    elect_one_sync,
    named_barrier_sync,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_view,
)
from numbatma.kernels import Axpy, StreamCopy, axpy, stream_copy

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng()


def random(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def poisoned(shape, dtype):
    dtype = np.dtype(dtype)
    fill = np.nan if dtype.kind == "f" else np.iinfo(dtype).max // 3
    return cuda.to_device(np.full(shape, fill, dtype=dtype))


# -- Pipeline semantics -------------------------------------------------------------------------------------
TR, TC = 8, 64  # tile of float32: 2 KiB
STAGES = 3


@cuda.jit
def ring_sums(src, sums, ntiles):
    """Warp 0 (one lane) streams ``ntiles`` row tiles through a 3-stage ring; warps 1-2 (64 threads) sum
    each tile and release it. Many more tiles than stages: the phases wrap many times."""
    ring = cuda.shared.array((STAGES, TR, TC), np.float32, alignment=128)
    partial = cuda.shared.array(64, np.float32)
    pipe = Pipeline(STAGES, 1, 64)
    warp = cuda.threadIdx.x // 32
    if warp == 0:
        if elect_one_sync():
            for t in range(ntiles):
                s = pipe.producer_acquire()
                pipe.load(ring[s], src, (t * TR, 0))
                pipe.producer_commit()
    else:
        me = cuda.threadIdx.x - 32
        for t in range(ntiles):
            s = pipe.consumer_wait()
            acc = np.float32(0)
            for k in range(me, TR * TC, 64):
                acc += ring[s, k // TC, k % TC]
            partial[me] = acc
            pipe.consumer_release()
            named_barrier_sync(1, 64)
            if me == 0:
                total = np.float32(0)
                for j in range(64):
                    total += partial[j]
                sums[t] = total
            named_barrier_sync(1, 64)


@pytest.mark.parametrize("ntiles", [1, 3, 4, 50])
def test_pipeline_ring_many_rounds(ntiles):
    host = random((ntiles * TR, TC), np.float32)
    src = cuda.to_device(host)
    sums = poisoned((ntiles,), np.float32)
    ring_sums[1, 96](TensorMap(src, (TR, TC)), sums, ntiles)
    expect = host.reshape(ntiles, TR * TC).astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(sums.copy_to_host(), expect, rtol=1e-4, atol=1e-3)


LD_THREADS = 64
LD_CHUNK = LD_THREADS * 4  # float32 elements per stage: one 16-byte copy per producer thread


@cuda.jit
def ldgsts_sums(src, sums, nchunks):
    """Warps 0-1 copy chunks with cp.async (16 bytes per thread) into a 4-stage ring, committing with
    cp.async.mbarrier.arrive.noinc; warp 2 sums each chunk."""
    ring = cuda.shared.array((4, LD_CHUNK), np.float32, alignment=128)
    pipe = Pipeline(4, LD_THREADS, 32)
    tid = cuda.threadIdx.x
    if tid < LD_THREADS:
        for c in range(nchunks):
            s = pipe.producer_acquire()
            cp_async(ring, (s, 4 * tid), src, c * LD_CHUNK + 4 * tid, 16)
            pipe.producer_commit_async()
    else:
        lane = tid - LD_THREADS
        for c in range(nchunks):
            s = pipe.consumer_wait()
            acc = np.float32(0)
            for k in range(lane, LD_CHUNK, 32):
                acc += ring[s, k]
            pipe.consumer_release()
            for off in (16, 8, 4, 2, 1):
                acc += cuda.shfl_down_sync(0xFFFFFFFF, acc, off)
            if lane == 0:
                sums[c] = acc


@pytest.mark.parametrize("nchunks", [1, 5, 33])
def test_ldgsts_pipeline(nchunks):
    host = random((nchunks * LD_CHUNK,), np.float32)
    sums = poisoned((nchunks,), np.float32)
    ldgsts_sums[1, LD_THREADS + 32](cuda.to_device(host), sums, nchunks)
    expect = host.reshape(nchunks, LD_CHUNK).astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(sums.copy_to_host(), expect, rtol=1e-4, atol=1e-3)


@cuda.jit
def count_elected(out):
    if elect_one_sync():
        cuda.atomic.add(out, cuda.threadIdx.x // 32, 1)


def test_elect_one_sync_elects_one_lane_per_warp():
    out = cuda.to_device(np.zeros(8, np.int32))
    count_elected[1, 256](out)
    assert out.copy_to_host().tolist() == [1] * 8


@cuda.jit(max_registers=128)  # 40 x 128 + 216 x 128 = 128 x 256
def rebalanced(out):
    wg = cuda.threadIdx.x // 128
    if wg == 0:
        setmaxnreg_dec(40)
        out[cuda.threadIdx.x] = 1
    else:
        setmaxnreg_inc(216)
        out[cuda.threadIdx.x] = 2


def test_setmaxnreg_runs():
    out = cuda.to_device(np.zeros(256, np.int32))
    rebalanced[1, 256](out)
    assert out.copy_to_host().tolist() == [1] * 128 + [2] * 128


@cuda.jit
def view_store(dst):
    ring = cuda.shared.array(0, np.float32, alignment=1024)
    tile = shared_view(ring, 512, (16, 32))
    for k in range(cuda.threadIdx.x, 512, cuda.blockDim.x):
        tile[k // 32, k % 32] = k
    numbatma.intrinsics.fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        numbatma.intrinsics.tma_store(dst, (0, 0), tile)
        bulk_commit_group()
        bulk_wait_group(0)


def test_shared_view_of_dynamic_shared_memory():
    out = poisoned((16, 32), np.float32)
    view_store[1, 128, 0, 1024 * 4](TensorMap(out, (16, 32)))
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(512, dtype=np.float32).reshape(16, 32))


# -- StreamCopy ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 4), (3, 260), (1000, 1004), (4096, 4096), (2, 3, 40), (1 << 20,), (1000,)])
@pytest.mark.parametrize("stages, two_roles", [(1, False), (2, False), (4, False), (1, True), (3, True)])
def test_stream_copy_shapes(shape, stages, two_roles):
    host = random(shape, np.float32)
    dst = poisoned(shape, np.float32)
    StreamCopy(cuda.to_device(host), dst, stages=stages, two_roles=two_roles).launch()
    np.testing.assert_array_equal(dst.copy_to_host(), host)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float16, np.float32, np.int64, np.float64])
def test_stream_copy_dtypes(dtype):
    shape = (777, 1024)
    host = random(shape, dtype)
    dst = poisoned(shape, dtype)
    stream_copy(cuda.to_device(host), dst, stages=3, ctas_per_sm=2, tile_bytes=16384)
    np.testing.assert_array_equal(dst.copy_to_host(), host)


def test_stream_copy_torch_strided_view():
    torch = pytest.importorskip("torch")
    base = torch.randn(512, 1024, device="cuda")
    src = base[:, 256:768]  # row stride 4096 bytes, 512 columns
    dst = torch.full((512, 512), float("nan"), device="cuda")
    StreamCopy(src, dst, stages=4).launch()
    torch.cuda.synchronize()
    assert torch.equal(dst, src)


def test_stream_copy_many_tiles_per_cta():
    shape = (8192, 2048)  # 512 tiles of 32 KiB: several rounds of the ring per CTA
    host = random(shape, np.float32)
    dst = poisoned(shape, np.float32)
    plan = StreamCopy(cuda.to_device(host), dst, stages=6)
    plan.launch()
    plan.launch()  # re-launch of the same plan
    np.testing.assert_array_equal(dst.copy_to_host(), host)


# -- Axpy -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 4), (5, 300), (1000, 1004), (2048, 4096), (3, 5, 64), (12345 * 4,)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stages", [1, 4])
def test_axpy(shape, dtype, stages):
    x, y = random(shape, dtype), random(shape, dtype)
    out = poisoned(shape, dtype)
    a = float(RNG.standard_normal())
    axpy(a, cuda.to_device(x), cuda.to_device(y), out, stages=stages)
    expect = dtype(a) * x + y
    np.testing.assert_allclose(out.copy_to_host(), expect, rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-6)


def test_axpy_plan_relaunch_with_new_scalar():
    shape = (4096, 1024)
    x, y = random(shape, np.float32), random(shape, np.float32)
    out = poisoned(shape, np.float32)
    plan = Axpy(2.0, cuda.to_device(x), cuda.to_device(y), out, stages=6)
    plan.launch()
    np.testing.assert_allclose(out.copy_to_host(), np.float32(2) * x + y, rtol=1e-6, atol=1e-6)
    plan.a = np.float32(-0.5)
    plan.launch()
    np.testing.assert_allclose(out.copy_to_host(), np.float32(-0.5) * x + y, rtol=1e-6, atol=1e-6)
