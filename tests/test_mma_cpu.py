"""CPU tests of the mma.sync / ldmatrix / stmatrix family (numbatma.intrinsics.mma): the PTX text of every variant;
the fragment helpers against the PTX ISA's tables; the kernels of tests/mma_kernels.py compiled to PTX holding
their instructions and linked (nvJitLink) for sm_90a, sm_100a and sm_120a, with HMMA / LDSM / STSM in the SASS and
no local memory; the sm_80-class targets (mma and ldmatrix link there, stmatrix does not and compiling it raises
UnsupportedTarget); misuse as typing errors in the user's terms."""
import functools
import re

import numpy as np
import pytest
from numba import cuda
from numba.core.errors import NumbaError
from numba.cuda import types

from numbatma import compile as nbc
from numbatma.intrinsics import all_ptx
from numbatma.intrinsics import mma as M
from numbatma.intrinsics._asm import TARGETS, UnsupportedTarget
from numbatma.intrinsics.mma import (
    ldmatrix,
    mma_a_row_col,
    mma_b_row_col,
    mma_c_row_col,
    mma_m16n8k16,
    mma_m16n8k16_f16acc,
    pack_bf16x2,
    pack_f16x2,
    stmatrix,
    unpack_bf16x2,
    unpack_f16x2,
)

import mma_kernels as K

u16, u32, i32, f32 = types.uint16, types.uint32, types.int32, types.float32


# -- the PTX ----------------------------------------------------------------------------------------------------------
def test_ptx_text_of_every_variant():
    text = {name: p.render() for name, p in M.PTX.items()}
    assert text["mma_m16n8k16(bf16)"] == ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {$0, $1, $2, $3}, "
                                          "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
    assert text["mma_m16n8k16(f16)"] == ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0, $1, $2, $3}, "
                                         "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
    assert text["mma_m16n8k16_f16acc"] == ("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {$0, $1}, "
                                           "{$2, $3, $4, $5}, {$6, $7}, {$8, $9};")
    assert text["ldmatrix(x1)"] == "ldmatrix.sync.aligned.m8n8.x1.shared.b16 {$0}, [$1];"
    assert text["ldmatrix(x2.trans)"] == "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {$0, $1}, [$2];"
    assert text["ldmatrix(x4)"] == "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];"
    assert re.fullmatch(r"stmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16 \[\$0\], \{\$1, \$2, \$3, \$4\}; "
                        r"// numbatma:[0-9a-f]{10}", text["stmatrix(x4.trans)"])
    assert text["stmatrix(x1)"].startswith("stmatrix.sync.aligned.m8n8.x1.shared.b16 [$0], {$1};")
    # cvt.rn.*x2.f32 d, a, b puts a in the upper half: hi first
    assert text["pack_bf16x2"] == "cvt.rn.bf16x2.f32 $0, $1, $2;" and M.PACK["bf16"].ins[0][0] == "hi"
    assert text["pack_f16x2"] == "cvt.rn.f16x2.f32 $0, $1, $2;" and M.PACK["f16"].ins[0][0] == "hi"
    assert len(M.PTX) == 3 + 6 + 6 + 2
    for name, p in M.PTX.items():
        assert all_ptx()[name] is p  # (listed: the target matrix links each one for every target)
        assert (p.targets is not None) == name.startswith("stmatrix")  # only stmatrix is restricted (sm_90+)


# -- fragment layouts -----------------------------------------------------------------------------------------------
def test_fragment_helpers_follow_the_ptx_isa_tables():
    """groupID = lane >> 2, threadID_in_group = lane % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
    point type"): A element a_i (register i // 2, half i % 2): row groupID (+8 for i in 2, 3, 6, 7), column
    2 * threadID_in_group + (i & 1) (+8 for i >= 4); B b_i: row 2 * threadID_in_group + (i & 1) (+8 for i >= 2),
    column groupID; C c_i: row groupID (+8 for i >= 2), column 2 * threadID_in_group + (i & 1)."""
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            row = g + (8 if i in (2, 3, 6, 7) else 0)
            col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
            assert mma_a_row_col(i // 2, i % 2, lane) == (row, col)
        for i in range(4):
            assert mma_b_row_col(i // 2, i % 2, lane) == (2 * t + (i & 1) + (8 if i >= 2 else 0), g)
            assert mma_c_row_col(i, lane) == (g + (8 if i >= 2 else 0), 2 * t + (i & 1))
    # every element exactly once
    a = {mma_a_row_col(r, h, ln) for r in range(4) for h in range(2) for ln in range(32)}
    b = {mma_b_row_col(r, h, ln) for r in range(2) for h in range(2) for ln in range(32)}
    c = {mma_c_row_col(r, ln) for r in range(4) for ln in range(32)}
    assert a == {(i, j) for i in range(16) for j in range(16)}
    assert b == {(i, j) for i in range(16) for j in range(8)}
    assert c == {(i, j) for i in range(16) for j in range(8)}
    # plain functions: NumPy arrays too
    rows, cols = mma_c_row_col(np.arange(4)[:, None], np.arange(32)[None, :])
    assert rows.shape == (4, 32) and cols[3, 31] == 7 and rows[3, 31] == 15


def test_the_ldmatrix_fragment_is_the_mma_fragment():
    """The lane addressing of tests/mma_kernels.py: ldmatrix x4 of A's quarters gives A's registers, x2 .trans of B
    stored (K, N) and x2 of B stored (N, K) give B's - checked with the PTX ldmatrix reference on index data."""
    a = np.arange(16 * 16, dtype=np.uint16).reshape(16, 16)  # element value = its flat index
    off = np.array([(ln % 16) * 16 + 8 * (ln // 16) for ln in range(32)])
    frags = K.ldmatrix_reference(a, off, 4, False)
    for lane in range(32):
        for reg in range(4):
            for half in range(2):
                r, c = mma_a_row_col(reg, half, lane)
                assert (int(frags[lane, reg]) >> 16 * half) & 0xFFFF == a[r, c]
    b_kn = np.arange(16 * 8, dtype=np.uint16).reshape(16, 8)
    for tile, off, trans in ((b_kn, [(ln % 16) * 8 for ln in range(32)], True),
                             (np.ascontiguousarray(b_kn.T), [(ln % 8) * 16 + 8 * ((ln // 8) % 2) for ln in range(32)],
                              False)):
        frags = K.ldmatrix_reference(tile, np.array(off), 2, trans)
        for lane in range(32):
            for reg in range(2):
                for half in range(2):
                    r, c = mma_b_row_col(reg, half, lane)
                    assert (int(frags[lane, reg]) >> 16 * half) & 0xFFFF == b_kn[r, c]


# -- compilation -------------------------------------------------------------------------------------------------------
GEMM_SIG = (u16[:, ::1], u16[:, ::1], f32[:, ::1], f32[:, ::1])
ROUNDTRIP_SIG = (u16[:, ::1], i32[::1], i32[::1], u32[:, ::1], u16[:, ::1])
PACK_SIG = (f32[::1], f32[::1], u32[::1], u32[::1], f32[::1], f32[::1])

# name -> (kernel factory arguments, signature, PTX it must hold, SASS it must hold)
KERNELS = {
    "fragment-bf16": (("fragment", "bf16"), (u16[:, ::1], u16[:, :, ::1], f32[:, ::1], f32[:, ::1]),
                      ["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"], ["HMMA"]),
    "fragment-f16": (("fragment", "f16"), (u16[:, ::1], u16[:, :, ::1], f32[:, ::1], f32[:, ::1]),
                     ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"], ["HMMA"]),
    "f16acc": (("f16acc",), (u16[:, ::1], u16[:, :, ::1], u16[:, ::1], u16[:, ::1]),
               ["mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"], ["HMMA"]),
    "gemm-bf16-nk": (("gemm", "bf16", "nk", 64), GEMM_SIG,
                     ["ldmatrix.sync.aligned.m8n8.x4.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"], ["HMMA", "LDSM"]),
    "gemm-bf16-kn": (("gemm", "bf16", "kn", 32), GEMM_SIG, ["ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"],
                     ["HMMA", "LDSM"]),
    "gemm-f16-kn-x1": (("gemm", "f16", "kn-x1", 48), GEMM_SIG,
                       ["ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"], ["HMMA", "LDSM"]),
    "roundtrip-x4": (("roundtrip", 4, False, True), ROUNDTRIP_SIG,
                     ["ldmatrix.sync.aligned.m8n8.x4.shared.b16", "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16"],
                     ["LDSM", "STSM"]),
    "roundtrip-x2": (("roundtrip", 2, True, False), ROUNDTRIP_SIG,
                     ["ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16", "stmatrix.sync.aligned.m8n8.x2.shared.b16"],
                     ["LDSM", "STSM"]),
    "roundtrip-x1": (("roundtrip", 1, True, True), ROUNDTRIP_SIG,
                     ["ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
                      "stmatrix.sync.aligned.m8n8.x1.trans.shared.b16"], ["LDSM", "STSM"]),
    "pack-bf16": (("pack", "bf16"), PACK_SIG, ["cvt.rn.bf16x2.f32"], ["F2FP"]),
    "pack-f16": (("pack", "f16"), PACK_SIG, ["cvt.rn.f16x2.f32", "cvt.f32.f16"], ["F2FP"]),
}


def _kernel(spec):
    what, *args = spec
    factory = {"fragment": K.fragment_mma_kernel, "f16acc": K.fragment_f16acc_kernel, "gemm": K.gemm_kernel,
               "roundtrip": K.roundtrip_kernel, "pack": K.pack_kernel}[what]
    return factory(*args).py_func


@functools.lru_cache(maxsize=None)
def _compiled(name, arch):
    """(PTX, SASS) of a kernel for ``arch`` (compiled once per test process)."""
    spec, sig, _, _ = KERNELS[name]
    ptx = nbc.compile_ptx(_kernel(spec), sig, arch)
    return ptx, nbc.sass(nbc.link_cubin(ptx, arch))


# sm_90a builds every kernel; the other targets a subset holding every operation (each PTX variant is linked for
# every target on its own by tests/test_target_matrix.py)
OTHER_TARGETS = ("f16acc", "gemm-bf16-nk", "gemm-f16-kn-x1", "roundtrip-x4", "roundtrip-x1", "pack-f16")


@pytest.mark.parametrize("arch", TARGETS)
def test_kernels_compile_and_link_for_every_target(arch):
    for name in KERNELS if arch == "sm_90a" else OTHER_TARGETS:
        _, _, want_ptx, want_sass = KERNELS[name]
        ptx, sass = _compiled(name, arch)
        for text in want_ptx:
            assert text in ptx, (name, arch, text)
        for op in want_sass:
            assert re.search(rf"\b{op}\b", sass), (name, arch, op)
        assert ".local" not in ptx, (name, arch)
        assert "STL" not in sass and "LDL" not in sass, (name, arch, "local memory")


def test_the_k_loop_keeps_the_accumulators_in_registers():
    """gemm k = 64: four HMMA (one per k-step) on sm_90a, the accumulator tuple carried in registers."""
    ptx, sass = _compiled("gemm-bf16-nk", "sm_90a")
    assert len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass)) == 4, sass
    assert len(re.findall(r"\bLDSM\.16\.M88\.4\b", sass)) == 4


def test_sm80_class_targets():
    """mma.sync and ldmatrix exist from sm_80 (ldmatrix sm_75), stmatrix from sm_90: nvJitLink/ptxas links the
    first two for sm_80 and refuses stmatrix; a kernel using stmatrix compiled for sm_80 raises UnsupportedTarget
    naming it, while a kernel of mma + ldmatrix compiles."""
    import test_target_matrix as T

    for name, p in M.PTX.items():
        source = T._standalone_ptx(p, "sm_80")
        if name.startswith("stmatrix"):
            with pytest.raises(Exception, match=r"stmatrix' requires \.target sm_90 or higher"):
                nbc.link_cubin(source, arch="sm_80")
        else:
            assert nbc.link_cubin(source, arch="sm_80")
    from numbatma._numba_internals import offline_target

    with offline_target((8, 0)):
        ptx, _ = cuda.compile_ptx(_kernel(KERNELS["gemm-bf16-kn"][0]), GEMM_SIG, cc=(8, 0))
        assert ".target sm_80" in ptx and "mma.sync.aligned.m16n8k16" in ptx
        with pytest.raises(UnsupportedTarget, match=r"stmatrix\(x4\.trans\) .*not available when compiling for "
                                                    r"sm_80; PTX has it on sm_90a, sm_100a, sm_120a only.*ordinary "
                                                    r"shared-memory stores"):
            cuda.compile_ptx(_kernel(KERNELS["roundtrip-x4"][0]), ROUNDTRIP_SIG, cc=(8, 0))


def test_fragment_helpers_are_plain_functions():
    assert mma_c_row_col(3, 5) == (9, 3) and mma_a_row_col(3, 1, 5) == (9, 11) and mma_b_row_col(1, 1, 5) == (11, 1)


# -- typing errors --------------------------------------------------------------------------------------------------
def _fails(fn, args, pattern):
    with pytest.raises(NumbaError, match=pattern):
        nbc.compile_ptx(fn, args)




def k_kind(out):
    z = np.float32(0)
    u = np.uint32(0)
    d = mma_m16n8k16((z, z, z, z), (u, u, u, u), (u, u), "tf32")
    out[0] = d[0]


def k_acc_f64(out):
    u = np.uint32(0)
    d = mma_m16n8k16((0.0, 0.0, 0.0, 0.0), (u, u, u, u), (u, u), "bf16")
    out[0] = d[0]


def k_a3(out):
    z = np.float32(0)
    u = np.uint32(0)
    d = mma_m16n8k16((z, z, z, z), (u, u, u), (u, u), "bf16")
    out[0] = d[0]


def k_a_widened(out):
    z = np.float32(0)
    u = np.uint32(cuda.threadIdx.x)
    w = u | (u << 16)  # uint64 in Numba
    d = mma_m16n8k16((z, z, z, z), (w, w, w, w), (u, u), "f16")
    out[0] = d[0]


def k_b4(out):
    z = np.float32(0)
    u = np.uint32(0)
    d = mma_m16n8k16((z, z, z, z), (u, u, u, u), (u, u, u, u), "bf16")
    out[0] = d[0]


def k_f16acc_float(out):
    z = np.float32(0)
    u = np.uint32(0)
    d = mma_m16n8k16_f16acc((z, z), (u, u, u, u), (u, u))
    out[0] = d[0]


def k_count3(out):
    t = cuda.shared.array((32, 8), np.uint16, alignment=16)
    r = ldmatrix(t, 0, 3, False)
    out[0] = r[0]


def k_count_runtime(out, n):
    t = cuda.shared.array((32, 8), np.uint16, alignment=16)
    r = ldmatrix(t, 0, n, False)
    out[0] = r[0]


def k_trans_runtime(out, flag):
    t = cuda.shared.array((32, 8), np.uint16, alignment=16)
    r = ldmatrix(t, 0, 1, flag)
    out[0] = r[0]


def k_global_tile(out, g):
    r = ldmatrix(g, 0, 1, False)
    out[0] = r[0]


def k_local_tile(out):
    t = cuda.local.array(64, np.uint16)
    r = ldmatrix(t, 0, 1, False)
    out[0] = r[0]


def k_f32_tile(out):
    t = cuda.shared.array((8, 8), np.float32, alignment=16)
    r = ldmatrix(t, 0, 1, False)
    out[0] = r[0]


def k_float_offset(out):
    t = cuda.shared.array((8, 8), np.uint16, alignment=16)
    r = ldmatrix(t, 8.0, 1, False)
    out[0] = r[0]


def k_misaligned_offset(out):
    t = cuda.shared.array((8, 16), np.uint16, alignment=16)
    r = ldmatrix(t, 4, 1, False)
    out[0] = r[0]


def k_offset_outside(out):
    t = cuda.shared.array((8, 8), np.uint16, alignment=16)
    stmatrix(t, 64, (np.uint32(0),), False)


def k_st_values3(out):
    t = cuda.shared.array((32, 8), np.uint16, alignment=16)
    u = np.uint32(0)
    stmatrix(t, 0, (u, u, u), False)


def k_st_values_float(out):
    t = cuda.shared.array((32, 8), np.uint16, alignment=16)
    stmatrix(t, 0, (np.float32(0), np.float32(1)), True)


def k_pack_tuple(out):
    out[0] = pack_bf16x2((1.0, 2.0), 3.0)


def k_unpack_float(out):
    lo, hi = unpack_f16x2(np.float32(1))
    out[0] = lo


def k_unpack_int64(out, x):
    lo, hi = unpack_bf16x2(x)
    out[0] = lo


TYPING_ERRORS = [
    (k_kind, (f32[::1],), r"mma_m16n8k16: kind must be one of 'bf16', 'f16', got 'tf32'"),
    (k_acc_f64, (f32[::1],), r"mma_m16n8k16: acc must be a tuple of 4 float32 \(the lane's 4 float32 registers of "
                             r"C, e\.g\. \(z, z, z, z\) with z = np\.float32\(0\).*\), got UniTuple\(float64 x 4\)"),
    (k_a3, (f32[::1],), r"mma_m16n8k16: a must be a tuple of 4 uint32 \(A's fragment.*got UniTuple\(uint32 x 3\)"),
    (k_a_widened, (f32[::1],), r"a must be a tuple of 4 uint32 .*got UniTuple\(uint64 x 4\); wrap words computed in "
                               r"the kernel in np\.uint32\(\.\.\.\)"),
    (k_b4, (f32[::1],), r"mma_m16n8k16: b must be a tuple of 2 uint32 \(B's fragment"),
    (k_f16acc_float, (u32[::1],), r"mma_m16n8k16_f16acc: acc must be a tuple of 2 uint32 \(the lane's 2 registers of "
                                  r"float16 pairs"),
    (k_count3, (u32[::1],), r"ldmatrix: count must be one of 1, 2, 4, got 3"),
    (k_count_runtime, (u32[::1], i32), r"ldmatrix: count must be a compile-time constant"),
    (k_trans_runtime, (u32[::1], types.boolean), r"ldmatrix: trans must be a compile-time constant bool"),
    (k_global_tile, (u32[::1], u16[::1]), r"ldmatrix: the tile must be a shared-memory array \(from "
                                          r"cuda\.shared\.array\); got .*not known to live in shared memory"),
    (k_local_tile, (u32[::1],), r"ldmatrix: the tile must be a shared-memory array"),
    (k_f32_tile, (u32[::1],), r"ldmatrix: the tile must hold 16-bit elements \(uint16, int16 or float16; bfloat16 "
                              r"data as uint16\): ldmatrix moves \.b16 matrices; got float32"),
    (k_float_offset, (u32[::1],), r"ldmatrix: offset \(the element offset of this lane's row address in the tile\) "
                                  r"must be an integer"),
    (k_misaligned_offset, (u32[::1],), r"ldmatrix: offset 4 is not a multiple of 8 elements: every row address must "
                                       r"be 16-byte aligned"),
    (k_offset_outside, (u32[::1],), r"stmatrix: offset 64 puts the 8-element row outside the tile \(shape \(8, 8\)\)"),
    (k_st_values3, (u32[::1],), r"stmatrix: values must be a tuple of 1, 2 or 4 uint32"),
    (k_st_values_float, (u32[::1],), r"stmatrix: values must be a tuple of 1, 2 or 4 uint32 .*got "
                                     r"UniTuple\(float32 x 2\)"),
    (k_pack_tuple, (u32[::1],), r"pack_bf16x2: lo must be a number"),
    (k_unpack_float, (f32[::1],), r"unpack_f16x2: the argument must be a uint32 holding two 16-bit values"),
    (k_unpack_int64, (f32[::1], types.int64), r"unpack_bf16x2: the argument must be a uint32 holding two 16-bit "
                                              r"values .*got int64"),
]


@pytest.mark.parametrize("fn, args, pattern", TYPING_ERRORS, ids=[t[0].__name__ for t in TYPING_ERRORS])
def test_typing_errors(fn, args, pattern):
    _fails(fn, args, pattern)


def test_constant_offsets_that_keep_the_rules_compile():
    def kern(out):
        t = cuda.shared.array((8, 16), np.uint16, alignment=16)
        r = ldmatrix(t, 120, 1, False)  # the last row slot
        stmatrix(t, 0, r, True)
        lo, hi = unpack_f16x2(r[0])
        out[0] = pack_f16x2(hi, lo)

    ptx = nbc.compile_ptx(kern, (u32[::1],))
    assert "ldmatrix.sync.aligned.m8n8.x1.shared.b16" in ptx and "stmatrix.sync.aligned.m8n8.x1.trans" in ptx
