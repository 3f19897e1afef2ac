"""Shared-memory views: carve fixed-shape tiles out of a shared buffer (typically the dynamic shared memory
of a kernel that needs more than the 48 KB of static shared memory).

``shared_view(ring, offset, (rows, cols))`` is a C-contiguous view of ``rows*cols`` elements of ``ring``
starting at element ``offset``, whose shape is a compile-time constant: TMA operations check its byte size
against the descriptor's box, and indexing it costs no runtime shape arithmetic (unlike ``reshape``,
which calls a runtime helper).
"""
from __future__ import annotations

import numpy as np

from ._define import SIMULATING, device_op, fail, require_int, require_shared

__all__ = ["shared_view"]

PTX = {}  # no instructions: address arithmetic only

if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types
    from numbatma._numba_internals import make_array, populate_array

    from numbatma._types import SharedArray


def _literal_shape(op, shape):
    if isinstance(shape, types.IntegerLiteral):
        return (shape.literal_value,)
    if isinstance(shape, types.BaseTuple) and all(isinstance(t, types.IntegerLiteral) for t in shape):
        return tuple(t.literal_value for t in shape)
    fail(op, f"the shape must be a tuple of compile-time constant integers, got {shape}")


@device_op(prefer_literal=True, simulate=lambda buf, offset, shape: buf.reshape(-1)[int(offset):int(offset) + int(np.prod(shape))].reshape(shape))
def shared_view(typingctx, buf, offset, shape):
    """A C-contiguous view with the constant ``shape`` of ``buf`` (a shared array, usually
    ``cuda.shared.array(0, dtype, alignment=1024)``) starting at element ``offset`` of ``buf``'s
    (contiguous) storage. No PTX: a pointer offset.

    The caller guarantees the view lies inside the buffer (for dynamic shared memory: inside the byte
    count given at launch) and, for TMA, that ``offset * itemsize`` keeps the alignment the operation
    needs (128 bytes; 1024 for 128-byte swizzle)."""
    op = "shared_view"
    require_shared(op, "the buffer", buf)
    if buf.layout != "C":
        fail(op, f"the buffer must be C-contiguous, got layout {buf.layout!r}")
    require_int(op, "the offset", offset)
    static = _literal_shape(op, shape)
    if any(s <= 0 for s in static):
        fail(op, f"every extent of the shape must be positive, got {static}")
    result = SharedArray(buf.dtype, len(static), "C", shape=static)

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        off = context.cast(builder, args[1], sig.args[1], types.intp)
        data = builder.gep(src.data, [off])
        out = make_array(result)(context, builder)
        itemsize = context.get_abi_sizeof(context.get_data_type(buf.dtype))
        intp = context.get_value_type(types.intp)
        strides = []
        step = itemsize
        for extent in reversed(static):
            strides.append(step)
            step *= extent
        populate_array(
            out,
            data=data,
            shape=[ir.Constant(intp, s) for s in static],
            strides=[ir.Constant(intp, s) for s in reversed(strides)],
            itemsize=ir.Constant(intp, itemsize),
            meminfo=None,
        )
        return out._getvalue()

    return result(buf, offset, shape), codegen
