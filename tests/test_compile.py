"""CPU tests: every intrinsic compiles to PTX holding its instruction and links to a cubin for each target
through nvJitLink (offline); the SASS has the TMA instructions; descriptors are by-value kernel parameters;
misuse is a typing error with a clear message."""
import re

import numpy as np
import pytest
from numba import cuda, types

import numbatma
from numbatma import TensorMap, compile as nbc
from numbatma._types import TensorMapArrayType
from numbatma.intrinsics import (
    Pipeline,
    all_ptx,
    cp_async,
    cp_async_commit_group,
    cp_async_mbarrier_arrive,
    cp_async_mbarrier_arrive_noinc,
    cp_async_wait_all,
    cp_async_wait_group,
    elect_one_sync,
    vote_all,
    vote_any,
    named_barrier_arrive,
    named_barrier_sync,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_view,
    tma_reduce,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    fence_mbarrier_init,
    fence_proxy_async_shared_cta,
    l2_policy_evict_first,
    l2_policy_evict_last,
    l2_policy_evict_normal,
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
    tma_load_hinted,
    tma_store,
    tma_store_hinted,
)

from fakes import FakeCudaArray

SHAPES = {1: (256,), 2: (64, 64), 3: (4, 16, 32), 4: (2, 4, 8, 32), 5: (2, 2, 4, 8, 32)}
BOXES = {1: (64,), 2: (16, 32), 3: (2, 8, 32), 4: (1, 2, 8, 32), 5: (1, 1, 2, 8, 32)}
DESC = {r: TensorMap(FakeCudaArray(SHAPES[r], np.float32), BOXES[r]) for r in SHAPES}
T1, T2, T3, T4, T5 = (DESC[r].shared_shape for r in (1, 2, 3, 4, 5))


def every_intrinsic(d1, d2, d3, d4, d5, descs, out):
    t1 = cuda.shared.array(T1, np.float32, alignment=128)
    t2 = cuda.shared.array(T2, np.float32, alignment=128)
    t3 = cuda.shared.array(T3, np.float32, alignment=128)
    t4 = cuda.shared.array(T4, np.float32, alignment=128)
    t5 = cuda.shared.array(T5, np.float32, alignment=128)
    bars = cuda.shared.array(2, np.uint64)
    bar = mbarrier_ref(bars, 1)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bars, 1)
        mbarrier_init(bar, 2)
        fence_mbarrier_init()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        mbarrier_arrive_expect_tx(bars, 5 * 0 + d1.box_bytes + d2.box_bytes + d3.box_bytes + d4.box_bytes + d5.box_bytes)
        tma_load(t1, d1, 0, bars)
        tma_load(t2, d2, (0, 1), bars)
        tma_load(t3, d3, (0, 1, 2), bars)
        tma_load(t4, d4, (0, 1, 2, 3), bars)
        tma_load(t5, d5, (0, 1, 2, 3, 4), bars)
        pol = l2_policy_evict_first()
        mbarrier_expect_tx(bars, d1.box_bytes + d2.box_bytes + d3.box_bytes + d4.box_bytes + d5.box_bytes)
        tma_load_hinted(t1, d1, 0, bars, pol)
        tma_load_hinted(t2, d2, (0, 1), bars, l2_policy_evict_last())
        tma_load_hinted(t3, d3, (0, 1, 2), bars, l2_policy_evict_normal())
        tma_load_hinted(t4, d4, (0, 1, 2, 3), bars, pol)
        tma_load_hinted(t5, d5, (0, 1, 2, 3, 4), bars, pol)
        mbarrier_expect_tx(bar, 16)
        mbarrier_complete_tx(bar, 16)
        mbarrier_arrive_n(bar, 2)
    mbarrier_wait_parity(bars, 0)
    tok = mbarrier_arrive(bar)
    out[0] = mbarrier_test_wait(bar, tok)
    mbarrier_wait(bar, tok)
    out[1] = mbarrier_try_wait_parity(bar, 1)
    out[2] = mbarrier_test_wait_parity(bar, 1)
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        g = tensormap_acquire(descs, 1)
        tma_store(g, (0, 0), t2)
        tma_store(d1, (0,), t1)
        tma_store(d2, (0, 1), t2)
        tma_store(d3, (0, 1, 2), t3)
        tma_store(d4, (0, 1, 2, 3), t4)
        tma_store(d5, (0, 1, 2, 3, 4), t5)
        pol = l2_policy_evict_first()
        tma_store_hinted(d1, (0,), t1, pol)
        tma_store_hinted(d2, (0, 1), t2, pol)
        tma_store_hinted(d3, (0, 1, 2), t3, pol)
        tma_store_hinted(d4, (0, 1, 2, 3), t4, pol)
        tma_store_hinted(d5, (0, 1, 2, 3, 4), t5, pol)
        bulk_commit_group()
        bulk_wait_group_read(1)
        bulk_wait_group(0)
        mbarrier_inval(bar)


SIG = tuple(DESC[r].numba_type for r in (1, 2, 3, 4, 5)) + (TensorMapArrayType(DESC[2].numba_type), types.int32[:])


def every_pipeline_op(d2, src, out):
    """The pipeline, LDGSTS, shared-view and warp-level operations in a warp-specialized layout (launched
    with 384 threads, so ptxas knows the register budget that setmaxnreg moves)."""
    ring = cuda.shared.array(0, np.float32, alignment=1024)
    bars = cuda.shared.array(1, np.uint64)
    pipe = Pipeline(2, 1, 128)
    lds = Pipeline(2, 32, 128)
    warpgroup = cuda.threadIdx.x // 128
    if warpgroup == 0:
        setmaxnreg_dec(40)
        if cuda.threadIdx.x < 32:
            if elect_one_sync():
                s = pipe.producer_acquire()
                pipe.load(shared_view(ring, s * 512, (16, 32)), d2, (0, 32))
                pipe.producer_commit()
        elif cuda.threadIdx.x < 64:
            t = cuda.threadIdx.x - 32
            s = lds.producer_acquire()
            cp_async(ring, 1024 + s * 512 + 4 * t, src, 4 * t, 16)
            cp_async(ring, 2048 + 2 * t, src, 2 * t, 8)
            cp_async(ring, 2304 + t, src, t, 4)
            cp_async_commit_group()
            cp_async_wait_group(1)
            cp_async_wait_all()
            cp_async_mbarrier_arrive(bars)
            lds.producer_commit_async()
        named_barrier_arrive(2, 96)
    else:
        setmaxnreg_inc(232)
        s = pipe.consumer_wait()
        v = shared_view(ring, s * 512, (16, 32))[cuda.threadIdx.x % 16, 0]
        pipe.consumer_release()
        s = lds.consumer_wait()
        v += ring[1024 + s * 512]
        lds.consumer_release()
        named_barrier_sync(1, 256)
        if vote_all(v > 0.0) or vote_any(cuda.threadIdx.x == 200):  # (warp-uniform: no divergence)
            v += 1.0
        out[cuda.threadIdx.x] = v


PIPE_SIG = (DESC[2].numba_type, types.float32[::1], types.float32[::1])


@pytest.fixture(scope="module", params=nbc.ARCHS)
def compiled(request):
    ptx = nbc.compile_ptx(every_intrinsic, SIG, arch=request.param)
    pipe_ptx = nbc.compile_ptx(every_pipeline_op, PIPE_SIG, arch=request.param, launch_bounds=(384, 1))
    return request.param, ptx + pipe_ptx, nbc.link_cubin(ptx, request.param), nbc.link_cubin(pipe_ptx, request.param)


def _ptx_regex(text):
    """A regex matching an instruction's rendered text with any registers/immediates."""
    body = re.sub(r"\$\w+", "\x00", text)
    parts = [re.escape(p) for p in body.split("\x00")]
    return r"[^;\n]*?".join(parts).replace(r"\ ", r"\s+")


def _core_ptx():
    """The instructions of the core modules, which every_intrinsic / every_pipeline_op use (the later
    families - bulk, cluster, descriptor, im2col, tensor reduce/prefetch - have their own test files; the
    architecture matrix links every instruction: tests/test_target_matrix.py)."""
    from numbatma.intrinsics import async_copy, cache, fence, mbarrier, pipeline, warp
    from numbatma.intrinsics.tma import LOAD_TILE, LOAD_TILE_HINT, STORE_TILE, STORE_TILE_HINT

    core = {**mbarrier.PTX, **fence.PTX, **async_copy.PTX, **warp.PTX, **pipeline.PTX, **cache.PTX}
    tile = {id(p) for d in (LOAD_TILE, LOAD_TILE_HINT, STORE_TILE, STORE_TILE_HINT) for p in d.values()}
    from numbatma.intrinsics import tma

    core.update({n: p for n, p in tma.PTX.items() if id(p) in tile or n.startswith("bulk_")})
    return {n: p for n, p in core.items() if n in all_ptx()}


@pytest.mark.parametrize("name", sorted(_core_ptx()))
def test_every_instruction_in_ptx(compiled, name):
    arch, ptx, cubin, _ = compiled
    text = all_ptx()[name].text
    assert re.search(_ptx_regex(text), ptx), f"{name}: {text!r} not found in the {arch} PTX"


def test_links_to_cubin(compiled):
    arch, ptx, cubin, pipe_cubin = compiled
    assert f".target {arch}" in ptx
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000
    assert pipe_cubin[:4] == b"\x7fELF"


def test_sass_has_tma_instructions(compiled):
    arch, ptx, cubin, _ = compiled
    sass = nbc.sass(cubin)
    for rank in (1, 2, 3, 4, 5):
        assert f"UTMALDG.{rank}D" in sass
        assert f"UTMASTG.{rank}D" in sass
    assert "SYNCS.ARRIVE.TRANS64" in sass  # mbarrier arrive with transaction count
    assert "SYNCS.PHASECHK.TRANS64" in sass  # try_wait / test_wait


def test_sass_has_pipeline_instructions(compiled):
    arch, ptx, cubin, pipe_cubin = compiled
    sass = nbc.sass(pipe_cubin)
    for op in ("UTMALDG.2D", "LDGSTS.E.BYPASS.128", "LDGSTS.E.64", "LDGSTS.E", "ARRIVES.LDGSTSBAR.64",
               "SYNCS.PHASECHK.TRANS64", "ELECT", "BAR.ARV", "BAR.SYNC"):
        assert op in sass, f"{op} missing from the {arch} SASS"
    assert ".local" not in ptx  # pipeline state lives in registers


def test_descriptor_parameters_are_by_value(compiled):
    arch, ptx, cubin, _ = compiled
    entry = ptx[ptx.index(".entry"): ptx.index("{", ptx.index(".entry"))]
    assert entry.count(".param .align 128 .b8") == 5  # the five by-value descriptors
    assert "cvta.param.u64" in ptx  # generic address of the parameter itself: no copy
    assert "st.local" not in ptx and ".local" not in ptx  # never copied to local memory
    assert "fence.proxy.tensormap::generic.acquire.gpu" in ptx  # the global-memory descriptor


# -- typing errors -----------------------------------------------------------------------------------------
D2 = DESC[2]


def _expect_typing_error(fn, sig, *fragments):
    with pytest.raises(Exception) as info:
        nbc.compile_ptx(fn, sig)
    assert type(info.value).__name__ == "TypingError", info.value
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg}"


def k_wrong_rank(d):
    t = cuda.shared.array((16, 32), np.float32)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0, 0), b)


def k_wrong_dtype(d):
    t = cuda.shared.array((16, 32), np.int32)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)


def k_wrong_size(d):
    t = cuda.shared.array((16, 16), np.float32)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)


def k_global_dst(d, a):
    b = cuda.shared.array(1, np.uint64)
    tma_load(a, d, (0, 0), b)


def k_local_dst(d):
    t = cuda.local.array((16, 32), np.float32)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)


def k_global_barrier(d, bar):
    t = cuda.shared.array((16, 32), np.float32)
    tma_load(t, d, (0, 0), bar)


def k_runtime_wait_n(n):
    bulk_wait_group(n)


def k_store_wrong_size(d):
    t = cuda.shared.array((8, 32), np.float32)
    tma_store(d, (0, 0), t)


def test_typing_error_wrong_number_of_coordinates():
    _expect_typing_error(k_wrong_rank, (D2.numba_type,), "rank 2", "3 coordinates")


def test_typing_error_tile_dtype():
    _expect_typing_error(k_wrong_dtype, (D2.numba_type,), "dtype int32", "float32")


def test_typing_error_tile_bytes():
    _expect_typing_error(k_wrong_size, (D2.numba_type,), "1024 bytes", "2048 bytes")
    _expect_typing_error(k_store_wrong_size, (D2.numba_type,), "tma_store", "1024 bytes", "2048 bytes")


def k_narrow_swizzled_box(d):
    t = cuda.shared.array((16, 8), np.float32)  # the box, but its 32-byte rows each take a 64-byte span
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)


def k_narrow_swizzled_padded(d):
    t = cuda.shared.array((16, 16), np.float32, alignment=512)
    b = cuda.shared.array(1, np.uint64)
    tma_load(t, d, (0, 0), b)


def test_typing_error_tile_of_rows_narrower_than_the_swizzle():
    narrow = TensorMap(FakeCudaArray((64, 64), np.float32), (16, 8), swizzle=64)
    _expect_typing_error(k_narrow_swizzled_box, (narrow.numba_type,), "512 bytes", "occupies 1024 bytes",
                         "shared shape (16, 16)", "narrower than the 64-byte swizzle span")
    ptx = nbc.compile_ptx(k_narrow_swizzled_padded, (narrow.numba_type,))
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile" in (ptx if isinstance(ptx, str) else ptx[0])


def k_store_box(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_store(d, (0, 0), t)


def k_reduce_box(d):
    t = cuda.shared.array((16, 32), np.float32, alignment=128)
    tma_reduce("add", d, (0, 0), t)


@pytest.mark.parametrize("kernel, op", [(k_store_box, "tma_store"), (k_reduce_box, "tma_reduce")])
def test_typing_error_store_through_rows_that_end_mid_16_bytes(kernel, op):
    """A view of 1003 float32 columns (in rows of 1008): a store reaching a row's end would write 4 bytes
    after it. Refused unless the TensorMap says those bytes are the caller's; a view of the aligned columns is
    fine as it is."""
    parent = FakeCudaArray((64, 1003), np.float32, strides=(1008 * 4, 4))
    _expect_typing_error(kernel, (TensorMap(parent, (16, 32)).numba_type,), f"{op}: the destination's rows are "
                         "not a whole number of 16-byte units (a multiple of 4 float32 elements)",
                         "writes the 4 bytes (1 element) after it", "allow_store_overhang=True",
                         "numbatma.aligned_columns")
    allowed = TensorMap(parent, (16, 32), allow_store_overhang=True)
    assert "bulk.tensor.2d.global.shared::cta" in nbc.compile_ptx(kernel, (allowed.numba_type,))
    aligned = FakeCudaArray((64, numbatma.aligned_columns(1003, 4)), np.float32, strides=(1008 * 4, 4))
    assert "bulk.tensor.2d.global.shared::cta" in nbc.compile_ptx(kernel, (TensorMap(aligned, (16, 32)).numba_type,))


def test_allow_store_overhang_must_be_a_bool():
    with pytest.raises(numbatma.TensorMapError, match="allow_store_overhang must be True or False"):
        TensorMap(FakeCudaArray((64, 64), np.float32), (16, 32), allow_store_overhang="yes")


def test_typing_error_not_shared_memory():
    _expect_typing_error(k_global_dst, (D2.numba_type, types.float32[:, ::1]), "shared-memory array")
    _expect_typing_error(k_local_dst, (D2.numba_type,), "shared-memory array")
    _expect_typing_error(k_global_barrier, (D2.numba_type, types.uint64[::1]), "mbarrier must live in shared")


def test_typing_error_wait_group_needs_constant():
    _expect_typing_error(k_runtime_wait_n, (types.int32,), "compile-time constant")


def test_shared_array_keeps_marker_through_indexing():
    def k(d):
        stages = cuda.shared.array((2, 16, 32), np.float32, alignment=128)
        b = cuda.shared.array(2, np.uint64)
        tma_load(stages[1], d, (0, 0), mbarrier_ref(b, 1))

    ptx = nbc.compile_ptx(k, (D2.numba_type,))
    assert "cp.async.bulk.tensor.2d" in ptx


def test_box_bytes_is_a_compile_time_constant():
    def k(d, out):
        out[0] = d.box_bytes
        out[1] = d.rank
        out[2] = d.box[1]

    ptx = nbc.compile_ptx(k, (D2.numba_type, types.int64[::1]))
    assert "2048" in ptx  # 16 * 32 * 4, folded into the code


# -- pipeline / shared_view / warp-level misuse --------------------------------------------------------
def k_pipeline_runtime_stages(n):
    Pipeline(n, 1, 1)


def k_pipeline_no_consumers():
    Pipeline(2, 1, 0)


def k_pipeline_wrong_tile(d):
    ring = cuda.shared.array(0, np.float32, alignment=1024)
    pipe = Pipeline(2, 1, 1)
    s = pipe.producer_acquire()
    pipe.load(shared_view(ring, s * 256, (8, 32)), d, (0, 0))
    pipe.producer_commit()


def k_shared_view_runtime_shape(n):
    ring = cuda.shared.array(0, np.float32)
    shared_view(ring, 0, (n, 4))[0, 0] = 1.0


def k_setmaxnreg_odd():
    setmaxnreg_inc(100)


def k_vote_float(x):
    if vote_any(x[0]):
        x[0] = 1.0


def test_vote_refuses_a_float():
    _expect_typing_error(k_vote_float, (types.float32[::1],), "vote_any", "must be a bool")


def k_named_barrier_partial_warp():
    named_barrier_sync(1, 48)


def k_cp_async_bad_size(src):
    ring = cuda.shared.array(64, np.float32)
    cp_async(ring, 0, src, 0, 12)


def k_cp_async_from_shared():
    ring = cuda.shared.array(64, np.float32)
    other = cuda.shared.array(64, np.float32)
    cp_async(ring, 0, other, 0, 16)


def test_typing_errors_pipeline_and_friends():
    _expect_typing_error(k_pipeline_runtime_stages, (types.int32,), "Pipeline", "compile-time constant")
    _expect_typing_error(k_pipeline_no_consumers, (), "consumer_arrivals must be in 1..1048575, got 0")
    _expect_typing_error(k_pipeline_wrong_tile, (D2.numba_type,), "1024 bytes", "2048 bytes")
    _expect_typing_error(k_shared_view_runtime_shape, (types.int32,), "shared_view", "compile-time constant")
    _expect_typing_error(k_setmaxnreg_odd, (), "multiple of 8")
    _expect_typing_error(k_named_barrier_partial_warp, (), "multiple of 32")
    _expect_typing_error(k_cp_async_bad_size, (types.float32[::1],), "4, 8 or 16")
    _expect_typing_error(k_cp_async_from_shared, (), "global-memory array")


def test_pipeline_tracks_phases_in_registers():
    """A producer/consumer loop over a 3-stage ring: the stage index wraps, the parities flip, and nothing
    spills to local memory."""

    def k(d, n):
        ring = cuda.shared.array(0, np.float32, alignment=1024)
        pipe = Pipeline(3, 1, 1)
        if cuda.threadIdx.x == 0:
            for i in range(n):
                s = pipe.producer_acquire()
                pipe.load(shared_view(ring, s * 512, (16, 32)), d, (0, 32 * i))
                pipe.producer_commit()
                pipe.consumer_wait()
                pipe.consumer_release()

    ptx = nbc.compile_ptx(k, (D2.numba_type, types.int32))
    assert ".local" not in ptx
    assert ptx.count("mbarrier.init.shared::cta.b64") == 6  # 3 full + 3 empty
    assert "mbarrier.expect_tx" in ptx and "mbarrier.try_wait.parity" in ptx


def k_rebalance(out):
    if cuda.threadIdx.x // 128 == 0:
        setmaxnreg_dec(40)
        out[cuda.threadIdx.x] = 1
    else:
        setmaxnreg_inc(216)
        out[cuda.threadIdx.x] = 2


@pytest.mark.parametrize("arch", nbc.ARCHS)
def test_setmaxnreg_survives_numba_cudas_lto_build(arch):
    """numba-cuda's GPU build (LTO-IR through nvJitLink) with a register cap keeps setmaxnreg; a plain
    PTX link drops it (ptxas C7504), which is why the docs ask for cuda.jit(max_registers=...)."""
    sass = nbc.sass(nbc.compile_cubin(k_rebalance, (types.int32[::1],), arch, max_registers=128))
    assert re.search(r"USETMAXREG\.DEALLOC\S*\s+0x28\b", sass)
    assert re.search(r"USETMAXREG\.TRY_ALLOC\S*\s+\S+, 0xd8\b", sass)
    uncapped = nbc.sass(nbc.compile_cubin(k_rebalance, (types.int32[::1],), arch))
    assert "USETMAXREG" not in uncapped  # ptxas C7508: no register count known at entry
