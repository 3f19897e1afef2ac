"""CPU tests of swizzled tile views (numbatma.intrinsics.swizzle): the mapping against the simulator's TMA byte
placement (``tma.tile_chunks``, checked against an H200 by tests/test_gpu_swizzle_image.py) for every swizzle,
element size and row width, in pure NumPy and through the lowering's own LLVM IR run on the host; the kernels
of tests/swizzle_kernels.py compiling and linking for every target with shared loads/stores, no local memory
and no more arithmetic than a shift, an and and an xor; misuse as typing errors in the user's terms."""
import ctypes
import itertools
import re
from types import SimpleNamespace

import numpy as np
import pytest
from numba import cuda
from numba.core.errors import TypingError
from numba.cuda import types

from numbatma import TensorMap, compile as nbc
from numbatma.intrinsics._asm import TARGETS
from numbatma.intrinsics.tma import tile_chunks as _tile_chunks
from numbatma.intrinsics.swizzle import SwizzledTileType, _element_index, _IrInt, swizzle_map, swizzle_offset, \
    swizzled

import swizzle_kernels as K
from fakes import FakeCudaArray

ITEMSIZES = {1: "uint8", 2: "uint16", 4: "float32", 8: "float64"}


# -- the mapping ----------------------------------------------------------------------------------------------------
def _placement(span, itemsize, box):
    """Flat element index in the tile of every element of the box, from the simulator's chunk placement."""
    row_bytes = box[-1] * itemsize
    nbytes = int(np.prod(box)) * itemsize
    chunks = _tile_chunks(SimpleNamespace(swizzle=span), row_bytes, nbytes)
    dense = np.arange(nbytes).reshape(-1, 16)  # byte b of the dense box
    where = (chunks[:, None] * 16 + np.arange(16)).reshape(-1)  # ... lands at this byte of the tile
    tile_byte = np.empty(nbytes, np.int64)
    tile_byte[dense.reshape(-1)] = where
    first = tile_byte[::itemsize]
    assert np.array_equal(first % itemsize, np.zeros_like(first))  # (elements never straddle chunks)
    return (first // itemsize).reshape(box)


def _all_layouts():
    """(span, itemsize, box): every span, element size and row width TMA allows (a multiple of 16 bytes up to
    the span; up to 256 bytes unswizzled), with 1, 8 and 24 rows and a rank-3 box."""
    for span, itemsize in itertools.product((0, 32, 64, 128), (1, 2, 4, 8)):
        for width in range(16, (span or 256) + 1, 16):
            cols = width // itemsize
            if cols > 256:
                continue
            for lead in ((), (1,), (8,), (24,), (3, 5)):
                yield span, itemsize, lead + (cols,)


LAYOUTS = list(_all_layouts())


def _desc_facts(span, itemsize, box):
    from numbatma.tensormap import tile_footprint

    shared = tile_footprint(box, (1,) * len(box), itemsize, span)[0]
    return SimpleNamespace(swizzle=span, box=box, shared_shape=shared, itemsize=itemsize, interleave=0,
                           element_strides=(1,) * len(box))


def test_the_mapping_is_the_simulators_tma_placement():
    assert len(LAYOUTS) > 200
    for span, itemsize, box in LAYOUTS:
        got = swizzle_map(_desc_facts(span, itemsize, box))
        want = _placement(span, itemsize, box)
        assert np.array_equal(got, want), (span, itemsize, box)


def test_swizzle_map_of_a_tensormap():
    d = TensorMap(FakeCudaArray((64, 64), np.float32), (16, 8), swizzle=64)
    m = swizzle_map(d)
    assert m.shape == (16, 8) and d.shared_shape == (16, 16)
    assert m[0].tolist() == list(range(8))  # rows 0, 1: no XOR
    assert m[2].tolist() == [36, 37, 38, 39, 32, 33, 34, 35]  # row 2 starts at byte 128: chunks 0/1 swap
    assert sorted(m.reshape(-1)) == sorted(set(m.reshape(-1)))  # a bijection onto the box's elements


def _host_jit(layout, rank):
    """The lowering's own index arithmetic (``_element_index`` on ``_IrInt``), as a host function
    ``int32 f(int32 *indices)`` compiled by LLVM."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    i32 = ir.IntType(32)
    module = ir.Module("swizzle_index")
    module.triple = llvm.get_process_triple()
    fn = ir.Function(module, ir.FunctionType(i32, [i32.as_pointer()]), "index")
    builder = ir.IRBuilder(fn.append_basic_block())
    args = [_IrInt(builder, builder.load(builder.gep(fn.args[0], [ir.Constant(i32, k)]))) for k in range(rank)]
    builder.ret(_element_index(layout, args).value)
    target = llvm.Target.from_default_triple().create_target_machine()
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)), target)
    engine.finalize_object()
    f = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_int32))(engine.get_function_address("index"))
    return engine, f


def test_the_lowered_arithmetic_is_the_mapping():
    """Run the IR the GPU lowering emits (32-bit index arithmetic) on the host for a spread of layouts."""
    picked = [lay for lay in LAYOUTS if lay[2][0] in (8, 3) or len(lay[2]) == 1]
    assert len(picked) > 60
    for span, itemsize, box in picked:
        facts = _desc_facts(span, itemsize, box)
        layout = (tuple(facts.shared_shape), itemsize, span)
        engine, f = _host_jit(layout, len(box))
        want = _placement(span, itemsize, box)
        buf = (ctypes.c_int32 * len(box))()
        for idx in np.ndindex(*box):
            buf[:] = idx
            assert f(buf) == want[idx], (span, itemsize, box, idx)
        del engine


# -- compilation ----------------------------------------------------------------------------------------------------
def _array(dtype, ndim):
    return types.Array(getattr(types, dtype), ndim, "C")


def _load_args(span, dtype, box):
    itemsize = np.dtype(dtype).itemsize
    desc = TensorMap(FakeCudaArray(K.source_shape(box, itemsize), dtype), box, swizzle=span)
    out = _array(dtype, 2 * len(box)) if len(box) > 1 else _array(dtype, 2)
    return K.load_kernel(dtype, box, desc.shared_shape, span).py_func, (desc, out, out, types.int64)


def _store_args(span, dtype, box):
    itemsize = np.dtype(dtype).itemsize
    desc = TensorMap(FakeCudaArray(K.source_shape(box, itemsize), dtype), box, swizzle=span)
    return K.store_kernel(dtype, box, desc.shared_shape).py_func, (_array(dtype, len(box)), desc, types.int64)


@pytest.mark.parametrize("span, dtype, box", K.CASES, ids=K.IDS)
def test_kernels_compile_for_sm90a(span, dtype, box):
    for fn, args in (_load_args(span, dtype, box), _store_args(span, dtype, box)):
        ptx = nbc.compile_ptx(fn, args, "sm_90a")
        assert ".local" not in ptx, "local memory"
        assert re.search(r"ld\.shared\.", ptx) or re.search(r"st\.shared\.", ptx)
        assert nbc.link_cubin(ptx, "sm_90a")


@pytest.mark.parametrize("arch", TARGETS)
def test_kernels_link_for_every_target_without_local_memory(arch):
    for case in [(128, "float32", (16, 32)), (64, "float32", (3, 4, 8)), (32, "uint8", (8, 32))]:
        for kind, (fn, args) in (("load", _load_args(*case)), ("store", _store_args(*case))):
            ptx = nbc.compile_ptx(fn, args, arch)
            sass = nbc.sass(nbc.link_cubin(ptx, arch))
            assert ".local" not in ptx
            assert "LDS" in sass or "STS" in sass
            if arch == "sm_120a" and kind == "load":
                # ptxas gives sm_120a's shared::cluster TMA load a slow path (CALL.ABS.NOINC) with a stack slot
                # of its own, views or not (a kernel of tma_load alone has it too): only that one store.
                assert sass.count("STL") == 1 and "CALL.ABS.NOINC" in sass and "LDL" not in sass
            else:
                assert "STL" not in sass and "LDL" not in sass


D64 = TensorMap(FakeCudaArray((64, 64), np.float32), (16, 8), swizzle=64)  # shared shape (16, 16)
SHAPE64 = D64.shared_shape
RING64 = (2,) + SHAPE64


def _arith(ptx):
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    return [ln.split()[0] for ln in body.splitlines() if re.match(r"\s+(shl|shr|and|xor|mul|mad|add|sub|or)\.", ln)]


def test_an_access_costs_a_shift_an_and_and_an_xor():
    """The swizzled read of ``[i, j]`` is the unswizzled one (same row pitch) plus exactly shr, and, xor."""

    def plain(desc, out, i, j):
        tile = cuda.shared.array(SHAPE64, np.float32, alignment=1024)
        out[0] = tile[i, j]

    def view(desc, out, i, j):
        tile = cuda.shared.array(SHAPE64, np.float32, alignment=1024)
        out[0] = swizzled(tile, desc)[i, j]

    flat_desc = TensorMap(FakeCudaArray((64, 64), np.float32), (16, 16))  # same shape, no swizzle
    args = (types.float32[:], types.uint32, types.uint32)
    a = _arith(nbc.compile_ptx(view, (D64,) + args))
    b = _arith(nbc.compile_ptx(view, (flat_desc,) + args))
    assert sorted(a) == sorted(b + ["shr.u32", "and.b32", "xor.b32"]), (a, b)
    c = _arith(nbc.compile_ptx(plain, (flat_desc,) + args))
    assert len(b) <= len(c)  # (no more than numba's own indexing of the tile)


def test_view_shape_is_a_compile_time_box():
    def kern(desc, out):
        tile = cuda.shared.array(SHAPE64, np.float32, alignment=1024)
        v = swizzled(tile, desc)
        out[0] = v.shape[0] * 1000 + v.shape[1]

    ptx = nbc.compile_ptx(kern, (D64, types.int64[:]))
    assert "16008" in ptx


def test_swizzle_offset_lowers_to_the_formula():
    def kern(out, o):
        out[0] = swizzle_offset(128, o)
        out[1] = swizzle_offset(0, o)

    ptx = nbc.compile_ptx(kern, (types.uint32[:], types.uint32))
    assert "xor.b32" in ptx and ".local" not in ptx


def test_types():
    t = SwizzledTileType(types.float32, (16, 8), (16, 16), 64)
    assert (t.dtype, t.shape, t.span, t.itemsize, t.shared_shape) == (types.float32, (16, 8), 64, 4, (16, 16))
    assert "swizzle=64B" in str(t) and "rows of 64B" in str(t)


# -- typing errors ---------------------------------------------------------------------------------------------------
def _compile(fn, *args):
    return nbc.compile_ptx(fn, args)


def test_tile_in_global_memory_is_refused():
    def kern(desc, out):
        swizzled(out, desc)[0, 0] = 1.0

    with pytest.raises(TypingError, match=r"swizzled: the tile must be a shared-memory array "
                                          r"\(from cuda.shared.array\);"
                                          r" got .*not known to live in shared memory"):
        _compile(kern, D64, types.float32[:, :])


def test_local_tile_is_refused():
    def kern(desc, out):
        t = cuda.local.array(SHAPE64, np.float32)
        out[0] = swizzled(t, desc)[0, 0]

    with pytest.raises(TypingError, match=r"swizzled: the tile must be a shared-memory array"):
        _compile(kern, D64, types.float32[:])


def test_tile_of_the_box_bytes_is_refused_with_the_expected_shape():
    def kern(desc, out):
        t = cuda.shared.array((16, 8), np.float32)
        out[0] = swizzled(t, desc)[0, 0]

    with pytest.raises(TypingError, match=r"swizzled: the shared tile has shape \(16, 8\) but one box of the "
                                          r"descriptor occupies shape \(16, 16\); expected a tile of shape \(16, 16\) "
                                          r"\(desc.shared_shape; box \(16, 8\) of float32: its 32-byte rows are "
                                          r"narrower than the 64-byte swizzle span, so each takes a whole span\), "
                                          r"e.g. cuda.shared.array\(desc.shared_shape, ..., alignment=512\)"):
        _compile(kern, D64, types.float32[:])


def test_tile_of_another_dtype_is_refused():
    def kern(desc, out):
        t = cuda.shared.array(SHAPE64, np.int32)
        out[0] = swizzled(t, desc)[0, 0]

    with pytest.raises(TypingError, match=r"swizzled: the shared tile has dtype int32 but the descriptor moves float32 "
                                          r"elements; expected a tile of shape \(16, 16\)"):
        _compile(kern, D64, types.float32[:])


def test_tile_of_unknown_shape_needs_the_rank():
    def ok(desc, out, s):
        ring = cuda.shared.array(RING64, np.float32, alignment=1024)
        out[0] = swizzled(ring[s], desc)[3, 4]

    assert ".local" not in _compile(ok, D64, types.float32[:], types.int64)

    def bad(desc, out, s):
        ring = cuda.shared.array((2, 16 * 16), np.float32, alignment=1024)
        out[0] = swizzled(ring[s], desc)[3, 4]

    with pytest.raises(TypingError, match=r"swizzled: the shared tile has 1 dimensions but the descriptor's box has 2"):
        _compile(bad, D64, types.float32[:], types.int64)


@pytest.mark.parametrize("index, message", [
    ("[1]", r"swizzled view: the view of a rank-2 box \(16, 8\) takes 2 indices, view\[i0, c\]; got 1"),
    ("[1, 2, 3]", r"swizzled view: the view of a rank-2 box \(16, 8\) takes 2 indices, view\[i0, c\]; got 3"),
    ("[1, 2:3]", r"swizzled view: every index must be an integer \(slices and arrays are not supported\)"),
    ("[1, 2.0]", r"swizzled view: every index must be an integer"),
])
@pytest.mark.parametrize("access", ["read", "write"])
def test_wrong_indices_are_refused(index, message, access):
    stmt = f"out[0] = v{index}" if access == "read" else f"v{index} = 1.0"
    src = (f"def kern(desc, out):\n    t = cuda.shared.array(SHAPE64, np.float32, alignment=1024)\n"
           f"    v = swizzled(t, desc)\n    {stmt}\n")
    scope = {"cuda": cuda, "np": np, "SHAPE64": SHAPE64, "swizzled": swizzled}
    exec(src, scope)  # noqa: S102
    with pytest.raises(TypingError, match=message):
        _compile(scope["kern"], D64, types.float32[:])


def test_rank3_and_rank1_index_counts():
    d3 = TensorMap(FakeCudaArray((8, 8, 32), np.float32), (2, 4, 8), swizzle=64)
    s3 = d3.shared_shape

    def kern(desc, out):
        t = cuda.shared.array(s3, np.float32, alignment=1024)
        out[0] = swizzled(t, desc)[1, 2]

    with pytest.raises(TypingError, match=r"the view of a rank-3 box \(2, 4, 8\) takes 3 indices, view\[i0, i1, c\]"):
        _compile(kern, d3, types.float32[:])
    d1 = TensorMap(FakeCudaArray((64,), np.float32), (32,))

    def kern1(desc, out, i):
        t = cuda.shared.array(32, np.float32, alignment=128)
        v = swizzled(t, desc)
        v[i] = 2.0
        out[0] = v[i]

    assert ".local" not in _compile(kern1, d1, types.float32[:], types.int32)


def test_storing_an_unconvertible_value_is_refused():
    def kern(desc, out):
        t = cuda.shared.array(SHAPE64, np.float32, alignment=1024)
        swizzled(t, desc)[0, 0] = (1.0, 2.0)

    with pytest.raises(TypingError, match=r"swizzled view: cannot store a UniTuple\(float64 x 2\) into a tile "
                                          r"of float32"):
        _compile(kern, D64, types.float32[:])


def test_interleaved_descriptor_is_refused():
    d = TensorMap(FakeCudaArray((4, 8, 32), np.float32), (4, 8, 8), interleave=16)
    shape = d.shared_shape

    def kern(desc, out):
        t = cuda.shared.array(shape, np.float32, alignment=1024)
        out[0] = swizzled(t, desc)[0, 0, 0]

    with pytest.raises(TypingError, match=r"swizzled: the descriptor is interleaved \(interleave=16B\); swizzled views "
                                          r"support plain tiled descriptors only"):
        _compile(kern, d, types.float32[:])


def test_element_strides_are_refused():
    d = TensorMap(FakeCudaArray((16, 32), np.float32), (8, 32), element_strides=(2, 1), swizzle=128)
    shape = d.shared_shape

    def kern(desc, out):
        t = cuda.shared.array(shape, np.float32, alignment=1024)
        out[0] = swizzled(t, desc)[0, 0]

    with pytest.raises(TypingError, match=r"swizzled: the descriptor has element_strides \(2, 1\); swizzled views "
                                          r"support element strides of 1 only"):
        _compile(kern, d, types.float32[:])


def test_not_a_descriptor_is_refused():
    def kern(desc, out):
        t = cuda.shared.array(SHAPE64, np.float32, alignment=1024)
        out[0] = swizzled(t, out)[0, 0]

    with pytest.raises(TypingError, match=r"swizzled: the descriptor operand must be a numbatma.TensorMap"):
        _compile(kern, D64, types.float32[:])


def test_swizzle_offset_needs_a_constant_span():
    def runtime_span(out, s, o):
        out[0] = swizzle_offset(s, o)

    with pytest.raises(TypingError, match=r"swizzle_offset: the swizzle span must be a compile-time constant"):
        _compile(runtime_span, types.int64[:], types.int64, types.int64)

    def odd_span(out, o):
        out[0] = swizzle_offset(48, o)

    with pytest.raises(TypingError, match=r"swizzle_offset: the swizzle span must be one of \(0, 32, 64, 128\)"):
        _compile(odd_span, types.int64[:], types.int64)
