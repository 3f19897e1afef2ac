"""CPU tests of the cluster-wide copies (intrinsics/cluster_copy.py): every PTX form is emitted and links
for sm_90a, sm_100a and sm_120a through nvJitLink; the sm_90a SASS has the multicast TMA load (UTMALDG
.MULTICAST), STAS and REDAS; misuse is a typing error naming the rule; the GPU test kernels
(tests/cluster_copy_kernels.py) compile."""
import re

import numpy as np
import pytest
from numba import cuda, types

from numbatma import TensorMap, compile as nbc
from numbatma.intrinsics import cluster_copy
from numbatma.intrinsics._asm import TARGETS, UnsupportedTarget, check_targets
from numbatma.intrinsics.cluster import cluster_ctarank, cluster_sync, mapa_barrier, mapa_shared
from numbatma.intrinsics.cluster_copy import (
    PTX,
    RED_ASYNC_TYPES,
    cluster_mask,
    cluster_mask_all,
    cluster_mask_column,
    cluster_mask_row,
    red_async,
    st_async,
    tma_load_multicast,
)
from numbatma.intrinsics.mbarrier import mbarrier_init

import cluster_copy_kernels as K
from fakes import FakeCudaArray

SHAPES = {1: (256,), 2: (64, 64), 3: (4, 16, 32), 4: (2, 4, 8, 32), 5: (2, 2, 4, 8, 32)}
BOXES = {1: (64,), 2: (16, 32), 3: (2, 8, 32), 4: (1, 2, 8, 32), 5: (1, 1, 2, 8, 32)}
DESC = {r: TensorMap(FakeCudaArray(SHAPES[r], np.float32), BOXES[r]) for r in SHAPES}
T1, T2, T3, T4, T5 = (DESC[r].shared_shape for r in (1, 2, 3, 4, 5))


def every_cluster_copy(d1, d2, d3, d4, d5, vals, out):
    """Every form of every cluster copy (not meant to run: the PTX and SASS are what is checked)."""
    t1 = cuda.shared.array(T1, np.float32, alignment=128)
    t2 = cuda.shared.array(T2, np.float32, alignment=128)
    t3 = cuda.shared.array(T3, np.float32, alignment=128)
    t4 = cuda.shared.array(T4, np.float32, alignment=128)
    t5 = cuda.shared.array(T5, np.float32, alignment=128)
    buf = cuda.shared.array(64, np.uint32, alignment=16)
    bar = cuda.shared.array(1, np.uint64)
    if cuda.threadIdx.x == 0:
        mbarrier_init(bar, 1)
    cluster_sync()
    mask = cluster_mask_all()
    tma_load_multicast(t1, d1, 0, bar, mask)
    tma_load_multicast(t2, d2, (0, 1), bar, cluster_mask_row())
    tma_load_multicast(t3, d3, (0, 1, 2), bar, cluster_mask_column())
    tma_load_multicast(t4, d4, (0, 1, 2, 3), bar, cluster_mask(1))
    tma_load_multicast(t5, d5, (0, 1, 2, 3, 4), bar, 3)
    peer = (cluster_ctarank() + 1) % 2
    a = mapa_shared(buf, peer)
    b = mapa_barrier(bar, peer)
    i = vals[0]
    u = np.uint32(i)
    s = np.int32(i)
    w = np.uint64(i)
    f = np.float32(i)
    g = np.float64(i)
    st_async(a, u, b)
    st_async(a, np.int64(i), b)
    st_async(a, f, b)
    st_async(a, g, b)
    st_async(a + 8, (s, s), b)
    st_async(a + 8, (w, w), b)
    st_async(a + 8, (f, f), b)
    st_async(a + 16, (g, g), b)
    st_async(a + 16, (u, u, u, u), b)
    st_async(a + 16, (f, f, f, f), b)
    red_async("inc", a, u, b)
    red_async("dec", a, u, b)
    red_async("min", a, u, b)
    red_async("min", a, s, b)
    red_async("max", a, u, b)
    red_async("max", a, s, b)
    red_async("and", a, u, b)
    red_async("or", a, s, b)
    red_async("xor", a, u, b)
    red_async("add", a, u, b)
    red_async("add", a, s, b)
    red_async("add", a + 8, w, b)
    out[0] = buf[0]
    cluster_sync()


SIG = tuple(DESC[r].numba_type for r in (1, 2, 3, 4, 5)) + (types.int32[::1], types.uint32[::1])


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request):
    ptx = nbc.compile_ptx(every_cluster_copy, SIG, arch=request.param)
    return request.param, ptx, nbc.link_cubin(ptx, request.param)


def _ptx_regex(text):
    """A regex matching an instruction's rendered text with any registers in place of its operands."""
    body = re.sub(r"\$\w+", "\x00", text)
    parts = [re.escape(p) for p in body.split("\x00")]
    return r"[^;\n]*?".join(parts).replace(r"\ ", r"\s+") + r"(?=\s*(//|$))"


def test_ptx_table_covers_every_form():
    assert len([k for k in PTX if k.startswith("tma_load_multicast")]) == 5
    assert len([k for k in PTX if k.startswith("st_async")]) == 10
    assert sorted(k for k in PTX if k.startswith("red_async")) == sorted(
        f"red_async({op}.{t})" for op, ts in RED_ASYNC_TYPES.items() for t in ts)
    assert len([k for k in PTX if k.startswith("red_async")]) == 12


@pytest.mark.parametrize("name", sorted(PTX))
def test_every_instruction_in_ptx(compiled, name):
    arch, ptx, _ = compiled
    text = PTX[name].text
    found = [line for line in ptx.splitlines() if re.search(_ptx_regex(text), line.strip())]
    assert found, f"{name}: {text!r} not found in the {arch} PTX"


def test_exact_operand_shapes(compiled):
    _, ptx, _ = compiled
    assert re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes"
                     r"\.multicast::cluster \[%r\d+\], \[%rd\d+, \{%r\d+, %r\d+\}\], \[%r\d+\], %rs\d+;", ptx)
    assert re.search(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.v4\.f32 \[%r\d+\], "
                     r"\{%f?r?\d+, %f?r?\d+, %f?r?\d+, %f?r?\d+\}, \[%r\d+\];", ptx)  # (f32 in %f or %r registers)
    assert re.search(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.v2\.b64 \[%r\d+\], "
                     r"\{%rd\d+, %rd\d+\}, \[%r\d+\];", ptx)
    assert re.search(r"red\.async\.relaxed\.cluster\.shared::cluster\.mbarrier::complete_tx::bytes\.add\.u64 "
                     r"\[%r\d+\], %rd\d+, \[%r\d+\];", ptx)


def test_links_for_every_target(compiled):
    arch, ptx, cubin = compiled
    assert f".target {arch}" in ptx
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000


def test_no_target_restrictions():
    """ptxas accepts every form on sm_90a, sm_100a and sm_120a (test_links_for_every_target), so none is
    restricted and no target raises UnsupportedTarget."""
    assert all(p.targets is None for p in PTX.values())
    ptx = nbc.compile_ptx(every_cluster_copy, SIG, arch="sm_120a")
    for arch in TARGETS:
        check_targets(ptx, arch, PTX)  # raises UnsupportedTarget if a restricted form were used
    assert issubclass(UnsupportedTarget, RuntimeError)


def test_sass_sm90a():
    ptx = nbc.compile_ptx(every_cluster_copy, SIG, arch="sm_90a")
    sass = nbc.sass(nbc.link_cubin(ptx, "sm_90a"))
    ops = set(re.findall(r"\b((?:UTMALDG|STAS|REDAS)[.\w]*)", sass))
    for rank in (1, 2, 3, 4, 5):
        assert f"UTMALDG.{rank}D.MULTICAST" in ops, ops
    for op in ("STAS", "STAS.64", "STAS.128", "REDAS.INC", "REDAS.DEC", "REDAS.MIN", "REDAS.MIN.S32", "REDAS.MAX",
               "REDAS.MAX.S32", "REDAS.AND", "REDAS.OR", "REDAS.XOR", "REDAS.ADD", "REDAS.ADD.S32", "REDAS.ADD.64"):
        assert op in ops, f"{op} missing from the sm_90a SASS: {sorted(ops)}"


# -- typing errors ---------------------------------------------------------------------------------------------
def _expect_typing_error(fn, sig, *fragments):
    with pytest.raises(Exception) as info:
        nbc.compile_ptx(fn, sig)
    assert type(info.value).__name__ == "TypingError", info.value
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg}"


def _red(op, value_of):
    def kernel(vals):
        buf = cuda.shared.array(8, np.uint32)
        bar = cuda.shared.array(1, np.uint64)
        red_async(op, mapa_shared(buf, 1), value_of(vals[0]), mapa_barrier(bar, 1))

    return kernel


@pytest.mark.parametrize("op,cast,fragments", [
    ("inc", np.int32, ("red.async.inc takes a value of type uint32, got int32", "for .u32 only")),
    ("dec", np.uint64, ("red.async.dec takes a value of type uint32, got uint64",)),
    ("min", np.uint64, ("red.async.min takes a value of type uint32 or int32, got uint64", ".u32, .s32 only")),
    ("max", np.float32, ("red.async.max takes a value of type uint32 or int32, got float32",)),
    ("and", np.uint64, ("red.async.and takes a value of type int32 or uint32, got uint64", ".b32 only")),
    ("add", np.int64, ("red.async.add takes a value of type uint32, int32 or uint64, got int64",
                       "np.uint64 adds the same bits")),
    ("add", np.float64, ("red.async.add", "got float64")),
    ("mul", np.uint32, ("the operation must be one of add, and, dec, inc, max, min, or, xor", "'mul'")),
])
def test_red_async_illegal_combinations(op, cast, fragments):
    _expect_typing_error(_red(op, cast), (types.int64[::1],), "red_async", *fragments)


def k_red_int_constant(vals):
    buf = cuda.shared.array(8, np.uint32)
    bar = cuda.shared.array(1, np.uint64)
    red_async("add", mapa_shared(buf, 1), 1, mapa_barrier(bar, 1))


def k_red_runtime_op(vals):
    buf = cuda.shared.array(8, np.uint32)
    bar = cuda.shared.array(1, np.uint64)
    op = "add" if vals[0] else "max"
    red_async(op, mapa_shared(buf, 1), np.uint32(1), mapa_barrier(bar, 1))


def k_red_array_address(vals):
    buf = cuda.shared.array(8, np.uint32)
    bar = cuda.shared.array(1, np.uint64)
    red_async("add", buf, np.uint32(1), mapa_barrier(bar, 1))


def k_red_local_barrier(vals):
    buf = cuda.shared.array(8, np.uint32)
    bar = cuda.shared.array(1, np.uint64)
    red_async("add", mapa_shared(buf, 1), np.uint32(1), bar)


def test_red_async_operand_errors():
    sig = (types.int64[::1],)
    _expect_typing_error(k_red_int_constant, sig, "got int64", "cast it, e.g. np.uint32(v)")
    _expect_typing_error(k_red_runtime_op, sig, "the operation must be a string constant")
    _expect_typing_error(k_red_array_address, sig, "the destination address must be an integer shared::cluster "
                                                   "address (from mapa_shared / mapa_barrier)")
    _expect_typing_error(k_red_local_barrier, sig, "the remote barrier must be an integer shared::cluster address")


def _st(value_of):
    value_of = cuda.jit(device=True)(value_of)

    def kernel(vals):
        buf = cuda.shared.array(8, np.uint32, alignment=16)
        bar = cuda.shared.array(1, np.uint64)
        st_async(mapa_shared(buf, 1), value_of(vals[0]), mapa_barrier(bar, 1))

    return kernel


@pytest.mark.parametrize("value_of,fragments", [
    (lambda v: (np.int64(v), np.int64(v), np.int64(v), np.int64(v)),
     ("st.async.v4 takes 32-bit elements only", "4 x int64", "use two 2-tuples")),
    (lambda v: (np.float64(v), np.float64(v), np.float64(v), np.float64(v)), ("4 x float64",)),
    (lambda v: (np.int32(v), np.float32(v)), ("must have one type, got int32, float32",)),
    (lambda v: (np.int32(v), np.int32(v), np.int32(v)), ("a scalar, a 2-tuple or a 4-tuple", "3-tuple")),
    (lambda v: np.int16(v), ("stores int32, uint32, float32, int64, uint64 or float64 values, got int16",)),
    (lambda v: np.uint8(v), ("got uint8",)),
    (lambda v: np.float16(v), ("got float16",)),
    (lambda v: v > 0, ("must be an integer or floating-point scalar",)),
])
def test_st_async_value_errors(value_of, fragments):
    _expect_typing_error(_st(value_of), (types.int64[::1],), "st_async", *fragments)


def k_st_array_address(vals):
    buf = cuda.shared.array(8, np.uint32)
    bar = cuda.shared.array(1, np.uint64)
    st_async(buf, np.uint32(1), mapa_barrier(bar, 1))


def k_st_local_barrier(vals):
    buf = cuda.shared.array(8, np.uint32)
    bar = cuda.shared.array(1, np.uint64)
    st_async(mapa_shared(buf, 1), np.uint32(1), bar)


def test_st_async_operand_errors():
    sig = (types.int64[::1],)
    _expect_typing_error(k_st_array_address, sig, "st_async: the destination address must be an integer "
                                                  "shared::cluster address")
    _expect_typing_error(k_st_local_barrier, sig, "st_async: the remote barrier must be an integer")


def test_st_async_width_follows_the_value_type():
    """A plain integer constant is int64 in Numba: an 8-byte store (documented); np.int32 gives 4 bytes."""
    def k_const(vals):
        buf = cuda.shared.array(8, np.uint32, alignment=16)
        bar = cuda.shared.array(1, np.uint64)
        st_async(mapa_shared(buf, 1), 5, mapa_barrier(bar, 1))
        st_async(mapa_shared(buf, 1) + 8, np.int32(5), mapa_barrier(bar, 1))

    ptx = nbc.compile_ptx(k_const, (types.int64[::1],))
    assert re.search(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b64 \[%r\d+\], %rd\d+", ptx)
    assert re.search(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes\.b32 \[%r\d+\], %r\d+", ptx)


D2 = DESC[2]


def k_mc_wrong_tile(d):
    t = cuda.shared.array((16, 16), np.float32)
    bar = cuda.shared.array(1, np.uint64)
    tma_load_multicast(t, d, (0, 0), bar, 1)


def k_mc_float_mask(d):
    t = cuda.shared.array((16, 32), np.float32)
    bar = cuda.shared.array(1, np.uint64)
    tma_load_multicast(t, d, (0, 0), bar, 1.0)


def k_mc_coords(d):
    t = cuda.shared.array((16, 32), np.float32)
    bar = cuda.shared.array(1, np.uint64)
    tma_load_multicast(t, d, (0, 0, 0), bar, 1)


def k_mc_global_barrier(d, bar):
    t = cuda.shared.array((16, 32), np.float32)
    tma_load_multicast(t, d, (0, 0), bar, 1)


def test_multicast_typing_errors():
    _expect_typing_error(k_mc_wrong_tile, (D2.numba_type,), "tma_load_multicast", "1024 bytes", "2048 bytes")
    _expect_typing_error(k_mc_float_mask, (D2.numba_type,), "tma_load_multicast: the CTA mask must be an integer")
    _expect_typing_error(k_mc_coords, (D2.numba_type,), "rank 2", "3 coordinates")
    _expect_typing_error(k_mc_global_barrier, (D2.numba_type, types.uint64[::1]), "mbarrier must live in shared")


def test_mask_helpers_compile_to_special_registers():
    def k(out):
        out[0] = cluster_mask_all()
        out[1] = cluster_mask_row()
        out[2] = cluster_mask_column()
        out[3] = cluster_mask(cluster_ctarank())

    ptx = nbc.compile_ptx(k, (types.uint32[::1],))
    for reg in ("%cluster_nctarank", "%cluster_ctarank", "%cluster_ctaid.x", "%cluster_ctaid.y",
                "%cluster_ctaid.z", "%cluster_nctaid.x", "%cluster_nctaid.y"):
        assert reg in ptx, reg


def test_module_exports():
    assert sorted(cluster_copy.__all__) == ["cluster_mask", "cluster_mask_all", "cluster_mask_column",
                                            "cluster_mask_row", "red_async", "st_async", "tma_load_multicast"]
    for name in ("tma_load_multicast", "st_async", "red_async"):
        doc = getattr(cluster_copy, name).__doc__
        assert doc and ("st.async" in doc or "red.async" in doc or "multicast::cluster" in doc)
        assert "The caller guarantees" in doc


# -- the GPU test kernels (tests/cluster_copy_kernels.py) compile (offline, sm_90a) ---------------------------------
def test_gpu_kernels_compile():
    for fn, sig in K.kernel_signatures(FakeCudaArray):
        ptx = nbc.compile_ptx(fn, sig, arch="sm_90a")
        nbc.link_cubin(ptx, "sm_90a")
