"""Bulk (non-tensor) asynchronous copies: ``cp.async.bulk`` / ``cp.reduce.async.bulk`` /
``cp.async.bulk.prefetch`` - contiguous byte ranges moved by the TMA unit without a tensor map.

Every operation comes in two forms:

* whole-array form - ``bulk_load(dst, src, bar)``: the byte count is the size of the *shared* operand
  (``dst.nbytes`` for a load, ``src.nbytes`` for a store or reduction) and both operands start at their
  first element. Slice the global array to choose where (``src[i:i + n]``) or use the indexed form;
* indexed form - ``bulk_load_at(dst, dst_index, src, src_index, nbytes, bar)``: ``nbytes`` bytes starting
  at element ``dst[dst_index]`` / ``src[src_index]`` (an integer for 1-D arrays, a tuple otherwise), like
  ``cp_async``.

The hardware's rules, which the caller guarantees: the byte count is a positive multiple of 16 (below
2**32), both addresses are 16-byte aligned (declare shared tiles with ``cuda.shared.array(...,
alignment=16)`` or more; ``cudaMalloc`` memory is 256-byte aligned), and the bytes lie inside both
arrays. A byte count or an index known at compile time (a literal or a global constant) is checked
while typing; run-time values are checked by the simulator (``SimulatedMisuse``), not on the GPU, where
a violation is undefined behaviour (usually a misaligned-address error).

Completion: a load (global -> shared) or a cluster copy (shared -> another CTA's shared) delivers its
bytes as transaction bytes on an mbarrier of the destination CTA (``mbarrier_arrive_expect_tx`` with the
byte count, then wait on the phase); a store or reduction (shared -> global) joins the issuing thread's
bulk group (``bulk_commit_group`` / ``bulk_wait_group_read`` / ``bulk_wait_group`` from ``tma.py``). A
shared source written by threads needs ``fence_proxy_async_shared_cta()`` and a block barrier before the
copy is issued.
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import mbarrier
from ._asm import Ptx
from ._define import (SIMULATING, barrier_address, device_op, element_pointer, fail, index_types, require_barrier,
                      require_shared, shared_pointer, sim)

__all__ = [
    "bulk_load",
    "bulk_load_at",
    "bulk_store",
    "bulk_store_at",
    "bulk_copy_to_cluster",
    "bulk_reduce",
    "bulk_reduce_at",
    "bulk_prefetch_l2",
    "bulk_prefetch_l2_at",
]

# -- the PTX --------------------------------------------------------------------------------------------
# Global operands arrive as generic addresses and are converted inside the asm block.
LOAD = Ptx(
    "{ .reg .u64 g; cvta.to.global.u64 g, $src; "
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$dst], [g], $size, [$bar]; }",
    ins=(("dst", "b32"), ("src", "b64"), ("size", "b32"), ("bar", "b32")),
)
STORE = Ptx(
    "{ .reg .u64 g; cvta.to.global.u64 g, $dst; cp.async.bulk.global.shared::cta.bulk_group [g], [$src], $size; }",
    ins=(("dst", "b64"), ("src", "b32"), ("size", "b32")),
)
CLUSTER_COPY = Ptx(
    "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [$dst], [$src], $size, [$bar];",
    ins=(("dst", "b32"), ("src", "b32"), ("size", "b32"), ("bar", "b32")),
)
PREFETCH_L2 = Ptx(
    "{ .reg .u64 g; cvta.to.global.u64 g, $src; cp.async.bulk.prefetch.L2.global [g], $size; }",
    ins=(("src", "b64"), ("size", "b32")),
)

# cp.reduce.async.bulk (global <- shared::cta, bulk group): operation -> element dtype -> PTX suffix. The
# PTX ISA's table, confirmed by linking every combination with ptxas (sm_90a, sm_100a, sm_120a). int64
# addition uses .u64 (two's-complement addition is the same bits; PTX has no .add.s64 here); float16
# addition is .add.noftz.f16 (the only f16 addition PTX offers). bfloat16 is omitted: NumPy/Numba arrays
# have no bfloat16 dtype.
_BITWISE = {"uint32": "b32", "int32": "b32", "uint64": "b64", "int64": "b64"}
_MINMAX = {"uint32": "u32", "int32": "s32", "uint64": "u64", "int64": "s64", "float16": "f16"}
REDUCE_TYPES = {
    "add": {"uint32": "u32", "int32": "s32", "uint64": "u64", "int64": "u64", "float32": "f32",
            "float64": "f64", "float16": "noftz.f16"},
    "min": _MINMAX,
    "max": _MINMAX,
    "inc": {"uint32": "u32"},
    "dec": {"uint32": "u32"},
    "and": _BITWISE,
    "or": _BITWISE,
    "xor": _BITWISE,
}
REDUCE = {
    (op, suffix): Ptx(
        "{ .reg .u64 g; cvta.to.global.u64 g, $dst; "
        f"cp.reduce.async.bulk.global.shared::cta.bulk_group.{op}.{suffix} [g], [$src], $size; }}",
        ins=(("dst", "b64"), ("src", "b32"), ("size", "b32")),
    )
    for op, table in REDUCE_TYPES.items()
    for suffix in sorted(set(table.values()))
}

if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types

    from numbatma._types import SharedArray




# -- typing checks ----------------------------------------------------------------------------------------
def _require_global(op, what, ty):
    if not isinstance(ty, types.Array) or isinstance(ty, SharedArray):
        fail(op, f"{what} must be a global-memory array (a kernel argument or a slice of one), got {ty}")


def _require_contiguous(op, what, ty):
    if ty.layout != "C":
        fail(
            op,
            f"{what} ({ty}) must be C-contiguous (layout 'C'), got layout {ty.layout!r}: the copy moves raw "
            f"consecutive bytes. Use shared_view for a shared tile, or the indexed form (e.g. bulk_load_at) "
            f"naming the first element",
        )


def _check_size(op, nbytes, item, what="the byte count", report=None):
    report = report or fail
    if nbytes <= 0 or nbytes % 16:
        report(op, f"{what} must be a positive multiple of 16 bytes (the bulk-copy granule), got {nbytes}")
    if nbytes >= 1 << 32:
        report(op, f"{what} must be below 2**32, got {nbytes}")
    if nbytes % item:
        report(op, f"{what} ({nbytes}) is not a whole number of {item}-byte elements")


def _literal_size(op, nbytes, item):
    """The byte count if it is a compile-time constant (checked), else None (a run-time integer)."""
    if isinstance(nbytes, types.IntegerLiteral):
        _check_size(op, nbytes.literal_value, item, report=fail)
        return nbytes.literal_value
    if not isinstance(nbytes, types.Integer):
        fail(op, f"nbytes must be an integer, got {nbytes}")
    return None


def _check_index(op, what, ary, index):
    """An index into ``ary``; a constant 1-D index must keep the 16-byte alignment of the array start."""
    index_types(op, what, ary, index)
    if isinstance(index, types.IntegerLiteral):
        offset = index.literal_value * (ary.dtype.bitwidth // 8)
        if offset % 16:
            fail(op, f"{what} index {index.literal_value} is {offset} bytes from the array start, not a "
                             f"multiple of 16: bulk copies need 16-byte aligned addresses")


def _require_same_dtype(op, a, b):
    if a.dtype != b.dtype:
        fail(op, f"the destination holds {a.dtype} but the source holds {b.dtype}")


def _static_bytes(op, what, ty):
    """Static byte size of a shared array (checked), or None when its shape is known only at run time."""
    nbytes = ty.nbytes if isinstance(ty, SharedArray) else None
    if nbytes is not None:
        _check_size(op, nbytes, ty.dtype.bitwidth // 8, f"the size of {what} {ty.static_shape}")
    return nbytes


# -- lowering helpers --------------------------------------------------------------------------------------
def _first_pointer(context, builder, ty, value):
    arr = context.make_array(ty)(context, builder, value)
    return builder.bitcast(arr.data, ir.IntType(8).as_pointer())


def _runtime_bytes(context, builder, ty, value):
    arr = context.make_array(ty)(context, builder, value)
    itemsize = ir.Constant(arr.nitems.type, ty.dtype.bitwidth // 8)
    return builder.trunc(builder.mul(arr.nitems, itemsize), ir.IntType(32))


def _size_operand(context, builder, static, ty, value):
    if static is not None:
        return ir.Constant(ir.IntType(32), static)
    return _runtime_bytes(context, builder, ty, value)


def _u32(context, builder, ty, value):
    return context.cast(builder, value, ty, types.uint32)


def _g(builder, ptr):
    return builder.ptrtoint(ptr, ir.IntType(64))


# -- global -> shared ---------------------------------------------------------------------------------------
@device_op(simulate=lambda dst, src, bar: _sim_load(dst, 0, src, 0, None, bar, "bulk_load"))
def bulk_load(typingctx, dst, src, bar):
    """Start copying ``dst.nbytes`` bytes from the start of the global array ``src`` into the shared array
    ``dst``; completion delivers that many transaction bytes to the mbarrier ``bar``.

    Emits the global -> shared ``cp.async.bulk`` copy of ``dst.nbytes`` bytes that completes on the mbarrier
    (PTX below).

    The caller guarantees: one thread issues it; ``bar`` expects the bytes in the phase waited on
    (``mbarrier_arrive_expect_tx(bar, nbytes)``); ``src`` holds at least ``dst.nbytes`` bytes; the size is
    a multiple of 16 and both addresses are 16-byte aligned; nobody reads ``dst`` before waiting on ``bar``.
    Typing checks: ``dst`` is a C-contiguous shared array whose static size (if known) is a positive
    multiple of 16 bytes; ``src`` is a C-contiguous global array of the same dtype."""
    op = "bulk_load"
    require_shared(op, "the destination", dst)
    _require_contiguous(op, "the destination", dst)
    _require_global(op, "the source", src)
    _require_contiguous(op, "the source", src)
    _require_same_dtype(op, dst, src)
    require_barrier(op, bar)
    static = _static_bytes(op, "the destination", dst)

    def codegen(context, builder, sig, args):
        LOAD.emit(
            builder,
            dst=shared_pointer(builder, _first_pointer(context, builder, sig.args[0], args[0])),
            src=_g(builder, _first_pointer(context, builder, sig.args[1], args[1])),
            size=_size_operand(context, builder, static, sig.args[0], args[0]),
            bar=barrier_address(context, builder, sig.args[2], args[2]),
        )
        return context.get_dummy_value()

    return types.void(dst, src, bar), codegen


@device_op(prefer_literal=True,
           simulate=lambda dst, di, src, si, n, bar: _sim_load(dst, di, src, si, n, bar, "bulk_load_at"))
def bulk_load_at(typingctx, dst, dst_index, src, src_index, nbytes, bar):
    """Start copying ``nbytes`` bytes from ``src[src_index]`` (global) on to ``dst[dst_index]`` (shared)
    on; completion delivers ``nbytes`` transaction bytes to the mbarrier ``bar``.

    Emits the instruction of ``bulk_load`` (its PTX: ``help(bulk_load)``, docs/ptx.md) with ``nbytes`` as the size.
    Same guarantees as ``bulk_load``; the ``nbytes`` bytes are contiguous in both arrays from the indexed
    element on. A constant ``nbytes`` is checked (positive multiple of 16, whole elements), as is a
    constant 1-D index (a multiple of 16 bytes from the array start)."""
    op = "bulk_load_at"
    require_shared(op, "the destination", dst)
    _require_global(op, "the source", src)
    _require_same_dtype(op, dst, src)
    _check_index(op, "the destination", dst, dst_index)
    _check_index(op, "the source", src, src_index)
    _literal_size(op, nbytes, dst.dtype.bitwidth // 8)
    require_barrier(op, bar)

    def codegen(context, builder, sig, args):
        d = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        s = element_pointer(context, builder, sig.args[2], args[2], sig.args[3], args[3])
        LOAD.emit(builder, dst=shared_pointer(builder, d), src=_g(builder, s),
                  size=_u32(context, builder, sig.args[4], args[4]),
                  bar=barrier_address(context, builder, sig.args[5], args[5]))
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index, nbytes, bar), codegen


# -- shared -> global -------------------------------------------------------------------------------------
@device_op(simulate=lambda dst, src: _sim_store(dst, 0, src, 0, None, "bulk_store", None))
def bulk_store(typingctx, dst, src):
    """Start copying the shared array ``src`` (``src.nbytes`` bytes) to the start of the global array
    ``dst``, in the issuing thread's current bulk group.

    Emits the shared -> global ``cp.async.bulk`` copy of ``src.nbytes`` bytes into the bulk group (PTX below).

    The caller guarantees: the threads that wrote ``src`` executed ``fence_proxy_async_shared_cta()`` and
    then a block barrier before one thread issues the store; ``dst`` holds at least ``src.nbytes`` bytes;
    size multiple of 16, addresses 16-byte aligned; ``src`` is not overwritten before
    ``bulk_wait_group_read``; ``bulk_commit_group()`` then ``bulk_wait_group(0)`` before relying on the
    data in global memory (other blocks and the host see it after the kernel ends)."""
    return types.void(dst, src), _shared_to_global("bulk_store", dst, src, lambda: STORE, 0)


def _shared_to_global(op, dst, src, ptx_for, first):
    """Checks and lowering of a whole-array shared -> global bulk operation (store or reduce): ``ptx_for()``
    gives its instruction once the operands are known good; ``dst``, ``src`` are arguments ``first`` and
    ``first + 1``."""
    _require_global(op, "the destination", dst)
    _require_contiguous(op, "the destination", dst)
    require_shared(op, "the source", src)
    _require_contiguous(op, "the source", src)
    _require_same_dtype(op, dst, src)
    ptx = ptx_for()
    static = _static_bytes(op, "the source", src)

    def codegen(context, builder, sig, args):
        d, s = first, first + 1
        ptx.emit(
            builder,
            dst=_g(builder, _first_pointer(context, builder, sig.args[d], args[d])),
            src=shared_pointer(builder, _first_pointer(context, builder, sig.args[s], args[s])),
            size=_size_operand(context, builder, static, sig.args[s], args[s]),
        )
        return context.get_dummy_value()

    return codegen


def _shared_to_global_at(op, dst, dst_index, src, src_index, nbytes, ptx_for, first):
    """``_shared_to_global`` for the indexed form: ``dst, dst_index, src, src_index, nbytes`` are arguments
    ``first`` .. ``first + 4``."""
    _require_global(op, "the destination", dst)
    require_shared(op, "the source", src)
    _require_same_dtype(op, dst, src)
    ptx = ptx_for()
    _check_index(op, "the destination", dst, dst_index)
    _check_index(op, "the source", src, src_index)
    _literal_size(op, nbytes, dst.dtype.bitwidth // 8)

    def codegen(context, builder, sig, args):
        a = first
        d = element_pointer(context, builder, sig.args[a], args[a], sig.args[a + 1], args[a + 1])
        s = element_pointer(context, builder, sig.args[a + 2], args[a + 2], sig.args[a + 3], args[a + 3])
        ptx.emit(builder, dst=_g(builder, d), src=shared_pointer(builder, s),
                 size=_u32(context, builder, sig.args[a + 4], args[a + 4]))
        return context.get_dummy_value()

    return codegen


@device_op(prefer_literal=True,
           simulate=lambda dst, di, src, si, n: _sim_store(dst, di, src, si, n, "bulk_store_at", None))
def bulk_store_at(typingctx, dst, dst_index, src, src_index, nbytes):
    """Start copying ``nbytes`` bytes from ``src[src_index]`` (shared) on to ``dst[dst_index]`` (global)
    on, in the current bulk group: ``cp.async.bulk.global.shared::cta.bulk_group [dst], [src], nbytes;``.
    Same guarantees as ``bulk_store``; constant ``nbytes`` / 1-D indices are checked as in ``bulk_load_at``."""
    codegen = _shared_to_global_at("bulk_store_at", dst, dst_index, src, src_index, nbytes, lambda: STORE, 0)
    return types.void(dst, dst_index, src, src_index, nbytes), codegen


# -- shared -> shared::cluster ----------------------------------------------------------------------------
def _cluster_operand(op, what, ty, barrier=False):
    """A shared::cluster address (an integer, e.g. from mapa_shared / mapa_barrier) or, for the issuing
    CTA itself, a shared array / mbarrier operand."""
    if isinstance(ty, types.Integer):
        return
    if barrier:
        require_barrier(op, ty)
    else:
        require_shared(op, what, ty)


# A shared::cta address of this CTA is turned into its shared::cluster address with cluster.py's ``mapa`` to
# the CTA's own rank (``%cluster_ctarank``) before it is used as a cp.async.bulk.shared::cluster operand.


def _cluster_address(context, builder, ty, value, barrier=False):
    if isinstance(ty, types.Integer):
        return _u32(context, builder, ty, value)
    if barrier:
        own = barrier_address(context, builder, ty, value)
    else:
        own = shared_pointer(builder, _first_pointer(context, builder, ty, value))
    from .cluster import CTARANK, MAPA

    return MAPA.emit(builder, addr=own, rank=CTARANK.emit(builder))


@device_op(prefer_literal=True,
           simulate=lambda dst, src, n, bar: _sim_cluster_copy(dst, src, n, bar))
def bulk_copy_to_cluster(typingctx, dst, src, nbytes, bar):
    """Start copying ``nbytes`` bytes from the start of the shared array ``src`` (this CTA) to the
    shared::cluster address ``dst`` (usually another CTA's shared memory: ``mapa_shared(array, rank)``);
    completion delivers ``nbytes`` transaction bytes to the mbarrier at the shared::cluster address
    ``bar`` (``mapa_barrier(bar, rank)``), which must be in the same CTA as ``dst``.

    Emits the shared::cta -> shared::cluster ``cp.async.bulk`` copy that completes on the mbarrier ``bar``
    (PTX below).

    ``dst`` and ``bar`` may also be this CTA's own shared array / mbarrier: they are translated with
    ``mapa.shared::cluster`` to this CTA's rank first.

    The kernel must be launched as a cluster (``numbatma.with_cluster`` / ``cluster_kernel``), even a
    cluster of one CTA: on an H200 the copy stopped a plain launch with an illegal-instruction error and
    worked with clusters of 1 and 2 (``scripts/probe_bulk_cluster_self.py``). The caller guarantees: the destination CTA's
    barrier expects the bytes (``mbarrier_arrive_expect_tx`` there) and the destination CTA is running
    (a cluster barrier after the barriers are initialised); the threads that wrote ``src`` fenced
    (``fence_proxy_async_shared_cta``) and passed a block barrier; ``src`` is not overwritten before the
    destination's barrier phase completes; size multiple of 16, addresses 16-byte aligned."""
    op = "bulk_copy_to_cluster"
    _cluster_operand(op, "the destination", dst)
    require_shared(op, "the source", src)
    _require_contiguous(op, "the source", src)
    _literal_size(op, nbytes, 1)
    if isinstance(nbytes, types.IntegerLiteral) and src.nbytes is not None and nbytes.literal_value > src.nbytes:
        fail(op, f"nbytes {nbytes.literal_value} exceeds the source {src.static_shape} ({src.nbytes} bytes)")
    _cluster_operand(op, "the mbarrier", bar, barrier=True)

    def codegen(context, builder, sig, args):
        CLUSTER_COPY.emit(
            builder,
            dst=_cluster_address(context, builder, sig.args[0], args[0]),
            src=shared_pointer(builder, _first_pointer(context, builder, sig.args[1], args[1])),
            size=_u32(context, builder, sig.args[2], args[2]),
            bar=_cluster_address(context, builder, sig.args[3], args[3], barrier=True),
        )
        return context.get_dummy_value()

    return types.void(dst, src, nbytes, bar), codegen


# -- reductions into global memory ---------------------------------------------------------------------
def _reduce_ptx(op_name, opty, dtype):
    if not isinstance(opty, types.StringLiteral):
        fail(op_name, f"the operation must be a constant string ({', '.join(repr(o) for o in REDUCE_TYPES)}), "
                      f"got {opty}")
    op = opty.literal_value
    table = REDUCE_TYPES.get(op)
    if table is None:
        fail(op_name, f"unknown reduction {op!r}; cp.reduce.async.bulk has "
                      f"{', '.join(repr(o) for o in REDUCE_TYPES)}")
    name = str(dtype)
    if name not in table:
        fail(op_name, f"{op!r} is not available for {name} elements: cp.reduce.async.bulk.{op} takes "
                      f"{', '.join(table)} (PTX ISA)")
    return REDUCE[(op, table[name])]


@device_op(prefer_literal=True, simulate=lambda op, dst, src: _sim_store(dst, 0, src, 0, None, "bulk_reduce", op))
def bulk_reduce(typingctx, op, dst, src):
    """Start reducing the shared array ``src`` element-wise into the start of the global array ``dst``
    (``dst[i] = op(dst[i], src[i])``, each element atomically), in the current bulk group.

    ``op`` is a constant string: ``"add"`` (uint32, int32, uint64, int64, float32, float64, float16),
    ``"min"`` / ``"max"`` (uint32, int32, uint64, int64, float16), ``"inc"`` / ``"dec"`` (uint32:
    ``inc``: ``0 if old >= s else old + 1``; ``dec``: ``s if old == 0 or old > s else old - 1``),
    ``"and"`` / ``"or"`` / ``"xor"`` (32- and 64-bit integers). Other combinations are typing errors.

    Emits the shared -> global ``cp.reduce.async.bulk`` into the bulk group, its ``.<op>.<type>`` from ``op``
    and the element type (PTX below; int64 add as ``.add.u64``, float16 add as ``.add.noftz.f16``). Same
    guarantees as ``bulk_store``."""
    name = "bulk_reduce"
    return types.void(op, dst, src), _shared_to_global(name, dst, src, lambda: _reduce_ptx(name, op, dst.dtype), 1)


@device_op(prefer_literal=True,
           simulate=lambda op, dst, di, src, si, n: _sim_store(dst, di, src, si, n, "bulk_reduce_at", op))
def bulk_reduce_at(typingctx, op, dst, dst_index, src, src_index, nbytes):
    """``bulk_reduce`` of ``nbytes`` bytes from ``src[src_index]`` (shared) into ``dst[dst_index]``
    (global): ``cp.reduce.async.bulk.global.shared::cta.bulk_group.<op>.<type> [dst], [src], nbytes;``.
    Same operations, types and guarantees as ``bulk_reduce``."""
    name = "bulk_reduce_at"
    codegen = _shared_to_global_at(name, dst, dst_index, src, src_index, nbytes,
                                   lambda: _reduce_ptx(name, op, dst.dtype), 1)
    return types.void(op, dst, dst_index, src, src_index, nbytes), codegen


# -- L2 prefetch -------------------------------------------------------------------------------------------
@device_op(prefer_literal=True, simulate=lambda src, n: _sim_prefetch(src, 0, n, "bulk_prefetch_l2"))
def bulk_prefetch_l2(typingctx, src, nbytes):
    """Hint that the first ``nbytes`` bytes of the global array ``src`` be brought into L2:
    ``cp.async.bulk.prefetch.L2.global [src], nbytes;``. No completion, no effect on results. The caller
    guarantees ``nbytes`` is a positive multiple of 16 inside ``src`` and ``src`` is 16-byte aligned (a
    constant ``nbytes`` is checked)."""
    op = "bulk_prefetch_l2"
    _require_global(op, "the prefetched array", src)
    _literal_size(op, nbytes, 1)

    def codegen(context, builder, sig, args):
        PREFETCH_L2.emit(builder, src=_g(builder, _first_pointer(context, builder, sig.args[0], args[0])),
                         size=_u32(context, builder, sig.args[1], args[1]))
        return context.get_dummy_value()

    return types.void(src, nbytes), codegen


@device_op(prefer_literal=True, simulate=lambda src, si, n: _sim_prefetch(src, si, n, "bulk_prefetch_l2_at"))
def bulk_prefetch_l2_at(typingctx, src, src_index, nbytes):
    """``bulk_prefetch_l2`` of ``nbytes`` bytes from ``src[src_index]`` on:
    ``cp.async.bulk.prefetch.L2.global [src], nbytes;``."""
    op = "bulk_prefetch_l2_at"
    _require_global(op, "the prefetched array", src)
    _check_index(op, "the prefetched array", src, src_index)
    _literal_size(op, nbytes, 1)

    def codegen(context, builder, sig, args):
        s = element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        PREFETCH_L2.emit(builder, src=_g(builder, s), size=_u32(context, builder, sig.args[2], args[2]))
        return context.get_dummy_value()

    return types.void(src, src_index, nbytes), codegen


PTX = {
    "bulk_load": LOAD,
    "bulk_store": STORE,
    "bulk_copy_to_cluster": CLUSTER_COPY,
    "bulk_prefetch_l2": PREFETCH_L2,
    **{f"bulk_reduce({op}.{suffix})": p for (op, suffix), p in REDUCE.items()},
}


# -- simulator semantics ------------------------------------------------------------------------------------
def _host(array):
    """The NumPy array behind a simulator device array (or the array itself)."""
    return sim().numpy_of(array)


def _root(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _raw(address, nbytes):
    return np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(address))


def _check_sim_size(op, nbytes):
    n = int(nbytes)
    if n <= 0 or n % 16:
        raise sim().SimulatedMisuse(f"{op}: the byte count must be a positive multiple of 16, got {n}")
    return n


def _byte_range(op, what, array, index, nbytes):
    """(address, raw uint8 view) of ``nbytes`` bytes of ``array`` from element ``index`` on, checked for
    16-byte alignment and for lying inside the array's memory (as the hardware sees it: raw bytes)."""
    a = _host(array)
    idx = (int(index),) if np.isscalar(index) else tuple(int(i) for i in index)
    if len(idx) == 1 and a.ndim > 1:  # (a flat element index into an N-D array)
        idx = tuple(int(i) for i in np.unravel_index(idx[0], a.shape)) if a.size else (0,) * a.ndim
    if a.ndim and any(not 0 <= i < n for i, n in zip(idx, a.shape)):
        raise sim().SimulatedMisuse(f"{op}: index {tuple(idx)} lies outside {what} of shape {a.shape}")
    address = int(a.__array_interface__["data"][0]) + sum(int(i) * st for i, st in zip(idx, a.strides))
    if address % 16:
        raise sim().SimulatedMisuse(
            f"{op}: {what} address is {address % 16} bytes past a 16-byte boundary (element {tuple(idx)}); bulk "
            f"copies need 16-byte aligned addresses (cuda.shared.array(..., alignment=16), offsets in 16-byte steps)")
    lo, hi = sim().bounds(a)
    if not a.flags.c_contiguous:
        lo, hi = sim().bounds(_root(a))
    if address + nbytes > hi:
        raise sim().SimulatedMisuse(
            f"{op}: {nbytes} bytes from element {tuple(idx)} run {address + nbytes - hi} byte(s) past the end of "
            f"{what} (shape {a.shape}, {a.dtype})")
    return address, _raw(address, nbytes)


def _whole_bytes(array):
    return _host(array).nbytes


def _sim_load(dst, dst_index, src, src_index, nbytes, bar, op):
    s = sim()
    if isinstance(src, s.SharedArray):
        raise s.SimulatedMisuse(f"{op}: the source must be a global-memory array, got a shared array")
    n = _check_sim_size(op, _whole_bytes(dst) if nbytes is None else nbytes)
    d_addr, d = _byte_range(op, "the destination", dst, dst_index, n)
    _, src_bytes = _byte_range(op, "the source", src, src_index, n)
    site = s.caller_site()
    with s.lock:
        d[:] = src_bytes
        b, phase = mbarrier.sim_complete_tx(bar, n)
        s.add_fill(d_addr, d_addr + n, f"the bytes the {op} at {site[0]}:{site[1]} copies (into "
                                       f"{s.describe_array(dst, site, op, 0)})", [(b, phase)])


_SOURCE_POSITION = {"bulk_store": 1, "bulk_store_at": 2, "bulk_reduce": 2, "bulk_reduce_at": 3}  # (messages)


def _sim_store(dst, dst_index, src, src_index, nbytes, op, reduce_op):
    s = sim()
    if reduce_op is not None:
        table = REDUCE_TYPES.get(str(reduce_op))
        if table is None or _host(dst).dtype.name not in table:
            raise s.SimulatedMisuse(f"{op}: {reduce_op!r} is not available for {_host(dst).dtype} elements")
    if isinstance(dst, s.SharedArray) or not isinstance(src, s.SharedArray):
        raise s.SimulatedMisuse(f"{op}: copies a shared array into a global array")
    n = _check_sim_size(op, _whole_bytes(src) if nbytes is None else nbytes)
    s_addr, src_bytes = _byte_range(op, "the source", src, src_index, n)
    _, d = _byte_range(op, "the destination", dst, dst_index, n)
    site = s.caller_site()
    with s.lock:
        name = s.describe_array(src, site, op, _SOURCE_POSITION.get(op, 1))
        s.check_store_source(s_addr, s_addr + n, op, f"{name}; the store at {site[0]}:{site[1]}")
        s.add_store_read(s_addr, s_addr + n, site, name)
    if reduce_op is None:
        d[:] = src_bytes
        return
    dtype = _host(dst).dtype
    with s.lock:  # (element-wise atomic on the GPU)
        old = d.view(dtype)
        old[:] = s.reduce_elements(str(reduce_op), old.copy(), src_bytes.view(dtype).copy())  # (as tma_reduce)


def _sim_prefetch(src, src_index, nbytes, op):
    s = sim()
    if isinstance(src, s.SharedArray):
        raise s.SimulatedMisuse(f"{op}: prefetches global memory, got a shared array")
    _byte_range(op, "the prefetched array", src, src_index, _check_sim_size(op, nbytes))


def _cluster_windows():
    """shared::cluster addresses that mapa_shared / mapa_barrier handed out in the running block (the
    cluster module's registry: base address -> (array or None, name)); empty if there is none."""
    from .cluster import sim_windows

    return sim_windows()


def _cluster_target(op, dst, nbytes):
    """(address, raw view) of the destination of a cluster copy: this CTA's shared array, or an integer
    shared::cluster address from mapa_shared (under the simulator: the host address of the bytes, in the
    one CTA of a simulated cluster)."""
    s = sim()
    if isinstance(dst, np.ndarray):
        if not isinstance(dst, s.SharedArray):
            raise s.SimulatedMisuse(f"{op}: the destination must be shared memory")
        return _byte_range(op, "the destination", dst, 0, nbytes)
    address = int(dst)
    with s.lock:
        for base, (array, name) in _cluster_windows().items():
            if array is None or not base <= address < base + array.nbytes:
                continue
            if address + nbytes > base + array.nbytes:
                raise s.SimulatedMisuse(f"{op}: {nbytes} bytes from address {address:#x} run "
                                        f"{address + nbytes - base - array.nbytes} byte(s) past the end of {name}")
            if address % 16:
                raise s.SimulatedMisuse(f"{op}: the destination address {address:#x} ({name}, byte "
                                        f"{address - base}) is not 16-byte aligned")
            return address, _raw(address, nbytes)
    raise s.SimulatedMisuse(
        f"{op}: the destination address {address:#x} is not inside a shared array translated with mapa_shared in "
        f"this CTA (pass the uint32 that mapa_shared(array, rank) returned, plus a byte offset within the array)")


def _sim_cluster_copy(dst, src, nbytes, bar):
    s = sim()
    op = "bulk_copy_to_cluster"
    n = _check_sim_size(op, nbytes)
    s_addr, src_bytes = _byte_range(op, "the source", src, 0, n)
    d_addr, d = _cluster_target(op, dst, n)
    if not isinstance(bar, (np.ndarray, s.BarrierRef)):
        entry = _cluster_windows().get(int(bar))
        bar = s.BarrierRef(int(bar), entry[1] if entry else f"mbarrier at shared::cluster address {int(bar):#x}")
    site = s.caller_site()
    with s.lock:
        s.check_store_source(s_addr, s_addr + n, op)
        d[:] = src_bytes
        b, phase = mbarrier.sim_complete_tx(bar, n)
        s.add_fill(d_addr, d_addr + n, f"the bytes the {op} at {site[0]}:{site[1]} copies", [(b, phase)])


# -- bulk async-groups (``bulk_commit_group`` / ``bulk_wait_group(_read)``, defined in tma.py) ----------------------
def sim_commit_group():
    """``cp.async.bulk.commit_group``: this thread's stores (tile and bulk) not yet in a group form its next
    bulk group."""
    s = sim()
    me = s.current_thread()
    groups = me.__dict__.setdefault("_numbatma_bulk_groups", 0)
    s.commit_store_reads(me, groups)
    me._numbatma_bulk_groups = groups + 1


def sim_wait_group(n):
    """``cp.async.bulk.wait_group(.read) n``: every bulk group of this thread but the newest ``n`` is done."""
    s = sim()
    me = s.current_thread()
    s.retire_store_reads(me, me.__dict__.get("_numbatma_bulk_groups", 0) - int(n))
