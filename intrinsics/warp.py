"""Warp- and block-level control for warp-specialized kernels: electing one lane, named barriers between a
subset of the block's warps, and moving registers between warpgroups (``setmaxnreg``)."""
from __future__ import annotations

from ._asm import Ptx
from ._define import SIMULATING, device_op, emit_only, fail, require_int, require_literal_int, sim, to_u32

__all__ = ["elect_one_sync", "named_barrier_arrive", "named_barrier_sync", "setmaxnreg_dec", "setmaxnreg_inc",
           "vote_all", "vote_any"]

ELECT_ONE = Ptx(
    "{ .reg .pred p; .reg .b32 lane; elect.sync lane|p, 0xffffffff; selp.u32 $elected, 1, 0, p; }",
    out=("elected", "b32"),
)
VOTE_ANY = Ptx(
    "{ .reg .pred p, q; setp.ne.u32 p, $pred, 0; vote.sync.any.pred q, p, 0xffffffff; selp.u32 $out, 1, 0, q; }",
    ins=(("pred", "b32"),), out=("out", "b32"), memory=False, min_sm=70,
)
VOTE_ALL = Ptx(
    "{ .reg .pred p, q; setp.ne.u32 p, $pred, 0; vote.sync.all.pred q, p, 0xffffffff; selp.u32 $out, 1, 0, q; }",
    ins=(("pred", "b32"),), out=("out", "b32"), memory=False, min_sm=70,
)
NAMED_BARRIER_SYNC = Ptx("bar.sync $id, $threads;", ins=(("id", "b32"), ("threads", "b32")), min_sm=70)
NAMED_BARRIER_ARRIVE = Ptx("bar.arrive $id, $threads;", ins=(("id", "b32"), ("threads", "b32")), min_sm=70)
SETMAXNREG_INC = Ptx("setmaxnreg.inc.sync.aligned.u32 $regs;", imm=("regs",))
SETMAXNREG_DEC = Ptx("setmaxnreg.dec.sync.aligned.u32 $regs;", imm=("regs",))

if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types


@device_op(simulate=lambda: sim().thread_index() % 32 == 0)
def elect_one_sync(typingctx):
    """True in exactly one lane of the (fully active) warp, False in the others.

    ``elect.sync lane|p, 0xffffffff;`` (sm_90). All 32 lanes must execute it together (``.sync``): call it
    outside lane-divergent branches, e.g. ``if warp == 0 and elect_one_sync():``."""

    def codegen(context, builder, sig, args):
        out = ELECT_ONE.emit(builder)
        return builder.icmp_unsigned("!=", out, ir.Constant(out.type, 0))

    return types.boolean(), codegen


def _vote(op, ptx, pred):
    if not isinstance(pred, (types.Boolean, types.Integer)):
        fail(op, f"the predicate must be a bool (or an integer: nonzero is true), got {pred}")

    def codegen(context, builder, sig, args):
        value = args[0]
        if isinstance(sig.args[0], types.Boolean):
            value = builder.zext(value, ir.IntType(32))
        else:
            value = to_u32(context, builder, sig.args[0], value)
        out = ptx.emit(builder, pred=value)
        return builder.icmp_unsigned("!=", out, ir.Constant(out.type, 0))

    return types.boolean(pred), codegen


@device_op(simulate=lambda pred: sim_vote(pred, any))
def vote_any(typingctx, pred):
    """True in every lane when ``pred`` is true in at least one lane of the warp: a warp-uniform decision (e.g.
    whether any of the warp's rows needs a rescale), so a branch on it does not diverge.
    ``vote.sync.any.pred`` with the full mask (sm_70+). All 32 lanes call it together (not under a
    lane-divergent branch)."""
    return _vote("vote_any", VOTE_ANY, pred)


@device_op(simulate=lambda pred: sim_vote(pred, all))
def vote_all(typingctx, pred):
    """True in every lane when ``pred`` is true in all 32 lanes of the warp. ``vote.sync.all.pred`` with the full
    mask (sm_70+). All 32 lanes call it together."""
    return _vote("vote_all", VOTE_ALL, pred)


def _check_barrier(op, barrier_id, threads):
    require_int(op, "the barrier id", barrier_id)
    if isinstance(barrier_id, types.IntegerLiteral):
        require_literal_int(op, "the barrier id", barrier_id, 0, 15)
    n = require_literal_int(op, "the thread count", threads, 32, 1024)
    if n % 32:
        fail(op, f"the thread count must be a multiple of 32 (whole warps), got {n}")


def _lower_barrier(ptx):
    def codegen(context, builder, sig, args):
        ptx.emit(
            builder,
            id=to_u32(context, builder, sig.args[0], args[0]),
            threads=to_u32(context, builder, sig.args[1], args[1]),
        )
        return context.get_dummy_value()

    return codegen


@device_op(prefer_literal=True, simulate=lambda barrier_id, threads: sim_named_barrier(barrier_id, threads, True))
def named_barrier_sync(typingctx, barrier_id, threads):
    """Block until ``threads`` threads (a constant multiple of 32: whole warps) have reached named barrier
    ``barrier_id`` (0..15). ``bar.sync id, threads;``. Id 0 is what ``cuda.syncthreads()`` uses; give each
    group of warps (e.g. the consumer warpgroups) its own id."""
    _check_barrier("named_barrier_sync", barrier_id, threads)
    return types.void(barrier_id, threads), _lower_barrier(NAMED_BARRIER_SYNC)


@device_op(prefer_literal=True, simulate=lambda barrier_id, threads: sim_named_barrier(barrier_id, threads, False))
def named_barrier_arrive(typingctx, barrier_id, threads):
    """Arrive at named barrier ``barrier_id`` without waiting (the signalling side of a hand-off between
    warps). ``bar.arrive id, threads;``."""
    _check_barrier("named_barrier_arrive", barrier_id, threads)
    return types.void(barrier_id, threads), _lower_barrier(NAMED_BARRIER_ARRIVE)


def _setmaxnreg(op, ptx, regs):
    value = require_literal_int(op, "the register count", regs, 24, 256)
    if value % 8:
        fail(op, f"the register count must be a multiple of 8 in 24..256, got {value}")

    return types.void(regs), emit_only(ptx, regs=value)


@device_op(prefer_literal=True, simulate=lambda regs: None)
def setmaxnreg_inc(typingctx, regs):
    """Raise this warpgroup's per-thread register limit to ``regs`` (a constant, multiple of 8, 24..256).
    ``setmaxnreg.inc.sync.aligned.u32 regs;`` (sm_90a, sm_100a, sm_120a). All 128 threads of the warpgroup
    execute it together. The kernel needs a register cap, ``cuda.jit(max_registers=R)`` with
    ``R * threads`` = the sum over warpgroups of their ``regs * 128``: without it ptxas silently drops the
    instruction (it cannot know the count at entry). numba-cuda's LTO build keeps it
    (``numbatma.compile.compile_cubin`` shows the ``USETMAXREG`` SASS offline)."""
    return _setmaxnreg("setmaxnreg_inc", SETMAXNREG_INC, regs)


@device_op(prefer_literal=True, simulate=lambda regs: None)
def setmaxnreg_dec(typingctx, regs):
    """Lower this warpgroup's per-thread register limit to ``regs`` and give the rest back to the CTA's
    pool. ``setmaxnreg.dec.sync.aligned.u32 regs;`` (sm_90a, sm_100a, sm_120a). Typically the producer
    warpgroup of a warp-specialized kernel (``setmaxnreg_dec(40)``). Needs ``cuda.jit(max_registers=R)``
    like ``setmaxnreg_inc``."""
    return _setmaxnreg("setmaxnreg_dec", SETMAXNREG_DEC, regs)


# -- simulator semantics ----------------------------------------------------------------------------------------
def sim_vote(pred, fold):
    """``vote.sync.{any,all}``: the warp's 32 predicates exchanged (every lane must take part), folded."""
    return bool(fold(bool(v) for v in sim().warp_exchange(0xFFFFFFFF, bool(pred))))


def sim_named_barrier(barrier_id, threads, wait):
    """``bar.sync`` (``wait``) / ``bar.arrive`` of named barrier ``barrier_id`` for ``threads`` threads: the
    participants share what they know (each generation of the barrier is its own knowledge pool)."""
    s = sim()
    named = s.block_local("named_barriers")  # id -> [arrived, generation]
    site = s.caller_site()
    me = s.current_thread()
    with s.lock:
        entry = named.setdefault(int(barrier_id), [0, 0])
        generation = entry[1]
        pool_key = ("named", int(barrier_id), generation)
        s.publish_knowledge(me, pool_key)
        entry[0] += 1
        if entry[0] >= int(threads):
            entry[0] = 0
            entry[1] += 1
            s.notify(("named", int(barrier_id)))
    if not wait:
        return

    def ready():
        return named[int(barrier_id)][1] != generation

    def describe():
        n = named[int(barrier_id)][0]
        return f"named_barrier_sync({int(barrier_id)}, {int(threads)}) at {site[0]}:{site[1]}; {n} arrived"

    s.wait_until(ready, describe, ("named", int(barrier_id)))
    s.absorb_knowledge(me, pool_key)


PTX = {
    "elect_one_sync": ELECT_ONE,
    "named_barrier_sync": NAMED_BARRIER_SYNC,
    "named_barrier_arrive": NAMED_BARRIER_ARRIVE,
    "setmaxnreg_inc": SETMAXNREG_INC,
    "vote_any": VOTE_ANY,
    "vote_all": VOTE_ALL,
    "setmaxnreg_dec": SETMAXNREG_DEC,
}
