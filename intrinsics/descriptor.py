"""Descriptor management inside kernels: prefetching a descriptor, editing a copy of it
(``tensormap.replace``) and publishing the edited copy to global memory for TMA to use.

TMA reads its descriptor from the ``.param`` (a by-value kernel argument), ``.const`` or ``.global`` state
space, never from shared memory. Retargeting a descriptor inside a kernel (grouped GEMM: one descriptor
walked over several arrays of different shapes) therefore goes:

1. ``h = tensormap_to_shared(buf, desc)``: copy the 128 bytes into a shared ``uint64[16]`` buffer
   (128-byte aligned) and get an *edit handle* ``h`` of the descriptor's type;
2. ``tensormap_replace_<field>(h, ...)``: edit fields in shared memory (one thread);
3. ``tensormap_publish(ws, i, h)``: the whole warp copies the edited bytes to slot ``i`` of a
   :class:`numbatma.TensorMapArray` (the workspace) with a release fence for the tensormap proxy
   (``tensormap.cp_fenceproxy``);
4. ``d = tensormap_acquire(ws, i)``: the acquire fence, and a descriptor ``tma_load`` / ``tma_store`` accept.

A slot of a TensorMapArray can also be edited in place: ``h = tensormap_ref(ws, i)``, the replaces (``.global``
forms), ``tensormap_fence_release_gpu()``, then ``tensormap_acquire(ws, i)``.

Axes are given in the array's own index order (like ``TensorMap``'s box); the PTX ordinal (innermost first)
is derived from the handle's rank. The handle's Numba type carries the facts of the descriptor it was made
from (``like``); the fields that are part of that type (rank, box, element strides, element type, swizzle,
interleave) may be edited, but the descriptor TMA then uses is typed by the workspace ``TensorMapArray``:
build the workspace from a template ``TensorMap`` with the layout the edited descriptor ends up with.

Simulator: an edit handle is a mutable Python copy of the descriptor (:class:`SimTensorMap`); a new global
address must be an array the simulator knows: a kernel array argument, or an integer address obtained on
the host with :func:`device_address` (which records the array). A new element type changes the dtype the
simulated copies move (tf32 rounding is not modelled); interleaved layouts are not simulated.
"""
from __future__ import annotations

import numpy as np

from ._asm import Ptx
from ._define import SIMULATING, descriptor_address, device_op, fail, require_int, require_shared, sim, shared_address

__all__ = [
    "align_up",
    "device_address",
    "prefetch_tensormap",
    "shared_tensormap",
    "tensormap_fence_acquire_cta",
    "tensormap_fence_acquire_gpu",
    "tensormap_fence_release_cta",
    "tensormap_fence_release_gpu",
    "tensormap_publish",
    "tensormap_ref",
    "tensormap_replace_box_dim",
    "tensormap_replace_element_stride",
    "tensormap_replace_elemtype",
    "tensormap_replace_fill_mode",
    "tensormap_replace_global_address",
    "tensormap_replace_global_dim",
    "tensormap_replace_global_stride",
    "tensormap_replace_interleave_layout",
    "tensormap_replace_rank",
    "tensormap_replace_swizzle_mode",
    "tensormap_to_shared",
]

# -- the PTX --------------------------------------------------------------------------------------------
PREFETCH = Ptx("prefetch.tensormap [$tmap];", ins=(("tmap", "b64"),))

# space -> (PTX state space, register class of the descriptor address)
SPACES = {"shared": ("shared::cta", "b32"), "global": ("global", "b64")}
# field -> (value type, takes an ordinal, value is an immediate)
FIELDS = {
    "global_address": ("b64", False, False),
    "rank": ("b32", False, True),
    "box_dim": ("b32", True, False),
    "global_dim": ("b32", True, False),
    "global_stride": ("b64", True, False),
    "element_stride": ("b32", True, False),
    "elemtype": ("b32", False, True),
    "interleave_layout": ("b32", False, True),
    "swizzle_mode": ("b32", False, True),
    "fill_mode": ("b32", False, True),
}


def _replace_ptx(field, space):
    vtype, has_ord, immediate = FIELDS[field]
    ss, areg = SPACES[space]
    operands = ("$ord, " if has_ord else "") + "$val"
    return Ptx(
        f"tensormap.replace.tile.{field}.{ss}.b1024.{vtype} [$tmap], {operands};",
        ins=(("tmap", areg),) + (() if immediate else (("val", vtype),)),
        imm=(("ord",) if has_ord else ()) + (("val",) if immediate else ()),
    )


REPLACE = {(field, space): _replace_ptx(field, space) for field in FIELDS for space in SPACES}
SCOPES = ("cta", "gpu")
RELEASE = {s: Ptx(f"fence.proxy.tensormap::generic.release.{s};") for s in SCOPES}
ACQUIRE = {s: Ptx(f"fence.proxy.tensormap::generic.acquire.{s} [$tmap], 128;", ins=(("tmap", "b64"),)) for s in SCOPES}
CP_FENCEPROXY = Ptx(
    "tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [$dst], [$src], 128;",
    ins=(("dst", "b64"), ("src", "b32")),
)

# Codes of the enumerated fields (PTX ISA, "Tensormap field encodings"). Element types: PTX's own numbering,
# which is NOT the driver's CUtensorMapDataType order (f32.ftz comes before f64 here).
ELEMTYPE = {
    "uint8": 0, "int8": 0, "bool": 0, "uint16": 1, "int16": 1, "uint32": 2, "int32": 3, "uint64": 4, "int64": 5,
    "float16": 6, "float32": 7, "float32_ftz": 8, "float64": 9, "bfloat16": 10, "tfloat32": 11, "tfloat32_ftz": 12,
}
_SIM_DTYPE = {0: "uint8", 1: "uint16", 2: "uint32", 3: "int32", 4: "uint64", 5: "int64", 6: "float16",
              7: "float32", 8: "float32", 9: "float64", 10: "uint16", 11: "float32", 12: "float32"}
SWIZZLE_CODE = {0: 0, 32: 1, 64: 2, 128: 3}  # span in bytes -> code
INTERLEAVE_CODE = {0: 0, 16: 1, 32: 2}  # interleave width in bytes -> code
FILL_CODE = {"zero": 0, "nan": 1}


# -- host helpers ---------------------------------------------------------------------------------------
def align_up(offset, alignment):
    """``offset`` rounded up to a multiple of ``alignment`` (a power of two), on the host and in kernels:
    e.g. the element offset of a 1024-byte-aligned swizzle tile inside dynamic shared memory."""
    return (offset + alignment - 1) // alignment * alignment


_REGISTRY = {}  # simulator: address -> NumPy array, for integer global addresses given to kernels


def device_address(array):
    """The device address (int) of ``array``'s first element, for ``tensormap_replace_global_address``
    with an address computed on the host (e.g. a table of group addresses). Under the simulator the array
    is also recorded, so that a simulated kernel can find the memory behind the address."""
    from numbatma.tensormap import array_layout

    layout = array_layout(array)
    if SIMULATING:
        host = _sim_host(array)
        _REGISTRY[int(host.__array_interface__["data"][0])] = host
    return layout.ptr


# -- Numba types: edit handles ----------------------------------------------------------------------------
if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.datamodel import models
    from numba.cuda.extending import overload, register_model

    from numbatma._types import CUTENSORMAP_PTR, SharedArray, TensorMapArrayType, TensorMapType

    class TensorMapRefType(types.Type):
        """A descriptor being edited: in shared memory (its 32-bit shared-window address) or in a slot of a
        TensorMapArray (its 64-bit global address). ``desc`` is the TensorMapType of its layout."""

        def __init__(self, desc, space):
            self.desc = desc
            self.space = space
            super().__init__(name=f"TensorMapRef({space}, {desc})")

        @property
        def key(self):
            return (self.desc, self.space)

    class _SharedRefModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            bits = 32 if fe_type.space == "shared" else 64
            super().__init__(dmm, fe_type, ir.IntType(bits))

    register_model(TensorMapRefType)(_SharedRefModel)

    @overload(align_up, target="cuda")
    def _align_up_cuda(offset, alignment):
        def impl(offset, alignment):
            return (offset + alignment - 1) // alignment * alignment

        return impl


def _require_ref(op, ref):
    if not isinstance(ref, TensorMapRefType):
        fail(op, f"the descriptor to edit must be a handle from tensormap_to_shared, shared_tensormap or "
                 f"tensormap_ref (TMA descriptors passed to the kernel are read-only), got {ref}")


def _require_buffer(op, buf):
    require_shared(op, "the descriptor buffer", buf)
    if buf.dtype not in (types.uint64, types.int64, types.uint8, types.int8):
        fail(op, f"the descriptor buffer must be a shared uint64 (16) or uint8 (128) array, got {buf}")
    if buf.nbytes is not None and buf.nbytes < 128:
        fail(op, f"the descriptor buffer holds {buf.nbytes} bytes; a descriptor takes 128 "
                 f"(cuda.shared.array(16, uint64, alignment=128))")
    if buf.layout != "C":
        fail(op, f"the descriptor buffer must be C-contiguous, got layout {buf.layout!r}")


def _require_descriptor(op, desc, what="the descriptor"):
    if not isinstance(desc, TensorMapType):
        fail(op, f"{what} must be a numbatma.TensorMap (a kernel argument or tensormap_acquire(...)), got {desc}")


# -- prefetch --------------------------------------------------------------------------------------------
@device_op(simulate=lambda desc: None)
def prefetch_tensormap(typingctx, desc):
    """``prefetch.tensormap [desc];`` - bring the descriptor into the TMA unit's cache ahead of its first
    use (issue it early, e.g. right at kernel start, by one thread). ``desc`` is a by-value descriptor (its
    generic ``.param`` address) or one from ``tensormap_acquire``. A hint only: no ordering, no result."""
    _require_descriptor("prefetch_tensormap", desc)

    def codegen(context, builder, sig, args):
        PREFETCH.emit(builder, tmap=descriptor_address(builder, args[0]))
        return context.get_dummy_value()

    return types.void(desc), codegen


# -- copies ----------------------------------------------------------------------------------------------
def _sim_to_shared(buf, desc):
    return _sim_store_shared(buf, SimTensorMap.copy_of(desc))


@device_op(simulate=_sim_to_shared)
def tensormap_to_shared(typingctx, buf, desc):
    """Copy the 128 bytes of ``desc`` (by value, or from ``tensormap_acquire``) into the shared buffer
    ``buf`` with ordinary loads and stores; returns an edit handle for ``tensormap_replace_*`` and
    ``tensormap_publish``, with ``desc``'s type.

    The caller guarantees: ``buf`` is ``cuda.shared.array(16, uint64, alignment=128)`` (or 128 uint8), 128-byte
    aligned (not checkable at compile time: pass ``alignment=128``); one thread copies (or several copy the
    same bytes) and the threads that edit or publish it synchronise with that thread first
    (``cuda.syncwarp()`` within a warp, ``cuda.syncthreads()`` across warps)."""
    op = "tensormap_to_shared"
    _require_buffer(op, buf)
    _require_descriptor(op, desc)
    ref = TensorMapRefType(desc, "shared")

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        dst = builder.bitcast(data, i64.as_pointer())
        src = builder.bitcast(args[1], i64.as_pointer())
        for k in range(16):
            idx = [ir.Constant(ir.IntType(32), k)]
            builder.store(builder.load(builder.gep(src, idx)), builder.gep(dst, idx))
        return shared_address(context, builder, sig.args[0], args[0])

    return ref(buf, desc), codegen


def _sim_shared_tensormap(buf, like):
    state = _sim_states()
    key = sim().address_of(buf)
    found = state.get(key)
    if found is None:
        raise sim().SimulatedMisuse(
            "shared_tensormap: no descriptor was copied into this shared buffer (tensormap_to_shared) in this "
            "block; its bytes are not a descriptor")
    return found


@device_op(simulate=_sim_shared_tensormap)
def shared_tensormap(typingctx, buf, like):
    """An edit handle for the descriptor already in the shared buffer ``buf`` (copied there by
    ``tensormap_to_shared``), typed like the descriptor ``like``. No PTX: the shared address of ``buf``.
    Use it in threads other than the one that copied (e.g. the warp that publishes)."""
    op = "shared_tensormap"
    _require_buffer(op, buf)
    _require_descriptor(op, like, "like")
    ref = TensorMapRefType(like, "shared")

    def codegen(context, builder, sig, args):
        return shared_address(context, builder, sig.args[0], args[0])

    return ref(buf, like), codegen


def _sim_ref(descs, index):
    i = int(index)
    current = descs.tensormaps[i]
    if not isinstance(current, SimTensorMap):
        current = descs.tensormaps[i] = SimTensorMap.copy_of(current)
    return current


@device_op(simulate=_sim_ref)
def tensormap_ref(typingctx, descs, index):
    """An edit handle for slot ``index`` of a :class:`numbatma.TensorMapArray` in global memory (the
    ``.global`` forms of ``tensormap_replace_*``). No PTX: the slot's address. The caller guarantees
    ``0 <= index < len(descs)`` and that no TMA operation uses the slot while it is edited; after the edits:
    ``tensormap_fence_release_gpu()``, then ``tensormap_acquire(descs, index)`` before using it."""
    op = "tensormap_ref"
    if not isinstance(descs, TensorMapArrayType):
        fail(op, f"expected a numbatma.TensorMapArray, got {descs}")
    require_int(op, "the index", index)
    ref = TensorMapRefType(descs.element, "global")

    def codegen(context, builder, sig, args):
        idx = context.cast(builder, args[1], sig.args[1], types.uint64)
        return builder.add(args[0], builder.mul(idx, ir.Constant(ir.IntType(64), 128)))

    return ref(descs, index), codegen


def _sim_publish(descs, index, ref):
    descs.tensormaps[int(index)] = ref.copy()


@device_op(simulate=_sim_publish)
def tensormap_publish(typingctx, descs, index, ref):
    """Copy the edited descriptor in shared memory (``ref`` from ``tensormap_to_shared`` /
    ``shared_tensormap``) to slot ``index`` of the :class:`numbatma.TensorMapArray` ``descs``, with a
    release fence for the tensormap proxy at GPU scope:
    ``tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [slot], [buf], 128;``.

    The caller guarantees: **all 32 threads of a warp** execute it together (``.sync.aligned``), with the same
    operands, after synchronising with the thread that edited the buffer (``cuda.syncwarp()``); no TMA
    operation uses the slot meanwhile; ``tensormap_acquire(descs, index)`` comes before the slot is used."""
    op = "tensormap_publish"
    if not isinstance(descs, TensorMapArrayType):
        fail(op, f"expected a numbatma.TensorMapArray, got {descs}")
    require_int(op, "the index", index)
    _require_ref(op, ref)
    if ref.space != "shared":
        fail(op, "the descriptor to publish must be in shared memory (tensormap_to_shared / shared_tensormap); "
                 "a slot edited in place (tensormap_ref) needs tensormap_fence_release_gpu() instead")

    def codegen(context, builder, sig, args):
        idx = context.cast(builder, args[1], sig.args[1], types.uint64)
        slot = builder.add(args[0], builder.mul(idx, ir.Constant(ir.IntType(64), 128)))
        CP_FENCEPROXY.emit(builder, dst=slot, src=args[2])
        return context.get_dummy_value()

    return types.void(descs, index, ref), codegen


# -- fences ----------------------------------------------------------------------------------------------
def _release(scope):
    def typer(typingctx):
        def codegen(context, builder, sig, args):
            RELEASE[scope].emit(builder)
            return context.get_dummy_value()

        return types.void(), codegen

    return typer


@device_op(simulate=lambda: None)
def tensormap_fence_release_cta(typingctx):
    """``fence.proxy.tensormap::generic.release.cta;`` - order this thread's preceding descriptor edits
    (``tensormap_replace_*``, stores) before later tensormap-proxy use by threads of this CTA (which
    acquire with ``tensormap_fence_acquire_cta``)."""
    return _release("cta")(typingctx)


@device_op(simulate=lambda: None)
def tensormap_fence_release_gpu(typingctx):
    """``fence.proxy.tensormap::generic.release.gpu;`` - the same at GPU scope (a descriptor in global
    memory used by any CTA: pair with ``tensormap_acquire`` / ``tensormap_fence_acquire_gpu``)."""
    return _release("gpu")(typingctx)


def _acquire(op, scope, desc):
    _require_descriptor(op, desc)

    def codegen(context, builder, sig, args):
        ACQUIRE[scope].emit(builder, tmap=descriptor_address(builder, args[0]))
        return context.get_dummy_value()

    return types.void(desc), codegen


@device_op(simulate=lambda desc: None)
def tensormap_fence_acquire_cta(typingctx, desc):
    """``fence.proxy.tensormap::generic.acquire.cta [desc], 128;`` - make the descriptor's current bytes
    (released at CTA scope) visible to this thread's following TMA operations on it."""
    return _acquire("tensormap_fence_acquire_cta", "cta", desc)


@device_op(simulate=lambda desc: None)
def tensormap_fence_acquire_gpu(typingctx, desc):
    """``fence.proxy.tensormap::generic.acquire.gpu [desc], 128;`` - the same at GPU scope (what
    ``tensormap_acquire`` emits for a TensorMapArray slot)."""
    return _acquire("tensormap_fence_acquire_gpu", "gpu", desc)


# -- tensormap.replace -----------------------------------------------------------------------------------
def _literal(op, what, ty, allowed=None, lo=None, hi=None):
    if not isinstance(ty, types.IntegerLiteral):
        fail(op, f"{what} must be a compile-time constant integer (a literal or a global), got {ty}")
    v = ty.literal_value
    if allowed is not None and v not in allowed:
        fail(op, f"{what} must be one of {', '.join(str(a) for a in allowed)}, got {v}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        fail(op, f"{what} must be in {lo}..{hi}, got {v}")
    return v


def _ordinal(op, ref, axis, strides=False):
    """PTX ordinal (innermost first) of array-order ``axis`` of the handle's rank."""
    rank = ref.desc.rank
    top = rank - 2 if strides else rank - 1
    if strides and rank == 1:
        fail(op, "a rank-1 descriptor has no global stride to replace (its only dimension is contiguous)")
    a = _literal(op, "the axis", axis)
    if a < 0:
        a += rank
    if not 0 <= a <= top:
        what = "strided axes (all but the innermost)" if strides else "axes"
        fail(op, f"the descriptor has rank {rank}: axis {axis.literal_value} is not among its {what} 0..{top}")
    return (rank - 2 - a) if strides else (rank - 1 - a)


def _emit_replace(field, ref, *, value=None, value_ty=None, ord=None, imm=None):
    ptx = REPLACE[(field, ref.space)]
    vtype = FIELDS[field][0]

    def codegen(context, builder, sig, args):
        operands = {"tmap": args[0]}
        if ord is not None:
            operands["ord"] = ord
        if imm is not None:
            operands["val"] = imm
        else:
            target = types.uint64 if vtype == "b64" else types.uint32
            operands["val"] = context.cast(builder, args[value], sig.args[value], target)
        ptx.emit(builder, **operands)
        return context.get_dummy_value()

    return codegen


def _array_pointer(context, builder, ty, value):
    return builder.ptrtoint(context.make_array(ty)(context, builder, value).data, ir.IntType(64))


@device_op(simulate=lambda ref, address: ref.set_address(address))
def tensormap_replace_global_address(typingctx, ref, address):
    """``tensormap.replace.tile.global_address.{shared::cta|global}.b1024.b64 [ref], address;`` - point the
    descriptor at ``address``: a device array (its first element) or an integer device address (from
    :func:`device_address` on the host). The caller guarantees 16-byte alignment (32 with 32-byte
    interleave) and that dimensions and strides fit the new array (replace them too when they differ)."""
    op = "tensormap_replace_global_address"
    _require_ref(op, ref)
    if isinstance(address, types.Array):
        if isinstance(address, SharedArray):
            fail(op, "the new global address must be global memory, got a shared array")
        ptx = REPLACE[("global_address", ref.space)]

        def codegen(context, builder, sig, args):
            ptx.emit(builder, tmap=args[0], val=_array_pointer(context, builder, sig.args[1], args[1]))
            return context.get_dummy_value()

        return types.void(ref, address), codegen
    require_int(op, "the new global address", address)
    return types.void(ref, address), _emit_replace("global_address", ref, value=1)


@device_op(prefer_literal=True, simulate=lambda ref, rank: ref.set("rank", int(rank)))
def tensormap_replace_rank(typingctx, ref, rank):
    """``tensormap.replace.tile.rank.{space}.b1024.b32 [ref], rank - 1;`` (the field counts from zero) -
    ``rank`` is the new rank, a constant in 1..5. Axes of later replaces on this handle still count with the
    handle's rank: make a new handle (``shared_tensormap(buf, like=...)``) of the new layout first."""
    op = "tensormap_replace_rank"
    _require_ref(op, ref)
    r = _literal(op, "the rank", rank, lo=1, hi=5)
    return types.void(ref, rank), _emit_replace("rank", ref, imm=r - 1)


def _ord_field(op, field, ref, axis, value, strides=False, lo=None, hi=None):
    _require_ref(op, ref)
    o = _ordinal(op, ref, axis, strides)
    require_int(op, f"the new {field.replace('_', ' ')}", value)
    if isinstance(value, types.IntegerLiteral):
        _literal(op, f"the new {field.replace('_', ' ')}", value, lo=lo, hi=hi)
    return types.void(ref, axis, value), _emit_replace(field, ref, value=2, ord=o)


@device_op(prefer_literal=True, simulate=lambda ref, axis, n: ref.set_axis("box", int(axis), int(n)))
def tensormap_replace_box_dim(typingctx, ref, axis, n):
    """``tensormap.replace.tile.box_dim.{space}.b1024.b32 [ref], ord, n;`` - box extent ``n`` (1..256) along
    array axis ``axis`` (a constant; ``ord = rank - 1 - axis``). Changes the descriptor's type: the
    workspace that publishes it must be typed with the new box."""
    return _ord_field("tensormap_replace_box_dim", "box_dim", ref, axis, n, lo=1, hi=256)


@device_op(prefer_literal=True, simulate=lambda ref, axis, n: ref.set_axis("shape", int(axis), int(n)))
def tensormap_replace_global_dim(typingctx, ref, axis, n):
    """``tensormap.replace.tile.global_dim.{space}.b1024.b32 [ref], ord, n;`` - extent ``n`` (1..2**32) of the
    global array along axis ``axis`` (a constant; ``ord = rank - 1 - axis``)."""
    return _ord_field("tensormap_replace_global_dim", "global_dim", ref, axis, n, lo=1)


@device_op(prefer_literal=True, simulate=lambda ref, axis, nbytes: ref.set_axis("strides", int(axis), int(nbytes)))
def tensormap_replace_global_stride(typingctx, ref, axis, nbytes):
    """``tensormap.replace.tile.global_stride.{space}.b1024.b64 [ref], ord, nbytes;`` - byte stride of array
    axis ``axis`` (a constant, any axis but the innermost; ``ord = rank - 2 - axis``). The caller guarantees a
    multiple of 16 bytes (32 with 32-byte interleave), below 2**40."""
    return _ord_field("tensormap_replace_global_stride", "global_stride", ref, axis, nbytes, strides=True, lo=16)


@device_op(prefer_literal=True, simulate=lambda ref, axis, e: ref.set_axis("element_strides", int(axis), int(e)))
def tensormap_replace_element_stride(typingctx, ref, axis, e):
    """``tensormap.replace.tile.element_stride.{space}.b1024.b32 [ref], ord, e;`` - traversal step ``e``
    (1..8) along array axis ``axis`` (``ord = rank - 1 - axis``). Changes the descriptor's type."""
    return _ord_field("tensormap_replace_element_stride", "element_stride", ref, axis, e, lo=1, hi=8)


@device_op(prefer_literal=True, simulate=lambda ref, code: ref.set("elemtype", int(code)))
def tensormap_replace_elemtype(typingctx, ref, code):
    """``tensormap.replace.tile.elemtype.{space}.b1024.b32 [ref], code;`` - element type ``code``, a constant
    in 0..12 (``numbatma.intrinsics.descriptor.ELEMTYPE[dtype_name]``: PTX's numbering). Changes the
    descriptor's type. Simulator: the copies move the new type's bytes (bfloat16 as uint16; tf32 rounding
    and flush-to-zero are not modelled)."""
    op = "tensormap_replace_elemtype"
    _require_ref(op, ref)
    c = _literal(op, "the element type code", code, lo=0, hi=12)
    return types.void(ref, code), _emit_replace("elemtype", ref, imm=c)


@device_op(prefer_literal=True, simulate=lambda ref, nbytes: ref.set("interleave", int(nbytes)))
def tensormap_replace_interleave_layout(typingctx, ref, nbytes):
    """``tensormap.replace.tile.interleave_layout.{space}.b1024.b32 [ref], code;`` - interleave width in
    bytes, a constant 0 (none), 16 or 32 (codes 0, 1, 2). Simulator: recorded only."""
    op = "tensormap_replace_interleave_layout"
    _require_ref(op, ref)
    v = _literal(op, "the interleave (bytes)", nbytes, allowed=tuple(INTERLEAVE_CODE))
    return types.void(ref, nbytes), _emit_replace("interleave_layout", ref, imm=INTERLEAVE_CODE[v])


@device_op(prefer_literal=True, simulate=lambda ref, span: ref.set("swizzle", int(span)))
def tensormap_replace_swizzle_mode(typingctx, ref, span):
    """``tensormap.replace.tile.swizzle_mode.{space}.b1024.b32 [ref], code;`` - swizzle span in bytes, a
    constant 0, 32, 64 or 128 (codes 0..3), like ``TensorMap(swizzle=...)``. Changes the descriptor's type."""
    op = "tensormap_replace_swizzle_mode"
    _require_ref(op, ref)
    v = _literal(op, "the swizzle span (bytes)", span, allowed=tuple(SWIZZLE_CODE))
    return types.void(ref, span), _emit_replace("swizzle_mode", ref, imm=SWIZZLE_CODE[v])


@device_op(prefer_literal=True, simulate=lambda ref, nan: ref.set("oob_fill", "nan" if int(nan) else "zero"))
def tensormap_replace_fill_mode(typingctx, ref, nan):
    """``tensormap.replace.tile.fill_mode.{space}.b1024.b32 [ref], code;`` - out-of-bounds fill: a constant
    0 (zeros) or 1 (NaN, floating-point element types only)."""
    op = "tensormap_replace_fill_mode"
    _require_ref(op, ref)
    v = _literal(op, "the fill mode (0 = zero, 1 = NaN)", nan, allowed=(0, 1))
    return types.void(ref, nan), _emit_replace("fill_mode", ref, imm=v)


PTX = {
    "prefetch_tensormap": PREFETCH,
    **{f"tensormap_replace_{f}({s})": p for (f, s), p in REPLACE.items()},
    "tensormap_fence_release_cta": RELEASE["cta"],
    "tensormap_fence_release_gpu": RELEASE["gpu"],
    "tensormap_fence_acquire_cta": ACQUIRE["cta"],
    "tensormap_fence_acquire_gpu": ACQUIRE["gpu"],
    "tensormap_publish": CP_FENCEPROXY,
}


# -- simulator --------------------------------------------------------------------------------------------
def _sim_host(array):
    return sim().numpy_of(array)


def _sim_states():
    """The descriptors copied into shared buffers in the running block: shared address -> TensorMap."""
    return sim().block_local("tensormaps")


def _sim_store_shared(buf, tm):
    _sim_states()[sim().address_of(buf)] = tm
    return tm


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class SimTensorMap:
    """A descriptor under the simulator: the fields ``tensormap.replace`` edits, and the memory it points at.
    Quacks like :class:`numbatma.TensorMap` for the simulated TMA copies."""

    def __init__(self, memory, address, shape, strides, dtype, box, element_strides, swizzle, interleave,
                 oob_fill, rank):
        self.memory = memory  # NumPy array whose memory holds ``address``
        self.address = address
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        self.dtype = np.dtype(dtype)
        self.box = tuple(box)
        self.element_strides = tuple(element_strides)
        self.swizzle = int(swizzle)
        self.interleave = int(interleave)
        self.oob_fill = oob_fill
        self.declared_rank = rank
        self.elemtype = None
        self.allow_store_overhang = False

    @classmethod
    def copy_of(cls, desc):
        if isinstance(desc, SimTensorMap):
            return desc.copy()
        host = _sim_host(desc.array)
        fill = getattr(desc.oob_fill, "value", desc.oob_fill)
        copy = cls(host, int(host.__array_interface__["data"][0]), desc.shape, desc.strides, desc.dtype, desc.box,
                   desc.element_strides, int(desc.swizzle), int(desc.interleave), fill, len(desc.shape))
        copy.allow_store_overhang = bool(getattr(desc, "allow_store_overhang", False))
        return copy

    def copy(self):
        other = SimTensorMap.__new__(SimTensorMap)
        other.__dict__.update(self.__dict__)
        return other

    # -- edits
    def set(self, field, value):
        if field == "rank":  # the per-axis fields keep their innermost entries (PTX counts from there)
            self.declared_rank = value
            for name, pad in (("shape", 1), ("strides", 0), ("box", 1), ("element_strides", 1)):
                old = getattr(self, name)
                setattr(self, name, ((pad,) * value + old)[-value:])
        elif field == "elemtype":  # the simulated copies move the bytes of the new element type
            self.elemtype = value
            self.dtype = np.dtype(_SIM_DTYPE[value])
        else:
            setattr(self, field, value)

    def set_axis(self, field, axis, value):
        values = list(getattr(self, field))
        values[axis] = value
        setattr(self, field, tuple(values))

    def set_address(self, address):
        if isinstance(address, (int, np.integer)):
            address = int(address)
            memory = _REGISTRY.get(address)
            if memory is None:
                for base, arr in _REGISTRY.items():
                    lo, hi = sim().bounds(_root(arr))
                    if lo <= address < hi:
                        memory = arr
                        break
            if memory is None:
                raise sim().SimulatedMisuse(
                    f"tensormap_replace_global_address: the simulator knows no array at address 0x{address:x}; "
                    f"obtain addresses on the host with numbatma.intrinsics.device_address(array), or pass the "
                    f"array itself")
            self.memory, self.address = memory, address
        else:
            host = _sim_host(address)
            self.memory, self.address = host, int(host.__array_interface__["data"][0])

    # -- what the simulated TMA copies read
    @property
    def array(self):
        rank = len(self.shape)
        if self.declared_rank != rank or len(self.box) != rank:
            raise sim().SimulatedMisuse(
                f"a descriptor with rank field {self.declared_rank} but {rank} dimensions was used")
        if self.interleave:
            raise NotImplementedError("interleaved layouts are not simulated")
        root = _root(self.memory)
        lo, hi = sim().bounds(root)
        strides = tuple(self.strides[:-1]) + (self.dtype.itemsize,)
        end = self.address + sum((n - 1) * s for n, s in zip(self.shape, strides)) + self.dtype.itemsize
        if self.address < lo or end > hi or self.address % 16:
            raise sim().SimulatedMisuse(
                f"the edited descriptor (address 0x{self.address:x}, shape {self.shape}, byte strides {strides}) "
                f"reaches bytes [0x{self.address:x}, 0x{end:x}) outside the array's memory [0x{lo:x}, 0x{hi:x})"
                + (" or is not 16-byte aligned" if self.address % 16 else ""))
        if not root.flags.c_contiguous:
            raise NotImplementedError("the simulator edits descriptors of contiguous allocations only")
        flat = root.reshape(-1).view(np.uint8)
        start = self.address - lo
        count = (flat.size - start) // self.dtype.itemsize
        base = flat[start:start + count * self.dtype.itemsize].view(self.dtype)
        return np.lib.stride_tricks.as_strided(base, shape=self.shape, strides=strides)

    @property
    def rank(self):
        return len(self.shape)

    @property
    def shared_shape(self):
        from numbatma.tensormap import tile_footprint

        return tile_footprint(self.box, self.element_strides, self.dtype.itemsize, self.swizzle)[0]

    @property
    def box_bytes(self):
        from numbatma.tensormap import tile_footprint

        return tile_footprint(self.box, self.element_strides, self.dtype.itemsize, self.swizzle)[1]

    @property
    def store_overhang(self):
        return -(self.shape[-1] * self.dtype.itemsize) % 16
