"""Shared machinery of the device-side intrinsics: the definition decorator, operand typing checks
and operand lowering (shared-window addresses, descriptor addresses, integer casts).

``device_op(simulate=...)`` is the single definition site of an intrinsic: the decorated function is a
Numba ``@intrinsic`` typer for the GPU; ``simulate`` is its Python semantics for
``NUMBA_ENABLE_CUDASIM=1``. Under the simulator the public name is bound to ``simulate`` (or to a
function that says the operation has no simulator semantics yet).
"""
from __future__ import annotations

import functools
import inspect
import math
import re

from llvmlite import ir

from numbatma import SIMULATING
from numbatma._shapes import tile_alignment

from numbatma.errors import TypingError

if not SIMULATING:
    from numba.cuda import cgutils, types
    from numba.cuda.core import errors
    from numbatma._numba_internals import intrinsic as _intrinsic

    from numbatma._types import MBarrierRefType, SharedArray, TensorMapType
else:  # pragma: no cover - exercised by the simulator tests
    types = errors = _intrinsic = cgutils = None


def sim():
    """The simulator runtime (``intrinsics/_sim.py``), imported on first use."""
    from . import _sim

    return _sim


def device_op(simulate=None, prefer_literal=False):
    """Define an intrinsic (GPU) and its simulator semantics at one site."""

    def wrap(typer):
        if SIMULATING:
            if simulate is not None:
                names = list(inspect.signature(typer).parameters)[1:]
                checked = [(i, n) for i, n in enumerate(names) if n in _SIM_OPERAND_CHECKS]

                slot = (names.index("descs"), names.index("index")) if {"descs", "index"} <= set(names) else None

                def simulated(*args):
                    for i, name in checked:  # (the launch-time misuse the GPU build refuses while typing)
                        if i < len(args):
                            _SIM_OPERAND_CHECKS[name](typer.__name__, args[i], args)
                    if slot is not None and max(slot) < len(args):
                        check_descriptor_index(typer.__name__, args[slot[0]], args[slot[1]])
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
        op = _intrinsic(target="cuda", prefer_literal=prefer_literal)(_checked_typer(typer, prefer_literal))
        _user_signature(op, typer)
        return op

    return wrap


#: The heading of the section that :func:`add_ptx_sections` appends to an intrinsic's docstring.
PTX_SECTION = "PTX (generated from the PTX table; all variants: docs/ptx.md):"
#: The intrinsic a PTX table key belongs to: ``name``, ``name(variant)``, ``name (note)`` or ``name.x``.
_PTX_KEY = re.compile(r"([A-Za-z_]\w*)(?:\s*\(|\.|$)")
#: The variant shown when an intrinsic has several (the first key containing the first of these that any
#: key contains; else the table's first): rank 2, the common wgmma, ldmatrix x4, an add.
_SHOWN_VARIANT = ("rank=2", "m64n128, f32, bf16xbf16, A from smem", "(x4", "(add.")


def add_ptx_sections(objects, table):
    """Append to the docstring of each intrinsic of ``objects`` (name -> object) the PTX it emits, taken from
    ``table`` (``all_ptx()``): of the entries keyed ``name``, ``name(variant)``, ``name (note)`` or ``name.x``,
    one (see ``_SHOWN_VARIANT``) with its exact text, whitespace collapsed, and how many others docs/ptx.md
    lists. Names without such an entry are left alone. A section already there is replaced, so a second call
    changes nothing. Returns the names that got a section and those whose ``__doc__`` cannot be set."""
    variants = {}
    for key in table:
        match = _PTX_KEY.match(key)
        if match:
            variants.setdefault(match.group(1), []).append(key)
    documented, refused = [], []
    for name, obj in objects.items():
        keys = variants.get(name)
        if not keys:
            continue
        shown = next((k for want in _SHOWN_VARIANT for k in keys if want in k), keys[0])
        text = " ".join(table[shown].text.split())
        notes = [shown] if shown != name else []
        if len(keys) > 1:
            more = f"{len(keys) - 1} more variant{'s' if len(keys) > 2 else ''}"
            same = all(" ".join(table[k].text.split()) == text for k in keys)
            notes.append(more + (", same text" if same else ""))
        doc = (obj.__doc__ or "").split(PTX_SECTION)[0].rstrip()
        body = [line for line in doc.splitlines()[1:] if line.strip()]
        indent = min((line[:len(line) - len(line.lstrip())] for line in body), key=len, default="")
        note = f"  ({'; '.join(notes)})" if notes else ""
        try:
            obj.__doc__ = f"{doc}\n\n{indent}{PTX_SECTION}\n{indent}    ``{text}``{note}\n"
        except (AttributeError, TypeError):  # (an object that takes no attributes: its docstring stays)
            refused.append(name)
            continue
        documented.append(name)
    return documented, refused


def _user_signature(op, typer):
    """``help()`` / ``inspect.signature`` of an intrinsic show the kernel's call, ``tma_load(dst, desc, coords,
    bar)``, not the typer's ``(typingctx, ...)``."""
    signature = inspect.signature(typer)
    try:
        op.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    except (AttributeError, TypeError):  # (an intrinsic object that takes no attributes: keep Numba's)
        pass


def _checked_typer(typer, prefer_literal):
    """The typer, with the call's arity checked first (a clear message instead of Python's TypeError) and,
    for a ``prefer_literal`` intrinsic, a rule broken while the constants were visible marked *fatal*: Numba
    retries such a call with the constants forgotten, which may type, and the broken rule would go
    unreported (``numbatma/errors.py`` reports it at the call's line)."""
    signature = inspect.signature(typer)
    names = list(signature.parameters)[1:]

    @functools.wraps(typer)
    def checked(typingctx, *args, **kws):
        try:
            signature.bind(typingctx, *args, **kws)
        except TypeError as exc:
            fail(typer.__name__, f"takes ({', '.join(names)}); the call passes {len(args) + len(kws)} "
                                 f"argument(s): {exc}")
        try:
            return typer(typingctx, *args, **kws)
        except TypingError as exc:
            if prefer_literal and any(types.unliteral(a) != a for a in (*args, *kws.values())):
                exc.fatal = True
            raise

    return checked


# -- simulator operand checks ---------------------------------------------------------------------------
def _sim_not_a_descriptor(value):
    """An array or a number where a descriptor goes (other objects may quack like one)."""
    import numpy as np

    kind = type(value)
    return (value is None or isinstance(value, (int, float, np.ndarray, np.generic))
            or (kind.__name__.startswith("Fake") and "Array" in kind.__name__)  # (simulated device arrays)
            or "__cuda_array_interface__" in dir(kind))


def _sim_check_desc(op, value, args):
    if _sim_not_a_descriptor(value):
        raise sim().SimulatedTypingError(
            f"{op}: the descriptor operand must be a numbatma.TensorMap, got {_sim_describe(value)} (pass the "
            f"TensorMap built from the array, not the array itself)")


def _sim_check_descs(op, value, args):
    tensormaps = getattr(value, "tensormaps", None)
    if tensormaps is None:
        raise sim().SimulatedTypingError(
            f"{op}: expected a numbatma.TensorMapArray, got {_sim_describe(value)}")


def _sim_describe(value):
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None and "Array" in type(value).__name__:
        return f"an array ({type(value).__name__}, dtype {dtype}, shape {tuple(shape)})"
    return f"{type(value).__name__} {value!r}"


def check_descriptor_index(op, descs, index):
    """Simulator: ``index`` must pick one of the ``len(descs)`` descriptors (on the GPU an index past the end
    reads whatever lies after the array as a descriptor)."""
    count = len(descs.tensormaps)
    i = int(index)
    if not 0 <= i < count:
        raise sim().SimulatedMisuse(
            f"{op}: descriptor index {i} is out of range for a TensorMapArray of {count} descriptor(s) "
            f"(valid: 0..{count - 1}); on the GPU the descriptor would be read from memory past the array")
    return descs.tensormaps[i]


_SIM_OPERAND_CHECKS = {"desc": _sim_check_desc, "tmap": _sim_check_desc, "descs": _sim_check_descs}


# -- typing checks ------------------------------------------------------------------------------------
def fail(op, message):
    """Report a broken rule of operation ``op``: a :class:`numbatma.errors.TypingError`, which the user sees
    as ``file:line: op: message`` at the kernel line of the call."""
    raise TypingError(f"{op}: {message}")


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
    need = tile_alignment(desc)
    declared = getattr(tile, "declared_alignment", None)
    if declared is not None and declared < need:
        fail(op, f"the shared tile was declared with alignment={declared}, but TMA needs "
                 + ("128 bytes" if need == 128 else f"{need} bytes (the repeat of the descriptor's "
                                                      f"{desc.swizzle}-byte swizzle)")
                 + f" for this descriptor: declare it with alignment={need}")
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


def index_types(op, what, ary, index):
    """Typing: ``index`` names one element of ``ary`` (an integer for a 1-D array, else a tuple of integers)."""
    if isinstance(index, types.Integer):
        if ary.ndim != 1:
            fail(op, f"{what} is {ary.ndim}-D: index it with a tuple of {ary.ndim} integers")
        return
    if not (isinstance(index, types.BaseTuple) and len(index) == ary.ndim
            and all(isinstance(t, types.Integer) for t in index)):
        fail(op, f"the index into {what} ({ary}) must be {ary.ndim} integer(s), got {index}")


def element_pointer(context, builder, aryty, ary, indty, index):
    """Lowering: an i8* to element ``index`` of ``ary``."""
    arr = context.make_array(aryty)(context, builder, ary)
    if isinstance(indty, types.Integer):
        inds = [context.cast(builder, index, indty, types.intp)]
    else:
        inds = [context.cast(builder, builder.extract_value(index, i), t, types.intp) for i, t in enumerate(indty)]
    ptr = cgutils.get_item_pointer(context, builder, aryty, arr, inds)
    return builder.bitcast(ptr, ir.IntType(8).as_pointer())


def shared_pointer(builder, ptr):
    """Lowering: the 32-bit shared-window address of a generic pointer into shared memory."""
    smem = builder.addrspacecast(ptr, ir.IntType(8).as_pointer(3))
    return builder.ptrtoint(smem, ir.IntType(32))
