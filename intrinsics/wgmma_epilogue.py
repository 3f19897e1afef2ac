"""Out of wgmma accumulators: stores to shared tiles and global arrays, beta * C and bias terms, A fragments.

The accumulator helpers of :mod:`numbatma.intrinsics.wgmma` (all in registers, after the ``wgmma_wait_group``
that covers the accumulator): :func:`wgmma_add_bias` (a per-column bias vector), :func:`wgmma_add_tile`
(beta * C from a shared tile), :func:`wgmma_a_fragments` (bf16/f16 register A fragments of a following wgmma),
:func:`wgmma_store` (into a shared tile, swizzled, ready for a TMA store; ``stmatrix`` for 16-bit tiles) and
:func:`wgmma_store_global` (straight to a 2-D global array, bounds-checked per element: any M, N). Which
element of the tile a register holds: :func:`numbatma.intrinsics.wgmma_row_col`.

What they compile to: float32 pairs packed to bfloat16 / float16 (sm_80+), ``stmatrix`` stores (sm_90+; 16-bit
tiles of ``wgmma_store``), a read of the thread index and plain loads and stores - no wgmma instruction, so these
compile for every target that has those (the exact PTX: the end of each intrinsic's ``help()``). Each docstring says what the caller guarantees (the covering wait, whole warps
for ``stmatrix``, 1-D blocks).

Under the CUDA simulator the same calls read the thread's registers from its :class:`SimAccumulator` (a read
before the covering wait is reported), place the values where the GPU would (the tile's swizzle; row and column
from ``wgmma_row_col``) and round as ``cvt.rn`` does.
"""
from __future__ import annotations

import numpy as np

from ._asm import TARGETS, Ptx
from ._define import SIMULATING, device_op, fail, require_int, require_shared, sim
from .wgmma import SimAccumulator, SimFragment, fence_count, require_f32_accumulator, sim_thread, wgmma_row_col
from .wgmma_operands import literal_string

__all__ = [
    "wgmma_a_fragments",
    "wgmma_add_bias",
    "wgmma_add_tile",
    "wgmma_store",
    "wgmma_store_global",
]

if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types

    from numbatma._types import TensorMapType

    from ._define import shared_address
    from .wgmma import WgmmaAccumulatorType, bitcast_to

    I32, I64 = ir.IntType(32), ir.IntType(64)


_THREAD_X = Ptx("mov.u32 $tid, %tid.x;", out=("tid", "b32"), memory=False, min_sm=20)
_F32_TO_BF16X2 = Ptx("cvt.rn.bf16x2.f32 $out, $hi, $lo;", ins=(("hi", "f32"), ("lo", "f32")), out=("out", "b32"),
                     memory=False, min_sm=80)
_F32_TO_F16X2 = Ptx("cvt.rn.f16x2.f32 $out, $hi, $lo;", ins=(("hi", "f32"), ("lo", "f32")), out=("out", "b32"),
                    memory=False, min_sm=80)


# stmatrix of the epilogue: x4 (two 8-column blocks of the warp's 16 rows) and x2 (one block)
_STMATRIX = {count: Ptx(f"stmatrix.sync.aligned.m8n8.x{count}.shared.b16 [$addr], $r;",
                        ins=(("addr", "b32"), ("r", "b32", count)), min_sm=90, targets=TARGETS)
             for count in (2, 4)}
_PACK = {"bf16": _F32_TO_BF16X2, "f16": _F32_TO_F16X2}


def _epilogue_tile(op, acc, tile, tmap, row0, col0):
    """Typing checks shared by the epilogue helpers; returns the tile geometry and the converter (or None for
    float32)."""
    if not isinstance(acc, WgmmaAccumulatorType) or acc.dtype != "f32":
        fail(op, f"expected a float32 wgmma accumulator, got {acc}")
    require_shared(op, "the tile", tile)
    if not isinstance(tmap, TensorMapType):
        fail(op, f"the third argument must be the TensorMap of the tile, got {tmap}")
    if tile.static_shape is None or tile.dtype != tmap.dtype:
        fail(op, f"the tile must have a static shape and the TensorMap's dtype {tmap.dtype}")
    require_int(op, "row0", row0)
    require_int(op, "col0", col0)
    box_rows, box_cols = tuple(tmap.shared_shape[-2:])
    shape = tile.static_shape
    if shape[-2:] != (box_rows, box_cols) or len(shape) not in (2, 3):
        fail(op, f"the tile {shape} must be one box ({box_rows}, {box_cols}) of the TensorMap or a stack "
                 f"(groups, {box_rows}, {box_cols}) side by side along the columns")
    groups = shape[0] if len(shape) == 3 else 1
    width = groups * box_cols
    if width % 8 or acc.n % width:
        fail(op, f"the tile holds {width} columns; the accumulator's {acc.n} columns must be a whole number of "
                 f"such chunks (and a chunk a multiple of 8 columns)")
    if isinstance(col0, types.IntegerLiteral) and (col0.literal_value % width or
                                                   not 0 <= col0.literal_value < acc.n):
        fail(op, f"col0={col0.literal_value} must be a multiple of the tile's {width} columns below {acc.n}")
    tma = tmap.tma_dtype
    converters = {"BFLOAT16": _F32_TO_BF16X2, "FLOAT16": _F32_TO_F16X2, "FLOAT32": None, "TFLOAT32": None}
    if tma not in converters:
        fail(op, f"the tile's TensorMap moves {tma}; the epilogue converts float32 accumulators to bfloat16, "
                 f"float16 or float32")
    return dict(box_rows=box_rows, box_cols=box_cols, width=width, itemsize=tmap.itemsize, span=tmap.swizzle,
                convert=converters[tma], tma=tma)


def _chunk_addresses(context, builder, sig, args, geo):
    """(base byte pointer, per-half (row_bytes, xor)) for the thread's two rows of the fragment."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    data = context.make_array(sig.args[1])(context, builder, args[1]).data
    base = builder.bitcast(data, ir.IntType(8).as_pointer())
    tid = builder.urem(_THREAD_X.emit(builder), c(128))
    warp, lane = builder.udiv(tid, c(32)), builder.urem(tid, c(32))
    r0 = context.cast(builder, args[3], sig.args[3], types.int32)
    row_a = builder.add(builder.add(r0, builder.mul(warp, c(16))), builder.udiv(lane, c(4)))
    col_lane = builder.mul(builder.urem(lane, c(4)), c(2 * geo["itemsize"]))  # bytes
    pitch = geo["box_cols"] * geo["itemsize"]
    mask = geo["span"] // 16 - 1 if geo["span"] else 0
    halves = []
    for half in (0, 1):
        row_bytes = builder.mul(builder.add(row_a, c(8 * half)), c(pitch))
        xor = builder.shl(builder.and_(builder.lshr(row_bytes, c(7)), c(mask)), c(4)) if geo["span"] else c(0)
        halves.append((row_bytes, xor))
    return base, col_lane, halves


def _pair_pointer(builder, geo, base, col_lane, halves, chunk_col, half):
    """Pointer to the tile bytes of the thread's column pair at chunk column ``chunk_col`` (a multiple of 8),
    row half ``half``."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    group, in_box = chunk_col // geo["box_cols"], (chunk_col % geo["box_cols"]) * geo["itemsize"]
    row_bytes, xor = halves[half]
    colb = builder.xor(builder.add(col_lane, c(in_box)), xor)
    off = builder.add(builder.add(row_bytes, colb), c(group * geo["box_rows"] * geo["box_cols"] * geo["itemsize"]))
    return builder.gep(base, [builder.zext(off, I64)])


def _switch_chunks(context, builder, col0, n, width, emit, value):
    """``emit(value, chunk)`` for the chunk ``col0 // width`` selected at run time; returns the merged value."""
    chunks = n // width
    if chunks == 1:
        out = emit(value, 0)
        return value if out is None else out
    fn = builder.function
    done = fn.append_basic_block("wgmma_chunk_done")
    default = fn.append_basic_block("wgmma_chunk_none")
    switch = builder.switch(col0, default)
    results = []
    for chunk in range(chunks):
        block = fn.append_basic_block(f"wgmma_chunk_{chunk}")
        switch.add_case(ir.Constant(I32, chunk * width), block)
        builder.position_at_end(block)
        out = emit(value, chunk)
        results.append((value if out is None else out, builder.block))
        builder.branch(done)
    builder.position_at_end(default)
    builder.branch(done)
    builder.position_at_end(done)
    if value is None:
        return None
    phi = builder.phi(value.type)
    for v, block in results:
        phi.add_incoming(v, block)
    phi.add_incoming(value, default)
    return phi


def _chunked(context, builder, sig, args, col0_index, n, width, emit, value):
    ty = sig.args[col0_index]
    if isinstance(ty, types.IntegerLiteral):
        out = emit(value, ty.literal_value // width)
        return value if out is None else out
    col0 = context.cast(builder, args[col0_index], ty, types.int32)
    return _switch_chunks(context, builder, col0, n, width, emit, value)


@device_op(simulate=lambda acc, tile, tmap, row0, col0: _sim_store(acc, tile, tmap, row0, col0))
def wgmma_store(typingctx, acc, tile, tmap, row0, col0):
    """Write columns ``col0 .. col0 + W - 1`` of the float32 accumulator ``acc`` (m64nN) into the shared tile
    ``tile`` (``W`` columns wide) at rows ``row0 .. row0 + 63`` - converted to the tile's element type
    (bfloat16 for the uint16 tile of a BFLOAT16 TensorMap, float16, float32) and placed where a TMA store
    through ``tmap`` reads it (its swizzle). ``tile`` is one box of ``tmap`` (shape ``tmap.shared_shape``) or a
    stack of boxes side by side along the columns, a 3-D tile ``(groups, rows, box_columns)``. ``col0`` is a
    multiple of ``W`` (a run-time value selects the chunk with a switch; the registers stay static).

    16-bit tiles: each warp converts pairs of adjacent columns (``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32``)
    and writes them with ``stmatrix.sync.aligned.m8n8.x4.shared.b16`` - four 8 x 8 blocks per instruction, each
    lane giving one 16-byte row address (swizzled); float32 tiles: an 8-byte ``st.shared.v2.f32`` per column
    pair (with a 128-byte swizzle a warp's stores hit distinct banks). All threads of each warp call it together
    with the same ``row0`` / ``col0`` (``stmatrix`` is warp-collective). The block is 1-D (the thread's
    warpgroup index is ``threadIdx.x % 128``). The caller guarantees: ``acc`` was returned by the covering
    wait; the threads then fence (``fence_proxy_async_shared_cta()``) and synchronise before one thread
    TMA-stores the boxes."""
    geo = _epilogue_tile("wgmma_store", acc, tile, tmap, row0, col0)
    width, convert = geo["width"], geo["convert"]

    def codegen(context, builder, sig, args):
        if geo["itemsize"] == 2:
            lanes = _stmatrix_lanes(context, builder, sig, args, geo)

            def emit16(_, chunk):
                blocks = width // 8
                for j in range(0, blocks, 2):  # blocks j, j + 1 of the chunk: fragment blocks chunk * blocks + j..
                    first = chunk * blocks + j
                    count = 4 if j + 1 < blocks else 2
                    regs = [convert.emit(builder, hi=builder.extract_value(args[0], 4 * first + 2 * r + 1),
                                         lo=builder.extract_value(args[0], 4 * first + 2 * r))
                            for r in range(count)]
                    _STMATRIX[count].emit(builder, addr=_stmatrix_address(builder, geo, lanes, 8 * j), r=regs)

            _chunked(context, builder, sig, args, 4, acc.n, width, emit16, None)
            return context.get_dummy_value()

        base, col_lane, halves = _chunk_addresses(context, builder, sig, args, geo)

        def emit(_, chunk):
            for j in range(width // 8):  # column block j of the chunk: fragment block chunk * width / 8 + j
                block = chunk * width // 8 + j
                for half in (0, 1):
                    i = 4 * block + 2 * half
                    lo, hi = builder.extract_value(args[0], i), builder.extract_value(args[0], i + 1)
                    ptr = _pair_pointer(builder, geo, base, col_lane, halves, 8 * j, half)
                    vec = ir.VectorType(ir.FloatType(), 2)
                    v = builder.insert_element(builder.insert_element(ir.Constant(vec, None), lo,
                                                                      ir.Constant(I32, 0)), hi, ir.Constant(I32, 1))
                    builder.store(v, builder.bitcast(ptr, vec.as_pointer()), align=8)

        _chunked(context, builder, sig, args, 4, acc.n, width, emit, None)
        return context.get_dummy_value()

    return types.void(acc, tile, tmap, row0, col0), codegen


def _stmatrix_lanes(context, builder, sig, args, geo):
    """What ``stmatrix`` needs per lane for the tile ``args[1]``: (shared-window base address, byte offset of the
    lane's row, its swizzle XOR, which of the two 8-column blocks its address is for). Lane ``l`` addresses row
    ``l % 8`` of matrix ``m = l // 8``: matrices 0/1 are rows 0-7 / 8-15 of the warp's 16 rows in the first
    block, 2/3 the same rows of the next block (the order of the registers: the accumulator's)."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    base = shared_address(context, builder, sig.args[1], args[1])
    tid = builder.urem(_THREAD_X.emit(builder), c(128))
    warp, lane = builder.udiv(tid, c(32)), builder.urem(tid, c(32))
    m = builder.udiv(lane, c(8))
    r0 = context.cast(builder, args[3], sig.args[3], types.int32)
    row = builder.add(builder.add(r0, builder.mul(warp, c(16))),
                      builder.add(builder.urem(lane, c(8)), builder.mul(builder.urem(m, c(2)), c(8))))
    pitch = geo["box_cols"] * geo["itemsize"]
    row_bytes = builder.mul(row, c(pitch))
    xor = builder.shl(builder.and_(builder.lshr(row_bytes, c(7)), c(geo["span"] // 16 - 1)), c(4)) \
        if geo["span"] else c(0)
    return base, row_bytes, xor, builder.udiv(m, c(2))


def _stmatrix_address(builder, geo, lanes, chunk_col):
    """The lane's row address for the block pair starting at chunk column ``chunk_col`` (a multiple of 16)."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    base, row_bytes, xor, second = lanes
    col = builder.add(c(chunk_col), builder.mul(second, c(8)))  # elements from the chunk's first column
    box_cols, itemsize = geo["box_cols"], geo["itemsize"]
    group = builder.udiv(col, c(box_cols))
    in_box = builder.mul(builder.urem(col, c(box_cols)), c(itemsize))
    off = builder.add(builder.mul(group, c(geo["box_rows"] * box_cols * itemsize)),
                      builder.add(row_bytes, builder.xor(in_box, xor)))
    return builder.add(base, off)


@device_op(simulate=lambda acc, tile, tmap, row0, col0, beta: _sim_add_tile(acc, tile, tmap, row0, col0, beta))
def wgmma_add_tile(typingctx, acc, tile, tmap, row0, col0, beta):
    """``acc[r, c] += beta * tile[row0 + r, c - col0]`` for the columns ``col0 .. col0 + W - 1`` of the float32
    accumulator, reading the tile (same shapes and rules as :func:`wgmma_store`: bfloat16/float16/float32
    elements where TMA placed them through ``tmap``) - e.g. ``beta * C`` of a GEMM epilogue after a TMA load of
    the C tile. In registers; returns the accumulator. The caller guarantees the tile's load completed."""
    op = "wgmma_add_tile"
    geo = _epilogue_tile(op, acc, tile, tmap, row0, col0)
    if not isinstance(beta, (types.Float, types.Integer)):
        fail(op, f"beta must be a number, got {beta}")
    width, tma = geo["width"], geo["tma"]

    def codegen(context, builder, sig, args):
        base, col_lane, halves = _chunk_addresses(context, builder, sig, args, geo)
        b = context.cast(builder, args[5], sig.args[5], types.float32)
        f32 = ir.FloatType()

        def emit(value, chunk):
            for j in range(width // 8):
                block = chunk * width // 8 + j
                for half in (0, 1):
                    i = 4 * block + 2 * half
                    ptr = _pair_pointer(builder, geo, base, col_lane, halves, 8 * j, half)
                    if tma in ("FLOAT32", "TFLOAT32"):
                        vec = builder.load(builder.bitcast(ptr, ir.VectorType(f32, 2).as_pointer()), align=8)
                        olds = [builder.extract_element(vec, ir.Constant(I32, e)) for e in (0, 1)]
                    else:
                        word = builder.load(builder.bitcast(ptr, I32.as_pointer()), align=4)
                        halfs = [builder.trunc(word, ir.IntType(16)),
                                 builder.trunc(builder.lshr(word, ir.Constant(I32, 16)), ir.IntType(16))]
                        if tma == "BFLOAT16":  # bfloat16 -> float32: the bits shifted up
                            olds = [builder.bitcast(builder.shl(builder.zext(h, I32), ir.Constant(I32, 16)), f32)
                                    for h in halfs]
                        else:
                            olds = [builder.fpext(builder.bitcast(h, ir.HalfType()), f32) for h in halfs]
                    for e in (0, 1):
                        value = builder.insert_value(
                            value, builder.fadd(builder.extract_value(value, i + e), builder.fmul(b, olds[e])), i + e)
            return value

        return _chunked(context, builder, sig, args, 4, acc.n, width, emit, args[0])

    return acc(acc, tile, tmap, row0, col0, beta), codegen


@device_op(prefer_literal=True, simulate=lambda acc, kind: _sim_a_fragments(acc, kind))
def wgmma_a_fragments(typingctx, acc, kind):
    """The float32 m64nN accumulator ``acc`` as ``N / 16`` register A fragments of a following K = 16 wgmma:
    a tuple whose item ``k`` (four uint32) holds columns ``16 k .. 16 k + 15`` rounded to ``kind`` (``"bf16"``
    or ``"f16"``, a constant) - ``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32`` of register pairs, no data movement:
    the accumulator layout of those columns is the A fragment layout of the PTX ISA ("WGMMA .m64nNk16 register
    fragment layout for matrix A"). ``O = P @ V`` after ``P = Q @ Kᵀ``::

        p = wgmma_a_fragments(s_acc, "bf16")                   # s_acc: m64n64, returned by the wait
        o_acc, p = wgmma_fence((o_acc, p))
        for k in range(4):
            o_acc = wgmma(o_acc, p[k], wgmma_desc(v_tile, v_map, "MN", 0, 16 * k), 1)

    The following wgmma must use a B of the same ``kind`` (the registers carry no type)."""
    op = "wgmma_a_fragments"
    require_f32_accumulator(op, acc)
    kind_value = literal_string(op, "kind", kind, ("bf16", "f16"))
    if acc.n % 16:
        fail(op, f"the accumulator is m64n{acc.n}; an A fragment is 16 columns (one k-step of 16), so N must be a "
                 f"multiple of 16")
    frag = types.UniTuple(types.uint32, 4)
    result = types.UniTuple(frag, acc.n // 16)
    pack = _PACK[kind_value]

    def codegen(context, builder, sig, args):
        out = ir.Constant(context.get_value_type(result), None)
        for k in range(acc.n // 16):
            f = ir.Constant(context.get_value_type(frag), None)
            for j in range(4):  # register j: row g + 8 (j % 2), columns 2 q + 8 (j // 2) + {0, 1} of the k-step
                i = 8 * k + 2 * j
                word = pack.emit(builder, hi=builder.extract_value(args[0], i + 1),
                                 lo=builder.extract_value(args[0], i))
                f = builder.insert_value(f, word, j)
            out = builder.insert_value(out, f, k)
        return out

    return result(acc, kind), codegen


def _fragment_pairs(builder, acc, value, block, half):
    """The two elements (columns ``8 block + 2 q`` and ``+1`` of row half ``half``) of a thread's fragment:
    float32 values, or (f16 accumulators) float16 values."""
    if acc.dtype == "f32":
        i = 4 * block + 2 * half
        return builder.extract_value(value, i), builder.extract_value(value, i + 1)
    word = builder.extract_value(value, 2 * block + half)
    i16, f16 = ir.IntType(16), ir.HalfType()
    return (builder.bitcast(builder.trunc(word, i16), f16),
            builder.bitcast(builder.trunc(builder.lshr(word, ir.Constant(I32, 16)), i16), f16))


@device_op(simulate=lambda acc, array, row0, col0: _sim_store_global(acc, array, row0, col0))
def wgmma_store_global(typingctx, acc, array, row0, col0):
    """Write the m64nN accumulator ``acc`` (float32 or float16) to the 2-D array ``array`` (global memory,
    any strides) at rows ``row0 ..``, columns ``col0 ..``: element (r, c) of the tile goes to
    ``array[row0 + r, col0 + c]`` when that lies inside the array and is skipped otherwise (each element is
    bounds-checked: any M, N, tile origins at the edges or past them). ``array``'s elements: float32, float16 or
    uint16 (bfloat16 bits), converted with round-to-nearest-even (``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32``).
    Plain ``st.global``: where the whole tile lies inside the array, its rows are contiguous and each thread's
    pairs of adjacent columns are 2-element aligned (the array's address at ``col0`` and its row stride; one
    check per call), straight-line 4-byte (float32: 8-byte) stores of the pairs; else element by element, each
    checked - the simple way out of registers; a TMA store of a tile filled by :func:`wgmma_store` moves large
    tiles faster. Call after the covering wait; 1-D blocks (the thread's
    warpgroup index is ``threadIdx.x % 128``)."""
    op = "wgmma_store_global"
    if not isinstance(acc, WgmmaAccumulatorType):
        fail(op, f"expected a wgmma accumulator (wgmma_zeros / wgmma_zeros_f16), got {acc}")
    if not isinstance(array, types.Array) or array.ndim != 2:
        fail(op, f"the destination must be a 2-D array, got {array}")
    if not array.mutable:
        fail(op, f"the destination {array} is read-only")
    if array.dtype not in (types.float32, types.float16, types.uint16):
        fail(op, f"the destination holds {array.dtype}; the accumulator converts to float32, float16 or uint16 "
                 f"(bfloat16 bits)")
    require_int(op, "row0", row0)
    require_int(op, "col0", col0)
    dst = array.dtype

    def codegen(context, builder, sig, args):
        from numba.cuda import cgutils

        i64 = ir.IntType(64)
        c = lambda v: ir.Constant(i64, v)  # noqa: E731
        aryty = sig.args[1]
        ary = context.make_array(aryty)(context, builder, args[1])
        shape = cgutils.unpack_tuple(builder, ary.shape, 2)
        strides = cgutils.unpack_tuple(builder, ary.strides, 2)
        tid = builder.zext(builder.urem(_THREAD_X.emit(builder), ir.Constant(I32, 128)), i64)
        lane = builder.urem(tid, c(32))
        row0 = context.cast(builder, args[2], sig.args[2], types.int64)
        col0 = context.cast(builder, args[3], sig.args[3], types.int64)
        r_base = builder.add(row0, builder.add(builder.mul(builder.udiv(tid, c(32)), c(16)), builder.udiv(lane, c(4))))
        c_base = builder.add(col0, builder.mul(builder.urem(lane, c(4)), c(2)))
        f32, f16, i16 = ir.FloatType(), ir.HalfType(), ir.IntType(16)
        size = 4 if dst == types.float32 else 2
        wide = ir.IntType(16 * size)  # (a pair of adjacent elements as one integer)
        data = builder.ptrtoint(ary.data, i64)
        # the fast path: the whole tile inside the array, rows contiguous, pairs 2-element aligned (a pair starts
        # at an even offset from col0: the array's address at col0 and its row stride decide for every pair)
        aligned = builder.and_(builder.or_(builder.add(data, builder.mul(col0, c(size))), strides[0]), c(2 * size - 1))
        inside = [builder.icmp_unsigned("==", strides[1], c(size)), builder.icmp_unsigned("==", aligned, c(0)),
                  builder.icmp_signed(">=", row0, c(0)), builder.icmp_signed(">=", col0, c(0)),
                  builder.icmp_signed("<=", builder.add(row0, c(64)), shape[0]),
                  builder.icmp_signed("<=", builder.add(col0, c(acc.n)), shape[1])]
        fast = inside[0]
        for cond in inside[1:]:
            fast = builder.and_(fast, cond)

        def pair_values(block, half):  # (the thread's pair in row half ``half`` of 8-column block ``block``)
            pair = _fragment_pairs(builder, acc, args[0], block, half)
            if dst == types.float32:
                return [v if v.type == f32 else builder.fpext(v, f32) for v in pair]
            if dst == types.float16 and acc.dtype == "f16":
                return list(pair)
            lo, hi = [v if v.type == f32 else builder.fpext(v, f32) for v in pair]
            word = _PACK["f16" if dst == types.float16 else "bf16"].emit(builder, hi=hi, lo=lo)
            values = [builder.trunc(word, i16), builder.trunc(builder.lshr(word, ir.Constant(I32, 16)), i16)]
            return [builder.bitcast(v, f16) for v in values] if dst == types.float16 else values

        with builder.if_else(fast, likely=True) as (one_each, checked):
            with one_each:  # (straight-line stores of pairs, 4 or 8 bytes each: the first element at the lower address)
                first = builder.add(data, builder.mul(c_base, c(size)))
                for half in (0, 1):
                    row_at = builder.add(first, builder.mul(builder.add(r_base, c(8 * half)), strides[0]))
                    for block in range(acc.n // 8):
                        bits = [builder.zext(bitcast_to(builder, v, ir.IntType(8 * size)), wide)
                                for v in pair_values(block, half)]
                        packed = builder.or_(bits[0], builder.shl(bits[1], ir.Constant(wide, 8 * size)))
                        at = builder.inttoptr(builder.add(row_at, c(8 * block * size)), wide.as_pointer())
                        builder.store(packed, at, align=2 * size)
            with checked:  # (the tile at an edge of the array, or strides that do not allow pairs)
                for block in range(acc.n // 8):
                    for half in (0, 1):
                        row = builder.add(r_base, c(8 * half))
                        row_ok = builder.icmp_unsigned("<", row, shape[0])  # (negative rows wrap to huge: skipped)
                        values = pair_values(block, half)
                        for e in (0, 1):
                            col = builder.add(c_base, c(8 * block + e))
                            ok = builder.and_(row_ok, builder.icmp_unsigned("<", col, shape[1]))
                            with cgutils.if_likely(builder, ok):
                                ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=shape,
                                                                strides=strides, layout=aryty.layout, inds=[row, col])
                                builder.store(bitcast_to(builder, values[e], ptr.type.pointee), ptr)  # (float16: i16)
        return context.get_dummy_value()

    return types.void(acc, array, row0, col0), codegen


@device_op(simulate=lambda acc, bias, col0: _sim_add_bias(acc, bias, col0))
def wgmma_add_bias(typingctx, acc, bias, col0):
    """``acc[r, c] += bias[col0 + c]`` for every element of the float32 m64nN accumulator (FADDs in registers):
    ``bias`` is a 1-D float32 array in global or shared memory; columns whose ``col0 + c`` lies outside it
    add nothing (each of the thread's N / 4 bias reads is bounds-checked). Returns the accumulator; call it
    after the covering wait and fence (``wgmma_fence``) before a later wgmma accumulates into the result."""
    op = "wgmma_add_bias"
    require_f32_accumulator(op, acc)
    if not isinstance(bias, types.Array) or bias.ndim != 1 or bias.dtype != types.float32:
        fail(op, f"bias must be a 1-D float32 array (global or shared memory), got {bias}")
    require_int(op, "col0", col0)

    def codegen(context, builder, sig, args):
        from numba.cuda import cgutils

        i64 = ir.IntType(64)
        c = lambda v: ir.Constant(i64, v)  # noqa: E731
        aryty = sig.args[1]
        ary = context.make_array(aryty)(context, builder, args[1])
        (length,) = cgutils.unpack_tuple(builder, ary.shape, 1)
        (stride,) = cgutils.unpack_tuple(builder, ary.strides, 1)
        lane = builder.zext(builder.urem(_THREAD_X.emit(builder), ir.Constant(I32, 32)), i64)
        c_base = builder.add(context.cast(builder, args[2], sig.args[2], types.int64),
                             builder.mul(builder.urem(lane, c(4)), c(2)))
        f32 = ir.FloatType()
        out = args[0]
        for block in range(acc.n // 8):
            for e in (0, 1):
                col = builder.add(c_base, c(8 * block + e))
                ok = builder.icmp_unsigned("<", col, length)
                before = builder.block
                with builder.if_then(ok, likely=True):
                    ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=[length],
                                                    strides=[stride], layout=aryty.layout, inds=[col])
                    loaded = builder.load(ptr)
                    inside = builder.block
                value = builder.phi(f32)
                value.add_incoming(loaded, inside)
                value.add_incoming(ir.Constant(f32, 0.0), before)
                for half in (0, 1):
                    i = 4 * block + 2 * half + e
                    out = builder.insert_value(out, builder.fadd(builder.extract_value(out, i), value), i)
        return out

    return acc(acc, bias, col0), codegen

PTX = {
    "wgmma_store(bf16 pack)": _F32_TO_BF16X2,
    "wgmma_store(f16 pack)": _F32_TO_F16X2,
    "wgmma_store(stmatrix x4)": _STMATRIX[4],
    "wgmma_store(stmatrix x2)": _STMATRIX[2],
    "wgmma_store(thread index)": _THREAD_X,
}


# =============================================================================================================
# Simulator semantics (NUMBA_ENABLE_CUDASIM=1): the thread's registers placed, rounded and added as on the GPU
# =============================================================================================================
def _sim_tile_positions(acc, tile, tmap, row0, col0, op):
    """(flat element index in the tile, fragment register) of the thread's registers in columns
    [col0, col0 + W)."""
    acc._ready(f"{op} reads")
    _, t = sim_thread()
    box_rows, box_cols = tuple(tmap.shared_shape[-2:])
    shape = np.shape(tile)
    groups = shape[0] if len(shape) == 3 else 1
    width = groups * box_cols
    col0 = int(col0)
    if col0 % width or not 0 <= col0 < acc.n:
        raise sim().SimulatedMisuse(f"{op}: col0={col0} must be a multiple of the tile's {width} columns below "
                                    f"{acc.n}")
    itemsize = np.asarray(tile).dtype.itemsize
    pitch = box_cols * itemsize
    span = int(tmap.swizzle)
    out = []
    for i in range(acc.values.size):
        r, c = wgmma_row_col(i, t)
        if not col0 <= c < col0 + width:
            continue
        group, col = divmod(c - col0, box_cols)
        o = (int(row0) + r) * pitch + col * itemsize
        if span:
            o ^= ((o >> 7) & (span // 16 - 1)) << 4
        out.append(((group * box_rows * pitch + o) // itemsize, i))
    return out


def _sim_store(acc, tile, tmap, row0, col0):
    flat = tile.reshape(-1)  # (a view: element writes go through the simulator's shared-memory checks)
    if tmap.tma_dtype == "BFLOAT16":
        import ml_dtypes

        values = acc.values.astype(ml_dtypes.bfloat16).view(np.uint16)
    elif tmap.tma_dtype == "FLOAT16":
        values = acc.values.astype(np.float16)
    else:
        values = acc.values.astype(np.float32)
    for index, i in _sim_tile_positions(acc, tile, tmap, row0, col0, "wgmma_store"):
        flat[index] = values[i]


def _sim_add_tile(acc, tile, tmap, row0, col0, beta):
    flat = tile.reshape(-1)
    values = acc.values.copy()
    for index, i in _sim_tile_positions(acc, tile, tmap, row0, col0, "wgmma_add_tile"):
        raw = flat[index]
        if tmap.tma_dtype == "BFLOAT16":
            import ml_dtypes

            old = np.float32(np.uint16(raw).view(ml_dtypes.bfloat16))
        else:
            old = np.float32(raw)
        values[i] = np.float32(values[i] + np.float32(beta) * old)
    return acc.copy(values=values, fenced=False)


def _round_bits(x, kind):
    """float32 values -> uint16 bits of bfloat16 / float16, rounded to nearest even; NaN -> 0x7FFF (what
    ``cvt.rn.bf16x2.f32`` / ``cvt.rn.f16x2.f32`` give)."""
    x = np.asarray(x, np.float32)
    if kind == "f16":
        with np.errstate(over="ignore", invalid="ignore"):
            out = x.astype(np.float16).view(np.uint16)
    else:
        b = x.view(np.uint32).astype(np.uint64)
        out = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FFF), out)


def _sim_a_fragments(acc, kind):
    s = sim()
    if not isinstance(acc, SimAccumulator) or acc.dtype != "f32":
        raise s.SimulatedMisuse("wgmma_a_fragments: expected a float32 wgmma accumulator")
    acc._ready("wgmma_a_fragments reads")
    kind = str(kind)
    if kind not in ("bf16", "f16"):
        raise s.SimulatedMisuse(f"wgmma_a_fragments: kind must be 'bf16' or 'f16', got {kind!r}")
    if acc.n % 16:
        raise s.SimulatedMisuse(f"wgmma_a_fragments: the accumulator is m64n{acc.n}; N must be a multiple of 16")
    bits = _round_bits(acc.values, kind).astype(np.uint32)
    words = bits[0::2] | (bits[1::2] << 16)  # register pairs (2 i, 2 i + 1): low half the even column
    me, _ = sim_thread()
    site = s.caller_site()
    return tuple(SimFragment(tuple(np.uint32(w) for w in words[4 * k:4 * k + 4]), kind, fence_count(me), site)
                 for k in range(acc.n // 16))


def _thread_elements(acc):
    """(row, column, float32 value) of every element of the thread's fragment."""
    _, t = sim_thread()
    if acc.dtype == "f32":
        i = np.arange(acc.values.size)
        rows, cols = wgmma_row_col(i, t)
        return rows, cols, acc.values.astype(np.float32)
    i = np.arange(acc.values.size)
    rows, cols = wgmma_row_col(2 * i, t)
    words = acc.values.astype(np.uint32)
    lo = (words & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
    hi = (words >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
    return np.concatenate([rows, rows]), np.concatenate([cols, cols + 1]), np.concatenate([lo, hi])


def _sim_store_global(acc, array, row0, col0):
    s = sim()
    if not isinstance(acc, SimAccumulator):
        raise s.SimulatedMisuse("wgmma_store_global: expected a wgmma accumulator")
    acc._ready("wgmma_store_global reads")
    shape = tuple(array.shape)
    dtype = np.dtype(array.dtype)
    if len(shape) != 2 or dtype not in (np.float32, np.float16, np.uint16):
        raise s.SimulatedMisuse(f"wgmma_store_global: the destination must be a 2-D float32, float16 or uint16 "
                                f"(bfloat16 bits) array, got {dtype} {shape}")
    rows, cols, values = _thread_elements(acc)
    rows, cols = rows + int(row0), cols + int(col0)
    if dtype == np.uint16:
        out = _round_bits(values, "bf16")
    elif dtype == np.float16:
        with np.errstate(over="ignore"):
            out = values.astype(np.float16)
    else:
        out = values
    for r, c, v in zip(rows, cols, out):
        if 0 <= r < shape[0] and 0 <= c < shape[1]:
            array[int(r), int(c)] = v


def _sim_add_bias(acc, bias, col0):
    s = sim()
    if not isinstance(acc, SimAccumulator) or acc.dtype != "f32":
        raise s.SimulatedMisuse("wgmma_add_bias: expected a float32 wgmma accumulator")
    acc._ready("wgmma_add_bias reads")
    if len(np.shape(bias)) != 1 or np.dtype(bias.dtype) != np.float32:
        raise s.SimulatedMisuse("wgmma_add_bias: bias must be a 1-D float32 array")
    _, t = sim_thread()
    n = np.shape(bias)[0]
    values = acc.values.copy()
    for i in range(values.size):
        c = int(col0) + int(wgmma_row_col(i, t)[1])
        if 0 <= c < n:
            values[i] = np.float32(values[i] + np.float32(bias[c]))
    return acc.copy(values=values, fenced=False)
