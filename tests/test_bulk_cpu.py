"""CPU tests of the bulk (non-tensor) copies and the block-cooperative memcpy_async: the PTX holds each
instruction, links for every target through nvJitLink, the sm_90a SASS has the bulk-copy units'
instructions (UBLKCP, UBLKRED, UBLKPF; LDGSTS for memcpy_async), misuse is a typing error naming the rule,
and every kernel of the GPU and simulator tests (tests/bulk_kernels.py) compiles for sm_90a."""
import re

import numpy as np
import pytest
from numba import cuda, types

from numbatma import compile as nbc
from numbatma.intrinsics import (
    all_ptx,
    bulk_commit_group,
    bulk_wait_group,
    cp_async_wait_all,
    fence_mbarrier_init,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait_parity,
)
from numbatma.intrinsics import async_copy, bulk
from numbatma.intrinsics.async_copy import memcpy_async, memcpy_async_mbarrier
from numbatma.intrinsics.bulk import (
    REDUCE_TYPES,
    bulk_copy_to_cluster,
    bulk_load,
    bulk_load_at,
    bulk_prefetch_l2,
    bulk_prefetch_l2_at,
    bulk_reduce,
    bulk_reduce_at,
    bulk_store,
    bulk_store_at,
)

import bulk_kernels as K


def every_copy(src, dst, n, addr, baddr):
    t = cuda.shared.array(64, np.float32, alignment=16)
    t2 = cuda.shared.array((4, 16), np.float32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
        fence_mbarrier_init()
        bulk_prefetch_l2(src, 256)
        bulk_prefetch_l2_at(src, 4, n)
        mbarrier_arrive_expect_tx(bar, 768)
        bulk_load(t, src, bar)
        bulk_load(t2[1], src[16:], bar)
        bulk_load_at(t, 4, src, n, n, bar)
        mbarrier_wait_parity(bar, 0)
        bulk_store(dst, t)
        bulk_store(dst[64:], t2)
        bulk_store_at(dst, 16, t, 0, 64)
        bulk_copy_to_cluster(addr, t, 64, baddr)
        bulk_copy_to_cluster(t, t2, n, bar)
        bulk_commit_group()
        bulk_wait_group(0)


COPY_SIG = (types.float32[::1], types.float32[::1], types.int32, types.uint32, types.uint32)


def _reduce_all_ops_kernel(dtype):
    """A kernel applying every reduction PTX has for ``dtype`` (both forms)."""
    ops = [op for op, table in REDUCE_TYPES.items() if dtype in table]
    lines = [f"        bulk_reduce({op!r}, dst, t)" for op in ops]
    lines += [f"        bulk_reduce_at({op!r}, dst, 16, t, 0, 64)" for op in ops]
    source = (f"def k(dst):\n    t = cuda.shared.array(64, np.{dtype}, alignment=16)\n"
              f"    if cuda.threadIdx.x == 0:\n" + "\n".join(lines) + "\n        bulk_commit_group()\n")
    ns = {"cuda": cuda, "np": np, "bulk_reduce": bulk_reduce, "bulk_reduce_at": bulk_reduce_at,
          "bulk_commit_group": bulk_commit_group}
    exec(compile(source, f"<reduce {dtype}>", "exec"), ns)
    return ns["k"]


REDUCE_DTYPES = sorted({dt for table in REDUCE_TYPES.values() for dt in table})


def block_copies(src, out, n):
    tile = cuda.shared.array((8, 64), np.float32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, cuda.blockDim.x)
        fence_mbarrier_init()
    cuda.syncthreads()
    memcpy_async(tile, src, 2048)
    cp_async_wait_all()
    cuda.syncthreads()
    memcpy_async_mbarrier(tile, src, n, bar)
    mbarrier_wait_parity(bar, 0)
    out[cuda.threadIdx.x] = tile[0, cuda.threadIdx.x]


BLOCK_SIG = (types.float32[:, ::1], types.float32[::1], types.int32)


@pytest.fixture(scope="module", params=nbc.ARCHS)
def compiled(request):
    arch = request.param
    ptx = nbc.compile_ptx(every_copy, COPY_SIG, arch=arch)
    reduce_ptx = {dt: nbc.compile_ptx(_reduce_all_ops_kernel(dt), (getattr(types, dt)[::1],), arch=arch)
                  for dt in REDUCE_DTYPES}
    block_ptx = nbc.compile_ptx(block_copies, BLOCK_SIG, arch=arch)
    cubins = {"copies": nbc.link_cubin(ptx, arch), "block": nbc.link_cubin(block_ptx, arch)}
    cubins.update({f"reduce {dt}": nbc.link_cubin(p, arch) for dt, p in reduce_ptx.items()})
    return arch, ptx + "".join(reduce_ptx.values()) + block_ptx, cubins


def _ptx_regex(text):
    body = re.sub(r"\$\w+", "\x00", text)
    parts = [re.escape(p) for p in body.split("\x00")]
    return r"[^;\n]*?".join(parts).replace(r"\ ", r"\s+")


MEMCPY_PTX = ("cp_async(16 bytes)", "cp_async_commit_group", "cp_async_mbarrier_arrive_noinc")


@pytest.mark.parametrize("name", sorted(bulk.PTX) + list(MEMCPY_PTX))
def test_every_instruction_in_ptx(compiled, name):
    arch, ptx, _ = compiled
    text = {**bulk.PTX, **async_copy.PTX}[name].text
    assert re.search(_ptx_regex(text), ptx), f"{name}: {text!r} not found in the {arch} PTX"


def test_bulk_ptx_is_in_all_ptx():
    everything = all_ptx()
    for name, ptx in bulk.PTX.items():
        assert everything[name] is ptx


def test_reduce_table_has_one_ptx_per_operation_and_type():
    assert len(bulk.REDUCE) == 24  # the legal (operation, PTX type) pairs of cp.reduce.async.bulk to global
    assert REDUCE_TYPES["add"]["int64"] == "u64" and REDUCE_TYPES["add"]["float16"] == "noftz.f16"
    assert set(REDUCE_TYPES["inc"]) == {"uint32"} and "float32" not in REDUCE_TYPES["min"]


def test_links_for_every_target(compiled):
    arch, ptx, cubins = compiled
    assert f".target {arch}" in ptx
    for what, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", what


def _sass(cubin):
    return nbc.sass(cubin)


def test_sass_has_bulk_copy_instructions():
    arch = "sm_90a"
    cubin = nbc.link_cubin(nbc.compile_ptx(every_copy, COPY_SIG, arch=arch), arch)
    sass = _sass(cubin)
    for op in ("UBLKCP.S.G", "UBLKCP.G.S", "UBLKCP.S.S", "UBLKPF.L2"):
        assert op in sass, f"{op} missing from the {arch} SASS"


# What ptxas makes of each reduction on sm_90a (the 32-bit unsigned and bitwise forms carry no type suffix).
SASS_REDUCE = {
    "uint32": ["ADD", "MIN", "MAX", "INC", "DEC", "AND", "OR", "XOR"],
    "int32": ["ADD.S32", "MIN.S32", "MAX.S32", "AND", "OR", "XOR"],
    "uint64": ["ADD.U64", "MIN.U64", "MAX.U64", "AND.U64", "OR.U64", "XOR.U64"],
    "int64": ["ADD.U64", "MIN.S64", "MAX.S64", "AND.U64", "OR.U64", "XOR.U64"],
    "float32": ["ADD.F32.RN"],
    "float64": ["ADD.F64.RN"],
    "float16": ["ADD.F16.RN", "MIN.F16.RN", "MAX.F16.RN"],
}


@pytest.mark.parametrize("dtype", REDUCE_DTYPES)
def test_sass_has_bulk_reductions(dtype):
    cubin = nbc.link_cubin(nbc.compile_ptx(_reduce_all_ops_kernel(dtype), (getattr(types, dtype)[::1],)), "sm_90a")
    found = set(re.findall(r"UBLKRED\.G\.S\.([\w.]+)", _sass(cubin)))
    assert found == set(SASS_REDUCE[dtype])


def test_sass_of_memcpy_async():
    cubin = nbc.link_cubin(nbc.compile_ptx(block_copies, BLOCK_SIG), "sm_90a")
    sass = _sass(cubin)
    for op in ("LDGSTS.E.BYPASS.128", "LDGDEPBAR", "ARRIVES.LDGSTSBAR.64.ARVCNT"):
        assert op in sass


# -- the GPU tests' kernels (tests/bulk_kernels.py) compile for sm_90a ------------------------------------------
def _link(fn, sig):
    ptx = nbc.compile_ptx(fn, sig)
    assert nbc.link_cubin(ptx)[:4] == b"\x7fELF"
    return ptx


# what each kernel's PTX must hold besides linking (by the kernel function's name)
_COPIES = ["cp.async.bulk.prefetch.L2.global", "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
           "cp.async.bulk.global.shared::cta.bulk_group"]
GPU_KERNEL_PTX = {
    "round_trip_at": _COPIES,
    "tile_round_trip": _COPIES,
    "cluster_copy_self": ["cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"],
    "cluster_exchange": ["cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes", "mapa"],
    "block_copy": ["cp.async.cg.shared.global", "cp.async.wait_all", "cp.async.mbarrier.arrive.noinc"],
}


@pytest.mark.parametrize("name", sorted(K.KERNEL_SIGNATURES))
def test_gpu_kernels_compile(name):
    fn, sig = K.KERNEL_SIGNATURES[name]
    ptx = _link(fn, sig)
    for text in GPU_KERNEL_PTX[fn.__name__]:
        assert text in ptx, (name, text)


def test_the_launched_kernels_are_the_compiled_ones():
    """What the GPU and simulator tests launch is the functions test_gpu_kernels_compile compiles."""
    fns = {fn for fn, _ in K.KERNEL_SIGNATURES.values()}
    launched = [K.round_trip_at_kernel, K.cluster_copy_self_kernel, K.cluster_exchange_kernel,
                K.tile_round_trip_kernel(), *(K.tile_round_trip_kernel(*case) for case in K.TILE_CASES),
                K.block_copy_kernel(), K.block_copy_kernel(*K.MEMCPY_SMALL)]
    for kernel in launched:
        assert kernel.py_func in fns, kernel.py_func.__name__


@pytest.mark.parametrize("op, dtype", K.REDUCE_CASES)
def test_gpu_reduce_kernels_compile(op, dtype):
    for indexed in (False, True):
        ptx = _link(K.make_reduce_kernel(op, dtype, indexed), K.REDUCE_SIGNATURE[dtype])
        assert f"cp.reduce.async.bulk.global.shared::cta.bulk_group.{op}." in ptx


# -- typing errors ---------------------------------------------------------------------------------------------
def _expect_typing_error(fn, sig, *fragments):
    with pytest.raises(Exception) as info:
        nbc.compile_ptx(fn, sig)
    assert type(info.value).__name__ == "TypingError", info.value
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg}"


F1 = types.float32[::1]
F2 = types.float32[:, ::1]


def k_load_odd_tile(src):
    t = cuda.shared.array(3, np.float32)
    bar = cuda.shared.array(1, np.uint64)
    bulk_load(t, src, bar)


def k_load_into_global(src, dst):
    bar = cuda.shared.array(1, np.uint64)
    bulk_load(dst, src, bar)


def k_load_from_shared():
    t = cuda.shared.array(16, np.float32)
    u = cuda.shared.array(16, np.float32)
    bar = cuda.shared.array(1, np.uint64)
    bulk_load(t, u, bar)


def k_load_dtype(src):
    t = cuda.shared.array(16, np.int32)
    bar = cuda.shared.array(1, np.uint64)
    bulk_load(t, src, bar)


def k_load_column(src):
    t = cuda.shared.array(16, np.float32)
    bar = cuda.shared.array(1, np.uint64)
    bulk_load(t, src[:, 0], bar)


def k_load_at_size(src):
    t = cuda.shared.array(16, np.float32)
    bar = cuda.shared.array(1, np.uint64)
    bulk_load_at(t, 0, src, 0, 40, bar)


def k_load_at_index(src):
    t = cuda.shared.array(16, np.float32)
    bar = cuda.shared.array(1, np.uint64)
    bulk_load_at(t, 0, src, 3, 16, bar)


def k_load_global_barrier(src, bar):
    t = cuda.shared.array(16, np.float32)
    bulk_load(t, src, bar)


def k_store_odd_tile(dst):
    t = cuda.shared.array((2, 5), np.float32)
    bulk_store(dst, t)


def k_store_at_size(dst):
    t = cuda.shared.array(16, np.float32)
    bulk_store_at(dst, 0, t, 0, 0)


def k_store_at_dst_index(dst):
    t = cuda.shared.array(16, np.float32)
    bulk_store_at(dst, 2, t, 0, 16)


def k_reduce(op, dtype):
    def k(dst):
        t = cuda.shared.array(16, dtype)
        bulk_reduce(op, dst, t)

    return k


def k_reduce_odd_tile(dst):
    t = cuda.shared.array(10, np.int32)
    bulk_reduce("add", dst, t)


def k_reduce_runtime_op(dst, flag):
    t = cuda.shared.array(16, np.int32)
    bulk_reduce("add" if flag else "min", dst, t)


def k_cluster_too_many(addr):
    t = cuda.shared.array(16, np.float32)
    bulk_copy_to_cluster(addr, t, 128, addr)


def k_cluster_global_source(src, addr):
    bulk_copy_to_cluster(addr, src, 64, addr)


def k_prefetch_size(src):
    bulk_prefetch_l2(src, 8)


def k_prefetch_shared():
    t = cuda.shared.array(16, np.float32)
    bulk_prefetch_l2(t, 64)


def k_memcpy_size(src):
    t = cuda.shared.array(64, np.float32)
    memcpy_async(t, src, 24)


def k_memcpy_too_big(src):
    t = cuda.shared.array(16, np.float32)
    memcpy_async(t, src, 128)


def k_memcpy_into_global(src, dst):
    memcpy_async(dst, src, 64)


def k_memcpy_barrier(src, bar):
    t = cuda.shared.array(16, np.float32)
    memcpy_async_mbarrier(t, src, 64, bar)


def test_typing_errors_of_loads():
    _expect_typing_error(k_load_odd_tile, (F1,), "bulk_load", "the size of the destination (3,)",
                         "positive multiple of 16 bytes", "got 12")
    _expect_typing_error(k_load_into_global, (F1, F1), "bulk_load", "shared-memory array")
    _expect_typing_error(k_load_from_shared, (), "bulk_load", "the source must be a global-memory array")
    _expect_typing_error(k_load_dtype, (F1,), "destination holds int32 but the source holds float32")
    _expect_typing_error(k_load_column, (F2,), "the source", "must be C-contiguous", "layout 'A'")
    _expect_typing_error(k_load_at_size, (F1,), "bulk_load_at", "positive multiple of 16 bytes", "got 40")
    _expect_typing_error(k_load_at_index, (F1,), "bulk_load_at", "the source index 3 is 12 bytes",
                         "16-byte aligned")
    _expect_typing_error(k_load_global_barrier, (F1, types.uint64[::1]), "mbarrier must live in shared")


def test_typing_errors_of_stores():
    _expect_typing_error(k_store_odd_tile, (F1,), "bulk_store", "(2, 5)", "got 40")
    _expect_typing_error(k_store_at_size, (F1,), "bulk_store_at", "got 0")
    _expect_typing_error(k_store_at_dst_index, (F1,), "the destination index 2 is 8 bytes")


@pytest.mark.parametrize("op, dtype, fragments", [
    ("min", types.float32, ("'min' is not available for float32", "uint32, int32, uint64, int64, float16")),
    ("add", types.int16, ("'add' is not available for int16",)),
    ("inc", types.int32, ("'inc' is not available for int32", "takes uint32")),
    ("and", types.float64, ("'and' is not available for float64",)),
    ("mul", types.int32, ("unknown reduction 'mul'", "'add'")),
])
def test_typing_errors_of_reductions(op, dtype, fragments):
    _expect_typing_error(k_reduce(op, dtype), (dtype[::1],), "bulk_reduce", *fragments)


def test_reduction_of_an_odd_tile_is_one_clear_error():
    with pytest.raises(Exception) as info:
        nbc.compile_ptx(k_reduce_odd_tile, (types.int32[::1],))
    assert type(info.value).__name__ == "TypingError"
    msg = str(info.value)
    assert "bulk_reduce: the size of the source (10,) must be a positive multiple of 16 bytes" in msg
    assert "constant string" not in msg  # (not the complaint of Numba's retry with non-literal arguments)


def test_reduction_needs_a_constant_operation():
    _expect_typing_error(k_reduce_runtime_op, (types.int32[::1], types.boolean), "bulk_reduce",
                         "the operation must be a constant string")


def test_typing_errors_of_cluster_copy_and_prefetch():
    _expect_typing_error(k_cluster_too_many, (types.uint32,), "bulk_copy_to_cluster", "nbytes 128 exceeds",
                         "64 bytes")
    _expect_typing_error(k_cluster_global_source, (F1, types.uint32), "bulk_copy_to_cluster", "the source",
                         "shared-memory array")
    _expect_typing_error(k_prefetch_size, (F1,), "bulk_prefetch_l2", "positive multiple of 16", "got 8")
    _expect_typing_error(k_prefetch_shared, (), "bulk_prefetch_l2", "global-memory array")


def test_typing_errors_of_memcpy_async():
    _expect_typing_error(k_memcpy_size, (F1,), "memcpy_async", "multiple of 16", "got 24")
    _expect_typing_error(k_memcpy_too_big, (F1,), "memcpy_async", "nbytes 128 exceeds the destination (16,)")
    _expect_typing_error(k_memcpy_into_global, (F1, F1), "memcpy_async", "shared-memory array")
    _expect_typing_error(k_memcpy_barrier, (F1, types.uint64[::1]), "memcpy_async_mbarrier",
                         "mbarrier must live in shared")
