"""Warpgroup matrix multiply-accumulate on Hopper tensor cores: ``wgmma.mma_async`` (sm_90a only).

A *warpgroup* (4 consecutive warps whose first warp index is a multiple of 4: 128 threads) computes
``D = A @ B + D`` for a 64 x N tile of D (N = 8, 16, ..., 256). B, and usually A, are read from shared memory
through 64-bit *matrix descriptors*; A may also come from registers. The result stays in registers: each
thread holds a fragment of D, an **accumulator** value (``wgmma_zeros(N)``), N/2 float32 registers (f32
accumulators) or N/4 registers of two packed float16 (f16 accumulators).

::

    acc = wgmma_zeros(256)                                  # m64n256, float32: 128 registers per thread
    acc = wgmma_fence(acc)                                  # before the first wgmma that reads acc
    for kk in range(BK // 16):                              # (a constant trip count: unrolled)
        acc = wgmma(acc, wgmma_desc(a_tile, a_map, "K", 64 * wg, 16 * kk),
                         wgmma_desc(b_tile, b_map, "K", 0, 16 * kk), 1)
    wgmma_commit_group()
    acc = wgmma_wait_group(0, acc)                          # the results are in acc from here on

Operand kinds (the element type of A and B): ``bf16`` and ``f16`` (K = 16 per instruction), ``tf32`` (K = 8;
float32 data), ``e4m3`` / ``e5m2`` (K = 32; float8 data, mixed pairs allowed). Accumulators are float32 for
every kind, or float16 for ``f16`` and the float8 kinds (``wgmma_zeros_f16(N)``).

**Matrix descriptors** come from ``wgmma_desc(tile, tmap, major, mn, k)``: ``tile`` is the shared tile that
the TensorMap ``tmap`` fills (one box: shape ``tmap.shared_shape``; boxes stacked along the rows, e.g. two
halves of a B tile that two CTAs of a cluster load; or boxes side by side: a 3-D tile ``(groups, rows,
row_elements)``), ``major`` says which axis is contiguous in shared memory:

* ``"K"``: the tile's rows run along M (or N), its contiguous elements along K - A given as (M, K) row-major,
  B given as (N, K) (i.e. Bᵀ row-major). Several boxes stack along K.
* ``"MN"``: the tile's rows run along K, its contiguous elements along M/N - B given as (K, N) row-major.
  Several boxes stack along N (``bf16``/``f16`` only: PTX transposes only 16-bit operands).

``mn`` and ``k`` (elements) select the operand's sub-matrix: the warpgroup's 64 rows of A, a k-step. The
swizzle mode, the leading/stride byte offsets and the k-step advance all follow from the compile-time facts of
the TensorMap type; a tile/descriptor combination wgmma cannot read is a typing error. The tile must start
on the swizzle repeat (``alignment=tmap.shared_alignment``: 1024 bytes for 128B swizzle).

**Ordering** (what the caller guarantees; PTX makes it undefined otherwise): all 128 threads of the warpgroup
execute every ``wgmma*`` call together with the same descriptors; ``wgmma_fence(acc)`` before the first
``wgmma`` that reads accumulators written by other instructions (zeros, scaling, a previous tile) and after
shared memory it reads was written by ordinary stores (plus ``fence_proxy_async_shared_cta``); the shared
memory stays unchanged until the ``wgmma_wait_group`` that covers the group; the accumulators are read only
after that wait. ``wgmma_fence`` / ``wgmma_wait_group`` take and return the accumulators through tied
operands, so the compiler cannot move a use of them across the fence or the wait.

**Float8** operands come from a TensorMap of a 1-byte array built with ``element="e4m3"`` or ``"e5m2"``
(uint8/int8 holding the bits, or a float8 array whose type implies it): TMA moves the bytes, the element is part
of the kernel type, and ``wgmma_desc`` reads the tile as float8 (K = 32 per instruction, K-major only).

**A from registers** (``wgmma(acc, a, b_desc, scale_d)`` with ``a`` four uint32 per thread): for bf16/f16 each
register holds two elements (low half: the lower column); thread ``t`` of the warpgroup (warp ``w = t // 32``,
``g = lane // 4``, ``q = lane % 4``) holds register ``j``: row ``16 w + g + 8 (j % 2)``, columns
``2 q + 8 (j // 2)`` and ``+1`` of the 64 x 16 A tile - the accumulator's own layout, so the columns
``16 k .. 16 k + 15`` of a float32 accumulator, packed, are A's k-step ``k`` (:func:`wgmma_a_fragments`: P @ V of
attention without shared memory). tf32: register ``j`` is row ``16 w + g + 8 (j % 2)``, column ``q + 4 (j // 2)``
of the 64 x 8 tile. The kind of a register A is B's kind (the registers carry no type): pass bf16 fragments
with a bf16 B. Fence (``wgmma_fence``) between writing A registers and the wgmma that reads them; the fence
also takes the fragments (``acc, frags = wgmma_fence((acc, frags))``) to pin them in order.

**Accumulator helpers** (all in registers, after the covering wait): ``acc[i]`` (register ``i``; which element:
:func:`wgmma_row_col`), :func:`wgmma_scale` (alpha), :func:`wgmma_add_bias` (a per-column bias vector),
:func:`wgmma_add_tile` (beta * C from a shared tile), :func:`wgmma_a_fragments` (bf16/f16 A fragments),
:func:`wgmma_store` (into a shared tile, swizzled, ready for a TMA store; ``stmatrix`` for 16-bit tiles) and
:func:`wgmma_store_global` (straight to a 2-D global array, bounds-checked per element: any M, N).

Under the CUDA simulator the same calls decode the descriptors, un-swizzle the tiles and multiply with NumPy
(float32 accumulation); A from registers is gathered from the 128 threads' fragments. Reading accumulators
before the covering wait, a wgmma on accumulators that were not fenced, register A fragments written after the
last fence, bf16 fragments fed with an f16 B (or the reverse), a tile that does not start on its swizzle repeat
and tiles still being filled by TMA are reported.

Targets: sm_90a only. Compiling a kernel that uses wgmma for sm_100a / sm_120a raises ``UnsupportedTarget``;
there, use ``mma_m16n8k16`` (:mod:`numbatma.intrinsics.mma`). (The accumulator helpers without wgmma compile
everywhere; ``stmatrix`` needs sm_90+.) See docs/tensor_cores.md.
"""
from __future__ import annotations

import functools

import numpy as np

from ._asm import TARGETS, Ptx
from ._define import SIMULATING, device_op, fail, require_int, require_literal_int, require_shared, sim
from .tma import tile_load_swizzles

__all__ = [
    "wgmma",
    "wgmma_a_fragments",
    "wgmma_add_bias",
    "wgmma_commit_group",
    "wgmma_desc",
    "wgmma_fence",
    "wgmma_row_col",
    "wgmma_scale",
    "wgmma_store",
    "wgmma_store_global",
    "wgmma_add_tile",
    "wgmma_wait_group",
    "wgmma_zeros",
    "wgmma_zeros_f16",
]

NS = tuple(range(8, 257, 8))
# operand kind -> (K of one instruction, bytes per element)
KINDS = {"bf16": (16, 2), "f16": (16, 2), "tf32": (8, 4), "e4m3": (32, 1), "e5m2": (32, 1)}
FP8 = ("e4m3", "e5m2")
ONLY_90A = ("sm_90a",)
INSTEAD = "use mma_m16n8k16 (numbatma.intrinsics.mma), which every target has"
# Swizzle span (bytes) -> the descriptor's layout code (bits 62-63).
LAYOUT_CODE = {0: 0, 128: 1, 64: 2, 32: 3}


def _combinations():
    """(A kind, B kind, accumulator type) triples PTX defines."""
    out = [("bf16", "bf16", "f32"), ("f16", "f16", "f32"), ("f16", "f16", "f16"), ("tf32", "tf32", "f32")]
    out += [(a, b, d) for a in FP8 for b in FP8 for d in ("f32", "f16")]
    return out


def accumulator_registers(n, dtype):
    """(registers per thread, PTX register class) of an m64nN accumulator of ``dtype`` ("f32" or "f16")."""
    return (n // 2, "f32") if dtype == "f32" else (n // 4, "b32")


def _mma_ptx(n, dtype, akind, bkind, a_source):
    k = KINDS[akind][0]
    count, reg = accumulator_registers(n, dtype)
    head = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{dtype}.{akind}.{bkind}"
    if a_source == "smem":
        a_text, a_ins = "$a_desc", (("a_desc", "b64"),)
    else:
        a_text, a_ins = "$a", (("a", "b32", 4),)
    imm = ("scale_a", "scale_b")
    tail = "$scale_a, $scale_b"
    if akind in ("bf16", "f16"):  # PTX transposes 16-bit operands only, and A only from shared memory
        imm += ("trans_a", "trans_b") if a_source == "smem" else ("trans_b",)
        tail += ", $trans_a, $trans_b" if a_source == "smem" else ", $trans_b"
    text = ("{ .reg .pred p; setp.ne.b32 p, $scale_d, 0; "
            f"{head} $d, {a_text}, $b_desc, p, {tail}; }}")
    return Ptx(text, ins=a_ins + (("b_desc", "b64"), ("scale_d", "b32")), inout=("d", reg, count), imm=imm,
               targets=ONLY_90A, instead=INSTEAD)


# -- the PTX: one description per (N, accumulator, A kind, B kind, A source) ------------------------------------
MMA = {
    (n, d, a, b, src): _mma_ptx(n, d, a, b, src)
    for n in NS
    for a, b, d in _combinations()
    for src in ("smem", "reg")
}


@functools.lru_cache(maxsize=None)
def fence_ptx(reg, count):
    """``wgmma.fence`` carrying ``count`` accumulator registers of class ``reg`` (tied in and out)."""
    return Ptx("wgmma.fence.sync.aligned;", inout=("d", reg, count), targets=ONLY_90A, instead=INSTEAD)


@functools.lru_cache(maxsize=None)
def wait_ptx(reg, count):
    """``wgmma.wait_group N`` carrying ``count`` accumulator registers (tied in and out)."""
    return Ptx("wgmma.wait_group.sync.aligned $n;", imm=("n",), inout=("d", reg, count), targets=ONLY_90A,
               instead=INSTEAD)


COMMIT = Ptx("wgmma.commit_group.sync.aligned;", targets=ONLY_90A, instead=INSTEAD)
_ACC_SHAPES = sorted({accumulator_registers(n, d)[::-1] for n in NS for d in ("f32", "f16")})


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
    if len(shape) == 2 and shape[1] == width and shape[0] % rows == 0:
        rows = shape[0]  # boxes stacked along the rows: one uniformly strided operand
    elif shape[-2:] != box or len(shape) not in (2, 3):
        op(f"the tile {shape} must be one box {box} of the TensorMap, boxes stacked along the rows "
           f"({rows} * i, {width}), or boxes side by side (groups, {rows}, {width})")
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
    from numba.cuda.extending import infer, lower_builtin, register_model
    from numba.cuda.typing.templates import AbstractTemplate, signature

    from numbatma._types import TensorMapType

    from ._define import shared_address

    I32, I64 = ir.IntType(32), ir.IntType(64)

    class WgmmaAccumulatorType(types.Type):
        """An m64nN accumulator fragment: ``count`` registers of one thread (float32, or uint32 holding two
        float16) as one SSA value."""

        def __init__(self, n, dtype):
            self.n, self.dtype = n, dtype
            self.count, self.reg = accumulator_registers(n, dtype)
            super().__init__(name=f"wgmma_accumulator(m64n{n}, {dtype})")

        @property
        def key(self):
            return (self.n, self.dtype)

        @property
        def element(self):
            return types.float32 if self.dtype == "f32" else types.uint32

        def llvm_type(self):
            return ir.ArrayType(ir.FloatType() if self.dtype == "f32" else I32, self.count)

    @register_model(WgmmaAccumulatorType)
    class _AccumulatorModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, fe_type.llvm_type())

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

    @infer
    class _AccumulatorStaticGetItem(AbstractTemplate):
        key = "static_getitem"

        def generic(self, args, kws):
            acc, index = args
            if isinstance(acc, WgmmaAccumulatorType) and isinstance(index, int):
                if not -acc.count <= index < acc.count:
                    fail("accumulator[i]", f"index {index} is out of range for {acc} ({acc.count} registers)")
                return signature(acc.element, acc, types.literal(index))

    @lower_builtin("static_getitem", WgmmaAccumulatorType, types.IntegerLiteral)
    def _lower_acc_getitem(context, builder, sig, args):
        return builder.extract_value(args[0], sig.args[1].literal_value % sig.args[0].count)

    def _as_array(builder, struct, ty):
        """The literal struct an asm statement returns -> the LLVM array value of the accumulator type ``ty``."""
        out = ir.Constant(ty.llvm_type(), None)
        for i in range(ty.count):
            out = builder.insert_value(out, builder.extract_value(struct, i), i)
        return out

    def _is_fragment(ty):
        """A register A fragment: four 32-bit integers (uint32 holding packed bf16/f16 pairs, or tf32 bits)."""
        return isinstance(ty, types.UniTuple) and ty.count == 4 and isinstance(ty.dtype, types.Integer) \
            and ty.dtype.bitwidth == 32

    def _register_classes(op, ty):
        """PTX register class of every register of ``ty`` - an accumulator, a register A fragment or a (nested)
        tuple of them - in order."""
        if isinstance(ty, WgmmaAccumulatorType):
            return [ty.reg] * ty.count
        if _is_fragment(ty):
            return ["b32"] * 4
        if isinstance(ty, types.BaseTuple) and len(ty):
            return [r for t in ty for r in _register_classes(op, t)]
        fail(op, f"expected a wgmma accumulator (from wgmma_zeros), a register A fragment (four uint32) or a tuple "
                 f"of them, got {ty}")

    def _accumulator_group(op, accs):
        """(register class, count) of the registers ``accs`` carries: one class, or "b32" for a mix (float32
        registers travel bit-cast)."""
        regs = _register_classes(op, accs)
        return (regs[0] if len(set(regs)) == 1 else "b32"), len(regs)

    def _registers(builder, accs, values):
        """Flat list of the registers of ``values`` (of type ``accs``: an accumulator, a fragment, a tuple)."""
        if isinstance(accs, types.Integer):
            return [values]
        if isinstance(accs, WgmmaAccumulatorType):
            return [builder.extract_value(values, i) for i in range(accs.count)]
        out = []
        for i, ty in enumerate(accs):
            out += _registers(builder, ty, builder.extract_value(values, i))
        return out

    def _rebuild(builder, accs, struct, old, start=0):
        """``old`` (of type ``accs``) with its registers replaced by registers ``start..`` of an asm result
        (bit-cast back where the asm carried float32 registers as b32). Returns (value, next start)."""
        if isinstance(accs, types.Integer):
            return _as(builder, builder.extract_value(struct, start), old.type), start + 1
        out = old
        if isinstance(accs, WgmmaAccumulatorType):
            for i in range(accs.count):
                reg = _as(builder, builder.extract_value(struct, start + i), old.type.element)
                out = builder.insert_value(out, reg, i)
            return out, start + accs.count
        for i, ty in enumerate(accs):
            item, start = _rebuild(builder, ty, struct, builder.extract_value(old, i), start)
            out = builder.insert_value(out, item, i)
        return out, start

    def _as(builder, value, ty):
        """``value`` as LLVM type ``ty`` (a bit-cast between float and i32 of the fence's register class)."""
        return value if value.type == ty else builder.bitcast(value, ty)


def _literal_string(op, what, ty, choices):
    if not isinstance(ty, types.StringLiteral):
        fail(op, f"{what} must be a compile-time constant string ({', '.join(map(repr, choices))}), got {ty}")
    if ty.literal_value not in choices:
        fail(op, f"{what} must be one of {', '.join(map(repr, choices))}, got {ty.literal_value!r}")
    return ty.literal_value


# -- accumulators ---------------------------------------------------------------------------------------------
def _zeros(op, n, dtype):
    value = require_literal_int(op, "N", n, 8, 256)
    if value % 8:
        fail(op, f"N must be a multiple of 8 in 8..256 (the wgmma shapes m64n8..m64n256), got {value}")
    ty = WgmmaAccumulatorType(value, dtype)

    def codegen(context, builder, sig, args):
        return ir.Constant(ty.llvm_type(), None)

    return ty(n), codegen


@device_op(prefer_literal=True, simulate=lambda n: _sim_zeros(n, "f32"))
def wgmma_zeros(typingctx, n):
    """A zero m64nN float32 accumulator (N a constant in 8..256, multiple of 8): N/2 float32 registers per
    thread, no instruction (a constant). ``acc[i]`` reads register ``i`` (a constant index) once the
    covering ``wgmma_wait_group`` has returned it; :func:`wgmma_row_col` says which element of D it is."""
    return _zeros("wgmma_zeros", n, "f32")


@device_op(prefer_literal=True, simulate=lambda n: _sim_zeros(n, "f16"))
def wgmma_zeros_f16(typingctx, n):
    """A zero m64nN float16 accumulator: N/4 registers per thread, each two float16 (low half: the even
    column). For ``f16`` and float8 operands."""
    return _zeros("wgmma_zeros_f16", n, "f16")


@device_op(prefer_literal=True, simulate=lambda acc, alpha: _sim_scale(acc, alpha))
def wgmma_scale(typingctx, acc, alpha):
    """Every float32 register of ``acc`` times ``alpha`` (FMULs, in registers). Call it after the wait that
    covers ``acc``; fence again (``wgmma_fence``) before a later wgmma accumulates into the result."""
    op = "wgmma_scale"
    if not isinstance(acc, WgmmaAccumulatorType) or acc.dtype != "f32":
        fail(op, f"expected a float32 wgmma accumulator, got {acc}")
    if not isinstance(alpha, (types.Float, types.Integer)):
        fail(op, f"alpha must be a number, got {alpha}")

    def codegen(context, builder, sig, args):
        a = context.cast(builder, args[1], sig.args[1], types.float32)
        out = args[0]
        for i in range(acc.count):
            out = builder.insert_value(out, builder.fmul(builder.extract_value(out, i), a), i)
        return out

    return acc(acc, alpha), codegen


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
    major_value = _literal_string(op, "major", major, ("K", "MN"))
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
        return builder.or_(builder.zext(start, I64), ir.Constant(I64, fields))

    return result(tile, tmap, major, mn, k), codegen


# -- the multiply-accumulate ------------------------------------------------------------------------------------
def _check_operands(op, acc, a, b):
    if not isinstance(acc, WgmmaAccumulatorType):
        fail(op, f"the accumulator must come from wgmma_zeros / wgmma_zeros_f16 (or a previous wgmma), got {acc}")
    if not isinstance(b, WgmmaOperandType):
        fail(op, f"B must be a shared-memory operand from wgmma_desc(tile, tmap, major, mn, k), got {b}")
    lb = b.layout
    if isinstance(a, WgmmaOperandType):
        la = a.layout
        a_source, akind = "smem", la.kind
    elif _is_fragment(a):
        la, a_source, akind = None, "reg", lb.kind if lb.kind not in FP8 else None
        if akind is None:
            fail(op, "A from registers with a float8 B: four uint32 registers do not say whether A is e4m3 or "
                     "e5m2, so numbatma reads float8 A from shared memory only (wgmma_desc)")
    else:
        fail(op, f"A must be a shared-memory operand (wgmma_desc) or a register fragment (a tuple of four "
                 f"uint32), got {a}")
    bkind = lb.kind
    if (akind in FP8) != (bkind in FP8) or (akind not in FP8 and akind != bkind):
        fail(op, f"A is {akind} but B is {bkind}; both must be the same kind (float8: e4m3/e5m2 in any pair)")
    if acc.dtype == "f16" and akind not in ("f16",) + FP8:
        fail(op, f"float16 accumulators take f16 or float8 operands, not {akind}; use wgmma_zeros(N)")
    kstep = KINDS[akind][0]
    if la is not None:
        if la.mn_extent - (a.mn or 0) < 64:
            fail(op, f"A ({la!r}{'' if a.mn is None else f', from row {a.mn}'}) has fewer than the 64 rows an "
                     f"m64 wgmma reads")
        if la.k_extent - (a.k or 0) < kstep:
            fail(op, f"A has fewer than {kstep} elements along K from k={a.k}")
    if lb.mn_extent - (b.mn or 0) < acc.n:
        fail(op, f"the accumulator is m64n{acc.n} but B ({lb!r}) has only {lb.mn_extent - (b.mn or 0)} columns "
                 f"along N{'' if b.mn is None else f' from {b.mn}'}")
    if lb.k_extent - (b.k or 0) < kstep:
        fail(op, f"B has fewer than {kstep} elements along K from k={b.k}")
    return a_source, akind, bkind, la, lb


@device_op(simulate=lambda acc, a, b, scale_d: _sim_mma(acc, a, b, scale_d))
def wgmma(typingctx, acc, a, b, scale_d):
    """``acc = A @ B + (acc if scale_d else 0)`` for the warpgroup's m64nN tile, issued asynchronously.

    Emits ``wgmma.mma_async`` m64nNkK of the accumulator's type (f32 or f16) and the A and B kinds - A from a
    descriptor or registers, B from a descriptor, scale-a and scale-b 1 (PTX below) - with
    ``p = (scale_d != 0)`` (a predicate set from the run-time value: pass 0 on the first k-step of a tile to
    overwrite instead of accumulating) and, for 16-bit kinds, the transposes (A's only from shared memory)
    from the operands' majors (MN-major = 1). ``acc`` is tied in and out; N comes from the accumulator's type,
    the kinds from the operands'. ``a``: a :func:`wgmma_desc` operand, or a register fragment (four uint32:
    8 bf16/f16 or 4 tf32 values per thread, the A fragment layout of the PTX ISA). ``b``: a :func:`wgmma_desc`
    operand with at least N columns. The returned accumulator must not be read before :func:`wgmma_wait_group`
    returns it.

    **Ranges**: with ``b`` a range of k-steps (``wgmma_desc(..., k=(k0, k1))``) and ``a`` a range of as many
    steps or a tuple of as many register fragments (``wgmma_a_fragments``), one call issues every step back to
    back - ``scale_d`` applies to the first, the others accumulate - with descriptors advanced by constants."""
    op = "wgmma"
    steps = _range_steps(op, a, b)
    if steps is None:
        a_source, akind, bkind, la, lb = _check_operands(op, acc, a, b)
    else:
        for i in range(steps):  # every step: the same instruction, each on its own k-slice
            a_i = a.step(i) if isinstance(a, WgmmaOperandRangeType) else a.dtype
            a_source, akind, bkind, la, lb = _check_operands(op, acc, a_i, b.step(i))
    if not isinstance(scale_d, types.Boolean):
        require_int(op, "scale_d", scale_d)
    ptx = MMA[(acc.n, acc.dtype, akind, bkind, a_source)]
    imm = {"scale_a": 1, "scale_b": 1}
    if akind in ("bf16", "f16"):
        imm["trans_b"] = int(lb.major == "MN")
        if a_source == "smem":
            imm["trans_a"] = int(la.major == "MN")

    def codegen(context, builder, sig, args):
        scale = context.cast(builder, args[3], sig.args[3], types.int32)
        d = args[0]
        for i in range(steps or 1):
            if steps is None:
                a_i, b_i = args[1], args[2]
            else:  # step i: the first step's descriptors advanced by constants; register A: fragment i
                b_i = builder.add(args[2], ir.Constant(I64, b.advance(i)))
                a_i = (builder.add(args[1], ir.Constant(I64, a.advance(i))) if a_source == "smem"
                       else builder.extract_value(args[1], i))
            operands = dict(d=d, b_desc=b_i, scale_d=scale if i == 0 else ir.Constant(I32, 1), **imm)
            operands["a_desc" if a_source == "smem" else "a"] = a_i
            d = _as_array(builder, ptx.emit(builder, **operands), acc)
        return d

    return acc(acc, a, b, scale_d), codegen


def _range_steps(op, a, b):
    """None for single operands; else the number of k-steps of a range call (B a ``k=(k0, k1)`` range; A a
    range of the same length or a tuple of as many register fragments)."""
    a_frags = isinstance(a, types.UniTuple) and _is_fragment(a.dtype)
    if not isinstance(b, WgmmaOperandRangeType):
        if isinstance(a, WgmmaOperandRangeType) or a_frags:
            fail(op, f"A covers several k-steps ({a}) but B is a single k-step ({b}): give B as a range too "
                     f"(wgmma_desc(..., k=(k0, k1)))")
        return None
    if isinstance(a, WgmmaOperandRangeType):
        count = a.count
    elif a_frags:
        count = a.count
    else:
        fail(op, f"B covers {b.count} k-steps ({b}); A must be a range of as many (wgmma_desc(..., k=(k0, k1))) or a "
                 f"tuple of {b.count} register fragments (wgmma_a_fragments), got {a}")
    if count != b.count:
        fail(op, f"A covers {count} k-steps but B {b.count}: one wgmma call multiplies matching k-slices")
    return count


@device_op(simulate=lambda acc: _sim_fence(acc))
def wgmma_fence(typingctx, acc):
    """``wgmma.fence.sync.aligned;`` with ``acc`` tied through it: returns ``acc``. ``acc``: an accumulator, a
    register A fragment (four uint32), or a (nested) tuple of them - e.g. ``acc, frags = wgmma_fence((acc,
    frags))``. Required before the first wgmma of a sequence that reads accumulators written otherwise
    (``wgmma_zeros``, ``wgmma_scale``, a finished tile), between writing register A fragments and the wgmma
    that reads them, and between ordinary writes to shared memory it reads (with
    ``fence_proxy_async_shared_cta``) and the wgmma. The instruction orders every register of the warpgroup;
    the tied values keep the compiler from moving their writes across it."""
    reg, count = _accumulator_group("wgmma_fence", acc)
    ptx = fence_ptx(reg, count)

    def codegen(context, builder, sig, args):
        return _rebuild(builder, acc, ptx.emit(builder, d=_registers(builder, acc, args[0])), args[0])[0]

    return acc(acc), codegen


@device_op(simulate=lambda: _sim_commit())
def wgmma_commit_group(typingctx):
    """``wgmma.commit_group.sync.aligned;`` - the wgmma operations this warpgroup issued since the last commit
    form one group (waited for with :func:`wgmma_wait_group`)."""

    def codegen(context, builder, sig, args):
        COMMIT.emit(builder)
        return context.get_dummy_value()

    return types.void(), codegen


@device_op(prefer_literal=True, simulate=lambda n, acc: _sim_wait(n, acc))
def wgmma_wait_group(typingctx, n, acc):
    """``wgmma.wait_group.sync.aligned N;`` with ``acc`` tied through (returned): waits until at most ``N``
    (a constant 0..7) of this warpgroup's committed groups are pending. Read accumulators only from the
    value returned by the wait that covers the wgmma that wrote them."""
    value = require_literal_int("wgmma_wait_group", "N", n, 0, 7)
    reg, count = _accumulator_group("wgmma_wait_group", acc)
    ptx = wait_ptx(reg, count)

    def codegen(context, builder, sig, args):
        return _rebuild(builder, acc, ptx.emit(builder, d=_registers(builder, acc, args[1]), n=value), args[1])[0]

    return acc(n, acc), codegen


# -- the fragment layout and the epilogue ------------------------------------------------------------------------
def wgmma_row_col(i, thread):
    """(row, column) in the m64nN tile of register ``i`` of a float32 accumulator held by ``thread`` (the
    thread's index in its warpgroup, 0..127). Warp ``w = thread // 32`` holds rows ``16 w .. 16 w + 15``;
    lane ``l``: row ``16 w + l // 4 + 8 * ((i // 2) % 2)``, column ``8 * (i // 4) + 2 * (l % 4) + i % 2``.
    (For float16 accumulators register ``i`` holds columns ``c, c + 1`` of that row for ``i' = 2 i``.)
    A plain function: use it in kernels (it inlines to integer arithmetic) and in host code."""
    w = thread // 32
    lane = thread % 32
    return 16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


if not SIMULATING:
    from numba.cuda.extending import register_jitable

    register_jitable(inline="always")(wgmma_row_col)  # callable in kernels; the name stays the plain function


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


# -- accumulator helpers: A fragments, global stores, bias ---------------------------------------------------------
def require_f32_accumulator(op, acc):
    if not isinstance(acc, WgmmaAccumulatorType) or acc.dtype != "f32":
        fail(op, f"expected a float32 wgmma accumulator (wgmma_zeros), got {acc}")


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
    kind_value = _literal_string(op, "kind", kind, ("bf16", "f16"))
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
    Plain ``st.global`` of single elements - the simple way out of registers; a TMA store of a tile filled by
    :func:`wgmma_store` moves large tiles faster. Call after the covering wait; 1-D blocks (the thread's
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
        r_base = builder.add(context.cast(builder, args[2], sig.args[2], types.int64),
                             builder.add(builder.mul(builder.udiv(tid, c(32)), c(16)), builder.udiv(lane, c(4))))
        c_base = builder.add(context.cast(builder, args[3], sig.args[3], types.int64),
                             builder.mul(builder.urem(lane, c(4)), c(2)))
        f32, f16, i16 = ir.FloatType(), ir.HalfType(), ir.IntType(16)
        for block in range(acc.n // 8):
            for half in (0, 1):
                row = builder.add(r_base, c(8 * half))
                row_ok = builder.icmp_unsigned("<", row, shape[0])  # (negative rows wrap to huge: skipped)
                pair = _fragment_pairs(builder, acc, args[0], block, half)
                if dst == types.float32:
                    values = [v if v.type == f32 else builder.fpext(v, f32) for v in pair]
                elif dst == types.float16 and acc.dtype == "f16":
                    values = list(pair)
                else:
                    lo, hi = [v if v.type == f32 else builder.fpext(v, f32) for v in pair]
                    word = _PACK["f16" if dst == types.float16 else "bf16"].emit(builder, hi=hi, lo=lo)
                    values = [builder.trunc(word, i16), builder.trunc(builder.lshr(word, ir.Constant(I32, 16)), i16)]
                    if dst == types.float16:
                        values = [builder.bitcast(v, f16) for v in values]
                for e in (0, 1):
                    col = builder.add(c_base, c(8 * block + e))
                    ok = builder.and_(row_ok, builder.icmp_unsigned("<", col, shape[1]))
                    with cgutils.if_likely(builder, ok):
                        ptr = cgutils.get_item_pointer2(context, builder, data=ary.data, shape=shape,
                                                        strides=strides, layout=aryty.layout, inds=[row, col])
                        builder.store(_as(builder, values[e], ptr.type.pointee), ptr)  # (float16: i16 in arrays)
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
    **{f"wgmma(m64n{n}, {d}, {a}x{b}, A from {src})": p for (n, d, a, b, src), p in MMA.items()},
    **{f"wgmma_fence({count} {reg})": fence_ptx(reg, count) for reg, count in _ACC_SHAPES},
    **{f"wgmma_wait_group({count} {reg})": wait_ptx(reg, count) for reg, count in _ACC_SHAPES},
    "wgmma_commit_group": COMMIT,
    "wgmma_store(bf16 pack)": _F32_TO_BF16X2,
    "wgmma_store(f16 pack)": _F32_TO_F16X2,
    "wgmma_store(stmatrix x4)": _STMATRIX[4],
    "wgmma_store(stmatrix x2)": _STMATRIX[2],
    "wgmma_store(thread index)": _THREAD_X,
}



# =============================================================================================================
# Simulator semantics (NUMBA_ENABLE_CUDASIM=1): decode the operands, un-swizzle, multiply with NumPy
# =============================================================================================================
class SimAccumulator:
    """A thread's accumulator under the simulator: its registers (float32; or uint32 pairs of float16), and
    what the GPU's ordering rules say about them: ``fenced`` (no other write since the last wgmma_fence /
    wgmma), ``group`` (the wgmma group that last wrote it; None when no wgmma is pending) and ``site``."""

    def __init__(self, n, dtype, values, fenced, group=None, site=None):
        self.n, self.dtype, self.values = n, dtype, values
        self.fenced, self.group, self.site = fenced, group, site

    def copy(self, **changes):
        out = SimAccumulator(self.n, self.dtype, self.values, self.fenced, self.group, self.site)
        out.__dict__.update(changes)
        return out

    def _ready(self, what):
        if self.group is not None:
            raise sim().SimulatedMisuse(
                f"{what} an accumulator that the wgmma at {self.site[0]}:{self.site[1]} is still writing: read it "
                f"only from the value returned by the wgmma_wait_group that covers that wgmma's commit group")

    def __getitem__(self, i):
        self._ready(f"accumulator[{i}] reads")
        return self.values[int(i)]

    def __len__(self):
        return len(self.values)


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


def _sim_me():
    """(thread object, index of the thread in its warpgroup)."""
    s = sim()
    return s.current_thread(), s.thread_index() % 128


def _sim_zeros(n, dtype):
    n = int(n)
    if not 8 <= n <= 256 or n % 8:
        raise sim().SimulatedMisuse(f"wgmma_zeros: N must be a multiple of 8 in 8..256, got {n}")
    count, _ = accumulator_registers(n, dtype)
    values = np.zeros(count, np.float32 if dtype == "f32" else np.uint32)
    return SimAccumulator(n, dtype, values, fenced=False)


def _sim_scale(acc, alpha):
    if not isinstance(acc, SimAccumulator) or acc.dtype != "f32":
        raise sim().SimulatedMisuse("wgmma_scale: expected a float32 wgmma accumulator")
    acc._ready("wgmma_scale reads")
    return acc.copy(values=(acc.values * np.float32(alpha)).astype(np.float32), fenced=False)


class SimFragment(tuple):
    """Register A fragment under the simulator (four np.uint32) made by :func:`wgmma_a_fragments` (or four integers
    of the kernel's own passed through :func:`wgmma_fence`): ``kind`` (what its halves hold; None: not known),
    ``epoch`` (the thread's wgmma_fence count when it was written), ``site`` and ``fenced`` (it went through a
    wgmma_fence since it was written: only then may a wgmma read it)."""

    def __new__(cls, values, kind, epoch, site, fenced=False):
        out = super().__new__(cls, values)
        out.kind, out.epoch, out.site, out.fenced = kind, epoch, site, fenced
        return out


def _fences(me):
    return me.__dict__.get("_numbatma_wgmma_fences", 0)


def _sim_fence(acc):
    sim().group_exchange("wgmma_fence", 128, None)
    me, _ = _sim_me()
    me._numbatma_wgmma_fences = _fences(me) + 1  # (orders every register written before it)
    return _fenced(acc)


def _fenced(acc):
    """What ``wgmma_fence`` returns for its operand: accumulators and register A fragments marked fenced (a wgmma may
    read them); a tuple of four integers (the kernel's own register A fragment) becomes a fenced SimFragment."""
    if isinstance(acc, SimAccumulator):
        return acc.copy(fenced=True)
    if isinstance(acc, SimFragment):
        return SimFragment(tuple(acc), acc.kind, acc.epoch, acc.site, fenced=True)
    if isinstance(acc, tuple):
        if len(acc) == 4 and all(isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_))
                                 for a in acc):
            me, _ = _sim_me()
            return SimFragment(acc, None, _fences(me), sim().caller_site(), fenced=True)
        return tuple(_fenced(a) for a in acc)
    return acc  # plain values


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
    if isinstance(k, tuple):  # a range of k-steps: one operand per step
        if len(k) != 2 or int(k[0]) < 0 or int(k[0]) % kstep or int(k[1]) <= int(k[0]) \
                or (int(k[1]) - int(k[0])) % kstep or int(k[1]) > layout.k_extent:
            error(f"k=({k[0]}, {k[1]}) must be a range of whole {layout.kind} k-steps of {kstep} inside the operand's "
                  f"K extent {layout.k_extent}")
        return SimOperandRange([_sim_desc(tile, tmap, major, mn, k0) for k0 in range(int(k[0]), int(k[1]), kstep)])
    mn, k = int(mn), int(k)
    if mn < 0 or mn % mn_step or mn >= layout.mn_extent:
        error(f"mn must be a non-negative multiple of {mn_step} inside the operand's {layout.mn_extent} elements "
              f"along M/N, got {mn}")
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


def _element_values(raw, kind):
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


def _operand_matrix(operand, rows, site):
    """The operand as a (rows x K-step) matrix of float64 values: ``rows`` along M/N from ``operand.mn``, one
    instruction's K from ``operand.k``. The async proxy reads the tile: TMA fills must be complete and ordinary
    writes fenced (the same checks as a TMA store's source)."""
    s = sim()
    lay = operand.layout
    tile = np.asarray(operand.tile)
    lo, hi = s.bounds(tile)
    with s.lock:
        s.check_store_source(lo, hi, "wgmma", f"{_allocation(operand.tile)[0]}; the wgmma at {site[0]}:{site[1]}")
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[lay.itemsize]
    raw = np.ascontiguousarray(tile).view(np.uint8).reshape(lay.groups, lay.rows, lay.pitch)
    if lay.swizzle:  # undo the swizzle: 16-byte chunk j of row r sits at j ^ (((r * pitch) >> 7) & mask)
        chunks = raw.reshape(lay.groups, lay.rows, lay.pitch // 16, 16)
        r = np.arange(lay.rows)[:, None]
        j = np.arange(lay.pitch // 16)[None, :]
        where = j ^ (((r * lay.pitch) >> 7) & (lay.swizzle // 16 - 1))
        raw = chunks[:, r, where, :].reshape(lay.groups, lay.rows, lay.pitch)
    elements = _element_values(np.ascontiguousarray(raw).view(bits).reshape(lay.groups, lay.rows, lay.width),
                               lay.kind)
    full = np.concatenate(list(elements), axis=1)  # K-major: (M/N, K); MN-major: (K, M/N)
    if lay.major == "MN":
        full = full.T
    kstep = KINDS[lay.kind][0]
    return full[operand.mn:operand.mn + rows, operand.k:operand.k + kstep]


def _is_fragment_value(a):
    return isinstance(a, (tuple, list, np.ndarray)) and not isinstance(a, SimOperand) and len(a) == 4


def _register_a_matrix(contributions, kind):
    """The 64 x K A tile (float64 values) from the 128 threads' register fragments (PTX ISA, "WGMMA .m64nNk16 /
    .m64nNk8 register fragment layout for matrix A"): thread t (warp w = t // 32, g = lane // 4, q = lane % 4)
    holds in register j row 16 w + g + 8 (j % 2); columns 2 q + 8 (j // 2) and +1 (bf16/f16: low half
    first), or column q + 4 (j // 2) (tf32)."""
    regs = np.array([[int(x) & 0xFFFFFFFF for x in c] for c in contributions], dtype=np.uint64).astype(np.uint32)
    t = np.arange(128)
    w, lane = t // 32, t % 32
    g, q = lane // 4, lane % 4
    k = KINDS[kind][0]
    out = np.zeros((64, k))
    for j in range(4):
        row = 16 * w + g + 8 * (j % 2)
        if kind == "tf32":
            out[row, q + 4 * (j // 2)] = _element_values(regs[:, j], kind)
        else:
            col = 2 * q + 8 * (j // 2)
            out[row, col] = _element_values(regs[:, j] & 0xFFFF, kind)
            out[row, col + 1] = _element_values(regs[:, j] >> 16, kind)
    return out


def _sim_mma(acc, a, b, scale_d):
    if isinstance(b, SimOperandRange) or isinstance(a, SimOperandRange):
        return _sim_mma_range(acc, a, b, scale_d)
    s = sim()
    me, t = _sim_me()
    site = s.caller_site()
    register_a = _is_fragment_value(a)
    # The async proxy reads the shared operands from the issue until the wait that retires the group: recorded by
    # every thread before the issue completes, so no thread can write them unseen (checked by the engine)
    group = me.__dict__.get("_numbatma_wgmma_commits", 0)
    for which, operand, rows in (("A", a, 64), ("B", b, getattr(acc, "n", 0))):
        if isinstance(operand, SimOperand):
            _record_operand_read(operand, rows, which, group, site)
    # .sync.aligned: the warpgroup issues it together (and register A is the warpgroup's 128 fragments)
    contributions = s.group_exchange("wgmma", 128, tuple(a) if register_a else None)
    if not isinstance(acc, SimAccumulator):
        raise s.SimulatedMisuse(f"wgmma: the accumulator must come from wgmma_zeros (got {type(acc).__name__})")
    if not isinstance(b, SimOperand):
        raise s.SimulatedMisuse("wgmma: B must be a shared-memory operand from wgmma_desc")
    if scale_d and not acc.fenced:
        raise s.SimulatedMisuse(
            f"wgmma at {site[0]}:{site[1]} accumulates into registers that other instructions wrote (wgmma_zeros, "
            f"wgmma_scale, ...) with no wgmma_fence(acc) in between: on the GPU the tensor cores may read the old "
            f"values. Pass acc through wgmma_fence first")
    bkind = b.layout.kind
    if register_a:
        if any(c is None for c in contributions):
            raise s.SimulatedMisuse(f"wgmma at {site[0]}:{site[1]}: some threads of the warpgroup pass A from "
                                    f"registers, others a descriptor; all 128 must pass the same form")
        if bkind in FP8:
            raise s.SimulatedMisuse("wgmma: A from registers with a float8 B: four uint32 registers do not say "
                                    "whether A is e4m3 or e5m2, so numbatma reads float8 A from shared memory only "
                                    "(wgmma_desc)")
        if not isinstance(a, SimFragment) or not a.fenced:
            written = (f"A fragments written at {a.site[0]}:{a.site[1]}" if isinstance(a, SimFragment) else
                       "A fragments (registers of the kernel's own)")
            raise s.SimulatedMisuse(
                f"wgmma at {site[0]}:{site[1]} reads {written} with no wgmma_fence after them (or one that was not "
                f"given them: they must pass through wgmma_fence since they were written): on the GPU the tensor cores "
                f"may read the registers before the conversion lands. Pass them through the fence, e.g. acc, frags = "
                f"wgmma_fence((acc, frags)), before the wgmma")
        if a.kind is not None and a.kind != bkind:
            raise s.SimulatedMisuse(
                f"wgmma at {site[0]}:{site[1]}: the A fragments hold {a.kind} values (wgmma_a_fragments at "
                f"{a.site[0]}:{a.site[1]}) but B is {bkind}: the registers would be read as {bkind}")
        akind = bkind
        a_matrix = _register_a_matrix(contributions, akind)
    else:
        if not isinstance(a, SimOperand):
            raise s.SimulatedMisuse(f"wgmma: A must be a wgmma_desc operand or a register fragment (four uint32), "
                                    f"got {type(a).__name__}")
        akind = a.layout.kind
        if a.layout.mn_extent - a.mn < 64:
            raise s.SimulatedMisuse(f"wgmma: the operands are smaller than m64n{acc.n}")
        a_matrix = _operand_matrix(a, 64, site)
    if (akind in FP8) != (bkind in FP8) or (akind not in FP8 and akind != bkind):
        raise s.SimulatedMisuse(f"wgmma: A is {akind} but B is {bkind}")
    if acc.dtype == "f16" and akind not in ("f16",) + FP8:
        raise s.SimulatedMisuse(f"wgmma: float16 accumulators take f16 or float8 operands, not {akind}")
    if b.layout.mn_extent - b.mn < acc.n:
        raise s.SimulatedMisuse(f"wgmma: the operands are smaller than m64n{acc.n}")
    product = a_matrix @ _operand_matrix(b, acc.n, site).T  # (64, N), float64
    count, _ = accumulator_registers(acc.n, acc.dtype)
    i = np.arange(count)
    if acc.dtype == "f32":
        rows, cols = wgmma_row_col(i, t)
        add = product[rows, cols].astype(np.float32)
        values = (acc.values if scale_d else np.float32(0)) + add
    else:
        rows, cols = wgmma_row_col(2 * i, t)
        old = acc.values.astype(np.uint32)
        lo_old = (old & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
        hi_old = (old >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
        lo = (lo_old if scale_d else 0) + product[rows, cols]
        hi = (hi_old if scale_d else 0) + product[rows, cols + 1]
        with np.errstate(over="ignore"):
            values = lo.astype(np.float16).view(np.uint16).astype(np.uint32) | \
                (hi.astype(np.float16).view(np.uint16).astype(np.uint32) << 16)
    return acc.copy(values=np.asarray(values, acc.values.dtype), fenced=True, group=group, site=site)


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


def _record_operand_read(operand, rows, which, group, site):
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
    if lay.major == "K":  # rows: M/N; the group holds the k-step
        g = min(operand.k // lay.width, lay.groups - 1)
        r0, r1 = min(operand.mn, lay.rows), min(operand.mn + rows, lay.rows)
        spans = [(g * lay.rows + r0, g * lay.rows + r1)]
    else:  # rows: K; the groups lie side by side along M/N
        kstep = KINDS[lay.kind][0]
        r0, r1 = min(operand.k, lay.rows), min(operand.k + kstep, lay.rows)
        g0, g1 = operand.mn // lay.width, min((operand.mn + max(rows, 1) - 1) // lay.width, lay.groups - 1)
        spans = [(g * lay.rows + r0, g * lay.rows + r1) for g in range(g0, g1 + 1)]
    for lo, hi in spans:
        if hi > lo:
            s.add_operand_read(start + lo * lay.pitch, start + hi * lay.pitch, owner, group, name, base, reader)


def _sim_mma_range(acc, a, b, scale_d):
    """The steps of a range call in order: the first with ``scale_d``, the others accumulating."""
    s = sim()
    if not isinstance(b, SimOperandRange):
        raise s.SimulatedMisuse("wgmma: A covers several k-steps but B is a single k-step: give B as a range too "
                                "(wgmma_desc(..., k=(k0, k1)))")
    if isinstance(a, SimOperandRange):
        a_steps = a.steps
    elif isinstance(a, tuple) and a and all(_is_fragment_value(f) for f in a):
        a_steps = list(a)
    else:
        raise s.SimulatedMisuse(f"wgmma: B covers {len(b)} k-steps; A must be a range of as many "
                                f"(wgmma_desc(..., k=(k0, k1))) or a tuple of {len(b)} register fragments")
    if len(a_steps) != len(b):
        raise s.SimulatedMisuse(f"wgmma: A covers {len(a_steps)} k-steps but B {len(b)}")
    for i, (a_i, b_i) in enumerate(zip(a_steps, b.steps)):
        acc = _sim_mma(acc, a_i, b_i, scale_d if i == 0 else 1)
    return acc


def _sim_commit():
    sim().group_exchange("wgmma_commit_group", 128, None)
    me, _ = _sim_me()
    me._numbatma_wgmma_commits = me.__dict__.get("_numbatma_wgmma_commits", 0) + 1


def _sim_wait(n, acc):
    sim().group_exchange("wgmma_wait_group", 128, None)  # (the warpgroup's reads of the group are done)
    me, _ = _sim_me()
    done = me.__dict__.get("_numbatma_wgmma_commits", 0) - int(n)  # groups 0 .. done-1 are complete
    if done > 0:  # their shared operands are read no more (as far as this thread and whom it releases to know)
        sim().retire_operand_reads(("wgmma", sim().thread_index() // 128), done)
    return _completed(acc, done)


def _completed(acc, done):
    if isinstance(acc, tuple):
        return tuple(_completed(a, done) for a in acc)
    if acc.group is not None and acc.group < done:
        return acc.copy(group=None)
    return acc


def _sim_tile_positions(acc, tile, tmap, row0, col0, op):
    """(flat element index in the tile, fragment register) of the thread's registers in columns
    [col0, col0 + W)."""
    acc._ready(f"{op} reads")
    _, t = _sim_me()
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
    me, _ = _sim_me()
    site = s.caller_site()
    return tuple(SimFragment(tuple(np.uint32(w) for w in words[4 * k:4 * k + 4]), kind, _fences(me), site)
                 for k in range(acc.n // 16))


def _thread_elements(acc):
    """(row, column, float32 value) of every element of the thread's fragment."""
    _, t = _sim_me()
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
    _, t = _sim_me()
    n = np.shape(bias)[0]
    values = acc.values.copy()
    for i in range(values.size):
        c = int(col0) + int(wgmma_row_col(i, t)[1])
        if 0 <= c < n:
            values[i] = np.float32(values[i] + np.float32(bias[c]))
    return acc.copy(values=values, fenced=False)
