"""CPU tests of wgmma (numbatma.intrinsics.wgmma): the PTX text of representative variants; every wgmma instruction
assembles and links for sm_90a (nvJitLink) and names mma_m16n8k16 when compiled for sm_100a / sm_120a; the matrix
descriptors against the PTX ISA's canonical layouts; the register fragment layouts (accumulator columns 16 k ..
16 k + 15 are A's k-step k); kernels of tests/wgmma_kernels.py built like numba-cuda builds them on a GPU (LTO):
HGMMA / QGMMA of the right shape, STSM for 16-bit epilogue tiles, no local memory, no serialized wgmma; float8
TensorMaps (element, validation, the kernel type); misuse as typing errors in the user's terms."""
import functools
import importlib
import itertools
import re

import numpy as np
import pytest
from numba import cuda
from numba.core.errors import NumbaError
from numba.cuda import types

import numbatma
from numbatma import TensorMap, TensorMapError
from numbatma import compile as nbc
from numbatma.intrinsics import all_ptx
from numbatma.intrinsics._asm import UnsupportedTarget, check_targets
from numbatma.intrinsics import (
    wgmma,
    wgmma_a_fragments,
    wgmma_add_bias,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_row_col,
    wgmma_scale,
    wgmma_store,
    wgmma_store_global,
    wgmma_wait_group,
    wgmma_zeros,
    wgmma_zeros_f16,
)

import wgmma_kernels as K
from fakes import FakeCudaArray

W = importlib.import_module("numbatma.intrinsics.wgmma")  # (the module; numbatma.intrinsics.wgmma is the intrinsic)
E = importlib.import_module("numbatma.intrinsics.wgmma_epilogue")  # (the accumulator helpers' PTX)
O = importlib.import_module("numbatma.intrinsics.wgmma_operands")  # (the matrix descriptors' layouts)
f32, u32, i64 = types.float32, types.uint32, types.int64


# -- the PTX ----------------------------------------------------------------------------------------------------------
def test_ptx_text_of_representative_variants():
    def text(key, **imm):
        p = W.MMA[key]
        return p.render(**{n: imm.get(n, 0) for n in p.imm})

    marker = r" // numbatma:[0-9a-f]{10}"
    d8 = ", ".join(f"${i}" for i in range(4))
    assert re.fullmatch(
        r"\{ \.reg \.pred p; setp\.ne\.b32 p, \$6, 0; wgmma\.mma_async\.sync\.aligned\.m64n8k16\.f32\.bf16\.bf16 "
        rf"\{{{re.escape(d8)}\}}, \$4, \$5, p, 1, 1, 0, 1; \}}" + marker,
        text((8, "f32", "bf16", "bf16", "smem"), scale_a=1, scale_b=1, trans_b=1))
    # A from registers: four b32 registers, no trans-a immediate
    reg = text((16, "f32", "f16", "f16", "reg"), scale_a=1, scale_b=1)
    assert "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {$0, $1, $2, $3, $4, $5, $6, $7}, {$8, $9, $10, " \
           "$11}, $12, p, 1, 1, 0; }" in reg
    # float16 accumulators: N/4 b32 registers; tf32 K = 8; float8 K = 32 with no transpose immediates
    assert "m64n256k16.f16.f16.f16 {" + ", ".join(f"${i}" for i in range(64)) + "}, $64, $65, p, 1, 1, 0, 0;" in \
        text((256, "f16", "f16", "f16", "smem"), scale_a=1, scale_b=1)
    assert "m64n64k8.f32.tf32.tf32 {" in text((64, "f32", "tf32", "tf32", "smem"), scale_a=1, scale_b=1)
    assert re.search(r"m64n128k32\.f16\.e4m3\.e5m2 \{[^}]*\$31\}, \$32, \$33, p, 1, 1; \}",
                     text((128, "f16", "e4m3", "e5m2", "smem"), scale_a=1, scale_b=1))
    assert W.MMA[(8, "f32", "bf16", "bf16", "smem")].inout == ("d", "f32", 4)
    assert W.MMA[(8, "f16", "f16", "f16", "smem")].inout == ("d", "b32", 2)
    assert W.fence_ptx("f32", 64).render().startswith("wgmma.fence.sync.aligned;")
    assert W.wait_ptx("b32", 8).render(n=1).startswith("wgmma.wait_group.sync.aligned 1;")
    assert W.COMMIT.render().startswith("wgmma.commit_group.sync.aligned;")
    assert E._STMATRIX[4].render() .startswith("stmatrix.sync.aligned.m8n8.x4.shared.b16 [$0], {$1, $2, $3, $4};")
    assert E._STMATRIX[2].render() .startswith("stmatrix.sync.aligned.m8n8.x2.shared.b16 [$0], {$1, $2};")
    # cvt.rn.bf16x2.f32 d, a, b puts a in the upper half: hi first
    assert E._PACK["bf16"].render() == "cvt.rn.bf16x2.f32 $0, $1, $2;" and E._PACK["bf16"].ins[0][0] == "hi"
    assert len(W.MMA) == 32 * 12 * 2  # every N x 12 (A, B, D) combinations x A source


def test_every_ptx_is_registered():
    everything = all_ptx()
    for name, p in {**W.PTX, **E.PTX}.items():
        assert everything[name] is p, name
    listed = {id(p) for p in {**W.PTX, **E.PTX}.values()}
    for p in [*W.MMA.values(), W.COMMIT, *E._STMATRIX.values(), *E._PACK.values(), E._THREAD_X]:
        assert id(p) in listed or any(q.text == p.text for q in {**W.PTX, **E.PTX}.values()), p.text
    # the fence / wait of any register count has the text of a registered one (the target check goes by the text)
    assert W.fence_ptx("b32", 37).marker == W.fence_ptx("f32", 4).marker


def _module(ptxs):
    """One PTX module with an entry per instruction, registers for its operands (immediates 0, scales 1)."""
    regname = {"b16": "h", "b32": "r", "b64": "l", "f32": "f", "f64": "d"}
    entries = []
    for e, p in enumerate(ptxs):
        imm = {n: (1 if n.startswith("scale") else 0) for n in p.imm}
        text = p.render(**imm)
        order = p.registers()
        for i in reversed(range(len(order))):
            text = re.sub(rf"\${i}(?!\d)", f"%{regname[order[i][1]]}{i}", text)
        decls = "\n".join(f"  .reg .{'b' + r[1:] if r.startswith('b') else r} %{regname[r]}<{len(order) + 1}>;"
                          for r in regname)
        entries.append(f".visible .entry e{e}()\n{{\n{decls}\n  {text}\n  ret;\n}}\n")
    return ".version 9.0\n.target TARGET\n.address_size 64\n\n" + "\n".join(entries)


def test_every_wgmma_instruction_links_for_sm_90a_only():
    restricted = {n: p for n, p in W.PTX.items() if p.targets is not None and "wgmma" in p.text}
    assert len(restricted) == len(W.MMA) + 2 * len(W._ACC_SHAPES) + 1
    module = _module(restricted.values())
    assert nbc.link_cubin(module.replace("TARGET", "sm_90a"), arch="sm_90a")[:4] == b"\x7fELF"
    for target in ("sm_100a", "sm_120a"):
        with pytest.raises(Exception, match="wgmma"):
            nbc.link_cubin(_module([W.MMA[(64, "f32", "bf16", "bf16", "smem")]]).replace("TARGET", target), arch=target)
        for name, p in restricted.items():
            with pytest.raises(UnsupportedTarget, match=rf"{re.escape(name)} .*not available when compiling for "
                                                        rf"{target}; PTX has it on sm_90a only.*mma_m16n8k16"):
                check_targets(p.render(**{n: 0 for n in p.imm}), target, {name: p})
    # the helpers' instructions exist everywhere numbatma compiles for (stmatrix from sm_90)
    helpers = [E._PACK["bf16"], E._PACK["f16"], E._STMATRIX[4], E._STMATRIX[2], E._THREAD_X]
    for target in ("sm_90a", "sm_100a", "sm_120a"):
        assert nbc.link_cubin(_module(helpers).replace("TARGET", target), arch=target)[:4] == b"\x7fELF"


# -- layouts ----------------------------------------------------------------------------------------------------------
def _isa_a_fragment(reg, half, thread):
    """PTX ISA, "WGMMA .m64nNk16 register fragment layout for matrix A": warp w = thread // 32 holds rows
    16 w .. 16 w + 15; lane l holds a0..a7 (two per register, low half first): row l // 4 (+8 for a2, a3, a6,
    a7), column 2 (l % 4) + (i & 1) (+8 for a4..a7)."""
    w, lane = divmod(thread, 32)
    i = 2 * reg + half
    return 16 * w + lane // 4 + (8 if i in (2, 3, 6, 7) else 0), 2 * (lane % 4) + (i & 1) + (8 if i >= 4 else 0)


def _isa_accumulator(i, thread):
    """PTX ISA, "WGMMA .m64nNk16 register fragment layout for accumulator matrix D": d_i of lane l in warp w:
    row 16 w + l // 4 (+8 for i % 4 in 2, 3), column 8 (i // 4) + 2 (l % 4) + (i & 1)."""
    w, lane = divmod(thread, 32)
    return 16 * w + lane // 4 + (8 if i % 4 >= 2 else 0), 8 * (i // 4) + 2 * (lane % 4) + (i & 1)


def test_fragment_layouts():
    for t in range(128):
        for i in range(128):
            assert wgmma_row_col(i, t) == _isa_accumulator(i, t)
    assert {_isa_accumulator(i, t) for i in range(128) for t in range(128)} == \
        {(r, c) for r in range(64) for c in range(256)}
    assert {_isa_a_fragment(j, h, t) for j in range(4) for h in range(2) for t in range(128)} == \
        {(r, c) for r in range(64) for c in range(16)}
    # wgmma_a_fragments: register j of fragment k packs accumulator registers 8 k + 2 j (low) and 8 k + 2 j + 1
    for t, k, j, h in itertools.product(range(128), range(16), range(4), range(2)):
        r, c = _isa_accumulator(8 * k + 2 * j + h, t)
        assert (r, c - 16 * k) == _isa_a_fragment(j, h, t)
    # the simulator's gather of register A (f16: value = the element's flat index, exact below 2048)
    contributions = []
    for t in range(128):
        regs = []
        for j in range(4):
            (r0, c0), (r1, c1) = _isa_a_fragment(j, 0, t), _isa_a_fragment(j, 1, t)
            regs.append(np.uint32(K.to_bits(16 * r0 + c0, "f16")) | (np.uint32(K.to_bits(16 * r1 + c1, "f16")) << 16))
        contributions.append(regs)
    np.testing.assert_array_equal(W._register_a_matrix(contributions, "f16"), np.arange(64 * 16).reshape(64, 16))
    # tf32 (.m64nNk8): register j = row g + 8 (j % 2), column q + 4 (j // 2)
    contributions = [[np.float32(16 * (16 * (t // 32) + (t % 32) // 4 + 8 * (j % 2)) + t % 4 + 4 * (j // 2))
                      .view(np.uint32) for j in range(4)] for t in range(128)]
    want = 16 * np.arange(64)[:, None] + np.arange(8)[None, :]
    np.testing.assert_array_equal(W._register_a_matrix(contributions, "tf32"), want)


def _canonical_offset(layout, mn, k):
    """Element offset of (mn, k) in the PTX ISA's canonical layouts ("Canonical Layouts", before the swizzle) with
    T = 16 bytes of elements, S = span / 16, and the descriptor's LBO / SBO (elements)."""
    t = 16 // layout.itemsize
    fields = O.descriptor_fields(layout)
    lbo = ((fields >> 16) & 0x3FFF) * 16 // layout.itemsize
    sbo = ((fields >> 32) & 0x3FFF) * 16 // layout.itemsize
    s = layout.swizzle // 16
    if layout.major == "K":
        i0, i1 = mn % 8, mn // 8
        if not s:  # ((8,m),(T,2k)):((1T,SBO),(1,LBO))
            return i0 * t + i1 * sbo + k % t + (k // t) * lbo
        return i0 * s * t + i1 * sbo + k  # ((8,m),(T,2k)):((S T,SBO),(1,T)), k inside one swizzle row
    k0, k1 = k % 8, k // 8
    if not s:  # ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))
        return mn % t + (mn // t) * sbo + k0 * t + k1 * lbo
    return mn % (s * t) + (mn // (s * t)) * lbo + k0 * s * t + k1 * sbo  # ((T,S,m),(8,k)):((1,T,LBO),(S T,SBO))


@pytest.mark.parametrize("kind, major", [("bf16", "K"), ("tf32", "K"), ("e4m3", "K"), ("f16", "MN")])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_descriptors_follow_the_canonical_layouts(kind, major, swizzle):
    itemsize = K.ITEMSIZE[kind]
    width = (swizzle or 16) // itemsize
    rows, groups = 64, 4
    layout = O.OperandLayout(kind, major, swizzle, groups, rows, width, itemsize)
    kstep = K.KSTEP[kind]
    for mn in range(layout.mn_extent):
        for k in range(layout.k_extent):
            if major == "K" and swizzle and (k % width) // kstep != 0:
                continue  # (a k-step's descriptor starts at its own k: the canonical form covers one step)
            k_in = k - (k // width) * width if major == "K" and swizzle else k
            base = layout.byte_offset(0, k - k_in) // itemsize if major == "K" and swizzle else 0
            assert layout.byte_offset(mn, k) // itemsize == base + _canonical_offset(layout, mn, k_in), (mn, k)
    fields = O.descriptor_fields(layout)
    assert fields >> 62 == {0: 0, 128: 1, 64: 2, 32: 3}[swizzle]
    if major == "K" and swizzle:
        assert (fields >> 16) & 0x3FFF == 1  # "not used, assumed to be 1"


def test_descriptor_of_the_isa_example():
    """PTX ISA example "K-Major, no-swizzling and tf32 type": LBO 64 * 4 bytes (encoded 16) when the next 16-byte
    column is 64 elements on; SBO 32 * 4 bytes (encoded 8) for the next 8 rows."""
    layout = O.OperandLayout("tf32", "K", 0, 2, 16, 4, 4)  # two 16 x 4 boxes: the next column 16 * 4 elements on
    fields = O.descriptor_fields(layout)
    assert (fields >> 16) & 0x3FFF == 16 and (fields >> 32) & 0x3FFF == 8


# -- float8 TensorMaps ------------------------------------------------------------------------------------------------
def test_fp8_tensormaps():
    import ml_dtypes

    raw = FakeCudaArray((64, 128), np.uint8)
    tm = TensorMap(raw, (64, 64), swizzle=64, element="e4m3")
    assert tm.element == "e4m3" and tm.tma_dtype == "UINT8"
    ty = tm.numba_type
    assert ty.element == "e4m3" and ty.dtype == types.uint8 and ", e4m3" in str(ty)
    other = TensorMap(raw, (64, 64), swizzle=64, element="e5m2").numba_type
    plain = TensorMap(raw, (64, 64), swizzle=64).numba_type
    assert len({ty, other, plain}) == 3 and plain.element is None
    assert O.operand_kind(ty.tma_dtype, ty.element) == "e4m3" and O.operand_kind(other.tma_dtype, other.element) \
        == "e5m2" and O.operand_kind(plain.tma_dtype, plain.element) is None
    assert TensorMap(FakeCudaArray((64, 128), np.int8), (64, 64), element="e5m2").element == "e5m2"
    # float8 arrays imply their element (what ml_dtypes / torch float8 data are)
    for dtype, element in ((ml_dtypes.float8_e4m3fn, "e4m3"), (ml_dtypes.float8_e5m2, "e5m2")):
        layout = numbatma.tensormap.ArrayLayout(1 << 20, (64, 128), (128, 1), np.dtype(dtype))
        tm = TensorMap(layout, (64, 32), swizzle=32)
        assert (tm.element, tm.tma_dtype, tm.numba_type.dtype) == (element, "UINT8", types.uint8)
        wrong = "e5m2" if element == "e4m3" else "e4m3"
        with pytest.raises(TensorMapError, match=rf"element='{wrong}' but the .* holds {np.dtype(dtype).name}"):
            TensorMap(layout, (64, 32), element=wrong)
    with pytest.raises(TensorMapError, match=r"element must be 'e4m3' or 'e5m2'.*got 'e4m3fn'"):
        TensorMap(raw, (64, 64), element="e4m3fn")
    with pytest.raises(TensorMapError, match=r"element='e4m3' describes float8 data, one byte per element.*4-byte "
                                             r"float32 elements"):
        TensorMap(FakeCudaArray((64, 128), np.float32), (64, 32), element="e4m3")
    with pytest.raises(TensorMapError, match=r"oob_fill=NAN needs a floating-point dtype"):
        TensorMap(raw, (64, 64), element="e4m3", oob_fill="nan")
    # views of float8 memory hand kernels the bits (uint8), as bfloat16 views hand them uint16
    layout = numbatma.tensormap.ArrayLayout(1 << 20, (64, 128), (128, 1), np.dtype(ml_dtypes.float8_e4m3fn))
    assert numbatma.layout_view(layout, raw).__cuda_array_interface__["typestr"] == "|u1"


# -- kernels, as numba-cuda builds them on a GPU (LTO) -----------------------------------------------------------------
BUILDS = {  # name -> (case, SASS patterns, the GMMA instructions)
    "bf16-tile-stmatrix": (K.make(n=128, out="tile", out_dtype="bf16", c_swizzle=128, groups=2, alpha=True,
                                  bias="global", scale0=True, a_swizzle=64, b_swizzle=64, k_steps=2),
                           [r"STSM\.16\.M88\.4", r"UTMASTG"], ["HGMMA.64x128x16.F32.BF16"]),
    "f16-MN-reg": (K.make(n=256, a="f16", a_src="reg", b_major="MN", b_swizzle=64, k_steps=2), [r"\bST\.E\b"],
                   ["HGMMA.64x256x16.F32"]),  # (f16 operands: no suffix)
    "tf32": (K.make(n=120, a="tf32", b_swizzle=32, k_steps=2), [], ["HGMMA.64x120x8.F32.TF32"]),
    "fp8-mixed-f16acc": (K.make(n=96, a="e4m3", b="e5m2", acc="f16", out="global", out_dtype="float16",
                                a_swizzle=64, b_swizzle=64), [], ["QGMMA.64x96x32.F16.E4M3.E5M2"]),
    "chain": (K.make(n=64, chain=(32, "MN", 64), a_swizzle=64, b_swizzle=64, k_steps=2),
              [r"F2FP\.BF16\.F32\.PACK_AB"], ["HGMMA.64x64x16.F32.BF16", "HGMMA.64x32x16.F32.BF16"]),
    "f16acc-rowcol-wg2": (K.make(n=64, a="f16", acc="f16", out="rowcol", groups=2, b_swizzle=0, k_steps=2), [],
                          ["HGMMA.64x64x16.F16"]),
}


@functools.lru_cache(maxsize=None)
def _build(name):
    """(SASS, ptxas info log) of a kernel linked with link-time optimisation, as numba-cuda does on a GPU."""
    from cuda.core import Linker, LinkerOptions, ObjectCode
    from numba.cuda.typing.typeof import typeof

    from numbatma._numba_internals import offline_target

    case = BUILDS[name][0]
    args = tuple(a if isinstance(a, types.Type) else typeof(a) for a in K.compile_args(case))
    with offline_target((9, 0, "a")):
        ltoir, _ = cuda.compile(K.gemm_kernel(case).py_func, args, device=False, abi="numba", cc=(9, 0, "a"),
                                output="ltoir")
    linker = Linker(ObjectCode.from_ltoir(ltoir), options=LinkerOptions(arch="sm_90a", link_time_optimization=True,
                                                                        verbose=True))
    cubin = linker.link("cubin").code
    return nbc.sass(cubin), linker.get_info_log()


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_sass(name):
    sass, log = _build(name)
    case, patterns, shapes = BUILDS[name]
    for pattern in patterns:
        assert re.search(pattern, sass), f"{pattern} not in the SASS of {case.name}"
    # (a commit_group is a predicated-off HGMMA.64x8x16.F16 RZ, gdesc[URZ], RZ, !UPT: not counted)
    found = re.findall(r"\b([HQ]GMMA\.\S+) (?!RZ, gdesc\[URZ\])", sass)
    assert set(found) == set(shapes), found
    assert not re.search(r"\b(STL|LDL)\b", sass), "local memory"
    if case.a_src == "reg" and _nvjitlink_version() < (13, 5):
        # Seen on the GPU image (nvJitLink < 13.5): its ptxas injects a warpgroup.arrive (C7519) for A fragments
        # gathered from global memory inside the k-loop, where nvJitLink 13.5 does not. A test-kernel pattern
        # (real kernels build fragments from accumulators); the HGMMA shapes and no local memory still hold.
        return
    assert not re.search(r"C75\d\d", log), log  # ptxas serializes wgmma it cannot pipeline (C7509, C7510, C7519..)


def _nvjitlink_version():
    from cuda.bindings import nvjitlink

    return tuple(nvjitlink.version())


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_other_targets_name_what_to_use_instead(arch):
    case = BUILDS["tf32"][0]
    with pytest.raises(UnsupportedTarget, match=rf"wgmma.*not available when compiling for {arch}.*mma_m16n8k16"):
        nbc.compile_ptx(K.gemm_kernel(case).py_func, K.compile_args(case), arch)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a", "sm_120a"])
def test_the_helpers_alone_compile_everywhere(arch):
    """Accumulator helpers without wgmma (zeros, bias, alpha, A fragments, global stores) need no sm_90a."""

    def kernel(bias, out):
        acc = wgmma_add_bias(wgmma_scale(wgmma_zeros(32), 2.0), bias, 0)
        frags = wgmma_a_fragments(acc, "f16")
        out[0, 0] = np.float32(frags[1][3])
        wgmma_store_global(acc, out, 0, 1)

    ptx = nbc.compile_ptx(kernel, (f32[::1], f32[:, :]), arch)
    assert "cvt.rn.f16x2.f32" in ptx and "wgmma." not in ptx


# -- typing errors -----------------------------------------------------------------------------------------------------
def fake_map(shape, kind, box, swizzle, **kw):
    import ml_dtypes

    dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "tf32": np.float32, "u8": np.uint8}[kind]
    return TensorMap(FakeCudaArray(shape, dtype), box, swizzle=swizzle, **kw)


BF16_K = fake_map((64, 64), "bf16", (64, 64), 128)  # (64 rows, 64 along K), 128B swizzle
BF16_K32 = fake_map((64, 64), "bf16", (64, 32), 64)
F16_K = fake_map((64, 64), "f16", (64, 64), 128)
TF32_K = fake_map((64, 64), "tf32", (64, 32), 128)
E4M3_K = fake_map((64, 128), "u8", (64, 128), 128, element="e4m3")
U8_K = fake_map((64, 128), "u8", (64, 128), 128)


def _fails(fn, args, *fragments):
    with pytest.raises(NumbaError) as info:
        nbc.compile_ptx(fn, args)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message}"


def _tile_kernel(dtype, shape, body):
    """A kernel declaring a shared tile ``shape`` of ``dtype`` and running ``body(tile, a_map, b_map, out)``."""
    body = cuda.jit(device=True)(body)

    def kernel(a_map, b_map, out):
        tile = cuda.shared.array(shape, dtype, alignment=1024)
        body(tile, a_map, b_map, out)

    return kernel


def _mma_k64(tile, a_map, b_map, out):
    acc = wgmma_fence(wgmma_zeros(64))
    acc = wgmma(acc, wgmma_desc(tile, a_map, "K", 0, 0), wgmma_desc(tile, b_map, "K", 0, 0), 1)
    wgmma_commit_group()
    out[0] = wgmma_wait_group(0, acc)[0]


def _mma_n128(tile, a_map, b_map, out):
    acc = wgmma_zeros(128)
    acc = wgmma(acc, wgmma_desc(tile, a_map, "K", 0, 0), wgmma_desc(tile, b_map, "K", 0, 0), 1)
    out[0] = acc[0]


def _mma_f16acc(tile, a_map, b_map, out):
    acc = wgmma_zeros_f16(64)
    acc = wgmma(acc, wgmma_desc(tile, a_map, "K", 0, 0), wgmma_desc(tile, b_map, "K", 0, 0), 1)
    out[0] = np.float32(acc[0])


def _desc_mn(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "MN", 0, 0)


def _desc_mn4(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "K", 4, 0)


def _desc_k8(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "K", 0, 8)


def _desc_k_past(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "K", 0, 64)


def _desc_major(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "M", 0, 0)


def _reg_a(tile, a_map, b_map, out):
    u = np.uint32(0)
    acc = wgmma(wgmma_zeros(64), (u, u, u, u), wgmma_desc(tile, b_map, "K", 0, 0), 1)
    out[0] = acc[0]


def _runtime_n(tile, a_map, b_map, out):
    wgmma_zeros(out.shape[0])


def _n_12(tile, a_map, b_map, out):
    wgmma_zeros(12)


def _float_scale(tile, a_map, b_map, out):
    wgmma(wgmma_zeros(64), wgmma_desc(tile, a_map, "K", 0, 0), wgmma_desc(tile, b_map, "K", 0, 0), 0.5)


def _fence_float(tile, a_map, b_map, out):
    wgmma_fence(out[0])


def _wait_8(tile, a_map, b_map, out):
    wgmma_wait_group(8, wgmma_zeros(8))


def _getitem_past(tile, a_map, b_map, out):
    out[0] = wgmma_zeros(8)[4]


def _frag_f16acc(tile, a_map, b_map, out):
    wgmma_a_fragments(wgmma_zeros_f16(64), "f16")


def _frag_n24(tile, a_map, b_map, out):
    wgmma_a_fragments(wgmma_zeros(24), "bf16")


def _frag_kind(tile, a_map, b_map, out):
    wgmma_a_fragments(wgmma_zeros(32), "tf32")


def _store_global_1d(tile, a_map, b_map, out):
    wgmma_store_global(wgmma_zeros(32), out, 0, 0)


def _bias_f64(tile, a_map, b_map, out):
    wgmma_add_bias(wgmma_zeros(32), out, 0)


def _store_f16acc(tile, a_map, b_map, out):
    wgmma_store(wgmma_zeros_f16(64), tile, a_map, 0, 0)


def _range_odd(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "K", 0, (0, 24))


def _range_past(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "K", 0, (0, 128))


def _range_runtime(tile, a_map, b_map, out):
    wgmma_desc(tile, a_map, "K", 0, (0, out.shape[0]))


def _range_b_single(tile, a_map, b_map, out):
    acc = wgmma(wgmma_zeros(64), wgmma_desc(tile, a_map, "K", 0, (0, 64)), wgmma_desc(tile, b_map, "K", 0, 0), 1)
    out[0] = acc[0]


def _range_counts(tile, a_map, b_map, out):
    acc = wgmma(wgmma_zeros(64), wgmma_desc(tile, a_map, "K", 0, (0, 32)), wgmma_desc(tile, b_map, "K", 0, (0, 64)),
                1)
    out[0] = acc[0]


def _range_fragments(tile, a_map, b_map, out):
    p = wgmma_a_fragments(wgmma_zeros(32), "bf16")  # two fragments
    acc = wgmma(wgmma_zeros(64), p, wgmma_desc(tile, b_map, "MN", 0, (0, 64)), 1)
    out[0] = acc[0]


MISUSE = [
    # (name, tile dtype, tile shape, body, A map, B map, out type, message fragments)
    ("range off the grid", np.uint16, (64, 64), _range_odd, BF16_K, BF16_K, f32[::1],
     ["k=(0, 24): k0 and k1 - k0 must be non-negative multiples of the bf16 k-step 16"]),
    ("range past the tile", np.uint16, (64, 64), _range_past, BF16_K, BF16_K, f32[::1],
     ["k=(0, 128) reaches past the operand's K extent 64"]),
    ("range not constant", np.uint16, (64, 64), _range_runtime, BF16_K, BF16_K, f32[::1],
     ["k must be an integer or a pair of constants (k0, k1)"]),
    ("range A, single B", np.uint16, (64, 64), _range_b_single, BF16_K, BF16_K, f32[::1],
     ["but B is a single k-step", "give B as a range too"]),
    ("range lengths", np.uint16, (64, 64), _range_counts, BF16_K, BF16_K, f32[::1],
     ["A covers 2 k-steps but B 4"]),
    ("fragments vs range", np.uint16, (64, 64), _range_fragments, BF16_K, BF16_K, f32[::1],
     ["A covers 2 k-steps but B 4"]),
    ("swizzle rows", np.uint16, (64, 64), _mma_k64, fake_map((64, 64), "bf16", (64, 32), 128), BF16_K, f32[::1],
     ["the TensorMap's box rows are 64 bytes but its 128-byte swizzle needs rows of exactly 128 bytes",
      "Use a 64-byte swizzle or a box 64 elements wide"]),
    ("not the box", np.uint16, (32, 64), _mma_k64, BF16_K, BF16_K, f32[::1],
     ["the tile (32, 64) must be one box (64, 64) of the TensorMap"]),
    ("too narrow B", np.uint16, (64, 64), _mma_n128, BF16_K, BF16_K, f32[::1],
     ["the accumulator is m64n128 but B", "has only 64 columns along N"]),
    ("mn off the grid", np.uint16, (64, 64), _desc_mn4, BF16_K, BF16_K, f32[::1],
     ["mn must be a non-negative multiple of 8, got 4"]),
    ("k off the grid", np.uint16, (64, 64), _desc_k8, BF16_K, BF16_K, f32[::1],
     ["k must be a non-negative multiple of 16, got 8"]),
    ("k past the tile", np.uint16, (64, 64), _desc_k_past, BF16_K, BF16_K, f32[::1],
     ["k=64: a bf16 k-step of 16 does not fit the operand's K extent 64"]),
    ("major", np.uint16, (64, 64), _desc_major, BF16_K, BF16_K, f32[::1], ["major must be one of 'K', 'MN'"]),
    ("tf32 MN-major", np.float32, (64, 32), _desc_mn, TF32_K, TF32_K, f32[::1],
     ["a tf32 operand must be K-major: PTX transposes (reads MN-major) only bf16/f16 operands"]),
    ("fp8 MN-major", np.uint8, (64, 128), _desc_mn, E4M3_K, E4M3_K, f32[::1], ["a e4m3 operand must be K-major"]),
    ("uint8 without element", np.uint8, (64, 128), _desc_mn, U8_K, U8_K, f32[::1],
     ["the TensorMap moves UINT8 elements", "element='e4m3' or element='e5m2'"]),
    ("tile dtype", np.float16, (64, 64), _mma_k64, BF16_K, BF16_K, f32[::1],
     ["the tile has dtype float16 but the TensorMap moves uint16"]),
    ("bf16 x f16", np.uint16, (64, 64), _mma_k64, BF16_K, F16_K, f32[::1], []),  # (tile dtype differs: below)
    ("f16 acc with bf16", np.uint16, (64, 64), _mma_f16acc, BF16_K, BF16_K, f32[::1],
     ["float16 accumulators take f16 or float8 operands, not bf16"]),
    ("f16 acc with tf32", np.float32, (64, 32), _mma_f16acc, TF32_K, TF32_K, f32[::1],
     ["float16 accumulators take f16 or float8 operands, not tf32"]),
    ("register A with float8 B", np.uint8, (64, 128), _reg_a, E4M3_K, E4M3_K, f32[::1],
     ["A from registers with a float8 B"]),
    ("non-constant N", np.uint16, (64, 64), _runtime_n, BF16_K, BF16_K, f32[::1],
     ["N must be a compile-time constant integer"]),
    ("N = 12", np.uint16, (64, 64), _n_12, BF16_K, BF16_K, f32[::1], ["N must be a multiple of 8 in 8..256"]),
    ("float scale_d", np.uint16, (64, 64), _float_scale, BF16_K, BF16_K, f32[::1], ["scale_d must be an integer"]),
    ("fence a float", np.uint16, (64, 64), _fence_float, BF16_K, BF16_K, f32[::1],
     ["wgmma_fence: expected a wgmma accumulator", "a register A fragment (four uint32)"]),
    ("wait 8", np.uint16, (64, 64), _wait_8, BF16_K, BF16_K, f32[::1], ["N must be in 0..7, got 8"]),
    ("register past the end", np.uint16, (64, 64), _getitem_past, BF16_K, BF16_K, f32[::1],
     ["index 4 is out of range for wgmma_accumulator(m64n8, f32) (4 registers)"]),
    ("fragments of f16 acc", np.uint16, (64, 64), _frag_f16acc, BF16_K, BF16_K, f32[::1],
     ["wgmma_a_fragments: expected a float32 wgmma accumulator"]),
    ("fragments of N=24", np.uint16, (64, 64), _frag_n24, BF16_K, BF16_K, f32[::1],
     ["the accumulator is m64n24; an A fragment is 16 columns"]),
    ("fragment kind", np.uint16, (64, 64), _frag_kind, BF16_K, BF16_K, f32[::1],
     ["kind must be one of 'bf16', 'f16', got 'tf32'"]),
    ("store_global 1-D", np.uint16, (64, 64), _store_global_1d, BF16_K, BF16_K, f32[::1],
     ["wgmma_store_global: the destination must be a 2-D array"]),
    ("store_global int32", np.uint16, (64, 64), _store_global_1d, BF16_K, BF16_K, types.int32[:, ::1],
     ["the destination holds int32; the accumulator converts to float32, float16 or uint16"]),
    ("store_global read-only", np.uint16, (64, 64), _store_global_1d, BF16_K, BF16_K,
     types.Array(f32, 2, "C", readonly=True), ["is read-only"]),
    ("bias float64", np.uint16, (64, 64), _bias_f64, BF16_K, BF16_K, types.float64[::1],
     ["bias must be a 1-D float32 array"]),
    ("bias 2-D", np.uint16, (64, 64), _bias_f64, BF16_K, BF16_K, f32[:, ::1], ["bias must be a 1-D float32 array"]),
    ("store f16 acc", np.uint16, (64, 64), _store_f16acc, BF16_K, BF16_K, f32[::1],
     ["wgmma_store: expected a float32 wgmma accumulator"]),
]


@pytest.mark.parametrize("name, dtype, shape, body, a_map, b_map, out, fragments", MISUSE,
                         ids=[m[0] for m in MISUSE])
def test_typing_errors(name, dtype, shape, body, a_map, b_map, out, fragments):
    if name == "bf16 x f16":  # one bf16 tile for A, one f16 tile for B
        def kernel(a_map, b_map, out):
            ta = cuda.shared.array((64, 64), np.uint16, alignment=1024)
            tb = cuda.shared.array((64, 64), np.float16, alignment=1024)
            acc = wgmma(wgmma_zeros(64), wgmma_desc(ta, a_map, "K", 0, 0), wgmma_desc(tb, b_map, "K", 0, 0), 1)
            out[0] = acc[0]

        fragments = ["A is bf16 but B is f16; both must be the same kind"]
    else:
        kernel = _tile_kernel(dtype, shape, body)
    _fails(kernel, (a_map, b_map, out), *fragments)


def test_fp8_pairs_and_register_a_compile():
    """Mixed float8 pairs are legal; A from registers takes B's 16-bit kind; a fence carries fragments."""

    def kernel(a_map, b_map, out):
        ta = cuda.shared.array((64, 128), np.uint8, alignment=1024)
        tb = cuda.shared.array((64, 128), np.uint8, alignment=1024)
        acc = wgmma_fence(wgmma_zeros(64))
        acc = wgmma(acc, wgmma_desc(ta, a_map, "K", 0, 32), wgmma_desc(tb, b_map, "K", 0, 96), 1)
        wgmma_commit_group()
        out[0] = wgmma_wait_group(0, acc)[0]

    e5m2 = fake_map((64, 128), "u8", (64, 128), 128, element="e5m2")
    ptx = nbc.compile_ptx(kernel, (E4M3_K, e5m2, f32[::1]))
    assert "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e5m2" in ptx

    def kernel_reg(b_map, out):
        tb = cuda.shared.array((64, 64), np.float16, alignment=1024)
        u = np.uint32(7)
        acc, frag = wgmma_fence((wgmma_zeros(64), (u, u, u, u)))
        acc = wgmma(acc, frag, wgmma_desc(tb, b_map, "K", 0, 16), 1)
        wgmma_commit_group()
        out[0] = wgmma_wait_group(0, acc)[0]

    ptx = nbc.compile_ptx(kernel_reg, (F16_K, f32[::1]))
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.f16\.f16 \{[^}]*\}, \{%r\d+, %r\d+, %r\d+, "
                     r"%r\d+\}, %rd\d+, p, 1, 1, 0;", ptx)
    assert ".local" not in ptx


def test_k_ranges_issue_every_step_back_to_back():
    """One wgmma call over k=(0, 64) of a 64 x 64 bf16 tile: four HGMMA, no wait between them; the descriptors
    advance by 32 bytes (2 in the 16-byte start-address field) per k-step; register A as a tuple of fragments."""
    def kernel(a_map, b_map, out):
        a = cuda.shared.array((64, 64), np.uint16, alignment=1024)
        b = cuda.shared.array((64, 64), np.uint16, alignment=1024)
        acc = wgmma_fence(wgmma_zeros(64))
        acc = wgmma(acc, wgmma_desc(a, a_map, "K", 0, (0, 64)), wgmma_desc(b, b_map, "K", 0, (0, 64)), 0)
        wgmma_commit_group()
        acc = wgmma_wait_group(0, acc)
        p = wgmma_a_fragments(acc, "bf16")  # four fragments: the k-steps of a 64-long K
        o, p = wgmma_fence((wgmma_zeros(64), p))
        o = wgmma(o, p, wgmma_desc(b, b_map, "MN", 0, (0, 64)), 1)
        wgmma_commit_group()
        wgmma_store_global(wgmma_wait_group(0, o), out, 0, 0)

    args = (BF16_K, BF16_K, f32[:, ::1])
    ptx = nbc.compile_ptx(kernel, args)
    assert ptx.count("wgmma.mma_async") == 8
    sass = nbc.sass(nbc.compile_cubin(kernel, args))
    ops = [line.split("*/")[1].split()[0] for line in sass.splitlines()
           if "*/" in line and ("HGMMA" in line or "WARPGROUP.DEPBAR" in line)]
    assert ops == ["HGMMA.64x64x16.F32.BF16"] * 4 + ["WARPGROUP.DEPBAR.LE"] + ["HGMMA.64x64x16.F32.BF16"] * 4 \
        + ["WARPGROUP.DEPBAR.LE"], ops
    assert "STL" not in sass and "LDL" not in sass
