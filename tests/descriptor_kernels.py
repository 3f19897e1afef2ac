"""Kernels, runners and NumPy references shared by the in-kernel descriptor tests (``tensormap.replace``,
publishing to a TensorMapArray workspace with ``tensormap.cp_fenceproxy``, in-place edits of a slot,
``prefetch.tensormap``): tests/test_descriptor_cpu.py (compile checks for every target),
tests/sim/test_sim_descriptor.py (simulator) and tests/test_gpu_descriptor.py (GPU).

* ``grouped_publish``: block g copies a template descriptor to shared memory, retargets it at group g's array,
  publishes it to slot g of the workspace and TMA-loads every tile of the group through it.
* ``grouped_in_place``: the same, editing slot g in global memory (the ``.global`` replaces).
* ``rebuild_all_fields``: every field of a float32 2-D descriptor rewritten to describe a float16 3-D array.
* ``prefetch_then_load``: ``prefetch_tensormap`` of a parameter and of a workspace slot, then loads through both.

The runners (``grouped_case``, ``rebuild_case``, ``prefetch_case``) build fresh random data and poisoned
outputs with ``cuda.to_device`` (a device array on the GPU, a simulated one under NUMBA_ENABLE_CUDASIM=1) and
return (got, want).
"""
import numpy as np
from numba import cuda, types

from numbatma import OOBFill, TensorMap, TensorMapArray
from numbatma._types import TensorMapArrayType
from numbatma.intrinsics import (
    device_address,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
    prefetch_tensormap,
    shared_tensormap,
    tensormap_acquire,
    tensormap_fence_release_gpu,
    tensormap_publish,
    tensormap_ref,
    tensormap_replace_box_dim,
    tensormap_replace_element_stride,
    tensormap_replace_elemtype,
    tensormap_replace_fill_mode,
    tensormap_replace_global_address,
    tensormap_replace_global_dim,
    tensormap_replace_global_stride,
    tensormap_replace_interleave_layout,
    tensormap_replace_rank,
    tensormap_replace_swizzle_mode,
    tensormap_to_shared,
    tma_load,
)
from numbatma.intrinsics.descriptor import ELEMTYPE

BR, BC = 8, 32  # the box of the grouped kernels (float32)
GROUP_SHAPES = [(20, 40), (37, 64), (8, 96)]  # rows of 160, 256, 384 bytes: valid TMA strides


# -- kernels (plain functions: jitted by the runners, compiled offline by the CPU test) ----------------------
def grouped_publish(template, ws, addrs, rows, cols, pitches, offsets, out):
    """Block g: copy `template` to shared memory, retarget it at group g's array (address, dims, stride),
    publish it to slot g of the workspace, then TMA-load every tile of the group through it."""
    buf = cuda.shared.array(16, np.uint64, alignment=128)
    tile = cuda.shared.array((BR, BC), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    g = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        h = tensormap_to_shared(buf, template)
        tensormap_replace_global_address(h, addrs[g])
        tensormap_replace_global_dim(h, 0, rows[g])
        tensormap_replace_global_dim(h, 1, cols[g])
        tensormap_replace_global_stride(h, 0, pitches[g])
    cuda.syncthreads()
    if tid < 32:
        tensormap_publish(ws, g, shared_tensormap(buf, template))
    cuda.syncthreads()
    nr = (rows[g] + BR - 1) // BR
    nc = (cols[g] + BC - 1) // BC
    phase = 0
    for t in range(nr * nc):
        r0 = (t // nc) * BR
        c0 = (t % nc) * BC
        if tid == 0:
            d = tensormap_acquire(ws, g)
            mbarrier_arrive_expect_tx(bar, d.box_bytes)
            tma_load(tile, d, (r0, c0), bar)
        mbarrier_wait_parity(bar, phase)
        phase ^= 1
        for k in range(tid, BR * BC, cuda.blockDim.x):
            i = k // BC
            j = k % BC
            if r0 + i < rows[g] and c0 + j < cols[g]:
                out[offsets[g] + (r0 + i) * cols[g] + c0 + j] = tile[i, j]
        cuda.syncthreads()


def grouped_in_place(ws, addrs, rows, cols, pitches, offsets, out):
    """Block g edits slot g of the workspace in global memory (the .global replaces), releases, acquires,
    and loads every tile of group g through it."""
    tile = cuda.shared.array((BR, BC), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    g = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        h = tensormap_ref(ws, g)
        tensormap_replace_global_address(h, addrs[g])
        tensormap_replace_global_dim(h, -2, rows[g])
        tensormap_replace_global_dim(h, -1, cols[g])
        tensormap_replace_global_stride(h, 0, pitches[g])
        tensormap_fence_release_gpu()
    cuda.syncthreads()
    nr = (rows[g] + BR - 1) // BR
    nc = (cols[g] + BC - 1) // BC
    phase = 0
    for t in range(nr * nc):
        r0 = (t // nc) * BR
        c0 = (t % nc) * BC
        if tid == 0:
            d = tensormap_acquire(ws, g)
            mbarrier_arrive_expect_tx(bar, d.box_bytes)
            tma_load(tile, d, (r0, c0), bar)
        mbarrier_wait_parity(bar, phase)
        phase ^= 1
        for k in range(tid, BR * BC, cuda.blockDim.x):
            i = k // BC
            j = k % BC
            if r0 + i < rows[g] and c0 + j < cols[g]:
                out[offsets[g] + (r0 + i) * cols[g] + c0 + j] = tile[i, j]
        cuda.syncthreads()


# The rebuild kernel: every field of a float32 2-D descriptor (box (8, 8), 32B swizzle) rewritten to describe
# a float16 3-D array with box (2, 4, 16), element strides (1, 2, 1), no swizzle, NaN fill.
RB_SHAPE = (3, 10, 24)
RB_BOX = (2, 4, 16)
RB_ESTRIDES = (1, 2, 1)
RB_SHARED = (2, 2, 16)
RB_COORDS = (2, 8, 16)  # partly out of bounds along every axis: exercises dims and the NaN fill
F16 = ELEMTYPE["float16"]


def rebuild_all_fields(template, like, ws, target, out):
    buf = cuda.shared.array(16, np.uint64, alignment=128)
    tile = cuda.shared.array(RB_SHARED, np.float16, alignment=128)
    ref_tile = cuda.shared.array(RB_SHARED, np.float16, alignment=128)
    bar = cuda.shared.array(2, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        h = tensormap_to_shared(buf, template)
        tensormap_replace_rank(h, 3)
        h3 = shared_tensormap(buf, like)  # axes now count with the 3-D layout
        tensormap_replace_global_address(h3, target)
        tensormap_replace_global_dim(h3, 0, target.shape[0])
        tensormap_replace_global_dim(h3, 1, target.shape[1])
        tensormap_replace_global_dim(h3, 2, target.shape[2])
        tensormap_replace_global_stride(h3, 0, target.strides[0])
        tensormap_replace_global_stride(h3, 1, target.strides[1])
        tensormap_replace_box_dim(h3, 0, 2)
        tensormap_replace_box_dim(h3, 1, 4)
        tensormap_replace_box_dim(h3, 2, 16)
        tensormap_replace_element_stride(h3, 0, 1)
        tensormap_replace_element_stride(h3, 1, 2)
        tensormap_replace_element_stride(h3, 2, 1)
        tensormap_replace_elemtype(h3, F16)
        tensormap_replace_interleave_layout(h3, 0)
        tensormap_replace_swizzle_mode(h3, 0)
        tensormap_replace_fill_mode(h3, 1)
    cuda.syncthreads()
    if tid < 32:
        tensormap_publish(ws, 0, shared_tensormap(buf, like))
    cuda.syncthreads()
    if tid == 0:
        d = tensormap_acquire(ws, 0)
        mbarrier_arrive_expect_tx(bar, d.box_bytes + like.box_bytes)
        tma_load(tile, d, RB_COORDS, bar)
        tma_load(ref_tile, like, RB_COORDS, bar)
    mbarrier_wait_parity(bar, 0)
    n = RB_SHARED[0] * RB_SHARED[1] * RB_SHARED[2]
    for k in range(tid, n, cuda.blockDim.x):
        a = k // (RB_SHARED[1] * RB_SHARED[2])
        b = (k // RB_SHARED[2]) % RB_SHARED[1]
        c = k % RB_SHARED[2]
        out[0, k] = tile[a, b, c]
        out[1, k] = ref_tile[a, b, c]


def prefetch_then_load(desc, descs, out):
    tile = cuda.shared.array((BR, BC), np.float32, alignment=128)
    tile2 = cuda.shared.array((BR, BC), np.float32, alignment=128)
    bar = cuda.shared.array(1, np.uint64)
    tid = cuda.threadIdx.x
    if tid == 0:
        prefetch_tensormap(desc)
        d1 = tensormap_acquire(descs, 1)
        prefetch_tensormap(d1)
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        mbarrier_arrive_expect_tx(bar, desc.box_bytes + d1.box_bytes)
        tma_load(tile, desc, (BR, BC), bar)
        tma_load(tile2, d1, (0, 0), bar)
    cuda.syncthreads()  # (the barrier is initialised before anyone waits on it)
    mbarrier_wait_parity(bar, 0)
    for k in range(tid, BR * BC, cuda.blockDim.x):
        out[0, k] = tile[k // BC, k % BC]
        out[1, k] = tile2[k // BC, k % BC]


# -- host side ------------------------------------------------------------------------------------------------
def group_tables(arrays):
    addrs = np.array([device_address(a) for a in arrays], np.uint64)
    rows = np.array([a.shape[0] for a in arrays], np.int32)
    cols = np.array([a.shape[1] for a in arrays], np.int32)
    pitches = np.array([a.strides[0] for a in arrays], np.int64)
    sizes = [a.shape[0] * a.shape[1] for a in arrays]
    offsets = np.array(np.cumsum([0] + sizes[:-1]), np.int64)
    return addrs, rows, cols, pitches, offsets, sum(sizes)


def grouped_case(rng, kernel_fn, publish):
    """Run a grouped kernel over three arrays of different shapes; return (got, want)."""
    hosts = [rng.standard_normal(s).astype(np.float32) for s in GROUP_SHAPES]
    arrays = [cuda.to_device(h) for h in hosts]
    decoy = cuda.to_device(np.full((16, 32), 7.0, np.float32))  # what a failed retarget would read
    template = TensorMap(decoy, (BR, BC))
    ws = TensorMapArray([TensorMap(decoy, (BR, BC)) for _ in arrays])
    addrs, rows, cols, pitches, offsets, total = group_tables(arrays)
    out = cuda.to_device(np.full(total, np.nan, np.float32))
    k = cuda.jit(kernel_fn)
    tables = [cuda.to_device(t) for t in (addrs, rows, cols, pitches, offsets)]
    if publish:
        k[len(arrays), 64](template, ws, *tables, out)
    else:
        k[len(arrays), 64](ws, *tables, out)
    cuda.synchronize()
    return out.copy_to_host(), np.concatenate([h.reshape(-1) for h in hosts])


def rebuild_expected(host):
    """NumPy: the box at RB_COORDS with element strides, NaN outside the array."""
    want = np.full(RB_SHARED, np.nan, np.float16)
    for a in range(RB_SHARED[0]):
        for b in range(RB_SHARED[1]):
            for c in range(RB_SHARED[2]):
                i = RB_COORDS[0] + a * RB_ESTRIDES[0]
                j = RB_COORDS[1] + b * RB_ESTRIDES[1]
                m = RB_COORDS[2] + c * RB_ESTRIDES[2]
                if i < host.shape[0] and j < host.shape[1] and m < host.shape[2]:
                    want[a, b, c] = host[i, j, m]
    return want.reshape(-1)


def rebuild_case(rng):
    host = rng.standard_normal(RB_SHAPE).astype(np.float16)
    target = cuda.to_device(host)
    decoy = cuda.to_device(np.full((5, 12, 40), 3.0, np.float16))
    template = TensorMap(cuda.to_device(np.zeros((64, 64), np.float32)), (8, 8), swizzle=32)
    like = TensorMap(target, RB_BOX, element_strides=RB_ESTRIDES, oob_fill=OOBFill.NAN)
    ws = TensorMapArray([TensorMap(decoy, RB_BOX, element_strides=RB_ESTRIDES, oob_fill=OOBFill.ZERO)])
    out = cuda.to_device(np.full((2, int(np.prod(RB_SHARED))), 1234.0, np.float16))
    cuda.jit(rebuild_all_fields)[1, 64](template, like, ws, target, out)
    cuda.synchronize()
    return out.copy_to_host(), rebuild_expected(host)


def prefetch_case(rng):
    host = rng.standard_normal((32, 96)).astype(np.float32)
    other = rng.standard_normal((BR, BC)).astype(np.float32)
    a, b = cuda.to_device(host), cuda.to_device(other)
    desc = TensorMap(a, (BR, BC))
    descs = TensorMapArray([TensorMap(a, (BR, BC)), TensorMap(b, (BR, BC))])
    out = cuda.to_device(np.full((2, BR * BC), np.nan, np.float32))
    cuda.jit(prefetch_then_load)[1, 64](desc, descs, out)
    cuda.synchronize()
    return out.copy_to_host(), np.stack([host[BR:2 * BR, BC:2 * BC].reshape(-1), other.reshape(-1)])


# -- argument types of every kernel above, for the offline compile checks (tests/test_descriptor_cpu.py) ----------
def kernel_signatures(fake_array):
    """{name: (python function, argument types)} of every kernel above, as the runners launch them;
    ``fake_array(shape, dtype)`` stands in for a device array (tests/fakes.py)."""
    d2 = TensorMap(fake_array((16, 32), np.float32), (BR, BC)).numba_type
    ws2 = TensorMapArrayType(d2)
    like = TensorMap(fake_array(RB_SHAPE, np.float16), RB_BOX, element_strides=RB_ESTRIDES,
                     oob_fill=OOBFill.NAN).numba_type
    template = TensorMap(fake_array((64, 64), np.float32), (8, 8), swizzle=32).numba_type
    i32, i64, u64 = types.int32[::1], types.int64[::1], types.uint64[::1]
    return {
        "grouped_publish": (grouped_publish, (d2, ws2, u64, i32, i32, i64, i64, types.float32[::1])),
        "grouped_in_place": (grouped_in_place, (ws2, u64, i32, i32, i64, i64, types.float32[::1])),
        "rebuild_all_fields": (rebuild_all_fields, (template, like, TensorMapArrayType(like),
                                                    types.float16[:, :, ::1], types.float16[:, ::1])),
        "prefetch_then_load": (prefetch_then_load, (d2, ws2, types.float32[:, ::1])),
    }
