"""wgmma's shared-memory operands: the matrix descriptors of ``wgmma_desc`` and the tile layouts they encode.

A wgmma reads B, and usually A, from shared memory through a 64-bit *matrix descriptor*.
``wgmma_desc(tile, tmap, major, mn, k)`` builds it from the shared tile the TensorMap ``tmap`` fills and the
compile-time facts of the TensorMap type: :func:`operand_layout` checks that wgmma can read the tile (one box,
boxes stacked along the rows, or boxes side by side; rows exactly the swizzle span; 8-row core matrices) and
returns its :class:`OperandLayout` (leading / stride byte offsets, swizzle mode, extents), whose constant bits
:func:`descriptor_fields` gives; only the start address is computed at run time (integer arithmetic, no PTX,
so ``PTX`` is empty). ``major``, ``mn``, ``k`` and the k-step ranges ``k=(k0, k1)`` are described in
:mod:`numbatma.intrinsics.wgmma` (the family's overview) and in :func:`wgmma_desc`.

Under the CUDA simulator ``wgmma_desc`` returns a :class:`SimOperand` (or a :class:`SimOperandRange`) after the
same checks plus the ones only a run can make (the tile starts on its swizzle repeat; the TMA that filled it
used the descriptor's swizzle); :func:`operand_matrix` un-swizzles an operand into float64 values for the
multiply and :func:`record_operand_read` records the bytes a wgmma reads with the engine until its group is
waited for (so a write to them before the wait is reported). The multiply itself is in ``wgmma.py``.
"""
from __future__ import annotations

import numpy as np

from ._asm import Ptx
from ._define import SIMULATING, device_op, fail, require_int, require_shared, sim
from .tma import tile_load_swizzles

__all__ = ["wgmma_desc"]

# operand kind -> (K of one instruction, bytes per element)
KINDS = {"bf16": (16, 2), "f16": (16, 2), "tf32": (8, 4), "e4m3": (32, 1), "e5m2": (32, 1)}
FP8 = ("e4m3", "e5m2")
# Swizzle span (bytes) -> the descriptor's layout code (bits 62-63).
LAYOUT_CODE = {0: 0, 128: 1, 64: 2, 32: 3}


def descriptor_fields(layout):
    """The constant bits of a matrix descriptor (everything but the start address) for a :class:`OperandLayout`:
    leading byte offset (bits 16-29), stride byte offset (bits 32-45), swizzle mode (bits 62-63)."""
    return ((layout.lbo >> 4) << 16) | ((layout.sbo >> 4) << 32) | (LAYOUT_CODE[layout.swizzle] << 62)


class OperandLayout:
    """How an operand tile lies in shared memory, from the tile shape and the TensorMap's compile-time facts.

    ``groups, rows, width``: the tile as ``groups`` boxes of ``rows`` x ``width`` elements (``width`` the
    contiguous axis, ``pitch`` bytes per row). K-major: rows run along M/N, groups along K. MN-major: rows run
    along K, groups along M/N. ``lbo`` / ``sbo``: the descriptor's byte offsets (PTX ISA, "Matrix Descriptor
    Format"; canonical layouts). ``mn_extent`` / ``k_extent``: the operand's size in elements."""

    def __init__(self, kind, major, swizzle, groups, rows, width, itemsize):
        self.kind, self.major, self.swizzle = kind, major, swizzle
        self.groups, self.rows, self.width, self.itemsize = groups, rows, width, itemsize
        self.pitch = width * itemsize
        group_bytes = rows * self.pitch
        self.group_bytes = group_bytes
        if major == "K":
            self.mn_extent, self.k_extent = rows, groups * width
            self.sbo = 8 * self.pitch  # the next 8 rows (core matrices along M/N)
            self.lbo = group_bytes if not swizzle else 16  # no swizzle: the next 16-byte column; else unused (1)
        else:
            self.mn_extent, self.k_extent = groups * width, rows
            if swizzle:
                self.lbo = group_bytes  # the next swizzle atom along M/N
                self.sbo = 8 * self.pitch  # the next 8 rows along K
            else:
                self.lbo = 8 * self.pitch  # the next 8 rows along K (16-byte rows: 128 bytes)
                self.sbo = group_bytes  # the next 16-byte column along M/N

    def byte_offset(self, mn, k):
        """Byte offset of the operand's element (mn, k) - with (mn, k) on the layout's grid - in the tile."""
        if self.major == "K":
            return mn * self.pitch + (k // self.width) * self.group_bytes + (k % self.width) * self.itemsize
        return (mn // self.width) * self.group_bytes + (mn % self.width) * self.itemsize + k * self.pitch

    def __repr__(self):
        return (f"{self.kind}, {self.major}-major, {self.swizzle or 'no'}{'B' if self.swizzle else ''} swizzle, "
                f"{self.mn_extent} (M/N) x {self.k_extent} (K)")


_TMA_KIND = {"BFLOAT16": "bf16", "FLOAT16": "f16", "FLOAT32": "tf32", "TFLOAT32": "tf32", "FLOAT32_FTZ": "tf32",
             "TFLOAT32_FTZ": "tf32"}
# The float8 element of a TensorMap (TensorMap(..., element=) / TensorMapType.element: "e4m3" or "e5m2"; the
# dtype names of float8 arrays are accepted too).
_FP8_ELEMENTS = {"e4m3": "e4m3", "e5m2": "e5m2", "float8_e4m3fn": "e4m3", "float8_e4m3": "e4m3",
                 "float8_e5m2": "e5m2"}


def operand_kind(tma_dtype, element=None):
    """The wgmma operand kind of a TensorMap's elements (``tma_dtype``: the driver's type name; ``element``: the
    TensorMap's float8 element), or None."""
    if element in _FP8_ELEMENTS:
        return _FP8_ELEMENTS[element]
    return _TMA_KIND.get(tma_dtype)


def operand_layout(op, tile_shape, tile_itemsize, desc, major):
    """Check that ``tile_shape`` holds boxes of ``desc`` wgmma can read as a ``major``-major operand; return its
    :class:`OperandLayout`. ``op(message)`` raises the caller's error."""
    kind = operand_kind(desc.tma_dtype, getattr(desc, "element", None))
    if kind is None:
        hint = (" - for float8 data build the TensorMap with element='e4m3' or element='e5m2'"
                if desc.tma_dtype == "UINT8" else "")
        op(f"the TensorMap moves {desc.tma_dtype} elements; wgmma reads bfloat16, float16, float32 (as tf32) and "
           f"float8 (e4m3/e5m2) operands{hint}")
    if major not in ("K", "MN"):
        op(f"major must be 'K' (the tile's contiguous axis is K: A as (M, K), B as (N, K)) or 'MN' (contiguous "
           f"along M/N: B as (K, N)), got {major!r}")
    if major == "MN" and kind not in ("bf16", "f16"):
        op(f"a {kind} operand must be K-major: PTX transposes (reads MN-major) only bf16/f16 operands. Give B as "
           f"(N, K), i.e. the transpose, row-major")
    if desc.interleave or any(e != 1 for e in desc.element_strides):
        op("the TensorMap must have no interleave and element strides of 1")
    box = tuple(desc.shared_shape[-2:]) if len(desc.shared_shape) >= 2 else (1,) + tuple(desc.shared_shape)
    rows, width = box
    if any(b != 1 for b in desc.shared_shape[:-2]):
        op(f"the TensorMap's box {desc.box} must be 2-D (leading extents 1)")
    shape = tuple(tile_shape)
    if len(shape) in (2, 3) and shape[-1] == width and shape[-2] % rows == 0:
        rows = shape[-2]  # boxes stacked along the rows (in each group): one uniformly strided operand per group
    else:
        op(f"the tile {shape} must be one box {box} of the TensorMap, boxes stacked along the rows "
           f"({rows} * i, {width}), or groups of them side by side (groups, {rows} * i, {width})")
    if tile_itemsize != desc.itemsize:
        op("the tile's element size differs from the TensorMap's")
    groups = shape[0] if len(shape) == 3 else 1
    itemsize = desc.itemsize
    span = desc.swizzle
    if span and desc.box[-1] * itemsize != span:
        op(f"the TensorMap's box rows are {desc.box[-1] * itemsize} bytes but its {span}-byte swizzle needs rows of "
           f"exactly {span} bytes ({span // itemsize} elements) for wgmma: TMA pads narrower rows to the span in "
           f"shared memory, and wgmma would read the padding. Use a {desc.box[-1] * itemsize}-byte swizzle or a "
           f"box {span // itemsize} elements wide")
    if span:
        if width * itemsize != span:
            op(f"the box rows are {width * itemsize} bytes but the {span}-byte swizzle needs rows of exactly {span} "
               f"bytes ({span // itemsize} elements) for wgmma (narrower rows are padded in shared memory)")
    elif width * itemsize != 16:
        op(f"without swizzle wgmma reads 16-byte core-matrix rows: the box rows must be 16 bytes "
           f"({16 // itemsize} elements), not {width * itemsize}; or use a 32/64/128-byte swizzle")
    if rows % 8:
        op(f"the box has {rows} rows; wgmma reads 8-row core matrices, so it needs a multiple of 8")
    return OperandLayout(kind, major, span, groups, rows, width, itemsize)

# =============================================================================================================
# Numba types, typing and lowering (GPU)
# =============================================================================================================
if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.datamodel import models
    from numba.cuda.extending import register_model

    from numbatma._types import TensorMapType

    from ._define import shared_address

    I32, I64 = ir.IntType(32), ir.IntType(64)

    class WgmmaOperandType(types.Type):
        """A shared-memory matrix descriptor (64 bits) for one wgmma operand, with its layout's compile-time
        facts (:class:`OperandLayout`)."""

        def __init__(self, layout, mn, k):
            self.layout = layout
            self.mn, self.k = mn, k  # literal offsets, or None when given at run time
            where = f", at mn={mn}" if mn is not None else ""
            where += f", k={k}" if k is not None else ""
            super().__init__(name=f"wgmma_operand({layout!r}{where})")

        @property
        def key(self):
            lay = self.layout
            return (lay.kind, lay.major, lay.swizzle, lay.groups, lay.rows, lay.width, lay.itemsize, self.mn, self.k)

    @register_model(WgmmaOperandType)
    class _OperandModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, I64)

    class WgmmaOperandRangeType(types.Type):
        """The k-steps ``k0, k0 + K, ..., < k1`` of one wgmma operand (``wgmma_desc(..., k=(k0, k1))``): the
        descriptor of the first step (64 bits) and the compile-time layout, ``k0`` and ``k1``; ``wgmma`` issues one
        instruction per step, back to back."""

        def __init__(self, layout, mn, k0, k1):
            self.layout = layout
            self.mn, self.k0, self.k1 = mn, k0, k1
            self.kstep = KINDS[layout.kind][0]
            self.count = (k1 - k0) // self.kstep
            where = f", at mn={mn}" if mn is not None else ""
            super().__init__(name=f"wgmma_operand_range({layout!r}{where}, k={k0}..{k1})")

        def step(self, i):
            """The single operand of step ``i``."""
            return WgmmaOperandType(self.layout, self.mn, self.k0 + i * self.kstep)

        def advance(self, i):
            """What step ``i`` adds to the first step's descriptor (its start address field, 16-byte units)."""
            lay = self.layout
            return (lay.byte_offset(0, self.k0 + i * self.kstep) - lay.byte_offset(0, self.k0)) >> 4

        @property
        def key(self):
            lay = self.layout
            return (lay.kind, lay.major, lay.swizzle, lay.groups, lay.rows, lay.width, lay.itemsize, self.mn,
                    self.k0, self.k1)

    @register_model(WgmmaOperandRangeType)
    class _OperandRangeModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, I64)


def literal_string(op, what, ty, choices):
    if not isinstance(ty, types.StringLiteral):
        fail(op, f"{what} must be a compile-time constant string ({', '.join(map(repr, choices))}), got {ty}")
    if ty.literal_value not in choices:
        fail(op, f"{what} must be one of {', '.join(map(repr, choices))}, got {ty.literal_value!r}")
    return ty.literal_value

# -- operand descriptors ----------------------------------------------------------------------------------------
def _offset_value(op, what, ty, step):
    """A literal offset (checked against ``step``) or None for a run-time integer."""
    if isinstance(ty, types.IntegerLiteral):
        v = ty.literal_value
        if v < 0 or v % step:
            fail(op, f"{what} must be a non-negative multiple of {step}, got {v}")
        return v
    require_int(op, what, ty)
    return None


def _k_range(op, k, kstep, layout):
    """``(k0, k1)`` of a ``k=(k0, k1)`` pair of constants, checked against the k-step and the operand."""
    if len(k) != 2 or not all(isinstance(t, types.IntegerLiteral) for t in k):
        fail(op, f"k must be an integer or a pair of constants (k0, k1) - the k-steps k0, k0 + {kstep}, ... < k1 for "
                 f"one wgmma call to issue back to back -, got {k}")
    k0, k1 = (t.literal_value for t in k)
    if k0 < 0 or k0 % kstep or k1 <= k0 or (k1 - k0) % kstep:
        fail(op, f"k=({k0}, {k1}): k0 and k1 - k0 must be non-negative multiples of the {layout.kind} k-step "
                 f"{kstep}, with k1 > k0")
    if k1 > layout.k_extent:
        fail(op, f"k=({k0}, {k1}) reaches past the operand's K extent {layout.k_extent}")
    return k0, k1


@device_op(prefer_literal=True, simulate=lambda tile, tmap, major, mn, k: _sim_desc(tile, tmap, major, mn, k))
def wgmma_desc(typingctx, tile, tmap, major, mn, k):
    """The shared-memory matrix descriptor of the wgmma operand that starts at element ``(mn, k)`` of the
    tile ``tile`` that the TensorMap ``tmap`` filled (see the module docstring for ``major``).

    The 64-bit value: start address ``(addr & 0x3FFFF) >> 4`` (bits 0-13), leading byte offset >> 4
    (16-29), stride byte offset >> 4 (32-45), swizzle mode (62-63: 1 = 128B, 2 = 64B, 3 = 32B, 0 = none);
    everything but the address is a constant of the types. No PTX: integer arithmetic.

    ``mn``: a multiple of 8 (K-major) or of the box width (MN-major) - e.g. ``64 * warpgroup`` for A;
    ``k``: a multiple of the instruction's K (16 for bf16/f16, 8 tf32, 32 float8) - or a pair of constants
    ``(k0, k1)``: the *range* of k-steps ``k0, k0 + K, ..., < k1``, which one :func:`wgmma` call issues back to
    back (``wgmma(acc, wgmma_desc(a, a_map, "K", row, (0, 128)), wgmma_desc(b, b_map, "K", 0, (0, 128)), 1)``:
    eight instructions for bf16; a Python loop of single steps is not always unrolled, and a loop around wgmma
    makes ptxas wait after each). Typing errors: a tile that
    is not the TensorMap's box (or a stack of boxes), rows that are not exactly the swizzle span, a kind
    that cannot be MN-major, offsets off the grid.

    The caller guarantees the tile starts on the swizzle repeat (``alignment=tmap.shared_alignment``)."""
    op = "wgmma_desc"
    require_shared(op, "the tile", tile)
    if not isinstance(tmap, TensorMapType):
        fail(op, f"the second argument must be the numbatma.TensorMap that fills the tile, got {tmap}")
    if tile.static_shape is None:
        fail(op, "the tile needs a static shape (cuda.shared.array or shared_view)")
    if tile.dtype != tmap.dtype:
        fail(op, f"the tile has dtype {tile.dtype} but the TensorMap moves {tmap.dtype}")
    if tile.layout != "C":
        fail(op, "the tile must be C-contiguous")
    major_value = literal_string(op, "major", major, ("K", "MN"))
    layout = operand_layout(lambda m: fail(op, m), tile.static_shape, tile.dtype.bitwidth // 8, tmap, major_value)
    kstep = KINDS[layout.kind][0]
    mn_step = 8 if major_value == "K" else layout.width
    mn_value = _offset_value(op, "mn", mn, mn_step)
    k_range = _k_range(op, k, kstep, layout) if isinstance(k, types.BaseTuple) else None
    k_value = _offset_value(op, "k", k, kstep) if k_range is None else k_range[0]
    if mn_value is not None and mn_value >= layout.mn_extent:
        fail(op, f"mn={mn_value} lies outside the operand ({layout.mn_extent} elements along M/N)")
    if k_value is not None and k_value + kstep > layout.k_extent:
        fail(op, f"k={k_value}: a {layout.kind} k-step of {kstep} does not fit the operand's K extent "
                 f"{layout.k_extent}")
    if k_range is None:
        result = WgmmaOperandType(layout, mn_value, k_value)
    else:
        result = WgmmaOperandRangeType(layout, mn_value, *k_range)
    fields = descriptor_fields(layout)

    def codegen(context, builder, sig, args):
        base = shared_address(context, builder, sig.args[0], args[0])
        mn_v = context.cast(builder, args[3], sig.args[3], types.int32)
        if k_range is None:
            k_v = context.cast(builder, args[4], sig.args[4], types.int32)
        else:
            k_v = ir.Constant(I32, k_range[0])
        c = lambda v: ir.Constant(I32, v)  # noqa: E731
        if layout.major == "K":
            off = builder.mul(mn_v, c(layout.pitch))
            k_group = builder.udiv(k_v, c(layout.width))
            off = builder.add(off, builder.mul(k_group, c(layout.group_bytes)))
            off = builder.add(off, builder.mul(builder.urem(k_v, c(layout.width)), c(layout.itemsize)))
        else:
            mn_group = builder.udiv(mn_v, c(layout.width))
            off = builder.mul(mn_group, c(layout.group_bytes))
            off = builder.add(off, builder.mul(builder.urem(mn_v, c(layout.width)), c(layout.itemsize)))
            off = builder.add(off, builder.mul(k_v, c(layout.pitch)))
        addr = builder.add(base, off)
        start = builder.lshr(builder.and_(addr, c(0x3FFFF)), c(4))
        start = PTX["wgmma_desc"].emit(builder, start=start)  # (32-bit from here on: see the table's note)
        return builder.or_(builder.zext(start, I64), ir.Constant(I64, fields))

    return result(tile, tmap, major, mn, k), codegen

PTX = {
    # wgmma_desc is integer arithmetic on the tile's 32-bit shared address; this move (ptxas drops it) only
    # keeps LLVM from redoing that arithmetic on the 64-bit pointer when it folds the final zero-extension:
    # ptxas then shifts both halves (SHF.R.U64) and keeps the address's high word alive - a register that a
    # kernel near its budget spills (AttentionBackward's loop: a local load before each descriptor)
    "wgmma_desc": Ptx("mov.b32 $out, $start;", ins=(("start", "b32"),), out=("out", "b32"), memory=False,
                      pure=True),
}


# =============================================================================================================
# Simulator semantics (NUMBA_ENABLE_CUDASIM=1): the operands, decoded and un-swizzled, their reads recorded
# =============================================================================================================
class SimOperand:
    """A wgmma operand under the simulator: the tile, its layout and the (mn, k) origin."""

    def __init__(self, tile, layout, mn, k, site):
        self.tile, self.layout, self.mn, self.k, self.site = tile, layout, int(mn), int(k), site


class SimOperandRange:
    """A range of k-steps of a wgmma operand under the simulator (``wgmma_desc(..., k=(k0, k1))``)."""

    def __init__(self, steps):
        self.steps = steps

    def __len__(self):
        return len(self.steps)


def _sim_desc(tile, tmap, major, mn, k):
    def error(message):
        raise sim().SimulatedMisuse(f"wgmma_desc: {message}")

    layout = operand_layout(error, np.shape(tile), np.asarray(tile).dtype.itemsize, tmap, str(major))
    repeat = 8 * layout.swizzle if layout.swizzle else 16
    offset = _shared_offset(tile)
    if offset % repeat:
        error(f"the tile starts {offset} bytes into its shared allocation, not on a multiple of {repeat} bytes: the "
              + (f"descriptor's {layout.swizzle}-byte swizzle repeats every {repeat} bytes (8 rows) from the start "
                 f"of the tile (TMA swizzles by shared address bits, wgmma from the descriptor's start), so the "
                 f"two would disagree; declare the tile with alignment=tmap.shared_alignment and carve views at "
                 f"multiples of {repeat} bytes" if layout.swizzle else
                 "matrix descriptors address shared memory in 16-byte units"))
    for written, what in tile_load_swizzles(tile):
        if written != (layout.swizzle or 0):
            error(f"the descriptor reads the tile {_describe_tile(tile)} with "
                  f"{_swizzle_words(layout.swizzle)} (from the TensorMap passed to wgmma_desc), but {what} wrote it "
                  f"with {_swizzle_words(written)}: the descriptor's bits disagree with the tile's real layout and "
                  f"wgmma would read scrambled rows. Pass the TensorMap that loaded the tile")
    kstep = KINDS[layout.kind][0]
    mn_step = 8 if layout.major == "K" else layout.width
    mn = int(mn)
    if mn < 0 or mn % mn_step or mn >= layout.mn_extent:
        error(f"mn must be a non-negative multiple of {mn_step} inside the operand's {layout.mn_extent} elements "
              f"along M/N, got {mn}")
    if isinstance(k, tuple):  # a range of k-steps: one operand per step
        if len(k) != 2 or int(k[0]) < 0 or int(k[0]) % kstep or int(k[1]) <= int(k[0]) \
                or (int(k[1]) - int(k[0])) % kstep or int(k[1]) > layout.k_extent:
            error(f"k=({k[0]}, {k[1]}) must be a range of whole {layout.kind} k-steps of {kstep} inside the operand's "
                  f"K extent {layout.k_extent}")
        site = sim().caller_site()  # (the tile, its layout and swizzle checked once for every step of the range)
        return SimOperandRange([SimOperand(tile, layout, mn, k0, site) for k0 in range(int(k[0]), int(k[1]), kstep)])
    k = int(k)
    if k < 0 or k % kstep or k + kstep > layout.k_extent:
        error(f"k must be a non-negative multiple of {kstep} with a whole k-step inside the operand's K extent "
              f"{layout.k_extent}, got {k}")
    return SimOperand(tile, layout, mn, k, sim().caller_site())


def _describe_tile(tile):
    """``(64, 64) bfloat16 tile at byte 8192 of its shared allocation, given at kernel.py:12 (`...`)``."""
    import linecache

    a = np.asarray(tile)
    site = sim().caller_site()
    line = linecache.getline(site[0], site[1]).strip()
    return (f"{a.shape} {a.dtype} at byte {_shared_offset(tile)} of its shared allocation, given at "
            f"{site[0]}:{site[1]}" + (f" (`{line}`)" if line else ""))


def _swizzle_words(span):
    return f"a {span}-byte swizzle" if span else "no swizzle"


def _shared_offset(tile):
    """Byte offset of a simulated shared tile from the start of its allocation (its root NumPy buffer: the
    allocation is aligned as declared on the GPU)."""
    a = np.asarray(tile)
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    return int(a.__array_interface__["data"][0]) - int(root.__array_interface__["data"][0])


def element_values(raw, kind):
    """The real values of operand elements given as their stored bits (a NumPy array of uint)."""
    if kind == "bf16":
        import ml_dtypes

        return raw.astype(np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    if kind == "f16":
        return raw.astype(np.uint16).view(np.float16).astype(np.float64)
    if kind == "tf32":  # the tensor cores read the top 19 bits of each float32
        return (raw.astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    import ml_dtypes

    return raw.astype(np.uint8).view(ml_dtypes.float8_e4m3fn if kind == "e4m3" else ml_dtypes.float8_e5m2) \
        .astype(np.float64)


def operand_matrix(operand, rows, site):
    """The operand as a (rows x K-step) matrix of float64 values: ``rows`` along M/N from ``operand.mn``, one
    instruction's K from ``operand.k``. The async proxy reads the tile: TMA fills must be complete and ordinary
    writes fenced (the same checks as a TMA store's source)."""
    s = sim()
    lay = operand.layout
    tile = np.asarray(operand.tile)
    start = int(tile.__array_interface__["data"][0])
    with s.lock:  # (the rows this instruction reads, as the hardware does - not the whole tile)
        for lo, hi in _read_spans(operand, rows):
            s.check_store_source(start + lo * lay.pitch, start + hi * lay.pitch, "wgmma",
                                 f"{_allocation(operand.tile)[0]}; the wgmma at {site[0]}:{site[1]}")
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[lay.itemsize]
    raw = np.ascontiguousarray(tile).view(np.uint8).reshape(lay.groups, lay.rows, lay.pitch)
    if lay.swizzle:  # undo the swizzle: 16-byte chunk j of row r sits at j ^ (((r * pitch) >> 7) & mask)
        chunks = raw.reshape(lay.groups, lay.rows, lay.pitch // 16, 16)
        r = np.arange(lay.rows)[:, None]
        j = np.arange(lay.pitch // 16)[None, :]
        where = j ^ (((r * lay.pitch) >> 7) & (lay.swizzle // 16 - 1))
        raw = chunks[:, r, where, :].reshape(lay.groups, lay.rows, lay.pitch)
    elements = element_values(np.ascontiguousarray(raw).view(bits).reshape(lay.groups, lay.rows, lay.width),
                               lay.kind)
    full = np.concatenate(list(elements), axis=1)  # K-major: (M/N, K); MN-major: (K, M/N)
    if lay.major == "MN":
        full = full.T
    kstep = KINDS[lay.kind][0]
    return full[operand.mn:operand.mn + rows, operand.k:operand.k + kstep]


def _allocation(tile):
    """(name for messages, address) of the kernel's shared array a tile is (a view of)."""
    s = sim()
    a = tile
    for _ in range(16):
        site = getattr(a, "__dict__", {}).get("_numbatma_site")
        if site is not None:
            return s.describe_site(site), int(a.__array_interface__["data"][0])
        a = getattr(a, "base", None)
        if not isinstance(a, np.ndarray):
            break
    return "a shared tile", int(np.asarray(tile).__array_interface__["data"][0])


def record_operand_read(operand, rows, which, group, site):
    """Record the shared bytes a wgmma operand reads (``rows`` along M/N from ``operand.mn``, its k-step from
    ``operand.k``) with the engine until the warpgroup's commit group ``group`` is retired (``_sim_wait``). Rows of
    a group are whole 16-byte-chunk rows (the swizzle permutes chunks inside a row), so the ranges are exact up to
    the unread k-steps of a K-major row."""
    s = sim()
    lay = operand.layout
    tile = np.asarray(operand.tile)
    start = int(tile.__array_interface__["data"][0])
    name, base = _allocation(operand.tile)
    reader = f"the {which} operand of the wgmma issued at {site[0]}:{site[1]}"
    owner = ("wgmma", s.thread_index() // 128)
    for lo, hi in _read_spans(operand, rows):
        s.add_operand_read(start + lo * lay.pitch, start + hi * lay.pitch, owner, group, name, base, reader)


def _read_spans(operand, rows):
    """The tile rows (``[lo, hi)`` in units of ``pitch`` bytes from the tile's start, groups stacked) that one
    instruction reads: ``rows`` along M/N from ``operand.mn``, its k-step from ``operand.k``. Rows of a group are
    whole 16-byte-chunk rows (the swizzle permutes chunks inside a row), so the spans are exact up to the unread
    k-steps of a K-major row."""
    lay = operand.layout
    if lay.major == "K":  # rows: M/N; the group holds the k-step
        g = min(operand.k // lay.width, lay.groups - 1)
        r0, r1 = min(operand.mn, lay.rows), min(operand.mn + rows, lay.rows)
        spans = [(g * lay.rows + r0, g * lay.rows + r1)]
    else:  # rows: K; the groups lie side by side along M/N
        kstep = KINDS[lay.kind][0]
        r0, r1 = min(operand.k, lay.rows), min(operand.k + kstep, lay.rows)
        g0, g1 = operand.mn // lay.width, min((operand.mn + max(rows, 1) - 1) // lay.width, lay.groups - 1)
        spans = [(g * lay.rows + r0, g * lay.rows + r1) for g in range(g0, g1 + 1)]
    return [(lo, hi) for lo, hi in spans if hi > lo]
