"""LDGSTS: the per-thread asynchronous global -> shared copy of sm_80+ (``cp.async``), with completion by
commit groups or by an mbarrier.

Each thread copies 4, 8 or 16 bytes per instruction; a block copies a tile cooperatively (the
``cuda::memcpy_async`` / ``cuda::pipeline`` model). Elements are named by an index into the array (an
integer for 1-D arrays, a tuple otherwise), so views with strides work.

``memcpy_async`` / ``memcpy_async_mbarrier`` are the block-cooperative form (``cuda::memcpy_async`` /
``cooperative_groups::memcpy_async``): every thread of the block calls them with the same arguments and
issues a strided share of 16-byte copies.
"""
from __future__ import annotations

import numpy as np

from . import mbarrier
from ._asm import Ptx
from ._define import (
    SIMULATING,
    barrier_address,
    device_op,
    element_pointer,
    emit_only,
    fail,
    index_types,
    require_barrier,
    require_literal_int,
    shared_pointer,
    sim,
)

__all__ = [
    "cp_async",
    "cp_async_commit_group",
    "cp_async_mbarrier_arrive",
    "cp_async_mbarrier_arrive_noinc",
    "cp_async_wait_all",
    "cp_async_wait_group",
    "memcpy_async",
    "memcpy_async_mbarrier",
]

# The global operand is converted from a generic address inside the asm block.
COPY_CA = Ptx(
    "{ .reg .u64 g; cvta.to.global.u64 g, $src; cp.async.ca.shared.global [$dst], [g], $nbytes; }",
    ins=(("dst", "b32"), ("src", "b64")), imm=("nbytes",), min_sm=80,
)
COPY_CG = Ptx(
    "{ .reg .u64 g; cvta.to.global.u64 g, $src; cp.async.cg.shared.global [$dst], [g], 16; }",
    ins=(("dst", "b32"), ("src", "b64")), min_sm=80,
)
COMMIT_GROUP = Ptx("cp.async.commit_group;", min_sm=80)
WAIT_GROUP = Ptx("cp.async.wait_group $n;", imm=("n",), min_sm=80)
WAIT_ALL = Ptx("cp.async.wait_all;", min_sm=80)
MBARRIER_ARRIVE = Ptx("cp.async.mbarrier.arrive.shared.b64 [$bar];", ins=(("bar", "b32"),), min_sm=80)
MBARRIER_ARRIVE_NOINC = Ptx("cp.async.mbarrier.arrive.noinc.shared.b64 [$bar];", ins=(("bar", "b32"),), min_sm=80)

if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import cgutils, types

    from numbatma._numba_internals import call_sreg

    from numbatma._types import SharedArray

    from ._define import require_shared



@device_op(prefer_literal=True, simulate=lambda dst, di, src, si, n: sim_cp_async(dst, di, src, si, n))
def cp_async(typingctx, dst, dst_index, src, src_index, nbytes):
    """Start copying ``nbytes`` (4, 8 or 16) bytes from ``src[src_index]`` (global) to ``dst[dst_index]``
    (shared) with this thread.

    Emits ``cp.async`` with the ``.cg`` cache operator for 16 bytes (cached in L2 only, the streaming
    choice) and ``.ca`` for 4 and 8 (PTX below). The caller guarantees: both
    addresses are ``nbytes``-aligned and the ``nbytes`` bytes are contiguous in both arrays; nobody reads
    ``dst`` before the copy is known complete (``cp_async_wait_group`` / ``cp_async_wait_all`` by this
    thread, or a wait on an mbarrier that ``cp_async_mbarrier_arrive*`` tracks)."""
    op = "cp_async"
    require_shared(op, "the destination", dst)
    if not isinstance(src, types.Array) or isinstance(src, SharedArray):
        fail(op, f"the source must be a global-memory array (a kernel argument), got {src}")
    index_types(op, "the destination", dst, dst_index)
    index_types(op, "the source", src, src_index)
    n = require_literal_int(op, "nbytes", nbytes, 4, 16)
    if n not in (4, 8, 16):
        fail(op, f"nbytes must be 4, 8 or 16, got {n}")
    if dst.dtype != src.dtype:
        fail(op, f"the destination holds {dst.dtype} but the source holds {src.dtype}")
    item = dst.dtype.bitwidth // 8
    if n % item:
        fail(op, f"{n} bytes is not a whole number of {dst.dtype} elements")

    def codegen(context, builder, sig, args):
        d = shared_pointer(builder, element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1]))
        s = builder.ptrtoint(element_pointer(context, builder, sig.args[2], args[2], sig.args[3], args[3]),
                             ir.IntType(64))
        if n == 16:
            COPY_CG.emit(builder, dst=d, src=s)
        else:
            COPY_CA.emit(builder, dst=d, src=s, nbytes=n)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index, nbytes), codegen


@device_op(simulate=lambda: sim_commit_group())
def cp_async_commit_group(typingctx):
    """``cp.async.commit_group;`` - close this thread's current group of ``cp_async`` copies."""
    return types.void(), emit_only(COMMIT_GROUP)


@device_op(prefer_literal=True, simulate=lambda n: sim_wait_group(n))
def cp_async_wait_group(typingctx, n):
    """``cp.async.wait_group N;`` - wait until at most ``N`` (a constant, 0..7 is typical) of this thread's
    committed groups are pending. Other threads' copies are covered only after a block barrier."""
    value = require_literal_int("cp_async_wait_group", "N", n, 0, 63)
    return types.void(n), emit_only(WAIT_GROUP, n=value)


@device_op(simulate=lambda: sim_wait_all())
def cp_async_wait_all(typingctx):
    """``cp.async.wait_all;`` - wait for all of this thread's ``cp_async`` copies."""
    return types.void(), emit_only(WAIT_ALL)


def _arrive(ptx):
    def codegen(context, builder, sig, args):
        ptx.emit(builder, bar=barrier_address(context, builder, sig.args[0], args[0]))
        return context.get_dummy_value()

    return codegen


@device_op(simulate=lambda bar: sim_mbarrier_arrive(bar, False))
def cp_async_mbarrier_arrive(typingctx, bar):
    """``cp.async.mbarrier.arrive.shared.b64 [bar];`` - when all of this thread's prior ``cp_async`` copies
    complete, arrive on ``bar``. The pending count is raised by one first, so the thread still makes its
    own ``mbarrier_arrive``; use ``cp_async_mbarrier_arrive_noinc`` to count the copy completion as the
    thread's arrival."""
    require_barrier("cp_async_mbarrier_arrive", bar)
    return types.void(bar), _arrive(MBARRIER_ARRIVE)


@device_op(simulate=lambda bar: sim_mbarrier_arrive(bar, True))
def cp_async_mbarrier_arrive_noinc(typingctx, bar):
    """``cp.async.mbarrier.arrive.noinc.shared.b64 [bar];`` - the completion of this thread's prior
    ``cp_async`` copies is one of the arrivals ``bar`` expects (initialise it with the number of copying
    threads)."""
    require_barrier("cp_async_mbarrier_arrive_noinc", bar)
    return types.void(bar), _arrive(MBARRIER_ARRIVE_NOINC)


# -- block-cooperative copies ----------------------------------------------------------------------------
def _block_copy_types(op, dst, src, nbytes):
    require_shared(op, "the destination", dst)
    if not isinstance(src, types.Array) or isinstance(src, SharedArray):
        fail(op, f"the source must be a global-memory array (a kernel argument or a slice of one), got {src}")
    for what, ary in (("the destination", dst), ("the source", src)):
        if ary.layout != "C":
            fail(op, f"{what} ({ary}) must be C-contiguous (layout 'C'), got layout {ary.layout!r}: the copy moves "
                     f"consecutive bytes from the first element on")
    if dst.dtype != src.dtype:
        fail(op, f"the destination holds {dst.dtype} but the source holds {src.dtype}")
    if isinstance(nbytes, types.IntegerLiteral):
        n = nbytes.literal_value
        if n < 0 or n % 16:
            fail(op, f"nbytes must be a non-negative multiple of 16 (each thread copies 16-byte pieces), "
                             f"got {n}")
        if dst.nbytes is not None and n > dst.nbytes:
            fail(op, f"nbytes {n} exceeds the destination {dst.static_shape} ({dst.nbytes} bytes)")
    elif not isinstance(nbytes, types.Integer):
        fail(op, f"nbytes must be an integer, got {nbytes}")


def _block_copy_codegen(finish):
    """Lowering: thread t of the block copies the 16-byte pieces t, t + nthreads, ... with cp.async.cg,
    then ``finish(context, builder, sig, args)`` (commit group or mbarrier arrive)."""

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        sreg = {n: call_sreg(builder, n) for n in ("tid.x", "tid.y", "tid.z", "ntid.x", "ntid.y", "ntid.z")}
        tid = builder.add(sreg["tid.x"], builder.mul(sreg["ntid.x"], builder.add(
            sreg["tid.y"], builder.mul(sreg["ntid.y"], sreg["tid.z"]))))
        nthreads = builder.mul(sreg["ntid.x"], builder.mul(sreg["ntid.y"], sreg["ntid.z"]))
        dst = context.make_array(sig.args[0])(context, builder, args[0])
        src = context.make_array(sig.args[1])(context, builder, args[1])
        d0 = shared_pointer(builder, builder.bitcast(dst.data, ir.IntType(8).as_pointer()))
        s0 = builder.ptrtoint(src.data, ir.IntType(64))
        nbytes = context.cast(builder, args[2], sig.args[2], types.uint32)
        pieces = builder.lshr(nbytes, ir.Constant(i32, 4))
        with cgutils.for_range_slice(builder, tid, pieces, nthreads, intp=i32) as (i, _):
            off = builder.shl(i, ir.Constant(i32, 4))
            COPY_CG.emit(builder, dst=builder.add(d0, off), src=builder.add(s0, builder.zext(off, ir.IntType(64))))
        finish(context, builder, sig, args)
        return context.get_dummy_value()

    return codegen


@device_op(prefer_literal=True, simulate=lambda dst, src, n: sim_memcpy_async(dst, src, n, None))
def memcpy_async(typingctx, dst, src, nbytes):
    """Block-cooperative asynchronous copy of ``nbytes`` bytes from the start of the global array ``src``
    to the start of the shared array ``dst``, completing in a cp.async commit group.

    Every thread of the block calls it (same arguments): thread ``t`` of ``n`` issues ``cp.async.cg.shared
    .global [dst + 16k], [src + 16k], 16;`` for ``k = t, t + n, ...`` below ``nbytes / 16``, then
    ``cp.async.commit_group;``. Before reading ``dst``: ``cp_async_wait_all()`` (or
    ``cp_async_wait_group(0)``) in every thread, then ``cuda.syncthreads()``.

    The caller guarantees: ``nbytes`` is a multiple of 16 (checked when constant) and fits in both arrays;
    both starts are 16-byte aligned (``cuda.shared.array(..., alignment=16)``); all threads of the block
    take part. Typing checks: C-contiguous shared destination and global source of the same dtype."""
    _block_copy_types("memcpy_async", dst, src, nbytes)

    def finish(context, builder, sig, args):
        COMMIT_GROUP.emit(builder)

    return types.void(dst, src, nbytes), _block_copy_codegen(finish)


@device_op(prefer_literal=True, simulate=lambda dst, src, n, bar: sim_memcpy_async(dst, src, n, bar))
def memcpy_async_mbarrier(typingctx, dst, src, nbytes, bar):
    """``memcpy_async`` whose completion is an arrival on the mbarrier ``bar``: each thread issues its
    16-byte ``cp.async.cg`` pieces, then ``cp.async.mbarrier.arrive.noinc.shared.b64 [bar];`` (the
    completion of its copies is the thread's arrival).

    The caller guarantees: ``bar`` was initialised with the number of threads of the block
    (``mbarrier_init(bar, blockDim)``, then ``fence_mbarrier_init`` and ``cuda.syncthreads()``); every thread
    calls this once per phase and then waits (``mbarrier_wait_parity(bar, phase & 1)``) before reading
    ``dst``; plus the guarantees of ``memcpy_async``. No thread makes another arrival on ``bar`` in that
    phase."""
    op = "memcpy_async_mbarrier"
    _block_copy_types(op, dst, src, nbytes)
    require_barrier(op, bar)

    def finish(context, builder, sig, args):
        MBARRIER_ARRIVE_NOINC.emit(builder, bar=barrier_address(context, builder, sig.args[3], args[3]))

    return types.void(dst, src, nbytes, bar), _block_copy_codegen(finish)


# -- simulator semantics ----------------------------------------------------------------------------------------
class _CpAsyncGroups:
    """The engine's completion key of one thread's cp.async groups: phase ``n`` complete = the thread's first
    ``n`` committed groups are done (its cp_async_wait_group; other threads learn it through a barrier)."""

    __slots__ = ("thread",)

    def __init__(self, thread):
        self.thread = thread

    def missing_wait(self, me, phase):
        return ("this thread's cp.async copies complete at its cp_async_wait_group / cp_async_wait_all (other "
                "threads: after a block barrier that follows it)")


def _groups_key(thread):
    key = thread.__dict__.get("_numbatma_cp_key")
    if key is None:
        key = thread._numbatma_cp_key = _CpAsyncGroups(thread)
    return key


def _elements(array, index, n):
    """``n`` elements of ``array`` from ``index`` on (C order), as a plain NumPy view (no access checks)."""
    a = np.asarray(sim().numpy_of(array))
    idx = (int(index),) if np.isscalar(index) else tuple(int(i) for i in index)
    flat = a.reshape(-1)
    if not np.shares_memory(flat, a):
        raise sim().SimulatedMisuse("cp_async: the array must be C-contiguous")
    start = int(np.ravel_multi_index(idx, a.shape)) if len(idx) == a.ndim else idx[0]
    return flat[start:start + n]


def sim_cp_async(dst, dst_index, src, src_index, nbytes):
    """The copy happens when issued; its bytes are readable once its group is known complete."""
    s = sim()
    n = int(nbytes) // dst.dtype.itemsize
    target = _elements(dst, dst_index, n)
    target[:] = _elements(src, src_index, n)
    me = s.current_thread()
    site = s.caller_site()
    with s.lock:
        lo, hi = s.bounds(target)
        group = me.__dict__.get("_numbatma_cp_groups", 0)
        fill = s.add_fill(lo, hi, f"the bytes the cp_async at {site[0]}:{site[1]} copies (into "
                                  f"{s.describe_array(dst, site, 'cp_async', 0)})", [(_groups_key(me), group)])
        mine = me.__dict__.setdefault("_numbatma_cp_fills", [])
        mine.append(fill)
        if len(mine) > 64:  # only the copies not yet waited for matter to cp_async_mbarrier_arrive
            done = s.knowledge(me).get(_groups_key(me), 0)
            mine[:] = [f for f in mine if f.completions[0][1] >= done]


def sim_commit_group():
    me = sim().current_thread()
    me._numbatma_cp_groups = me.__dict__.get("_numbatma_cp_groups", 0) + 1


def sim_wait_group(n):
    s = sim()
    me = s.current_thread()
    done = me.__dict__.get("_numbatma_cp_groups", 0) - int(n)
    seen = s.knowledge(me)
    key = _groups_key(me)
    if seen.get(key, 0) < done:
        seen[key] = done


def sim_wait_all():
    sim_commit_group()
    sim_wait_group(0)


def sim_mbarrier_arrive(bar, counts_as_arrival):
    """The completion of this thread's prior cp.async copies arrives on ``bar`` (they are done already):
    their bytes are also known to whoever waits for the phase this arrival counts towards."""
    s = sim()
    me = s.current_thread()
    with s.lock:
        b, phase = mbarrier.sim_phase(bar, "cp_async_mbarrier_arrive")
        for f in me.__dict__.get("_numbatma_cp_fills", ()):
            f.completions.append((b, phase))
        me._numbatma_cp_fills = []  # (bound to this phase now; later arrivals concern later copies)
        if counts_as_arrival:  # (under the same lock: the arrival counts towards that same phase)
            mbarrier.sim_arrive(bar)


def sim_memcpy_async(dst, src, nbytes, bar):
    """Simulator semantics of ``memcpy_async`` (``bar`` None) and ``memcpy_async_mbarrier``."""
    s = sim()
    op = "memcpy_async" if bar is None else "memcpy_async_mbarrier"
    n = int(nbytes)
    if n < 0 or n % 16:
        raise s.SimulatedMisuse(f"{op}: nbytes must be a non-negative multiple of 16, got {n}")
    for what, ary in (("the destination", dst), ("the source", src)):
        a = s.numpy_of(ary)
        if n > a.nbytes:
            raise s.SimulatedMisuse(f"{op}: {n} bytes do not fit in {what} ({a.nbytes} bytes)")
        if a.__array_interface__["data"][0] % 16:
            raise s.SimulatedMisuse(f"{op}: {what} is not 16-byte aligned")
    per = 16 // dst.dtype.itemsize
    for k in range(s.thread_index(), n // 16, s.block_size()):
        sim_cp_async(dst, k * per, src, k * per, 16)
    if bar is None:
        sim_commit_group()
    else:
        sim_mbarrier_arrive(bar, True)


PTX = {
    "cp_async(16 bytes)": COPY_CG,
    "cp_async(4/8 bytes)": COPY_CA,
    "cp_async_commit_group": COMMIT_GROUP,
    "cp_async_wait_group": WAIT_GROUP,
    "cp_async_wait_all": WAIT_ALL,
    "cp_async_mbarrier_arrive": MBARRIER_ARRIVE,
    "cp_async_mbarrier_arrive_noinc": MBARRIER_ARRIVE_NOINC,
}
