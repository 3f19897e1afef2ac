"""CPU tests of the TMA reduce-stores (tma_reduce, tma_reduce_hinted) and tensor L2 prefetches (tma_prefetch,
tma_prefetch_hinted): the PTX of every reduction at every rank, linking for every target, the SASS
(UTMAREDG / UTMAPF), the (reduction, dtype) table of the PTX ISA enforced at typing time, misuse as typing
errors, and the kernels of tests/test_gpu_tma_ops.py compiling for sm_90a."""
import re

import ml_dtypes
import numpy as np
import pytest
from numba import cuda
from numba.core.errors import TypingError

from numbatma import TensorMap, compile as nbc
from numbatma.intrinsics import (
    bulk_commit_group,
    bulk_wait_group,
    fence_proxy_async_shared_cta,
    l2_policy_evict_first,
    l2_policy_evict_last,
)
from numbatma.intrinsics import tma as tma_module
from numbatma.intrinsics._asm import TARGETS
from numbatma.intrinsics.tma import (
    REDUCE_OPS,
    reduce_type_error,
    tma_prefetch,
    tma_prefetch_hinted,
    tma_reduce,
    tma_reduce_hinted,
)

import tma_ops_kernels as K
from fakes import FakeCudaArray


def fake(shape, dtype):
    return FakeCudaArray(shape, ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)  # (typestr "<V2")


def desc(rank, dtype="uint32"):
    return TensorMap(fake(K.SHAPES[rank], dtype), K.BOXES[rank])


D = {r: desc(r) for r in K.SHAPES}  # uint32: every reduction is defined for it
S1, S2, S3, S4, S5 = (D[r].shared_shape for r in (1, 2, 3, 4, 5))


def every_rank_kernel(kind, hinted):
    def kernel(d1, d2, d3, d4, d5, x):
        t1 = cuda.shared.array(S1, np.uint32, alignment=128)
        t2 = cuda.shared.array(S2, np.uint32, alignment=128)
        t3 = cuda.shared.array(S3, np.uint32, alignment=128)
        t4 = cuda.shared.array(S4, np.uint32, alignment=128)
        t5 = cuda.shared.array(S5, np.uint32, alignment=128)
        fence_proxy_async_shared_cta()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            if hinted:
                p = l2_policy_evict_first()
                tma_reduce_hinted(kind, d1, x, t1, p)
                tma_reduce_hinted(kind, d2, (x, 1), t2, p)
                tma_reduce_hinted(kind, d3, (x, 1, 2), t3, p)
                tma_reduce_hinted(kind, d4, (x, 1, 2, 3), t4, p)
                tma_reduce_hinted(kind, d5, (x, 1, 2, 3, 4), t5, p)
            else:
                tma_reduce(kind, d1, x, t1)
                tma_reduce(kind, d2, (x, 1), t2)
                tma_reduce(kind, d3, (x, 1, 2), t3)
                tma_reduce(kind, d4, (x, 1, 2, 3), t4)
                tma_reduce(kind, d5, (x, 1, 2, 3, 4), t5)
            bulk_commit_group()
            bulk_wait_group(0)

    return kernel


ARGS = tuple(D[r] for r in (1, 2, 3, 4, 5)) + (np.int32(0),)


def _instruction(kind, rank, hinted):
    coords = r"\{" + ", ".join([r"%r\d+"] * rank) + r"\}"
    hint = r"\.L2::cache_hint" if hinted else ""
    policy = r", %rd\d+" if hinted else ""
    return re.compile(rf"cp\.reduce\.async\.bulk\.tensor\.{rank}d\.global\.shared::cta\.{kind}\.tile\.bulk_group{hint} "
                      rf"\[%rd\d+, {coords}\], \[%r\d+\]{policy};")


@pytest.mark.parametrize("hinted", [False, True])
@pytest.mark.parametrize("kind", REDUCE_OPS)
def test_ptx_of_every_reduction_at_every_rank(kind, hinted):
    ptx = nbc.compile_ptx(every_rank_kernel(kind, hinted), ARGS, arch="sm_90a")
    for rank in (1, 2, 3, 4, 5):
        assert len(_instruction(kind, rank, hinted).findall(ptx)) == 1, (kind, rank, ptx[-3000:])
    assert ptx.count("cp.reduce.async.bulk.tensor") == 5
    assert ("L2::cache_hint" in ptx) == hinted


def test_ptx_table_lists_every_variant():
    names = [n for n in tma_module.PTX if n.startswith(("tma_reduce", "tma_prefetch"))]
    assert len(names) == 2 * 8 * 5 + 2 * 5
    assert tma_module.PTX["tma_reduce(kind='inc', rank=3)"].text.startswith(
        "cp.reduce.async.bulk.tensor.3d.global.shared::cta.inc.tile.bulk_group [")
    assert tma_module.PTX["tma_prefetch(rank=4)"].text == (
        "cp.async.bulk.prefetch.tensor.4d.L2.global.tile [$tmap, {$c0, $c1, $c2, $c3}];")
    assert set(tma_module.__all__) >= {"tma_reduce", "tma_reduce_hinted", "tma_prefetch", "tma_prefetch_hinted"}


def prefetch_kernel(d1, d2, d3, d4, d5, x):
    tma_prefetch(d1, x)
    tma_prefetch(d2, (x, -1))
    tma_prefetch(d3, (x, 1, 2))
    tma_prefetch(d4, (x, 1, 2, 3))
    tma_prefetch(d5, (x, 1, 2, 3, 4))
    p = l2_policy_evict_last()
    tma_prefetch_hinted(d1, x, p)
    tma_prefetch_hinted(d2, (x, 1), p)
    tma_prefetch_hinted(d3, (x, 1, 2), p)
    tma_prefetch_hinted(d4, (x, 1, 2, 3), p)
    tma_prefetch_hinted(d5, (x, 1, 2, 3, 4), p)


def test_ptx_of_prefetch_at_every_rank():
    ptx = nbc.compile_ptx(prefetch_kernel, ARGS, arch="sm_90a")
    for rank in (1, 2, 3, 4, 5):
        coords = r"\{" + ", ".join([r"%r\d+"] * rank) + r"\}"
        assert len(re.findall(rf"cp\.async\.bulk\.prefetch\.tensor\.{rank}d\.L2\.global\.tile \[%rd\d+, {coords}\];",
                              ptx)) == 1, rank
        assert len(re.findall(rf"cp\.async\.bulk\.prefetch\.tensor\.{rank}d\.L2\.global\.tile\.L2::cache_hint "
                              rf"\[%rd\d+, {coords}\], %rd\d+;", ptx)) == 1, rank


def everything_kernel(d1, d2, d3, d4, d5, x):
    t2 = cuda.shared.array(S2, np.uint32, alignment=128)
    fence_proxy_async_shared_cta()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        tma_prefetch(d1, x)
        tma_prefetch(d2, (x, 1))
        tma_prefetch(d3, (x, 1, 2))
        tma_prefetch(d4, (x, 1, 2, 3))
        tma_prefetch(d5, (x, 1, 2, 3, 4))
        tma_prefetch_hinted(d2, (x, 1), l2_policy_evict_last())
        tma_reduce("add", d2, (x, 1), t2)
        tma_reduce("min", d2, (x, 1), t2)
        tma_reduce("max", d2, (x, 1), t2)
        tma_reduce("inc", d2, (x, 1), t2)
        tma_reduce("dec", d2, (x, 1), t2)
        tma_reduce("and", d2, (x, 1), t2)
        tma_reduce("or", d2, (x, 1), t2)
        tma_reduce("xor", d2, (x, 1), t2)
        tma_reduce_hinted("add", d2, (x, 1), t2, l2_policy_evict_first())
        bulk_commit_group()
        bulk_wait_group(0)


@pytest.mark.parametrize("target", TARGETS)
def test_links_for_every_target_with_utmaredg_and_utmapf(target):
    cubin = nbc.link_cubin(nbc.compile_ptx(everything_kernel, ARGS, arch=target), arch=target)
    if target != "sm_90a":
        return  # (the SASS spot check is for Hopper)
    sass = nbc.sass(cubin)
    reds = re.findall(r"UTMAREDG\.2D\.([A-Z]+)", sass)
    assert sorted(reds) == sorted(["ADD", "MIN", "MAX", "INC", "DEC", "AND", "OR", "XOR", "ADD"]), reds
    prefetches = re.findall(r"UTMAPF\.L2\.(\d)D", sass)
    assert sorted(prefetches) == ["1", "2", "2", "3", "4", "5"], prefetches


# -- the (reduction, dtype) table --------------------------------------------------------------------------
TMA_TYPE = {"uint8": "UINT8", "int8": "UINT8", "uint16": "UINT16", "int16": "UINT16", "uint32": "UINT32",
            "int32": "INT32", "uint64": "UINT64", "int64": "INT64", "float16": "FLOAT16", "bfloat16": "BFLOAT16",
            "float32": "FLOAT32", "float64": "FLOAT64"}


@pytest.mark.parametrize("kind", REDUCE_OPS)
def test_reduction_table_matches_the_ptx_isa(kind):
    for dtype in K.ALL_DTYPES:
        d = TensorMap(fake((64, 64), dtype), (8, 32))
        assert d.tma_dtype == TMA_TYPE[dtype]
        error = reduce_type_error(kind, d.tma_dtype)
        assert (error is None) == (dtype in K.LEGAL[kind]), (kind, dtype, error)
    assert reduce_type_error(kind, "TFLOAT32") is not None  # (tf32=True float32 maps: not a PTX .f32)


ILLEGAL = [
    ("add", "int64", r"'add' is not defined for int64 elements \(the descriptor's TMA data type INT64\); PTX "
                     r"defines 'add' for uint32, int32, uint64, float32, float16, bfloat16 elements only; "
                     r".*view\(np\.uint64\)"),
    ("add", "float64", r"'add' is not defined for float64 elements .* PTX defines 'add' for uint32, int32, uint64, "
                       r"float32, float16, bfloat16"),
    ("add", "int16", r"'add' is not defined for uint16/int16 elements"),
    ("min", "float32", r"'min' is not defined for float32 elements .* PTX defines 'min' for uint32, int32, uint64, "
                       r"int64, float16, bfloat16"),
    ("max", "float64", r"'max' is not defined for float64 elements"),
    ("inc", "int32", r"'inc' is not defined for int32 elements .* PTX defines 'inc' for uint32 elements only"),
    ("dec", "uint64", r"'dec' is not defined for uint64 elements .* 'dec' for uint32 elements only"),
    ("and", "float32", r"'and' is not defined for float32 elements .* 'and' for uint32, int32, uint64 "),
    ("xor", "int64", r"'xor' is not defined for int64 elements.*stops the kernel on an H200.*viewed as uint64"),
    ("or", "bfloat16", r"'or' is not defined for bfloat16 elements"),
    ("xor", "uint8", r"'xor' is not defined for uint8/int8/bool elements"),
]


@pytest.mark.parametrize("kind, dtype, message", ILLEGAL, ids=[f"{k}-{d}" for k, d, _ in ILLEGAL])
def test_illegal_reduction_is_a_typing_error(kind, dtype, message):
    d = TensorMap(fake((64, 64), dtype), (8, 32))
    tile_shape = d.shared_shape
    tile_dtype = K.tile_dtype(dtype)

    def kernel(d):
        t = cuda.shared.array(tile_shape, tile_dtype, alignment=128)
        tma_reduce(kind, d, (0, 0), t)

    with pytest.raises(TypingError, match="tma_reduce: reduction " + message):
        nbc.compile_ptx(kernel, (d,))


def test_illegal_reduction_hinted_is_a_typing_error():
    d = TensorMap(fake((64, 64), "float32"), (8, 32))

    def kernel(d):
        t = cuda.shared.array((8, 32), np.float32, alignment=128)
        tma_reduce_hinted("max", d, (0, 0), t, l2_policy_evict_first())

    with pytest.raises(TypingError, match="tma_reduce_hinted: reduction 'max' is not defined for float32"):
        nbc.compile_ptx(kernel, (d,))


def test_tf32_descriptor_is_refused():
    d = TensorMap(fake((64, 64), "float32"), (8, 32), tf32=True)

    def kernel(d):
        t = cuda.shared.array((8, 32), np.float32, alignment=128)
        tma_reduce("add", d, (0, 0), t)

    with pytest.raises(TypingError, match="'add' is not defined for float32 with tf32=True elements .*TFLOAT32"):
        nbc.compile_ptx(kernel, (d,))


def test_unknown_reduction():
    d = TensorMap(fake((64, 64), "uint32"), (8, 32))

    def kernel(d):
        t = cuda.shared.array((8, 32), np.uint32, alignment=128)
        tma_reduce("mul", d, (0, 0), t)

    with pytest.raises(TypingError, match=r"tma_reduce: unknown reduction 'mul'; the reductions are 'add', 'min', "
                                          r"'max', 'inc', 'dec', 'and', 'or', 'xor'"):
        nbc.compile_ptx(kernel, (d,))


def test_reduction_must_be_a_constant():
    d = TensorMap(fake((64, 64), "uint32"), (8, 32))

    def kernel(d, flag):
        t = cuda.shared.array((8, 32), np.uint32, alignment=128)
        kind = "add"
        if flag:
            kind = "max"
        tma_reduce(kind, d, (0, 0), t)

    with pytest.raises(TypingError, match="tma_reduce: the reduction must be a compile-time constant string"):
        nbc.compile_ptx(kernel, (d, np.int32(0)))


@pytest.mark.parametrize("case", ["dtype", "size", "coords", "not_shared", "descriptor"])
def test_reduce_operand_checks(case):
    d = TensorMap(fake((64, 64), "int32"), (8, 32))

    if case == "dtype":
        def kernel(d, a):
            t = cuda.shared.array((8, 32), np.uint32, alignment=128)
            tma_reduce("add", d, (0, 0), t)
        message = "the shared tile has dtype uint32 but the descriptor moves int32"
    elif case == "size":
        def kernel(d, a):
            t = cuda.shared.array((8, 16), np.int32, alignment=128)
            tma_reduce("add", d, (0, 0), t)
        message = r"the shared tile \(8, 16\) holds 512 bytes but one box of the descriptor occupies 1024 bytes"
    elif case == "coords":
        def kernel(d, a):
            t = cuda.shared.array((8, 32), np.int32, alignment=128)
            tma_reduce("add", d, (0, 0, 0), t)
        message = r"the descriptor has rank 2 .* but 3 coordinates were given"
    elif case == "not_shared":
        def kernel(d, a):
            tma_reduce("add", d, (0, 0), a)
        message = "the shared-memory tile must be a shared-memory array"
    else:
        def kernel(d, a):
            t = cuda.shared.array((8, 32), np.int32, alignment=128)
            tma_reduce("add", a, (0, 0), t)
        message = "the descriptor operand must be a numbatma.TensorMap"

    with pytest.raises(TypingError, match="tma_reduce: " + message):
        nbc.compile_ptx(kernel, (d, np.zeros((8, 32), np.int32)))


@pytest.mark.parametrize("case", ["coords", "descriptor", "policy"])
def test_prefetch_operand_checks(case):
    d = TensorMap(fake((64, 64), "float32"), (8, 32))
    if case == "coords":
        def kernel(d, x):
            tma_prefetch(d, (x, x, x))
        message = r"tma_prefetch: the descriptor has rank 2 \(box \(8, 32\)\) but 3 coordinates were given"
    elif case == "descriptor":
        def kernel(d, x):
            tma_prefetch(x, (0, 0))
        message = "tma_prefetch: the descriptor operand must be a numbatma.TensorMap"
    else:
        def kernel(d, x):
            tma_prefetch_hinted(d, (0, 0), 1.5)
        message = "tma_prefetch_hinted: the cache policy must be an integer"
    with pytest.raises(TypingError, match=message):
        nbc.compile_ptx(kernel, (d, np.int32(0)))


# -- the kernels of the GPU tests compile for sm_90a ----------------------------------------------------
GPU_PAIRS = [(kind, dtype) for kind, dtypes in K.LEGAL.items() for dtype in dtypes]


def _reduce_args(kind, dtype, rank, swizzle=0):
    box = K.BOXES[rank]
    src = TensorMap(fake((8 * box[0],) + box[1:], dtype), box, swizzle=swizzle)
    dst = TensorMap(fake(K.SHAPES[rank], dtype), box, swizzle=swizzle)
    c = np.zeros((8, rank), np.int32)
    return src, (src, dst, c, c)


@pytest.mark.parametrize("kind, dtype", GPU_PAIRS, ids=[f"{k}-{d}" for k, d in GPU_PAIRS])
def test_gpu_reduce_kernel_compiles(kind, dtype):
    src, args = _reduce_args(kind, dtype, 2)
    ptx = nbc.compile_ptx(K.reduce_kernel_source(kind, src.shared_shape, dtype, 2), args, arch="sm_90a")
    assert _instruction(kind, 2, False).search(ptx)


@pytest.mark.parametrize("rank", [1, 3, 4, 5])
def test_gpu_reduce_kernel_compiles_at_every_rank(rank):
    src, args = _reduce_args("add", "float32", rank)
    ptx = nbc.compile_ptx(K.reduce_kernel_source("add", src.shared_shape, "float32", rank), args, arch="sm_90a")
    assert _instruction("add", rank, False).search(ptx)


def test_gpu_hinted_and_swizzled_kernels_compile():
    src, args = _reduce_args("max", "int64", 3)
    ptx = nbc.compile_ptx(K.reduce_kernel_source("max", src.shared_shape, "int64", 3, True), args, arch="sm_90a")
    assert _instruction("max", 3, True).search(ptx)
    src, args = _reduce_args("add", "float16", 2, swizzle=64)
    ptx = nbc.compile_ptx(K.reduce_kernel_source("add", src.shared_shape, "float16", 2), args, arch="sm_90a")
    assert _instruction("add", 2, False).search(ptx)


@pytest.mark.parametrize("hinted", [False, True])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_gpu_prefetch_kernel_compiles(rank, hinted):
    box = K.BOXES[rank]
    src = TensorMap(fake(K.SHAPES[rank], "float32"), box)
    out = TensorMap(fake((8 * box[0],) + box[1:], "float32"), box)
    c = np.zeros((8, rank), np.int32)
    ptx = nbc.compile_ptx(K.prefetch_kernel_source(src.shared_shape, "float32", rank, hinted), (src, out, c, c),
                          arch="sm_90a")
    assert re.search(rf"cp\.async\.bulk\.prefetch\.tensor\.{rank}d\.L2\.global\.tile"
                     + (r"\.L2::cache_hint" if hinted else r" "), ptx)


def test_gpu_probe_kernel_compiles():
    from test_gpu_tma_ops import reduce_constant_tile

    d = TensorMap(FakeCudaArray((16, 70), np.float32, strides=(72 * 4, 4)), (8, 16), allow_store_overhang=True)
    ptx = nbc.compile_ptx(reduce_constant_tile.py_func, (d, np.int32(0), np.int32(0), np.float32(0)), arch="sm_90a")
    assert _instruction("add", 2, False).search(ptx)
