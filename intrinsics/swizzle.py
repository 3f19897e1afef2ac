"""Swizzle-aware views of TMA tiles: index a shared tile in the box's logical order, whatever the swizzle.

A TMA load through a descriptor with a 32/64/128-byte swizzle does not put element ``(r, c)`` of the box at
``tile[r, c]``: it permutes the 16-byte chunks of every row (and rows narrower than the swizzle span each
take a whole span). ``swizzled(tile, desc)`` is a view of the tile that undoes this on every access::

    tile = cuda.shared.array(desc.shared_shape, np.float32, alignment=1024)
    ...                                   # tma_load(tile, desc, coords, bar); mbarrier_wait_parity(bar, 0)
    v = swizzled(tile, desc)
    x = v[r, c]                           # element (r, c) of the box, wherever TMA placed it
    v[r, c] = y                           # written where a TMA store through desc reads (r, c)

The element of the logical index ``(i0, ..., ik, c)`` (one index per axis of the box) sits at the byte offset

    o  = row * pitch + c * itemsize        row = the leading indices folded (row-major) over the box
    o' = o ^ (((o >> 7) & (span / 16 - 1)) << 4)

of the tile, where ``pitch`` is the byte length of a tile row (``desc.shared_shape[-1] * itemsize``: the
box's row, or the whole span when the row is narrower than the span) and ``span`` the swizzle (32/64/128;
without swizzle ``o' = o``). Every one of these is a compile-time fact of the descriptor's type, so an
access costs the index arithmetic of a plain array plus a shift, an and and an xor.

The pattern is anchored at the tile's first byte, which must sit on the swizzle repeat (8 rows of the span:
``alignment=desc.shared_alignment``, i.e. 256/512/1024 bytes) - the same alignment the TMA copy needs for the
pattern to start with the tile.

* :func:`swizzled` - the view (``view[i0, ..., c]`` reads and writes; ``view.shape`` is the box).
* :func:`swizzle_offset` - ``o'`` for a byte offset ``o`` (code that computes its own addresses).
* :func:`swizzle_map` - host side: the flat tile index of every element of the box, as a NumPy array.

Under ``NUMBA_ENABLE_CUDASIM=1`` ``swizzled`` returns a Python object applying the same mapping through the
tile's own (race-checked) element accessors. No PTX: address arithmetic only.
"""
from __future__ import annotations

import operator

import numpy as np

from ._define import SIMULATING, TypingError, device_op, fail, require_int, require_literal_int, require_shared, require_tensormap

__all__ = ["swizzled", "swizzle_offset", "swizzle_map"]

PTX = {}  # no instructions: address arithmetic only

SPANS = (0, 32, 64, 128)


# -- the mapping: one definition, evaluated on Python ints, NumPy arrays and LLVM values alike -----------
def _swizzle(x, span, unit_shift=0):
    """``x`` (an offset in units of ``1 << unit_shift`` bytes) after the ``span``-byte swizzle: the 16-byte
    chunk index XOR bits 7.. of the byte offset, modulo the span. ``x`` may be an int, a NumPy array or an
    :class:`_IrInt`; only shifts, and, xor are used."""
    if not span:
        return x
    return x ^ (((x >> (7 - unit_shift)) & (span // 16 - 1)) << (4 - unit_shift))


def _element_index(layout, indices):
    """Flat element index in the tile of the logical box index ``indices`` (one per axis), for
    ``layout = (shared_shape, itemsize, span)``. Works on ints, NumPy arrays and :class:`_IrInt`."""
    shared_shape, itemsize, span = layout
    *lead, col = indices
    row = None
    for extent, i in zip(shared_shape[:-1], lead):
        row = i if row is None else row * extent + i
    e = col if row is None else row * shared_shape[-1] + col
    return _swizzle(e, span, itemsize.bit_length() - 1)


def _layout(desc):
    """``(shared_shape, itemsize, span)`` of a TensorMap or its Numba type (both carry these facts)."""
    return tuple(int(s) for s in desc.shared_shape), int(desc.itemsize), int(desc.swizzle)


def swizzle_map(desc):
    """Host side (NumPy): an integer array of shape ``desc.box`` whose entry at ``(i0, ..., c)`` is the flat
    element index in the shared tile (``tile.reshape(-1)``) where a TMA load through ``desc`` puts that
    element of the box - what ``swizzled(tile, desc)[i0, ..., c]`` reads. ``desc``: a TensorMap (or its
    Numba type)."""
    message = _descriptor_error("swizzle_map", desc)
    if message:
        raise ValueError(message)
    grids = np.meshgrid(*[np.arange(b, dtype=np.int64) for b in desc.box], indexing="ij")
    return _element_index(_layout(desc), grids)


# -- rules shared by the typer and the simulator (same words in both) ------------------------------------
def _descriptor_error(op, desc):
    if int(desc.interleave):
        return (f"{op}: the descriptor is interleaved (interleave={int(desc.interleave)}B); swizzled views "
                f"support plain tiled descriptors only (interleave NONE, element strides of 1)")
    if any(int(e) != 1 for e in desc.element_strides):
        return (f"{op}: the descriptor has element_strides {tuple(int(e) for e in desc.element_strides)}; "
                f"swizzled views support element strides of 1 only (load every element and skip in the "
                f"kernel)")
    if int(desc.swizzle) not in SPANS:
        return f"{op}: unknown swizzle {desc.swizzle} (expected one of {SPANS})"
    return None


def _expected_tile(desc, dtype_name):
    shape = tuple(int(s) for s in desc.shared_shape)
    box = tuple(int(b) for b in desc.box)
    why = ""
    if shape != box:
        why = (f": its {box[-1] * int(desc.itemsize)}-byte rows are narrower than the {int(desc.swizzle)}-byte "
               f"swizzle span, so each takes a whole span")
    return (f"a tile of shape {shape} (desc.shared_shape; box {box} of {dtype_name}{why}), e.g. "
            f"cuda.shared.array(desc.shared_shape, ..., alignment={8 * int(desc.swizzle) or 128})")


def _tile_error(op, desc, dtype_name, desc_dtype_name, shape):
    """The tile's dtype and (when known) static shape against the descriptor; a message or None."""
    if dtype_name != desc_dtype_name:
        return (f"{op}: the shared tile has dtype {dtype_name} but the descriptor moves {desc_dtype_name} "
                f"elements; expected {_expected_tile(desc, desc_dtype_name)}")
    expect = tuple(int(s) for s in desc.shared_shape)
    if shape is not None and tuple(shape) != expect:
        return (f"{op}: the shared tile has shape {tuple(shape)} but one box of the descriptor occupies "
                f"shape {expect}; expected {_expected_tile(desc, desc_dtype_name)}")
    return None


def _count_error(op, box, given):
    names = ", ".join([f"i{k}" for k in range(len(box) - 1)] + ["c"])
    return (f"{op}: the view of a rank-{len(box)} box {box} takes {len(box)} indices, view[{names}]; "
            f"got {given}")


# -- the public operations ------------------------------------------------------------------------------
def _simulate_swizzled(tile, desc):
    return sim_view(tile, desc)


@device_op(simulate=_simulate_swizzled)
def swizzled(typingctx, tile, desc):
    """A view of the shared tile ``tile`` that TMA fills or stores through the descriptor ``desc`` (a
    TensorMap kernel argument): ``view[i0, ..., c]`` (one integer index per axis of the box, run-time values
    allowed) reads or writes element ``(i0, ..., c)`` of the box, wherever the descriptor's swizzle puts it
    in shared memory. ``view.shape`` is ``desc.box`` (a compile-time tuple).

    ``tile``: a C-contiguous shared array (``cuda.shared.array`` or ``shared_view``) of the descriptor's
    dtype whose static shape is ``desc.shared_shape`` (a tile whose shape is not known at compile time,
    e.g. ``stages[s]`` of a 3-D shared buffer, is taken on trust as one box). The caller guarantees the
    tile starts on the swizzle repeat (``alignment=desc.shared_alignment``) and that indices lie inside the
    box (no bounds checks, no negative-index wraparound; the simulator raises IndexError).

    Typing errors: a tile that is not shared memory, of another dtype or static shape than
    ``desc.shared_shape``; an interleaved descriptor or one with element strides other than 1; the wrong
    number of indices."""
    op = "swizzled"
    require_tensormap(op, desc)
    message = _descriptor_error(op, desc)
    if message:
        raise TypingError(message)
    require_shared(op, "the tile", tile)
    if tile.layout != "C":
        fail(op, f"the shared tile must be C-contiguous, got layout {tile.layout!r}")
    message = _tile_error(op, desc, str(tile.dtype), str(desc.dtype), tile.static_shape)
    if message is None and tile.static_shape is None and tile.ndim != desc.rank:
        message = (f"{op}: the shared tile has {tile.ndim} dimensions but the descriptor's box has "
                   f"{desc.rank}; expected {_expected_tile(desc, str(desc.dtype))}")
    if message:
        raise TypingError(message)
    result = SwizzledTileType(desc.dtype, desc.box, _layout(desc)[0], int(desc.swizzle))

    def codegen(context, builder, sig, args):
        return context.make_array(sig.args[0])(context, builder, args[0]).data

    return result(tile, desc), codegen


def _simulate_swizzle_offset(span, byte_offset):
    span = int(span)
    if span not in SPANS:
        raise ValueError(f"swizzle_offset: the span must be one of {SPANS}, got {span}")
    return _swizzle(int(byte_offset), span)


@device_op(prefer_literal=True, simulate=_simulate_swizzle_offset)
def swizzle_offset(typingctx, span, byte_offset):
    """``byte_offset ^ (((byte_offset >> 7) & (span / 16 - 1)) << 4)``: where the byte at ``byte_offset`` of
    a dense tile sits after TMA's ``span``-byte swizzle (``span``: a compile-time constant, 0/32/64/128; 0
    gives the offset unchanged). Offsets are relative to a tile aligned to the swizzle repeat. The result has
    the type of ``byte_offset``. A row narrower than the span still takes a whole span: compute
    ``byte_offset`` with a row pitch of ``desc.shared_shape[-1] * itemsize``."""
    op = "swizzle_offset"
    value = require_literal_int(op, "the swizzle span", span)
    if value not in SPANS:
        fail(op, f"the swizzle span must be one of {SPANS} (bytes), got {value}")
    require_int(op, "the byte offset", byte_offset)
    ty = byte_offset.literal_type if isinstance(byte_offset, types.IntegerLiteral) else byte_offset

    def codegen(context, builder, sig, args):
        x = context.cast(builder, args[1], sig.args[1], sig.return_type)
        return _swizzle(_IrInt(builder, x), value).value

    return ty(span, byte_offset), codegen


# -- simulator semantics --------------------------------------------------------------------------------
def sim_view(tile, desc):
    """Under the simulator: the view object (checks as the typer does, same words)."""
    from ._sim import SharedArray as SimShared, SimulatedMisuse

    op = "swizzled"
    message = _descriptor_error(op, desc)
    if message is None and not isinstance(tile, SimShared):
        message = (f"{op}: the tile must be a shared-memory array (from cuda.shared.array or shared_view), "
                   f"got {type(tile).__name__}")
    if message is None and not tile.flags.c_contiguous:
        message = f"{op}: the shared tile must be C-contiguous"
    if message is None:
        desc_dtype = _tile_dtype_name(desc.dtype)
        tile_dtype = tile.dtype.name if tile.dtype.name == desc_dtype else _tile_dtype_name(tile.dtype)
        message = _tile_error(op, desc, tile_dtype, desc_dtype, tile.shape)
    if message:
        raise SimulatedMisuse(message)
    return SimSwizzledTile(tile, desc)


def _tile_dtype_name(dtype):
    """The dtype a kernel declares tiles of ``dtype`` data with (bfloat16 as uint16, bool as uint8)."""
    return {"bfloat16": "uint16", "bool": "uint8"}.get(np.dtype(dtype).name, np.dtype(dtype).name)


class SimSwizzledTile:
    """Simulator form of ``swizzled(tile, desc)``: element ``(i0, ..., c)`` of the box is element
    ``_element_index(...)`` of the tile's flat view, read and written through the simulated shared array's
    own accessors (so the simulator's hazard checks see every access)."""

    def __init__(self, tile, desc):
        self._flat = tile.reshape(-1)  # (a view: C-contiguous; keeps the SharedArray accessors)
        self._layout = _layout(desc)
        self.shape = tuple(int(b) for b in desc.box)

    def _index(self, index):
        index = index if isinstance(index, tuple) else (index,)
        if len(index) != len(self.shape):
            from ._sim import SimulatedMisuse

            raise SimulatedMisuse(_count_error("swizzled view", self.shape, f"{len(index)}: {index!r}"))
        try:
            index = tuple(operator.index(i) for i in index)
        except TypeError:
            from ._sim import SimulatedMisuse

            raise SimulatedMisuse(f"swizzled view: indices must be integers (no slices), got {index!r}") from None
        for i, n in zip(index, self.shape):
            if not 0 <= i < n:
                raise IndexError(f"swizzled view: index {index} is outside the box {self.shape} (negative "
                                 f"indices do not wrap around; on the GPU this is undefined)")
        return _element_index(self._layout, index)

    def __getitem__(self, index):
        return self._flat[self._index(index)]

    def __setitem__(self, index, value):
        self._flat[self._index(index)] = value

    def __repr__(self):
        shape, itemsize, span = self._layout
        return f"swizzled view(box={self.shape}, rows of {shape[-1] * itemsize} bytes, swizzle={span}B)"


# -- Numba type, typing and lowering (GPU) ----------------------------------------------------------------
class _IrInt:
    """An LLVM integer value with Python's operators (against other values or Python ints), so that
    :func:`_element_index` / :func:`_swizzle` lower to exactly the arithmetic they compute on ints."""

    def __init__(self, builder, value):
        self.builder, self.value = builder, value

    def _v(self, other):
        if isinstance(other, _IrInt):
            return other.value
        from llvmlite import ir

        return ir.Constant(self.value.type, int(other))

    def _op(self, name, other):
        return _IrInt(self.builder, getattr(self.builder, name)(self.value, self._v(other)))

    def __mul__(self, other):
        return self._op("mul", other)

    def __add__(self, other):
        return self._op("add", other)

    def __xor__(self, other):
        return self._op("xor", other)

    def __and__(self, other):
        return self._op("and_", other)

    def __lshift__(self, other):
        return self._op("shl", other)

    def __rshift__(self, other):
        return self._op("lshr", other)


if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.core import errors
    from numba.cuda.datamodel import models
    from numba.cuda.extending import lower_builtin, register_model
    from numba.cuda.typing.templates import AbstractTemplate, infer_global, signature

    from numbatma._types import register_constant_attributes

    _I32 = ir.IntType(32)

    class SwizzledTileType(types.Type):
        """``swizzled(tile, desc)``: a shared tile seen in the box's logical order. Compile-time facts:
        ``dtype``, ``shape`` (the box: the logical extents), ``shared_shape`` (the tile: rows padded to the
        span), ``span`` (swizzle bytes, 0 for none), ``itemsize``. The value is the tile's data pointer."""

        def __init__(self, dtype, shape, shared_shape, span):
            self.dtype = dtype
            self.shape = tuple(int(s) for s in shape)
            self.shared_shape = tuple(int(s) for s in shared_shape)
            self.span = int(span)
            self.itemsize = dtype.bitwidth // 8
            pitch = self.shared_shape[-1] * self.itemsize
            super().__init__(name=f"swizzled_tile({dtype}, box={self.shape}, rows of {pitch}B, "
                                  f"swizzle={self.span}B)")

        @property
        def key(self):
            return (self.dtype, self.shape, self.shared_shape, self.span)

        @property
        def ndim(self):
            return len(self.shape)

        @property
        def layout(self):
            return self.shared_shape, self.itemsize, self.span

    @register_model(SwizzledTileType)
    class _SwizzledTileModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, dmm.lookup(fe_type.dtype).get_data_type().as_pointer())

    # ``view.shape``: the box, a compile-time tuple.
    register_constant_attributes(SwizzledTileType, ("shape",))

    def _index_types(op, view, index):
        """The element types of ``index`` (an integer or a tuple of them), one per axis of the box."""
        if isinstance(index, types.BaseTuple):
            given = tuple(index)
        elif isinstance(index, (types.Integer, types.SliceType, types.Float, types.Boolean)):
            given = (index,)
        else:
            fail(op, f"index the view with integers, view[i0, ..., c]; got {index}")
        if len(given) != view.ndim:
            raise TypingError(_count_error(op, view.shape, f"{len(given)} ({index})"))
        for t in given:
            if not isinstance(t, types.Integer):
                fail(op, f"every index must be an integer (slices and arrays are not supported), got {index}")
        return given

    @infer_global(operator.getitem)
    class _SwizzledGetItem(AbstractTemplate):

        def generic(self, args, kws):
            view, index = args
            if isinstance(view, SwizzledTileType):
                _index_types("swizzled view", view, index)
                return signature(view.dtype, view, index)

    @infer_global(operator.setitem)
    class _SwizzledSetItem(AbstractTemplate):

        def generic(self, args, kws):
            view, index, value = args
            if isinstance(view, SwizzledTileType):
                _index_types("swizzled view", view, index)
                if not self.context.can_convert(value, view.dtype):
                    fail("swizzled view", f"cannot store a {value} into a tile of {view.dtype}")
                return signature(types.none, view, index, value)

    def _element_pointer(context, builder, view_ty, index_ty, view, index):
        """The pointer to the element the logical ``index`` names: 32-bit index arithmetic (a tile is at most
        227 KiB), the swizzle a shift, an and and an xor."""
        if isinstance(index_ty, types.BaseTuple):
            values = cgutils.unpack_tuple(builder, index, len(index_ty))
            given = tuple(index_ty)
        else:
            values, given = [index], (index_ty,)
        ints = [_IrInt(builder, context.cast(builder, v, t, types.int32)) for v, t in zip(values, given)]
        element = _element_index(view_ty.layout, ints).value
        return builder.gep(view, [element], inbounds=True)

    @lower_builtin(operator.getitem, SwizzledTileType, types.Integer)
    @lower_builtin(operator.getitem, SwizzledTileType, types.BaseTuple)
    def _lower_getitem(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], sig.args[1], args[0], args[1])
        return context.unpack_value(builder, sig.args[0].dtype, ptr)

    @lower_builtin(operator.setitem, SwizzledTileType, types.Integer, types.Any)
    @lower_builtin(operator.setitem, SwizzledTileType, types.BaseTuple, types.Any)
    def _lower_setitem(context, builder, sig, args):
        view_ty, index_ty, value_ty = sig.args
        ptr = _element_pointer(context, builder, view_ty, index_ty, args[0], args[1])
        value = context.cast(builder, args[2], value_ty, view_ty.dtype)
        context.pack_value(builder, view_ty.dtype, value, ptr)
        return context.get_dummy_value()
else:  # pragma: no cover - the simulator has no Numba types
    errors = types = None
    SwizzledTileType = None
