"""Warp-level tensor-core matrix multiply-accumulate: ``mma.sync`` (m16n8k16, bf16/f16), the warp-collective
shared-memory matrix loads and stores that feed it (``ldmatrix`` / ``stmatrix``), and the conversions that pack
two float32 into one register of bfloat16 / float16 pairs.

Unlike ``wgmma`` (sm_90a only, a warpgroup, asynchronous, operands in shared memory) ``mma.sync`` is issued by
one warp (32 threads), is synchronous, and takes every operand from registers: each thread holds a *fragment*
of A, B and C/D. Every target numbatma builds for (sm_90a, sm_100a, sm_120a) has it - it is what tensor-core
code uses where wgmma does not exist::

    acc = (np.float32(0), np.float32(0), np.float32(0), np.float32(0))   # this lane's 4 registers of C
    for k0 in range(0, K, 16):
        a = ldmatrix(a_tile, a_offset + k0, 4, False)      # A (16 x 16, row-major in shared memory)
        b = ldmatrix(b_tile, b_offset + 8 * k0, 2, True)   # B (16 x 8), stored (K, N) row-major
        acc = mma_m16n8k16(acc, a, b, "bf16")              # D = A @ B + C, float32
    r, c = mma_c_row_col(0, lane)                          # where acc[0] lies in the 16 x 8 tile

**Fragments** (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"). With ``lane`` the
thread's lane (0..31), ``g = lane // 4`` and ``t = lane % 4``:

* A (16 x 16, M x K): four uint32 registers of two 16-bit elements each (the low half holds the lower
  column). Register ``reg``, half ``h``: row ``g + 8 * (reg % 2)``, column ``2 t + h + 8 * (reg // 2)``
  (:func:`mma_a_row_col`).
* B (16 x 8, K x N): two uint32 registers. Register ``reg``, half ``h``: row (k) ``2 t + h + 8 reg``,
  column (n) ``g`` (:func:`mma_b_row_col`).
* C / D (16 x 8), float32: four registers. Register ``reg``: row ``g + 8 * (reg // 2)``, column
  ``2 t + reg % 2`` (:func:`mma_c_row_col`). float16 accumulators: two uint32 registers, register ``r`` half
  ``h`` holds element ``mma_c_row_col(2 r + h, lane)``.

**ldmatrix / stmatrix** move 1, 2 or 4 8 x 8 matrices of 16-bit elements between shared memory and such
fragments. Each matrix row is 16 contiguous bytes at a 16-byte aligned address that one lane supplies: lanes
``8 i .. 8 i + 7`` give rows 0..7 of matrix ``i`` (lanes 0-7 for x1, 0-15 for x2, all for x4; the others'
addresses are not used). Register ``i`` of every lane holds (or gives) a fragment of matrix ``i``: row
``g``, columns ``2 t`` (low half) and ``2 t + 1`` - or, with ``trans``, column ``g``, rows ``2 t`` and
``2 t + 1``. So ``ldmatrix(.., 4, False)`` of the four 8 x 8 quarters of a row-major A (top-left, bottom-left,
top-right, bottom-right) is A's fragment; ``ldmatrix(.., 2, True)`` of B stored (K, N) row-major, and
``ldmatrix(.., 2, False)`` of B stored (N, K) row-major, are B's fragment.

**What the caller guarantees** (PTX makes it undefined otherwise): all 32 lanes of the warp execute each of
these warp-collective calls together (``.sync.aligned``: no lane-divergent branch around them, no exited
lane) with the same constants; the warp is made of consecutive threads of the block (x fastest); shared
memory written by other lanes is synchronised (``cuda.syncwarp()`` / ``cuda.syncthreads()``) before
``ldmatrix`` reads it or after ``stmatrix`` wrote it; row addresses are 16-byte aligned (declare tiles with
``cuda.shared.array(..., alignment=16)`` or more and use element offsets that are multiples of 8).

Under the CUDA simulator the same calls exchange the 32 lanes' operands (``_sim.group_exchange``) and compute
with NumPy: products and sums in float64, rounded once to float32 (or float16, to nearest even); bfloat16 /
float16 conversions round to nearest even. Misaligned or out-of-tile row addresses, a tile that is not in
shared memory and lanes that disagree on the constants are reported (``SimulatedMisuse``, raised in every lane
of the warp).

Targets: ``mma.sync`` (bf16 / f16, m16n8k16) and ``cvt.rn.{bf16x2,f16x2}.f32`` need sm_80, ``ldmatrix`` sm_75,
``stmatrix`` sm_90 - all present on sm_90a, sm_100a and sm_120a. Compiling a kernel that uses ``stmatrix``
for an sm_8x target raises ``UnsupportedTarget``.
"""
from __future__ import annotations

import numpy as np

from ._asm import TARGETS, Ptx
from ._define import SIMULATING, TypingError, device_op, fail, require_shared, sim

__all__ = [
    "ldmatrix",
    "mma_a_row_col",
    "mma_b_row_col",
    "mma_c_row_col",
    "mma_m16n8k16",
    "mma_m16n8k16_f16acc",
    "pack_bf16x2",
    "pack_f16x2",
    "stmatrix",
    "unpack_bf16x2",
    "unpack_f16x2",
]

KINDS = ("bf16", "f16")  # operand kinds of mma_m16n8k16 (A and B the same kind)
COUNTS = (1, 2, 4)  # 8 x 8 matrices per ldmatrix / stmatrix
STMATRIX_INSTEAD = ("store the fragment with ordinary shared-memory stores (mma_c_row_col / the ldmatrix fragment "
                    "layout say where each half of a register goes)")


# -- the PTX: one description per variant ------------------------------------------------------------------------
def _mma_ptx(kind):
    return Ptx(f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 $d, $a, $b, $c;",
               ins=(("a", "b32", 4), ("b", "b32", 2), ("c", "f32", 4)), out=("d", "f32", 4), memory=False,
               min_sm=80)


MMA = {kind: _mma_ptx(kind) for kind in KINDS}
MMA_F16ACC = Ptx("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 $d, $a, $b, $c;",
                 ins=(("a", "b32", 4), ("b", "b32", 2), ("c", "b32", 2)), out=("d", "b32", 2), memory=False,
                 min_sm=80)


def _suffix(count, trans):
    return f"x{count}" + (".trans" if trans else "")


# (x1: a scalar output spelled {$r} - libNVVM rejects an inline asm returning a one-member struct)
LDMATRIX = {
    (count, trans): Ptx(f"ldmatrix.sync.aligned.m8n8.{_suffix(count, trans)}.shared.b16 "
                        + ("{$r}" if count == 1 else "$r") + ", [$addr];",
                        ins=(("addr", "b32"),), out=("r", "b32") if count == 1 else ("r", "b32", count), min_sm=75)
    for count in COUNTS for trans in (False, True)
}
# stmatrix is sm_90+: every numbatma target has it; the marker makes an sm_8x compile raise UnsupportedTarget.
STMATRIX = {
    (count, trans): Ptx(f"stmatrix.sync.aligned.m8n8.{_suffix(count, trans)}.shared.b16 [$addr], $r;",
                        ins=(("addr", "b32"), ("r", "b32", count)), min_sm=90, targets=TARGETS,
                        instead=STMATRIX_INSTEAD)
    for count in COUNTS for trans in (False, True)
}
# cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a (converted) in the upper half of d and b in the lower half.
PACK = {
    "bf16": Ptx("cvt.rn.bf16x2.f32 $out, $hi, $lo;", ins=(("hi", "f32"), ("lo", "f32")), out=("out", "b32"),
                memory=False, min_sm=80),
    "f16": Ptx("cvt.rn.f16x2.f32 $out, $hi, $lo;", ins=(("hi", "f32"), ("lo", "f32")), out=("out", "b32"),
               memory=False, min_sm=80),
}

PTX = {
    **{f"mma_m16n8k16({kind})": p for kind, p in MMA.items()},
    "mma_m16n8k16_f16acc": MMA_F16ACC,
    **{f"ldmatrix({_suffix(c, t)})": p for (c, t), p in LDMATRIX.items()},
    **{f"stmatrix({_suffix(c, t)})": p for (c, t), p in STMATRIX.items()},
    "pack_bf16x2": PACK["bf16"],
    "pack_f16x2": PACK["f16"],
}


# -- fragment layouts: plain functions (host, device, simulator) ---------------------------------------------------
def mma_a_row_col(reg, half, lane):
    """(row, column) in the 16 x 16 A tile (M x K) of half ``half`` (0: the low 16 bits, 1: the high) of A
    register ``reg`` (0..3) of lane ``lane`` (0..31): row ``lane // 4 + 8 * (reg % 2)``, column
    ``2 * (lane % 4) + half + 8 * (reg // 2)``. A plain function: use it in kernels (integer arithmetic), in
    host code and on NumPy arrays."""
    return lane // 4 + 8 * (reg % 2), 2 * (lane % 4) + half + 8 * (reg // 2)


def mma_b_row_col(reg, half, lane):
    """(row, column) = (k, n) in the 16 x 8 B tile (K x N) of half ``half`` of B register ``reg`` (0..1) of lane
    ``lane``: row ``2 * (lane % 4) + half + 8 * reg``, column ``lane // 4``."""
    return 2 * (lane % 4) + half + 8 * reg, lane // 4


def mma_c_row_col(reg, lane):
    """(row, column) in the 16 x 8 C / D tile of float32 accumulator register ``reg`` (0..3) of lane ``lane``:
    row ``lane // 4 + 8 * (reg // 2)``, column ``2 * (lane % 4) + reg % 2``. For float16 accumulators, half
    ``h`` of register ``r`` is element ``mma_c_row_col(2 * r + h, lane)``."""
    return lane // 4 + 8 * (reg // 2), 2 * (lane % 4) + reg % 2


if not SIMULATING:
    from numba.cuda.extending import register_jitable

    for _fn in (mma_a_row_col, mma_b_row_col, mma_c_row_col):
        register_jitable(inline="always")(_fn)  # (the names stay the plain Python functions)
    del _fn


# =============================================================================================================
# Typing and lowering (GPU)
# =============================================================================================================
if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types

    from ._define import shared_address

    I32 = ir.IntType(32)
    _TILE_DTYPES = (types.uint16, types.int16, types.float16)


def _literal_choice(op, what, ty, choices):
    """The value of a compile-time constant argument among ``choices``."""
    if isinstance(ty, types.Literal) and not isinstance(ty, types.Omitted):
        value = ty.literal_value
        if value in choices and type(value) in {type(c) for c in choices}:
            return value
        fail(op, f"{what} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    fail(op, f"{what} must be a compile-time constant ({', '.join(map(repr, choices))}: a literal or a global), "
             f"got {ty}")


def _literal_trans(op, ty):
    if isinstance(ty, types.BooleanLiteral):
        return bool(ty.literal_value)
    if isinstance(ty, types.IntegerLiteral) and ty.literal_value in (0, 1):
        return bool(ty.literal_value)
    fail(op, f"trans must be a compile-time constant bool (True: .trans, the matrices transposed; False), got {ty}")


def _require_registers(op, what, ty, count, dtype, hint):
    """``ty`` is a tuple of ``count`` values of ``dtype``."""
    if isinstance(ty, types.BaseTuple) and len(ty) == count and all(t == dtype for t in ty):
        return
    widened = ""
    if dtype == types.uint32 and isinstance(ty, types.BaseTuple) and any(
            isinstance(t, types.Integer) and t != dtype for t in ty):
        widened = "; wrap words computed in the kernel in np.uint32(...) - Numba widens integer arithmetic to 64 bits"
    fail(op, f"{what} must be a tuple of {count} {dtype} ({hint}), got {ty}{widened}")


_A_HINT = "A's fragment: 8 bf16/f16 elements packed in pairs, e.g. ldmatrix(tile, offset, 4, False) or pack_bf16x2"
_B_HINT = "B's fragment: 4 elements packed in pairs, e.g. ldmatrix(tile, offset, 2, True)"
_ACC_HINT = "the lane's 4 float32 registers of C, e.g. (z, z, z, z) with z = np.float32(0), or a previous mma's result"
_ACC16_HINT = ("the lane's 2 registers of float16 pairs of C, e.g. (np.uint32(0), np.uint32(0)) or a previous "
               "mma_m16n8k16_f16acc's result")


def _tuple_value(context, builder, ty, struct, count):
    """The Numba tuple ``ty`` from the ``count`` members of an asm statement's literal struct."""
    return context.make_tuple(builder, ty, [builder.extract_value(struct, i) for i in range(count)])


@device_op(prefer_literal=True, simulate=lambda acc, a, b, kind: _sim_mma(acc, a, b, kind, "mma_m16n8k16"))
def mma_m16n8k16(typingctx, acc, a, b, kind):
    """``D = A @ B + C`` for one warp's 16 x 8 x 16 tile: returns this lane's 4 float32 registers of D.

    Emits the warp's ``mma.sync`` m16n8k16 (A row-major, B column-major) of ``kind`` elements with float32 C and
    D (PTX below).
    ``kind``: the constant string ``"bf16"`` or ``"f16"`` (A and B elements); ``acc``: a tuple of 4 float32
    (C: this lane's fragment, :func:`mma_c_row_col`); ``a``: a tuple of 4 uint32 (A, 16 x 16 row-major:
    :func:`mma_a_row_col`); ``b``: a tuple of 2 uint32 (B, 16 x 8 column-major: :func:`mma_b_row_col`). Each
    uint32 holds two 16-bit elements, the lower column (A) / row (B) in the low half.

    The caller guarantees: all 32 lanes of the warp execute it together (``.sync.aligned``) with the same
    ``kind``. Accumulation is float32 (rounding inside the tensor core is the hardware's)."""
    op = "mma_m16n8k16"
    value = _literal_choice(op, "kind", kind, KINDS)
    _require_registers(op, "acc", acc, 4, types.float32, _ACC_HINT)
    _require_registers(op, "a", a, 4, types.uint32, _A_HINT)
    _require_registers(op, "b", b, 2, types.uint32, _B_HINT)
    ptx = MMA[value]
    result = types.UniTuple(types.float32, 4)

    def codegen(context, builder, sig, args):
        out = ptx.emit(builder, a=args[1], b=args[2], c=args[0])
        return _tuple_value(context, builder, sig.return_type, out, 4)

    return result(acc, a, b, kind), codegen


@device_op(simulate=lambda acc, a, b: _sim_mma(acc, a, b, "f16", "mma_m16n8k16_f16acc"))
def mma_m16n8k16_f16acc(typingctx, acc, a, b):
    """``D = A @ B + C`` with float16 operands *and* float16 accumulators: returns this lane's 2 registers of D.

    Emits the warp's ``mma.sync`` m16n8k16 (A row-major, B column-major) with float16 A, B, C and D (PTX below).
    ``acc``: a tuple of 2 uint32, each two float16 of C (register ``r`` half ``h``: element
    ``mma_c_row_col(2 r + h, lane)``; build them with :func:`pack_f16x2`, read them with :func:`unpack_f16x2`);
    ``a`` / ``b``: as for :func:`mma_m16n8k16`, float16 elements. Same guarantees (all 32 lanes together)."""
    op = "mma_m16n8k16_f16acc"
    _require_registers(op, "acc", acc, 2, types.uint32, _ACC16_HINT)
    _require_registers(op, "a", a, 4, types.uint32, _A_HINT)
    _require_registers(op, "b", b, 2, types.uint32, _B_HINT)
    result = types.UniTuple(types.uint32, 2)

    def codegen(context, builder, sig, args):
        out = MMA_F16ACC.emit(builder, a=args[1], b=args[2], c=args[0])
        return _tuple_value(context, builder, sig.return_type, out, 2)

    return result(acc, a, b), codegen


# -- ldmatrix / stmatrix ----------------------------------------------------------------------------------------
def _check_tile(op, tile, offset):
    """Typing checks of the (tile, offset) pair; returns a message for a constant offset that breaks a rule
    (raised by ``_deferred``) or None."""
    require_shared(op, "the tile", tile)
    if tile.dtype not in _TILE_DTYPES:
        fail(op, f"the tile must hold 16-bit elements (uint16, int16 or float16; bfloat16 data as uint16): "
                 f"{op} moves .b16 matrices; got {tile.dtype}")
    if tile.layout != "C":
        fail(op, f"the tile must be C-contiguous (offset counts elements from its first one), got layout "
                 f"{tile.layout!r}")
    if not isinstance(offset, types.Integer):
        fail(op, f"offset (the element offset of this lane's row address in the tile) must be an integer, got "
                 f"{offset}")
    if isinstance(offset, types.IntegerLiteral):
        value = offset.literal_value
        if value % 8:
            return (f"{op}: offset {value} is not a multiple of 8 elements: every row address must be 16-byte "
                    f"aligned (8 elements of 16 bits; the tile itself declared with alignment=16 or more)")
        size = None if tile.static_shape is None else int(np.prod(tile.static_shape))
        if value < 0 or (size is not None and value + 8 > size):
            return (f"{op}: offset {value} puts the 8-element row outside the tile "
                    f"({'shape ' + str(tile.static_shape) if size is not None else 'its start'})")
    return None


def _deferred(message):
    """A constant argument broke a rule: raise it now (``device_op`` marks it fatal, so Numba's retry with the
    plain argument type cannot type the call silently; the user sees it at the call's line)."""
    raise TypingError(message)


def _row_address(context, builder, sig, args):
    base = shared_address(context, builder, sig.args[0], args[0])
    offset = context.cast(builder, args[1], sig.args[1], types.int32)
    return builder.add(base, builder.mul(offset, ir.Constant(I32, 2)))


@device_op(prefer_literal=True,
           simulate=lambda tile, offset, count, trans: _sim_ldmatrix(tile, offset, count, trans))
def ldmatrix(typingctx, tile, offset, count, trans):
    """Load ``count`` (1, 2 or 4) 8 x 8 matrices of 16-bit elements from shared memory into fragments:
    returns a tuple of ``count`` uint32 (register ``i``: this lane's two elements of matrix ``i``).

    Emits the warp's ``ldmatrix`` of ``count`` 8 x 8 b16 matrices (``.x<count>``, ``.trans`` with ``trans``;
    PTX below) with ``addr = &tile[0] + 2 * offset`` (32-bit shared-window address). ``tile``: a C-contiguous
    shared array of 16-bit elements (uint16 - bfloat16 data -, int16 or float16); ``offset``: the element
    offset of the row this lane supplies (lanes 8 i .. 8 i + 7: rows 0..7 of matrix i; lanes past 8 * count
    are not used).
    Register ``i``: row ``lane // 4`` of matrix ``i``, columns ``2 (lane % 4)`` (low half) and ``+1``; with
    ``trans`` (a constant bool) column ``lane // 4``, rows ``2 (lane % 4)`` and ``+1``.

    The caller guarantees: all 32 lanes execute it together with the same ``count`` / ``trans``; each used
    row is 16 bytes inside the tile at a 16-byte aligned address (tile alignment >= 16, offset a multiple of
    8); writes by other threads are synchronised before. A constant offset is checked while typing."""
    op = "ldmatrix"
    n = _literal_choice(op, "count", count, COUNTS)
    t = _literal_trans(op, trans)
    problem = _check_tile(op, tile, offset)
    result = types.UniTuple(types.uint32, n)
    if problem:
        return result(tile, offset, count, trans), _deferred(problem)
    ptx = LDMATRIX[(n, t)]

    def codegen(context, builder, sig, args):
        out = ptx.emit(builder, addr=_row_address(context, builder, sig, args))
        if n == 1:
            return context.make_tuple(builder, sig.return_type, [out])
        return _tuple_value(context, builder, sig.return_type, out, n)

    return result(tile, offset, count, trans), codegen


@device_op(prefer_literal=True,
           simulate=lambda tile, offset, values, trans: _sim_stmatrix(tile, offset, values, trans))
def stmatrix(typingctx, tile, offset, values, trans):
    """Store ``len(values)`` (1, 2 or 4) 8 x 8 matrices of 16-bit elements from fragments into shared memory:
    the inverse of :func:`ldmatrix` with the same ``count`` and ``trans``.

    Emits the warp's ``stmatrix`` of ``count`` 8 x 8 b16 matrices (``.x<count>``, ``.trans`` with ``trans``;
    sm_90+; PTX below) with ``addr = &tile[0] + 2 * offset``. ``values``: a tuple of 1, 2 or 4 uint32
    (register ``i``: this lane's two elements of matrix ``i``, laid out as ldmatrix returns them); ``tile``,
    ``offset``, ``trans`` and the rows each lane addresses: as for :func:`ldmatrix`.

    The caller guarantees what :func:`ldmatrix` needs, and synchronises before other threads read the rows.
    Targets: sm_90a, sm_100a, sm_120a; compiling for an sm_8x target raises ``UnsupportedTarget``."""
    op = "stmatrix"
    t = _literal_trans(op, trans)
    if not (isinstance(values, types.BaseTuple) and len(values) in COUNTS
            and all(v == types.uint32 for v in values)):
        fail(op, f"values must be a tuple of 1, 2 or 4 uint32 (one register per 8 x 8 matrix, as ldmatrix "
                 f"returns them), got {values}")
    n = len(values)
    problem = _check_tile(op, tile, offset)
    if problem:
        return types.void(tile, offset, values, trans), _deferred(problem)
    ptx = STMATRIX[(n, t)]

    def codegen(context, builder, sig, args):
        ptx.emit(builder, addr=_row_address(context, builder, sig, args), r=args[2])
        return context.get_dummy_value()

    return types.void(tile, offset, values, trans), codegen


# -- packing -----------------------------------------------------------------------------------------------------
def _pack(op, kind, lo, hi):
    for what, ty in (("lo", lo), ("hi", hi)):
        if not isinstance(ty, (types.Float, types.Integer)) or isinstance(ty, types.Boolean):
            fail(op, f"{what} must be a number (converted to float32 first), got {ty}")

    def codegen(context, builder, sig, args):
        lo_v = context.cast(builder, args[0], sig.args[0], types.float32)
        hi_v = context.cast(builder, args[1], sig.args[1], types.float32)
        return PACK[kind].emit(builder, hi=hi_v, lo=lo_v)

    return types.uint32(lo, hi), codegen


@device_op(simulate=lambda lo, hi: _sim_pack(lo, hi, "bf16"))
def pack_bf16x2(typingctx, lo, hi):
    """Two float32 rounded (to nearest even) to bfloat16 and packed into one uint32: ``lo`` in bits 0-15,
    ``hi`` in bits 16-31 - one register of an A / B fragment. Emits one ``cvt.rn`` to ``.bf16x2`` with ``hi``
    as its first source (PTX puts its first source in the upper half; PTX below). Float64 or integer arguments
    are converted to float32 first."""
    return _pack("pack_bf16x2", "bf16", lo, hi)


@device_op(simulate=lambda lo, hi: _sim_pack(lo, hi, "f16"))
def pack_f16x2(typingctx, lo, hi):
    """Two float32 rounded (to nearest even; overflow gives infinity) to float16 and packed into one uint32:
    ``lo`` in bits 0-15, ``hi`` in bits 16-31. Emits one ``cvt.rn`` to ``.f16x2`` with ``hi`` as its first
    source, as :func:`pack_bf16x2` (PTX below)."""
    return _pack("pack_f16x2", "f16", lo, hi)


def _unpack(op, u, kind):
    if not isinstance(u, types.Integer) or (u.bitwidth > 32 and not isinstance(u, types.IntegerLiteral)):
        fail(op, f"the argument must be a uint32 holding two 16-bit values (e.g. a fragment register), got {u}")
    result = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[0], sig.args[0], types.uint32)
        f32 = ir.FloatType()
        if kind == "bf16":  # bfloat16 -> float32 is exact: the bits shifted up
            lo = builder.bitcast(builder.shl(word, ir.Constant(I32, 16)), f32)
            hi = builder.bitcast(builder.and_(word, ir.Constant(I32, 0xFFFF0000)), f32)
        else:  # float16 -> float32 is exact (cvt.f32.f16)
            halves = [builder.trunc(word, ir.IntType(16)),
                      builder.trunc(builder.lshr(word, ir.Constant(I32, 16)), ir.IntType(16))]
            lo, hi = (builder.fpext(builder.bitcast(h, ir.HalfType()), f32) for h in halves)
        return context.make_tuple(builder, sig.return_type, [lo, hi])

    return result(u), codegen


@device_op(simulate=lambda u: _sim_unpack(u, "bf16"))
def unpack_bf16x2(typingctx, u):
    """The two bfloat16 of ``u`` (a uint32: bits 0-15 and 16-31) as float32 ``(lo, hi)`` - exact. No PTX of its
    own: a shift and a mask."""
    return _unpack("unpack_bf16x2", u, "bf16")


@device_op(simulate=lambda u: _sim_unpack(u, "f16"))
def unpack_f16x2(typingctx, u):
    """The two float16 of ``u`` (bits 0-15 and 16-31) as float32 ``(lo, hi)`` - exact. No PTX of its own: NVVM
    emits ``cvt.f32.f16`` for each half."""
    return _unpack("unpack_f16x2", u, "f16")


# =============================================================================================================
# Simulator semantics (NUMBA_ENABLE_CUDASIM=1)
# =============================================================================================================
_LANES = np.arange(32)


def _fragment_index(layout, registers):
    """(rows, cols) index arrays of shape (32, registers, 2): lane, register, half -> element."""
    lane = _LANES[:, None, None]
    reg = np.arange(registers)[None, :, None]
    half = np.arange(2)[None, None, :]
    rows, cols = layout(reg, half, lane)
    shape = (32, registers, 2)
    return np.broadcast_to(rows, shape), np.broadcast_to(cols, shape)


_A_INDEX = _fragment_index(mma_a_row_col, 4)
_B_INDEX = _fragment_index(mma_b_row_col, 2)
_C_INDEX = mma_c_row_col(np.arange(4)[None, :], _LANES[:, None])  # (32, 4) each
_C16_INDEX = _fragment_index(lambda reg, half, lane: mma_c_row_col(2 * reg + half, lane), 2)


def _misuse(message):
    raise sim().SimulatedMisuse(message)


def _words(op, what, values, count):
    """A lane's register tuple as int64 words (0..2**32-1)."""
    if not isinstance(values, tuple) or len(values) != count:
        _misuse(f"{op}: {what} must be a tuple of {count} uint32, got {values!r}")
    try:
        return np.array([int(v) for v in values], np.int64) & 0xFFFFFFFF
    except (TypeError, ValueError):
        _misuse(f"{op}: {what} must be a tuple of {count} uint32, got {values!r}")


def _halves(words):
    """(..., registers) words -> (..., registers, 2) 16-bit halves (low first)."""
    return np.stack([words & 0xFFFF, (words >> 16) & 0xFFFF], axis=-1)


def _decode(bits, kind):
    """16-bit patterns -> float64 values of bfloat16 / float16 elements."""
    bits = np.asarray(bits, np.int64)
    if kind == "bf16":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return bits.astype(np.uint16).view(np.float16).astype(np.float64)


def _round_bf16(x):
    """float32 values -> bfloat16 bit patterns (int64), rounded to nearest even; NaN -> 0x7FFF."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.int64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, np.float32))
    return np.where(nan, 0x7FFF, rounded & 0xFFFF)


def _round_f16(x):
    """float32 (or float64) values -> float16 bit patterns (int64), rounded to nearest even; NaN -> 0x7FFF."""
    x = np.asarray(x)
    with np.errstate(over="ignore"):
        bits = x.astype(np.float16).view(np.uint16).astype(np.int64)
    return np.where(np.isnan(x), 0x7FFF, bits)


def _exchange(op, constants, local):
    """The warp-collective step: every lane contributes ``local()`` (its operands, read and checked; a
    SimulatedMisuse it raises is passed on, not raised here) and the constants it issued the operation with;
    returns the 32 contributions once the warp has arrived. Raises in every lane when a lane's operands were
    wrong or the lanes disagree - so no lane is left waiting for one that failed."""
    s = sim()
    try:
        payload, problem = local(), None
    except s.SimulatedMisuse as exc:
        payload, problem = None, str(exc)
    values = s.group_exchange(op, 32, (op, constants, payload, problem))  # .sync.aligned: the warp together
    problems = [v[3] for v in values if v[3] is not None]
    if problems:
        _misuse(problems[0])
    if any(v[:2] != (op, constants) for v in values):
        _misuse(f"{op}: the lanes of warp {s.thread_index() // 32} disagree on the warp-collective operation or its "
                f"constants ({sorted({repr(v[:2]) for v in values})}); all 32 lanes must issue the same one")
    return [v[2] for v in values]


def _sim_mma(acc, a, b, kind, op):
    lane = sim().thread_index() % 32
    f16acc = op == "mma_m16n8k16_f16acc"

    def local():
        if kind not in KINDS:
            _misuse(f"{op}: kind must be one of 'bf16', 'f16', got {kind!r}")
        return (_words(op, "a", a, 4), _words(op, "b", b, 2),
                _words(op, "acc", acc, 2) if f16acc else _accumulators(op, acc))

    values = _exchange(op, kind, local)
    A = np.empty((16, 16))
    B = np.empty((16, 8))
    C = np.empty((16, 8))
    A[_A_INDEX] = _decode(_halves(np.stack([v[0] for v in values])), kind)
    B[_B_INDEX] = _decode(_halves(np.stack([v[1] for v in values])), kind)
    if f16acc:
        C[_C16_INDEX] = _decode(_halves(np.stack([v[2] for v in values])), "f16")
    else:
        C[_C_INDEX] = np.stack([v[2] for v in values])
    D = A @ B + C  # float64, rounded once below
    if not f16acc:
        return tuple(np.float32(D[mma_c_row_col(i, lane)]) for i in range(4))
    out = []
    for reg in range(2):
        lo = _round_f16(D[mma_c_row_col(2 * reg, lane)])
        hi = _round_f16(D[mma_c_row_col(2 * reg + 1, lane)])
        out.append(np.uint32(int(lo) | int(hi) << 16))
    return tuple(out)


def _accumulators(op, acc):
    if not isinstance(acc, tuple) or len(acc) != 4:
        _misuse(f"{op}: acc must be a tuple of 4 float32, got {acc!r}")
    return np.array([np.float32(v) for v in acc], np.float64)


def _check_row(op, tile, offset, lane):
    """The element offset of a lane's row, checked: a 16-byte aligned row of 8 elements inside the tile."""
    s = sim()
    if not isinstance(tile, s.SharedArray):
        _misuse(f"{op}: the tile must be a shared-memory array (from cuda.shared.array), got "
                f"{type(tile).__name__}")
    if tile.dtype.itemsize != 2:
        _misuse(f"{op}: the tile must hold 16-bit elements (uint16, int16 or float16), got {tile.dtype}")
    if not tile.flags.c_contiguous:
        _misuse(f"{op}: the tile must be C-contiguous")
    offset = int(offset)
    if offset < 0 or offset + 8 > tile.size:
        _misuse(f"{op}: lane {lane}'s row (element offset {offset}) is not inside the tile of {tile.size} elements")
    if s.address_of(tile, offset) % 16:
        _misuse(f"{op}: lane {lane}'s row address (element offset {offset} of the tile) is not 16-byte aligned: "
                f"declare the tile with alignment=16 (or more) and use offsets that are multiples of 8")
    return offset


def _sim_ldmatrix(tile, offset, count, trans):
    op = "ldmatrix"
    lane = sim().thread_index() % 32
    count, trans = int(count), bool(trans)

    def local():
        if count not in COUNTS:
            _misuse(f"{op}: count must be one of 1, 2, 4, got {count}")
        if lane >= 8 * count:  # (lanes 8 i .. 8 i + 7 supply the rows of matrix i)
            return None
        o = _check_row(op, tile, offset, lane)
        flat = tile.reshape(-1)  # (element reads go through the simulator's shared-memory checks)
        return np.array([flat[o + j] for j in range(8)], tile.dtype).view(np.uint16).astype(np.int64)

    rows = _exchange(op, (count, trans), local)
    matrices = np.stack(rows[:8 * count]).reshape(count, 8, 8)  # (matrix, row, column) bit patterns
    if trans:
        matrices = matrices.transpose(0, 2, 1)
    g, t = lane // 4, lane % 4
    return tuple(np.uint32(int(m[g, 2 * t]) | int(m[g, 2 * t + 1]) << 16) for m in matrices)


def _sim_stmatrix(tile, offset, values, trans):
    op = "stmatrix"
    lane = sim().thread_index() % 32
    trans = bool(trans)
    count = len(values) if isinstance(values, tuple) else 0

    def local():
        if count not in COUNTS:
            _misuse(f"{op}: values must be a tuple of 1, 2 or 4 uint32, got {values!r}")
        words = _words(op, "values", values, count)
        return words, (_check_row(op, tile, offset, lane) if lane < 8 * count else None)

    contributions = _exchange(op, (count, trans), local)
    o = contributions[lane][1]
    if o is None:
        return
    regs = np.stack([c[0] for c in contributions])  # (lane, matrix)
    i, j = divmod(lane, 8)  # this lane's address is row j of matrix i
    halves = _halves(regs[:, i])  # (lane, half): the fragment of matrix i
    g, t = np.arange(8)[:, None], np.arange(8)[None, :] // 2  # element (row, column) of the fragment ...
    matrix = halves[4 * g + t, np.arange(8)[None, :] % 2]  # ... is lane 4 row + column // 2, half column % 2
    if trans:
        matrix = matrix.T
    flat = tile.reshape(-1)
    for c, bits in enumerate(np.asarray(matrix[j], np.uint16)):
        flat[o + c] = bits.view(tile.dtype)


def _sim_pack(lo, hi, kind):
    rnd = _round_bf16 if kind == "bf16" else _round_f16
    return np.uint32(int(rnd(np.float32(lo))) | int(rnd(np.float32(hi))) << 16)


def _sim_unpack(u, kind):
    word = int(u) & 0xFFFFFFFF
    halves = np.array([word & 0xFFFF, word >> 16], np.uint32)
    if kind == "bf16":  # exact, bits kept (no arithmetic)
        lo, hi = (halves << np.uint32(16)).view(np.float32)
    else:
        lo, hi = halves.astype(np.uint16).view(np.float16).astype(np.float32)
    return lo, hi
