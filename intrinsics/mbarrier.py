"""mbarrier: shared-memory barriers with arrival counts, transaction bytes and phases.

A barrier operand is either a shared ``uint64`` array (its element 0: ``bar = cuda.shared.array(1,
uint64)``) or ``mbarrier_ref(bars, i)`` for element ``i`` of a barrier array. Every wait is on the
*parity* of a phase (0, 1, 0, ...) or on the state token an arrive returned.
"""
from __future__ import annotations

import numpy as np
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


@device_op(simulate=lambda bars, i: sim_ref(bars, i))
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


@device_op(simulate=lambda bar, count: sim_init(bar, count))
def mbarrier_init(typingctx, bar, count):
    """``mbarrier.init.shared::cta.b64 [bar], count;`` - set the expected arrival count of each phase.

    Call from one thread, then ``fence_mbarrier_init()`` (for cluster visibility) and a block barrier
    (``cuda.syncthreads()``) before any other thread uses the barrier. ``1 <= count < 2**20``."""
    require_barrier("mbarrier_init", bar)
    require_int("mbarrier_init", "count", count)
    return types.void(bar, count), _lower(INIT, ("count",))


@device_op(simulate=lambda bar: sim_inval(bar))
def mbarrier_inval(typingctx, bar):
    """``mbarrier.inval.shared::cta.b64 [bar];`` - invalidate before reusing the memory for other data.
    No thread may be waiting on, or later arrive at, the barrier."""
    require_barrier("mbarrier_inval", bar)
    return types.void(bar), _lower(INVAL)


@device_op(simulate=lambda bar: sim_arrive(bar))
def mbarrier_arrive(typingctx, bar):
    """Arrive once on the barrier (release semantics at CTA scope); returns the phase state token (uint64).

    ``mbarrier.arrive.shared::cta.b64 state, [bar];``. Pass the token to ``mbarrier_wait`` /
    ``mbarrier_test_wait``."""
    require_barrier("mbarrier_arrive", bar)
    return types.uint64(bar), _lower(ARRIVE, returns=True)


@device_op(simulate=lambda bar, count: sim_arrive(bar, count))
def mbarrier_arrive_n(typingctx, bar, count):
    """Arrive ``count`` times at once; returns the state token.
    ``mbarrier.arrive.shared::cta.b64 state, [bar], count;`` (sm_90). ``count >= 1``."""
    require_barrier("mbarrier_arrive_n", bar)
    require_int("mbarrier_arrive_n", "count", count)
    return types.uint64(bar, count), _lower(ARRIVE_COUNT, ("count",), returns=True)


@device_op(simulate=lambda bar, tx: sim_arrive(bar, 1, tx))
def mbarrier_arrive_expect_tx(typingctx, bar, tx_bytes):
    """Arrive and raise the current phase's expected transaction count by ``tx_bytes``; returns the state.

    ``mbarrier.arrive.expect_tx.shared::cta.b64 state, [bar], tx;``. This is how the thread that issues
    TMA loads announces the bytes they will deliver (``desc.box_bytes`` per tile). ``tx_bytes < 2**20``."""
    require_barrier("mbarrier_arrive_expect_tx", bar)
    require_int("mbarrier_arrive_expect_tx", "tx_bytes", tx_bytes)
    return types.uint64(bar, tx_bytes), _lower(ARRIVE_EXPECT_TX, ("tx",), returns=True)


@device_op(simulate=lambda bar, tx: sim_expect_tx(bar, tx))
def mbarrier_expect_tx(typingctx, bar, tx_bytes):
    """``mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], tx;`` - raise the expected transaction
    count without arriving."""
    require_barrier("mbarrier_expect_tx", bar)
    require_int("mbarrier_expect_tx", "tx_bytes", tx_bytes)
    return types.void(bar, tx_bytes), _lower(EXPECT_TX, ("tx",))


@device_op(simulate=lambda bar, tx: sim_complete_tx(bar, tx))
def mbarrier_complete_tx(typingctx, bar, tx_bytes):
    """``mbarrier.complete_tx.relaxed.cta.shared::cta.b64 [bar], tx;`` - mark ``tx_bytes`` as delivered
    (what the async proxy does when a TMA copy lands)."""
    require_barrier("mbarrier_complete_tx", bar)
    require_int("mbarrier_complete_tx", "tx_bytes", tx_bytes)
    return types.void(bar, tx_bytes), _lower(COMPLETE_TX, ("tx",))


@device_op(simulate=lambda bar, parity: sim_wait_parity(bar, parity))
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


@device_op(simulate=lambda bar, parity: sim_test_wait_parity(bar, parity))
def mbarrier_try_wait_parity(typingctx, bar, parity):
    """One ``mbarrier.try_wait.parity`` (which may sleep for a system-defined time); returns True if the
    phase with that parity has completed."""
    require_barrier("mbarrier_try_wait_parity", bar)
    require_int("mbarrier_try_wait_parity", "parity", parity)

    def codegen(context, builder, sig, args):
        done = _lower(TRY_WAIT_PARITY, ("parity",), returns=True)(context, builder, sig, args)
        return builder.icmp_unsigned("!=", done, ir.Constant(done.type, 0))

    return types.boolean(bar, parity), codegen


@device_op(simulate=lambda bar, parity: sim_test_wait_parity(bar, parity))
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


@device_op(simulate=lambda bar, token: sim_wait_token(bar, token))
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


@device_op(simulate=lambda bar, token: sim_test_wait_token(bar, token))
def mbarrier_test_wait(typingctx, bar, state):
    """``mbarrier.test_wait.shared::cta.b64`` with a state token; True if that phase has completed."""
    require_barrier("mbarrier_test_wait", bar)
    require_int("mbarrier_test_wait", "state", state)
    return types.boolean(bar, state), _token_codegen(TEST_WAIT_TOKEN, True)


# -- simulator semantics ----------------------------------------------------------------------------------------
# The barriers of the running block by shared address (the engine's per-block state "mbarriers"). A barrier is
# also a completion key of the engine: a copy that completes transaction bytes on it is readable once its phase
# is known complete (``knowledge``), and it explains a missing wait in messages.
class _MBarrier:
    def __init__(self, count, name):
        self.count = count
        self.pending = count
        self.tx = 0
        self.phase = 0  # number of completed phases
        self.name = name
        self.arrivals_done = 0
        self.waiters = 0
        self.carried = {}  # knowledge of the threads that arrived in the current phase (release)
        self.released = {}  # knowledge a thread acquires by seeing a phase complete
        self.init_thread = None  # the thread that initialised it (others use it once that reached them)
        self.init_site = ("<unknown>", 0)
        self.init_fenced = False
        self.arrivals_by = {}  # pipeline barriers: thread -> arrivals so far (see _check_pipeline_arrival)
        self.pipeline = None  # a Pipeline's barrier: its SimPipeline (named in reports)

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.arrivals_done = 0
            sim().merge(self.released, self.carried)
            self.carried = {}

    def describe(self):
        text = (f"{self.name}: phase {self.phase} (parity {self.phase & 1}) waits for {self.count} arrivals "
                f"(got {self.arrivals_done}) and has {self.tx} transaction bytes outstanding")
        if self.tx > 0 and self.pending == 0:
            text += (f" - every arrival is in, but the copies delivered {self.tx} bytes fewer than expect_tx "
                     f"announced (the expect_tx total differs from the bytes delivered)")
        elif self.tx < 0:
            text += (f" - the copies delivered {-self.tx} bytes more than expect_tx announced (the expect_tx "
                     f"total differs from the bytes delivered)")
        return text

    def missing_wait(self, me, phase):
        """(Completion key) why ``me`` may not read bytes that complete with ``phase`` of this barrier yet."""
        text = (f"it completes phase {phase} (parity {phase & 1}) of {self.name}, and this thread has not waited "
                f"for that phase (nor passed a block barrier after a thread that did)")
        last = me.__dict__.get("_numbatma_last_wait", {}).get(self)
        if last is not None and last[1] <= phase:
            text += (f"; its last wait on that barrier, {last[0]}, returned for phase {last[1] - 1} - a wait on the "
                     f"parity of a completed phase returns at once with stale data (wrong parity?)")
        return text

    def refill_hint(self):
        """(Completion key) a hint for a refill of a Pipeline stage that races a reader."""
        pipe = self.pipeline
        if pipe is None:
            return ""
        return (f"; Pipeline({pipe.stages}, {pipe.counts[0]}, {pipe.counts[1]}) expects "
                f"consumer_arrivals={pipe.counts[1]} release(s) per stage: if the producer did acquire "
                f"the stage, its empty barrier completed without this reader's release - does the count "
                f"match the threads that call consumer_release?")


def _barriers():
    return sim().block_local("mbarriers")


def sim_ref(bars, index):
    """``mbarrier_ref(bars, i)`` under the simulator."""
    s = sim()
    return s.BarrierRef(s.address_of(bars, int(index)), f"mbarrier {s.describe_element(bars, int(index))}")


def _barrier_state(ref, op, use=True):
    """The barrier ``ref`` names. ``use``: the calling thread operates on it, so its initialisation must have
    reached this thread (happens-before: see ``_check_init_known``)."""
    b = _barriers().get(ref.address)
    if b is None:
        s = sim()
        raise s.SimulatedMisuse(
            f"{op}: thread {s.who(s.current_thread())} uses {ref.name} before its initialisation reached this "
            f"thread: no mbarrier_init of it has run (never initialised, or initialised by another thread without "
            f"fence_mbarrier_init() and a block barrier between the two); on the GPU this is undefined"
        )
    if use:
        _check_init_known(b, op)
    return b


def _check_init_known(b, op):
    """A barrier initialised by another thread may be used only after the initialisation reached this
    thread: the initialising thread's ``fence_mbarrier_init`` (or ``fence_proxy_async_shared_cta``) and then
    a block barrier (or any synchronisation that carries what it knows) - not by luck of timing."""
    s = sim()
    me = s.current_thread()
    if b.init_thread is me or b.init_thread is None or s.knowledge(me).get(("init", b)):
        return
    if b.init_fenced:
        missing = ("it fenced (fence_mbarrier_init) but no block barrier (cuda.syncthreads()) or other "
                   "synchronisation orders that before this use")
    else:
        missing = "it has not executed fence_mbarrier_init() since, so no block barrier can publish it"
    raise s.SimulatedMisuse(
        f"{op}: thread {s.who(me)} uses {b.name} before its initialisation reached this thread: thread "
        f"{s.who(b.init_thread)} initialised it at {b.init_site[0]}:{b.init_site[1]} (mbarrier_init), but {missing}. "
        f"After mbarrier_init the initialising thread runs fence_mbarrier_init() and then a block barrier before "
        f"any other thread (or a TMA copy it issues) uses the barrier; on the GPU this thread may see an "
        f"uninitialised barrier"
    )


def sim_fence_inits():
    """``fence.mbarrier_init`` (fence.py; also ``fence.proxy.async``): this thread's initialisations become
    publishable (a block barrier after it passes them on to the other threads)."""
    s = sim()
    me = s.current_thread()
    pending = me.__dict__.get("_numbatma_inits")
    if pending:
        seen = s.knowledge(me)
        for b in pending:
            b.init_fenced = True
            seen[("init", b)] = 1
        me._numbatma_inits = []


def sim_init(bar, count):
    s = sim()
    ref = s.barrier_of(bar)
    if not 1 <= int(count) < (1 << 20):
        raise s.SimulatedMisuse(f"mbarrier_init: the arrival count must be in 1..2**20-1, got {count}")
    with s.lock:
        barriers = _barriers()
        old = barriers.get(ref.address)
        if old is not None and (old.arrivals_done or old.tx or old.waiters):
            raise s.SimulatedMisuse(
                f"mbarrier_init re-initialises {old.describe()}, while it is in use"
                + (f" ({old.waiters} thread(s) waiting on it)" if old.waiters else "")
                + "; on the GPU this is undefined. Re-initialise a barrier only when its phase is complete and "
                  "nobody waits on it (mbarrier_inval first)"
            )
        b = barriers[ref.address] = _MBarrier(int(count), ref.name)
        b.pipeline = getattr(ref, "pipeline", None)  # (a Pipeline's barrier: named in reports)
        me = s.current_thread()
        b.init_thread, b.init_site = me, s.caller_site()
        me.__dict__.setdefault("_numbatma_inits", []).append(b)
        s.notify(("mbarrier", ref.address))


def sim_inval(bar):
    s = sim()
    ref = s.barrier_of(bar)
    with s.lock:
        old = _barriers().pop(ref.address, None)
        if old is not None and old.waiters:
            raise s.SimulatedMisuse(f"mbarrier_inval of {old.describe()}, while {old.waiters} thread(s) wait on it")


def sim_arrive(bar, count=1, tx=0):
    s = sim()
    ref = s.barrier_of(bar)
    with s.lock:
        b = _barrier_state(ref, "mbarrier_arrive")
        token = b.phase
        b.tx += int(tx)
        if int(count) > b.pending:
            raise s.SimulatedMisuse(
                f"mbarrier_arrive: {int(count)} arrivals on {b.describe()}; more arrivals than the phase expects "
                f"is undefined on the GPU"
            )
        if getattr(ref, "pipeline", None) is not None:
            _check_pipeline_arrival(ref, b)
        _check_arrival_known(b)
        b.pending -= int(count)
        b.arrivals_done += int(count)
        s.merge(b.carried, s.release(s.current_thread()))
        b._maybe_complete()
        s.notify(("mbarrier", ref.address))
        return np.uint64(token)


def _check_arrival_known(b):
    """An arrival counts towards the barrier's current phase p; for p >= 1 the arriving thread must know phase p - 1
    complete (it waited for it, or synchronised after a thread that did). In a correct kernel every thread arrives
    once per phase and learns of the phase's completion before its next arrival (a wait on this barrier, or on the
    barrier of the stage its next round consumes). An arrival that finds a later phase it never saw means earlier
    phases completed without it: more threads arrive per phase than the count given to mbarrier_init - reported
    at the first extra arrival, whatever order the threads run in."""
    s = sim()
    me = s.current_thread()
    if b.phase == 0 or s.knowledge(me).get(b, 0) >= b.phase:
        return
    seen = s.knowledge(me).get(b, 0)
    raise s.SimulatedMisuse(
        f"mbarrier_arrive: thread {s.who(me)} arrives on {b.name} in its phase {b.phase}, but it has seen only "
        f"{seen} of its {b.phase} completed phase(s) (phase {b.phase - 1} completed without this thread waiting for "
        f"it or synchronising after a thread that did): more threads arrive per phase than the arrival count "
        f"{b.count} given to mbarrier_init at {b.init_site[0]}:{b.init_site[1]}? On the GPU the extra arrivals "
        f"complete phases early and the waits on them return before the data is there. The count must equal the "
        f"number of arrivals per phase"
    )


def sim_expect_tx(bar, nbytes):
    s = sim()
    ref = s.barrier_of(bar)
    with s.lock:
        b = _barrier_state(ref, "mbarrier_expect_tx")
        if getattr(ref, "kind", None) == "full":
            _check_pipeline_refill(ref, b, "Pipeline.load")
        b.tx += int(nbytes)


def sim_complete_tx(bar, nbytes):
    """Deliver ``nbytes`` to the current phase of ``bar``; returns (barrier, phase it counted towards): the
    completion pair of the copy that delivered them (``add_fill``)."""
    s = sim()
    ref = s.barrier_of(bar)
    with s.lock:
        b = _barrier_state(ref, "mbarrier_complete_tx")
        phase = b.phase
        b.tx -= int(nbytes)
        b._maybe_complete()
        s.notify(("mbarrier", ref.address))
        return b, phase


def sim_phase(bar, op):
    """(barrier, its current phase) of ``bar``, used by the calling thread in operation ``op``: the completion
    pair of copies that complete with that phase (cp.async's mbarrier arrivals)."""
    b = _barrier_state(sim().barrier_of(bar), op)
    return b, b.phase


def _phase_done(b, parity):
    """True when the phase with ``parity`` is complete: the current (incomplete) phase has parity
    ``b.phase & 1``; the other parity names the phase just before it, which is complete."""
    return (b.phase & 1) != (int(parity) & 1)


def _observe(b, how, phase=None):
    """The calling thread saw every phase of ``b`` before ``phase`` (default: its current one) complete."""
    s = sim()
    phase = b.phase if phase is None else phase
    me = s.current_thread()
    seen = s.knowledge(me)
    s.merge(seen, b.released)
    if seen.get(b, 0) < phase:
        seen[b] = phase
    me.__dict__.setdefault("_numbatma_last_wait", {})[b] = (how, phase)


def sim_test_wait_parity(bar, parity):
    s = sim()
    ref = s.barrier_of(bar)
    site = s.caller_site()
    with s.lock:
        b = _barrier_state(ref, "mbarrier_test_wait_parity")
        done = _phase_done(b, parity)
        if done:
            _observe(b, f"a test/try wait with parity {int(parity) & 1} at {site[0]}:{site[1]}")
        return done


def sim_test_wait_token(bar, token):
    s = sim()
    ref = s.barrier_of(bar)
    site = s.caller_site()
    with s.lock:
        b = _barrier_state(ref, "mbarrier_test_wait")
        done = b.phase > int(token)
        if done:
            _observe(b, f"a test wait with the token of phase {int(token)} at {site[0]}:{site[1]}")
        return done


def _behind_hint(b, thread, ref):
    """For a hang report: a waiter that has not seen the phase before the one it waits for fell behind - the
    phases ran ahead of it (wrong parity, or fewer arrivals per phase than threads that arrive)."""
    seen = sim().knowledge(thread).get(b, 0)
    if seen >= b.phase:  # (it saw every completed phase: an ordinary wait for the next one)
        return ""
    text = (f" - this thread has seen {seen} of its {b.phase} completed phase(s): it waits for phase {b.phase} "
            f"with the parity of a phase it never saw (wrong parity? on the GPU a wait on the parity of a completed "
            f"phase returns at once, with stale data when it runs early)")
    pipe = getattr(ref, "pipeline", None)
    if pipe is not None:
        text += (f"; the phases ran ahead of it: Pipeline({pipe.stages}, {pipe.counts[0]}, {pipe.counts[1]}) "
                 f"completes a phase of its full barriers with producer_arrivals={pipe.counts[0]} arrivals and of its "
                 f"empty barriers with consumer_arrivals={pipe.counts[1]}: do they match the threads that commit / "
                 f"release each stage?")
    return text


def _check_pipeline_refill(ref, b, op):
    """A Pipeline's producer loading into a stage for round k+1 must know the consumers released round k
    (it waited on the stage's empty barrier: producer_acquire) - checked by happens-before, not timing."""
    s = sim()
    me = s.current_thread()
    rounds = b.arrivals_by.get(me, 0)
    if rounds < 1:
        return
    pipe = ref.pipeline
    stage = (ref.address - s.address_of(pipe.bars)) // 8
    empty = _barriers().get(s.address_of(pipe.bars, pipe.stages + stage))
    if empty is not None and s.knowledge(me).get(empty, 0) >= rounds:
        return
    raise s.SimulatedMisuse(
        f"{op}: thread {s.who(me)} refills stage {stage} of {pipe.name} for round {rounds + 1} before it knows "
        f"the consumers released round {rounds} (phase {rounds - 1} of the stage's empty barrier: this thread "
        f"has not waited for it): the copy may overwrite the stage while they still read it. Call "
        f"producer_acquire() before loading a stage again"
    )


def _check_pipeline_arrival(ref, b):
    """A Pipeline's barrier: every thread that commits / releases a stage arrives once per round of the
    stage, so its n-th arrival must count towards phase n. An arrival that finds a later phase means earlier
    phases completed without it: more threads arrive than the count the pipeline was created with."""
    s = sim()
    me = s.current_thread()
    n = b.arrivals_by.get(me, 0)
    b.arrivals_by[me] = n + 1
    if b.phase == n:
        return
    pipe, kind = ref.pipeline, ref.kind
    counts = pipe.counts
    which, method = (("consumer_arrivals", "consumer_release") if kind == "empty" else
                     ("producer_arrivals", "producer_commit"))
    count = counts[1] if kind == "empty" else counts[0]
    same_round = sum(1 for k in b.arrivals_by.values() if k > n)
    if b.phase > n:
        raise s.SimulatedMisuse(
            f"{method}: {ref.name} was created with {which}={count} (Pipeline({pipe.stages}, {counts[0]}, "
            f"{counts[1]})), but more threads arrive on it: thread {s.who(me)}'s arrival #{n + 1} is arrival "
            f"#{same_round} of that round of the stage (phase {n}), which already completed after {count}. The "
            f"arrival count must equal the number of threads that call {method} for each stage; on the GPU the "
            f"extra arrivals complete later phases early (the stage is handed over before its readers are done)"
        )
    raise s.SimulatedMisuse(
        f"{method}: thread {s.who(me)} arrives on {ref.name} for round {n + 1} of the stage while its round "
        f"{b.phase + 1} is still open ({b.arrivals_done} of {count} arrivals, {which}={count}): it arrived twice "
        f"before the others; every one of the {which} threads arrives once per round"
    )


def _wait_on(ref, op, ready_for, what):
    s = sim()
    site = s.caller_site()
    me = s.current_thread()
    with s.lock:
        b = _barrier_state(ref, op)
        b.waiters += 1
    seen = []
    try:
        def ready():
            b = _barrier_state(ref, op, use=False)
            if ready_for(b):
                seen.append(b.phase)
                return True
            return False

        def describe():
            b = _barriers()[ref.address]
            return f"{op}({ref.name}, {what}) at {site[0]}:{site[1]}; {b.describe()}{_behind_hint(b, me, ref)}"

        s.wait_until(ready, describe, ("mbarrier", ref.address))
    finally:
        with s.lock:
            b.waiters -= 1
    with s.lock:
        _observe(b, f"{op} with {what} at {site[0]}:{site[1]}", seen[-1])


def sim_wait_parity(bar, parity):
    _wait_on(sim().barrier_of(bar), "mbarrier_wait_parity", lambda b: _phase_done(b, parity),
             f"parity {int(parity) & 1}")


def sim_wait_token(bar, token):
    _wait_on(sim().barrier_of(bar), "mbarrier_wait", lambda b: b.phase > int(token), f"the token of phase {int(token)}")


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
