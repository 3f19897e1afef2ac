"""mbarrier: shared-memory barriers with arrival counts, transaction bytes and phases.

A barrier operand is either a shared ``uint64`` array (its element 0: ``bar = cuda.shared.array(1,
uint64)``) or ``mbarrier_ref(bars, i)`` for element ``i`` of a barrier array. Every wait is on the
*parity* of a phase (0, 1, 0, ...) or on the state token an arrive returned.
"""
from __future__ import annotations

from llvmlite import ir

from . import _debug
from ._asm import Ptx
from ._define import SIMULATING, barrier_address, device_op, require_barrier, require_int, to_u32, sim

__all__ = [
    "mbarrier_arrive",
    "mbarrier_arrive_expect_tx",
    "mbarrier_arrive_n",
    "mbarrier_complete_tx",
    "mbarrier_expect_tx",
    "mbarrier_init",
    "mbarrier_inval",
    "mbarrier_ref",
    "mbarrier_test_wait",
    "mbarrier_test_wait_parity",
    "mbarrier_try_wait_parity",
    "mbarrier_wait",
    "mbarrier_wait_parity",
]

# -- the PTX ------------------------------------------------------------------------------------------
INIT = Ptx("mbarrier.init.shared::cta.b64 [$bar], $count;", ins=(("bar", "b32"), ("count", "b32")), min_sm=80)
INVAL = Ptx("mbarrier.inval.shared::cta.b64 [$bar];", ins=(("bar", "b32"),), min_sm=80)
ARRIVE = Ptx("mbarrier.arrive.shared::cta.b64 $state, [$bar];", ins=(("bar", "b32"),), out=("state", "b64"),
             min_sm=80)
ARRIVE_COUNT = Ptx("mbarrier.arrive.shared::cta.b64 $state, [$bar], $count;",
                   ins=(("bar", "b32"), ("count", "b32")), out=("state", "b64"))
ARRIVE_EXPECT_TX = Ptx("mbarrier.arrive.expect_tx.shared::cta.b64 $state, [$bar], $tx;",
                       ins=(("bar", "b32"), ("tx", "b32")), out=("state", "b64"))
EXPECT_TX = Ptx("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$bar], $tx;", ins=(("bar", "b32"), ("tx", "b32")))
COMPLETE_TX = Ptx("mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [$bar], $tx;",
                  ins=(("bar", "b32"), ("tx", "b32")))
# Blocking waits: a try_wait loop in a brace scope, so the label can be inlined many times.
WAIT_PARITY = Ptx(
    "{ .reg .pred p; NBTMA_WAIT_PARITY: mbarrier.try_wait.parity.shared::cta.b64 p, [$bar], $parity; "
    "@!p bra NBTMA_WAIT_PARITY; }",
    ins=(("bar", "b32"), ("parity", "b32")),
)
WAIT_TOKEN = Ptx(
    "{ .reg .pred p; NBTMA_WAIT_TOKEN: mbarrier.try_wait.shared::cta.b64 p, [$bar], $state; "
    "@!p bra NBTMA_WAIT_TOKEN; }",
    ins=(("bar", "b32"), ("state", "b64")),
)
# Non-blocking forms return 1 when the phase has completed.
TRY_WAIT_PARITY = Ptx(
    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$bar], $parity; selp.u32 $done, 1, 0, p; }",
    ins=(("bar", "b32"), ("parity", "b32")), out=("done", "b32"),
)
TEST_WAIT_PARITY = Ptx(
    "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [$bar], $parity; selp.u32 $done, 1, 0, p; }",
    ins=(("bar", "b32"), ("parity", "b32")), out=("done", "b32"), min_sm=80,
)
TEST_WAIT_TOKEN = Ptx(
    "{ .reg .pred p; mbarrier.test_wait.shared::cta.b64 p, [$bar], $state; selp.u32 $done, 1, 0, p; }",
    ins=(("bar", "b32"), ("state", "b64")), out=("done", "b32"), min_sm=80,
)

if not SIMULATING:
    from numba.cuda import types

    from numbatma._types import SharedArray, mbarrier_ref as _mbarrier_ref_type

    from ._define import fail, shared_address


def _lower(ptx, extra=(), *, returns=False):
    """Lowering of ``op(bar, *extra_ints)``: emit ``ptx`` with the extra operands as b32 inputs; return its
    output (``returns=True``) or nothing."""

    def codegen(context, builder, sig, args):
        ops = {"bar": barrier_address(context, builder, sig.args[0], args[0])}
        for name, ty, val in zip(extra, sig.args[1:], args[1:]):
            ops[name] = to_u32(context, builder, ty, val)
        out = ptx.emit(builder, **ops)
        return out if returns else context.get_dummy_value()

    return codegen


@device_op(simulate=lambda bars, i: sim().BarrierRef(sim().address_of(bars, int(i)),
                                                    f"mbarrier {sim().describe_element(bars, int(i))}"))
def mbarrier_ref(typingctx, bars, index):
    """Reference to barrier ``bars[index]`` of a shared ``uint64`` array, usable wherever a barrier is
    expected. No PTX: the 32-bit shared address ``&bars[0] + 8*index``. The caller guarantees
    ``0 <= index < len(bars)``."""
    op = "mbarrier_ref"
    if not (isinstance(bars, SharedArray) and bars.dtype in (types.uint64, types.int64)):
        fail(op, f"expected a shared uint64 array of barriers, got {bars}")
    require_int(op, "the barrier index", index)

    def codegen(context, builder, sig, args):
        base = shared_address(context, builder, sig.args[0], args[0])
        idx = to_u32(context, builder, sig.args[1], args[1])
        return builder.add(base, builder.mul(idx, ir.Constant(ir.IntType(32), 8)))

    return _mbarrier_ref_type(bars, index), codegen


@device_op(simulate=lambda bar, count: sim().mbarrier_init(bar, count))
def mbarrier_init(typingctx, bar, count):
    """``mbarrier.init.shared::cta.b64 [bar], count;`` - set the expected arrival count of each phase.

    Call from one thread, then ``fence_mbarrier_init()`` (for cluster visibility) and a block barrier
    (``cuda.syncthreads()``) before any other thread uses the barrier. ``1 <= count < 2**20``."""
    require_barrier("mbarrier_init", bar)
    require_int("mbarrier_init", "count", count)
    return types.void(bar, count), _lower(INIT, ("count",))


@device_op(simulate=lambda bar: sim().mbarrier_inval(bar))
def mbarrier_inval(typingctx, bar):
    """``mbarrier.inval.shared::cta.b64 [bar];`` - invalidate before reusing the memory for other data.
    No thread may be waiting on, or later arrive at, the barrier."""
    require_barrier("mbarrier_inval", bar)
    return types.void(bar), _lower(INVAL)


@device_op(simulate=lambda bar: sim().mbarrier_arrive(bar))
def mbarrier_arrive(typingctx, bar):
    """Arrive once on the barrier (release semantics at CTA scope); returns the phase state token (uint64).

    ``mbarrier.arrive.shared::cta.b64 state, [bar];``. Pass the token to ``mbarrier_wait`` /
    ``mbarrier_test_wait``."""
    require_barrier("mbarrier_arrive", bar)
    return types.uint64(bar), _lower(ARRIVE, returns=True)


@device_op(simulate=lambda bar, count: sim().mbarrier_arrive(bar, count))
def mbarrier_arrive_n(typingctx, bar, count):
    """Arrive ``count`` times at once; returns the state token.
    ``mbarrier.arrive.shared::cta.b64 state, [bar], count;`` (sm_90). ``count >= 1``."""
    require_barrier("mbarrier_arrive_n", bar)
    require_int("mbarrier_arrive_n", "count", count)
    return types.uint64(bar, count), _lower(ARRIVE_COUNT, ("count",), returns=True)


@device_op(simulate=lambda bar, tx: sim().mbarrier_arrive(bar, 1, tx))
def mbarrier_arrive_expect_tx(typingctx, bar, tx_bytes):
    """Arrive and raise the current phase's expected transaction count by ``tx_bytes``; returns the state.

    ``mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], tx;``. This is how the thread that issues
    TMA loads announces the bytes they will deliver (``desc.box_bytes`` per tile). ``tx_bytes < 2**20``."""
    require_barrier("mbarrier_arrive_expect_tx", bar)
    require_int("mbarrier_arrive_expect_tx", "tx_bytes", tx_bytes)
    return types.uint64(bar, tx_bytes), _lower(ARRIVE_EXPECT_TX, ("tx",), returns=True)


@device_op(simulate=lambda bar, tx: sim().mbarrier_expect_tx(bar, tx))
def mbarrier_expect_tx(typingctx, bar, tx_bytes):
    """``mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], tx;`` - raise the expected transaction
    count without arriving."""
    require_barrier("mbarrier_expect_tx", bar)
    require_int("mbarrier_expect_tx", "tx_bytes", tx_bytes)
    return types.void(bar, tx_bytes), _lower(EXPECT_TX, ("tx",))


@device_op(simulate=lambda bar, tx: sim().mbarrier_complete_tx(bar, tx))
def mbarrier_complete_tx(typingctx, bar, tx_bytes):
    """``mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [bar], tx;`` - mark ``tx_bytes`` as delivered
    (what the async proxy does when a TMA copy lands)."""
    require_barrier("mbarrier_complete_tx", bar)
    require_int("mbarrier_complete_tx", "tx_bytes", tx_bytes)
    return types.void(bar, tx_bytes), _lower(COMPLETE_TX, ("tx",))


@device_op(simulate=lambda bar, parity: sim().wait_parity(bar, parity))
def mbarrier_wait_parity(typingctx, bar, parity):
    """Block until the phase with parity ``parity`` (0 or 1) has completed.

    A loop over ``mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity;`` (acquire at CTA scope).
    The first phase of a fresh barrier has parity 0; flip the parity after each completed phase."""
    require_barrier("mbarrier_wait_parity", bar)
    require_int("mbarrier_wait_parity", "parity", parity)
    plain = _lower(WAIT_PARITY, ("parity",))

    def codegen(context, builder, sig, args):
        if not _debug.enabled():
            return plain(context, builder, sig, args)
        _debug.wait_parity(context, builder, "mbarrier_wait_parity",
                           barrier_address(context, builder, sig.args[0], args[0]),
                           to_u32(context, builder, sig.args[1], args[1]))
        return context.get_dummy_value()

    return types.void(bar, parity), codegen


@device_op(simulate=lambda bar, parity: sim().test_wait_parity(bar, parity))
def mbarrier_try_wait_parity(typingctx, bar, parity):
    """One ``mbarrier.try_wait.parity`` (which may sleep for a system-defined time); returns True if the
    phase with that parity has completed."""
    require_barrier("mbarrier_try_wait_parity", bar)
    require_int("mbarrier_try_wait_parity", "parity", parity)

    def codegen(context, builder, sig, args):
        done = _lower(TRY_WAIT_PARITY, ("parity",), returns=True)(context, builder, sig, args)
        return builder.icmp_unsigned("!=", done, ir.Constant(done.type, 0))

    return types.boolean(bar, parity), codegen


@device_op(simulate=lambda bar, parity: sim().test_wait_parity(bar, parity))
def mbarrier_test_wait_parity(typingctx, bar, parity):
    """``mbarrier.test_wait.parity`` - non-blocking test; True if the phase with that parity completed."""
    require_barrier("mbarrier_test_wait_parity", bar)
    require_int("mbarrier_test_wait_parity", "parity", parity)

    def codegen(context, builder, sig, args):
        done = _lower(TEST_WAIT_PARITY, ("parity",), returns=True)(context, builder, sig, args)
        return builder.icmp_unsigned("!=", done, ir.Constant(done.type, 0))

    return types.boolean(bar, parity), codegen


def _token_codegen(ptx, returns_bool):
    def codegen(context, builder, sig, args):
        bar = barrier_address(context, builder, sig.args[0], args[0])
        state = context.cast(builder, args[1], sig.args[1], types.uint64)
        out = ptx.emit(builder, bar=bar, state=state)
        if returns_bool:
            return builder.icmp_unsigned("!=", out, ir.Constant(out.type, 0))
        return context.get_dummy_value()

    return codegen


@device_op(simulate=lambda bar, token: sim().wait_token(bar, token))
def mbarrier_wait(typingctx, bar, state):
    """Block until the phase that ``state`` (a token from ``mbarrier_arrive*``) belongs to has completed.
    A loop over ``mbarrier.try_wait.shared::cta.b64 p, [bar], state;``."""
    require_barrier("mbarrier_wait", bar)
    require_int("mbarrier_wait", "state", state)
    plain = _token_codegen(WAIT_TOKEN, False)

    def codegen(context, builder, sig, args):
        if not _debug.enabled():
            return plain(context, builder, sig, args)
        _debug.wait_token(context, builder, "mbarrier_wait",
                          barrier_address(context, builder, sig.args[0], args[0]),
                          context.cast(builder, args[1], sig.args[1], types.uint64))
        return context.get_dummy_value()

    return types.void(bar, state), codegen


@device_op(simulate=lambda bar, token: sim().test_wait_token(bar, token))
def mbarrier_test_wait(typingctx, bar, state):
    """``mbarrier.test_wait.shared::cta.b64`` with a state token; True if that phase has completed."""
    require_barrier("mbarrier_test_wait", bar)
    require_int("mbarrier_test_wait", "state", state)
    return types.boolean(bar, state), _token_codegen(TEST_WAIT_TOKEN, True)


PTX = {
    "mbarrier_init": INIT,
    "mbarrier_inval": INVAL,
    "mbarrier_arrive": ARRIVE,
    "mbarrier_arrive_n": ARRIVE_COUNT,
    "mbarrier_arrive_expect_tx": ARRIVE_EXPECT_TX,
    "mbarrier_expect_tx": EXPECT_TX,
    "mbarrier_complete_tx": COMPLETE_TX,
    "mbarrier_wait_parity": WAIT_PARITY,
    "mbarrier_wait": WAIT_TOKEN,
    "mbarrier_try_wait_parity": TRY_WAIT_PARITY,
    "mbarrier_test_wait_parity": TEST_WAIT_PARITY,
    "mbarrier_test_wait": TEST_WAIT_TOKEN,
}
