"""Shared machinery of the device-side intrinsics: the definition decorator, operand typing checks
and operand lowering (shared-window addresses, descriptor addresses, integer casts).

``device_op(simulate=...)`` is the single definition site of an intrinsic: the decorated function is a
Numba ``@intrinsic`` typer for the GPU; ``simulate`` is its Python semantics for
``NUMBA_ENABLE_CUDASIM=1``. Under the simulator the public name is bound to ``simulate`` (or to a
function that says the operation has no simulator semantics yet).
"""
from __future__ import annotations

import functools
import math

from llvmlite import ir

from numbatma import SIMULATING

if not SIMULATING:
    from numba.cuda import types
    from numba.cuda.core import errors
    from numba.cuda.extending import _intrinsic

    from numbatma._types import MBarrierRefType, SharedArray, TensorMapType
else:  # pragma: no cover - exercised by the simulator tests
    types = errors = _intrinsic = None


def sim():
    """The simulator runtime (``intrinsics/_sim.py``), imported on first use."""
    from . import _sim

    return _sim


def device_op(simulate=None, prefer_literal=False):
    """Define an intrinsic (GPU) and its simulator semantics at one site."""

    def wrap(typer):
        if SIMULATING:
            if simulate is not None:
                def simulated(*args):
                    return simulate(*args)

                functools.update_wrapper(simulated, typer, assigned=("__name__", "__qualname__", "__doc__"))
                return simulated

            @functools.wraps(typer)
            def unsupported(*args, **kwargs):
                raise NotImplementedError(
                    f"numbatma.intrinsics.{typer.__name__} has no CUDA-simulator semantics yet; run this kernel "
                    f"on a GPU (compute capability 9.0+)."
                )

            return unsupported
        return _intrinsic(target="cuda", prefer_literal=prefer_literal)(typer)

    return wrap


# -- typing checks ------------------------------------------------------------------------------------
def fail(op, message):
    raise errors.TypingError(f"{op}: {message}")


def require_int(op, what, ty):
    if not isinstance(ty, types.Integer):
        fail(op, f"{what} must be an integer, got {ty}")


def require_literal_int(op, what, ty, lo=None, hi=None):
    if not isinstance(ty, types.IntegerLiteral):
        fail(op, f"{what} must be a compile-time constant integer (a literal or a global), got {ty}")
    v = ty.literal_value
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        fail(op, f"{what} must be in {lo}..{hi}, got {v}")
    return v


def require_shared(op, what, ty):
    if isinstance(ty, SharedArray):
        return
    if isinstance(ty, types.Array):
        fail(
            op,
            f"{what} must be a shared-memory array (from cuda.shared.array); got {ty}, which is not known to "
            f"live in shared memory (a kernel argument, a local array, or a value mixed from several arrays)",
        )
    fail(op, f"{what} must be a shared-memory array (from cuda.shared.array), got {ty}")


def require_barrier(op, ty):
    """A barrier operand is an mbarrier reference, or a shared uint64/int64 array (its element 0)."""
    if isinstance(ty, MBarrierRefType):
        return
    if isinstance(ty, SharedArray) and ty.dtype in (types.uint64, types.int64):
        return
    if isinstance(ty, types.Array) and not isinstance(ty, SharedArray):
        fail(op, f"the mbarrier must live in shared memory (cuda.shared.array(n, uint64)); got {ty}")
    fail(
        op,
        f"the mbarrier operand must be a shared uint64 array (its element 0 is used) or "
        f"mbarrier_ref(bars, i); got {ty}",
    )


def require_tensormap(op, ty):
    if not isinstance(ty, TensorMapType):
        fail(op, f"the descriptor operand must be a numbatma.TensorMap, got {ty}")


_TMA_DTYPE_NAMES = {"BFLOAT16": "bfloat16", "TFLOAT32": "float32", "TFLOAT32_FTZ": "float32",
                    "FLOAT32_FTZ": "float32"}


def require_exact_store_target(op, desc):
    """A tile store/reduce must not write outside the array: refuse a descriptor whose rows end short of a
    16-byte boundary unless its TensorMap allowed the overhang (``allow_store_overhang=True``)."""
    if desc.store_overhang and not desc.allow_store_overhang:
        from numbatma.tensormap import store_overhang_error

        name = _TMA_DTYPE_NAMES.get(desc.tma_dtype, str(desc.dtype))
        fail(op, store_overhang_error(op, name, desc.itemsize, desc.store_overhang).split(": ", 1)[1])


def coords_types(op, desc, coords):
    """Check a coordinate tuple against a descriptor's rank; return the element types."""
    if isinstance(coords, types.Integer) and desc.rank == 1:
        return (coords,)
    if not isinstance(coords, types.BaseTuple):
        fail(op, f"coordinates must be a tuple of {desc.rank} integers (array index order), got {coords}")
    if len(coords) != desc.rank:
        fail(
            op,
            f"the descriptor has rank {desc.rank} (box {desc.box}) but {len(coords)} coordinates were given; "
            f"pass one coordinate per dimension, in the array's own index order",
        )
    for t in coords:
        require_int(op, "every coordinate", t)
    return tuple(coords)


def require_tile_matches(op, tile, desc, unit="one box of the descriptor", detail=""):
    """The shared tile must hold exactly what one load of the descriptor occupies (``unit``; ``detail`` says
    how that size comes about), in the descriptor's dtype."""
    require_shared(op, "the shared-memory tile", tile)
    if tile.dtype != desc.dtype:
        fail(op, f"the shared tile has dtype {tile.dtype} but the descriptor moves {desc.dtype} elements")
    if tile.layout != "C":
        fail(op, f"the shared tile must be C-contiguous, got layout {tile.layout!r}")
    footprint = math.prod(desc.shared_shape) * desc.itemsize
    if tile.nbytes is not None and tile.nbytes != footprint:
        padded = footprint != desc.box_bytes
        fail(
            op,
            f"the shared tile {tile.static_shape} holds {tile.nbytes} bytes but {unit} "
            f"occupies {footprint} bytes{detail} (shared shape {desc.shared_shape}"
            + (f"; its rows are narrower than the {desc.swizzle}-byte swizzle span, so each takes a whole span"
               if padded else "") + ")",
        )


# -- lowering helpers ----------------------------------------------------------------------------------
def array_data(context, builder, ty, value):
    return context.make_array(ty)(context, builder, value).data


def shared_address(context, builder, ty, value):
    """32-bit shared-window address of a shared array's first element."""
    ptr = array_data(context, builder, ty, value)
    byte_ptr = builder.bitcast(ptr, ir.IntType(8).as_pointer())
    smem = builder.addrspacecast(byte_ptr, ir.IntType(8).as_pointer(3))
    return builder.ptrtoint(smem, ir.IntType(32))


def barrier_address(context, builder, ty, value):
    if isinstance(ty, MBarrierRefType):
        return value
    return shared_address(context, builder, ty, value)


def descriptor_address(builder, value):
    """64-bit generic address of a descriptor (param space for a by-value kernel parameter)."""
    return builder.ptrtoint(value, ir.IntType(64))


def emit_only(ptx, **immediates):
    """Lowering of an operation that takes no register operands and returns nothing: emit ``ptx`` with
    ``immediates`` spelled in."""

    def codegen(context, builder, sig, args):
        ptx.emit(builder, **immediates)
        return context.get_dummy_value()

    return codegen


def to_i32(context, builder, ty, value):
    return context.cast(builder, value, ty, types.int32)


def to_u32(context, builder, ty, value):
    return context.cast(builder, value, ty, types.uint32)

