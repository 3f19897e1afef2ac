"""GPU tests (marker ``gpu``): TMA round trips and mbarrier semantics against NumPy on fresh random data.

Outputs are poisoned before every launch, so an element nobody wrote fails the comparison.
"""
import numpy as np
import pytest
from numba import cuda

import numbatma
from numbatma import OOBFill, Swizzle, TensorMap, TensorMapArray
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_arrive_n,
    mbarrier_complete_tx,
    mbarrier_expect_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_ref,
    mbarrier_test_wait,
    mbarrier_test_wait_parity,
    mbarrier_try_wait_parity,
    mbarrier_wait,
    mbarrier_wait_parity,
    tensormap_acquire,
    tma_load,
    tma_store,
)
from numbatma.kernels import tma_copy

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()

INT_DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]
FLOAT_DTYPES = ["float16", "float32", "float64"]


def random_array(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def poisoned_like(host):
    if host.dtype.kind == "f":
        fill = np.nan
    else:
        fill = np.iinfo(host.dtype).max // 3
    return cuda.to_device(np.full(host.shape, fill, dtype=host.dtype))


def assert_same_bits(got, want):
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.view(f"u{want.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}"))


# -- round trips -------------------------------------------------------------------------------------
RANK_SHAPES = {
    1: (1000,),
    2: (77, 132),
    3: (5, 33, 68),
    4: (3, 4, 9, 36),
    5: (2, 3, 5, 6, 20),
}


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_roundtrip_every_rank_with_partial_boxes(rank):
    host = random_array(RANK_SHAPES[rank], "float32")
    box = {1: (64,), 2: (16, 32), 3: (2, 8, 16), 4: (2, 3, 4, 8), 5: (1, 2, 2, 4, 8)}[rank]
    src = cuda.to_device(host)
    dst = poisoned_like(host)
    tma_copy(src, dst, box)
    cuda.synchronize()
    assert_same_bits(dst.copy_to_host(), host)


@pytest.mark.parametrize("dtype", INT_DTYPES + FLOAT_DTYPES)
def test_roundtrip_every_dtype(dtype):
    itemsize = np.dtype(dtype).itemsize
    host = random_array((61, 160 // itemsize * 3), dtype)
    src = cuda.to_device(host)
    dst = poisoned_like(host)
    tma_copy(src, dst, (8, 64 // itemsize))
    cuda.synchronize()
    assert_same_bits(dst.copy_to_host(), host)


def test_roundtrip_bfloat16_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(50, 200, device="cuda").to(torch.bfloat16)
    y = torch.full_like(x, float("nan"))
    tma_copy(x, y, (16, 64))
    torch.cuda.synchronize()
    assert torch.equal(x.view(torch.int16), y.view(torch.int16))


@pytest.mark.parametrize("swizzle", [Swizzle.NONE, Swizzle.B32, Swizzle.B64, Swizzle.B128])
@pytest.mark.parametrize("dtype", ["float16", "float32", "int8"])
def test_roundtrip_every_swizzle(swizzle, dtype):
    itemsize = np.dtype(dtype).itemsize
    span = int(swizzle) or 128
    host = random_array((45, 3 * span // itemsize + 16 // itemsize), dtype)
    src = cuda.to_device(host)
    dst = poisoned_like(host)
    tma_copy(src, dst, (16, span // itemsize), swizzle=swizzle)
    cuda.synchronize()
    assert_same_bits(dst.copy_to_host(), host)


def test_cupy_and_torch_inputs():
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    a = cp.asarray(random_array((70, 96), "float32"))
    b = cp.full_like(a, cp.nan)
    tma_copy(a, b, (32, 32))
    cp.cuda.runtime.deviceSynchronize()
    assert cp.array_equal(a, b)
    t = torch.randn(33, 48, device="cuda", dtype=torch.float64)
    u = torch.full_like(t, float("nan"))
    tma_copy(t, u, (8, 16))
    torch.cuda.synchronize()
    assert torch.equal(t, u)
    # a strided (non-contiguous outer axis) torch view: every other row
    big = torch.randn(64, 32, device="cuda")
    view = big[::2]
    out = torch.full((32, 32), float("nan"), device="cuda")
    tma_copy(view, out, (8, 32))
    torch.cuda.synchronize()
    assert torch.equal(view, out)


# -- OOB fill ---------------------------------------------------------------------------------------------
def _load_box_kernel(shared_shape, alignment=128):
    @cuda.jit
    def load_box(desc, coords, out):
        tile = cuda.shared.array(shared_shape, "float32", alignment=alignment)
        bar = cuda.shared.array(1, "uint64")
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            mbarrier_arrive_expect_tx(bar, desc.box_bytes)
            tma_load(tile, desc, coords, bar)
        mbarrier_wait_parity(bar, 0)
        for i in range(cuda.threadIdx.x, shared_shape[0] * shared_shape[1], cuda.blockDim.x):
            out[i // shared_shape[1], i % shared_shape[1]] = tile[i // shared_shape[1], i % shared_shape[1]]

    return load_box


@pytest.mark.parametrize("fill", [OOBFill.ZERO, OOBFill.NAN])
def test_oob_fill(fill):
    host = random_array((20, 36), "float32")
    src = cuda.to_device(host)
    desc = TensorMap(src, (16, 16), oob_fill=fill)
    kernel = _load_box_kernel((16, 16))
    for coords in [(12, 28), (-5, -4), (0, 32), (30, 0), (-16, 20)]:
        out = cuda.to_device(np.full((16, 16), 12345.0, np.float32))
        kernel[1, 128](desc, coords, out)
        got = out.copy_to_host()
        want = np.full((16, 16), 0.0 if fill == OOBFill.ZERO else np.nan, np.float32)
        r0, c0 = coords
        for i in range(16):
            for j in range(16):
                if 0 <= r0 + i < 20 and 0 <= c0 + j < 36:
                    want[i, j] = host[r0 + i, c0 + j]
        np.testing.assert_array_equal(got, want)


def test_element_strides_and_box_bytes():
    host = random_array((32, 64), "float32")
    src = cuda.to_device(host)
    desc = TensorMap(src, (16, 32), element_strides=(2, 1))
    assert desc.shared_shape == (8, 32)
    kernel = _load_box_kernel((8, 32))
    out = cuda.to_device(np.full((8, 32), np.nan, np.float32))
    kernel[1, 128](desc, (0, 0), out)
    np.testing.assert_array_equal(out.copy_to_host(), host[0:16:2, 0:32])


# -- descriptor management -------------------------------------------------------------------------------
def test_repointed_descriptor():
    a_host, b_host = random_array((40, 64), "float32"), random_array((40, 64), "float32")
    a, b = cuda.to_device(a_host), cuda.to_device(b_host)
    out = poisoned_like(a_host)
    from numbatma.kernels.copy import TmaCopy

    plan = TmaCopy(a, out, (8, 32))
    plan.launch()
    cuda.synchronize()
    assert_same_bits(out.copy_to_host(), a_host)
    s, d = plan.src_map, plan.dst_map
    s.repoint(b)  # same layout, new address: no re-encoding
    out2 = poisoned_like(a_host)
    d.repoint(out2)
    plan.launch()
    cuda.synchronize()
    assert_same_bits(out2.copy_to_host(), b_host)
    with pytest.raises(numbatma.TensorMapError, match="same layout|layout the descriptor"):
        s.repoint(cuda.to_device(random_array((40, 32), "float32")))


def test_descriptor_array_in_global_memory():
    hosts = [random_array((24, 32), "float32") for _ in range(3)]
    arrays = [cuda.to_device(h) for h in hosts]
    descs = TensorMapArray([TensorMap(x, (24, 32)) for x in arrays])
    out_host = np.full((3, 24, 32), np.nan, np.float32)
    out = cuda.to_device(out_host)
    out_desc = TensorMap(out, (1, 24, 32))

    @cuda.jit
    def gather(descs, out_desc):
        tile = cuda.shared.array((24, 32), "float32", alignment=128)
        bar = cuda.shared.array(1, "uint64")
        which = cuda.blockIdx.x
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            d = tensormap_acquire(descs, which)
            mbarrier_arrive_expect_tx(bar, d.box_bytes)
            tma_load(tile, d, (0, 0), bar)
            mbarrier_wait_parity(bar, 0)
            out3 = tile  # same bytes as one (1, 24, 32) box
            tma_store(out_desc, (which, 0, 0), out3)
            bulk_commit_group()
            bulk_wait_group(0)

    gather[3, 32](descs, out_desc)
    np.testing.assert_array_equal(out.copy_to_host(), np.stack(hosts))


# -- mbarrier semantics -----------------------------------------------------------------------------------
def test_mbarrier_arrivals_tokens_and_parity():
    @cuda.jit
    def k(out):
        bars = cuda.shared.array(2, "uint64")
        tid = cuda.threadIdx.x
        b0 = mbarrier_ref(bars, 0)
        b1 = mbarrier_ref(bars, 1)
        if tid == 0:
            mbarrier_init(b0, 32)
            mbarrier_init(b1, 1)
            fence_mbarrier_init()
        cuda.syncthreads()
        # phase 0 of b0: all 32 threads arrive
        token = mbarrier_arrive(b0)
        mbarrier_wait(b0, token)
        out[0, tid] = mbarrier_test_wait(b0, token)
        out[1, tid] = mbarrier_test_wait_parity(b0, 0)
        out[2, tid] = mbarrier_test_wait_parity(b0, 1)  # phase 1 has not completed
        cuda.syncthreads()
        # phase 1 of b0: one thread arrives for everyone
        if tid == 0:
            mbarrier_arrive_n(b0, 32)
        mbarrier_wait_parity(b0, 1)
        out[3, tid] = mbarrier_try_wait_parity(b0, 1)
        # transaction bytes: b1 needs its arrival AND 64 bytes
        if tid == 0:
            mbarrier_expect_tx(b1, 64)
            mbarrier_arrive(b1)
        cuda.syncthreads()
        out[4, tid] = mbarrier_test_wait_parity(b1, 0)  # bytes still pending
        cuda.syncthreads()
        if tid == 0:
            mbarrier_complete_tx(b1, 64)
        mbarrier_wait_parity(b1, 0)
        out[5, tid] = mbarrier_test_wait_parity(b1, 0)
        cuda.syncthreads()
        if tid == 0:
            mbarrier_inval(b0)
            mbarrier_inval(b1)

    out = cuda.to_device(np.full((6, 32), 7, np.int32))
    k[1, 32](out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[0], 1)
    np.testing.assert_array_equal(got[1], 1)
    np.testing.assert_array_equal(got[2], 0)
    np.testing.assert_array_equal(got[3], 1)
    np.testing.assert_array_equal(got[4], 0)
    np.testing.assert_array_equal(got[5], 1)


# -- > 48 KiB of dynamic shared memory, stores with wait_group.read ---------------------------------------
def test_dynamic_shared_memory_above_48k():
    host = random_array((96, 256), "float32")  # 96 KiB
    src = cuda.to_device(host)
    out = poisoned_like(host)
    s = TensorMap(src, (32, 32))
    d = TensorMap(out, (32, 32))

    @cuda.jit
    def k(s, d):
        smem = cuda.shared.array(0, "float32", alignment=128)
        bar = cuda.shared.array(1, "uint64")
        n = 24  # 24 tiles of 32x32 float32 = 96 KiB
        if cuda.threadIdx.x == 0:
            mbarrier_init(bar, 1)
            fence_mbarrier_init()
            mbarrier_arrive_expect_tx(bar, n * s.box_bytes)
            for t in range(n):
                tile = smem[t * 1024:(t + 1) * 1024]
                tma_load(tile, s, ((t // 8) * 32, (t % 8) * 32), bar)
            mbarrier_wait_parity(bar, 0)
        cuda.syncthreads()
        for i in range(cuda.threadIdx.x, n * 1024, cuda.blockDim.x):
            smem[i] = smem[i] * 2.0
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            for t in range(n):
                tma_store(d, ((t // 8) * 32, (t % 8) * 32), smem[t * 1024:(t + 1) * 1024])
                bulk_commit_group()
            bulk_wait_group_read(0)
            bulk_wait_group(0)

    k[1, 256, 0, 96 * 1024 + 0](s, d)
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), host * 2)
