"""Runtime of the intrinsics under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs one block at a time, each thread a Python thread. This module keeps, per block: the
state of every mbarrier (keyed by its shared-memory address), named barriers, the pipelines' barrier
storage, and which threads are waiting on what - so that a wait that can never complete raises
:class:`SimulatedHang` naming the barrier, its phase, the arrivals and the transaction bytes, instead of
hanging. Asynchronous copies move their bytes when they are issued, so a block is hung exactly when every
live thread waits and nothing it waits on can complete.

What is asynchronous on the GPU stays checkable: every copy in flight is recorded with the shared-memory
bytes it touches and what completes it (a barrier phase, a bulk group, a cp.async group). Shared arrays in
the simulator are :class:`SharedArray` views that check each read and write against those records and each
thread's *knowledge* (the barrier phases it has waited for, passed on through block barriers), so a kernel
that reads a tile before waiting for it, waits on the wrong parity, overwrites a tile a TMA store is still
reading, or stores a tile written without ``fence.proxy.async`` gets :class:`SimulatedMisuse` naming the
access, instead of a result that depends on timing.

Only imported under the simulator; the GPU path never touches it.
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

from numbatma._shapes import tile_alignment  # (one definition: typer, debug build, simulator)

_lock = threading.RLock()


def _channel(key):
    """The condition (on the one lock) that threads waiting on ``key`` sleep on: a barrier's address, a named
    barrier, a warp. Waking only those threads (not every waiting thread of the block) keeps a block of
    hundreds of simulated threads from convoying on the lock."""
    channels = block_state().channels
    cond = channels.get(key)
    if cond is None:
        cond = channels[key] = threading.Condition(_lock)
    return cond


def _notify(key):
    cond = block_state().channels.get(key)
    if cond is not None:
        cond.notify_all()


class SimulatedHang(RuntimeError):
    """Every live thread of a block waits on something that can no longer happen."""


class SimulatedMisuse(RuntimeError):
    """An operation whose result on the GPU would be undefined (wrong byte counts, uninitialised barrier)."""


class SimulatedTypingError(SimulatedMisuse, TypeError):
    """An operand the GPU build refuses at typing time (a numba TypingError there), with the typer's words."""


# -- per-block state ----------------------------------------------------------------------------------------
class _BlockState:
    def __init__(self):
        self.barriers = {}  # address -> _MBarrier
        self.named = {}  # id -> [arrived, generation]
        self.waiting = {}  # thread -> description (callable returning str, or None when it can progress)
        self.allocations = {}  # (file, line) -> numpy array (pipeline barrier storage)
        self.warps = {}  # warp -> exchange state of warp-synchronous operations
        self.fills = {}  # 128-byte line -> [_Fill]: shared bytes copies write, until a thread may read them
        self.unfenced = set()  # threads with shared writes not yet followed by fence.proxy.async
        self.reads = []  # _StoreRead: shared bytes a TMA store still reads, until its group is waited for
        self.sync_pool = {}  # barrier instance -> knowledge published there (key -> phases known complete)
        self.hang_checked = 0.0  # time of the last hang check
        self.channels = {}  # key -> threading.Condition (see _channel)
        self.started = 0  # threads of the block that have started (a hang needs every one started)


def _thread():
    return threading.current_thread()


def block_state():
    """The state of the current simulated block (created on first use)."""
    manager = getattr(_thread(), "_manager", None)
    if manager is None:
        raise RuntimeError("numbatma intrinsics can only run inside a kernel launched in the CUDA simulator")
    state = getattr(manager, "_numbatma_state", None)
    if state is not None:
        return state
    with _lock:
        state = getattr(manager, "_numbatma_state", None)
        if state is None:
            global _tracked
            state = manager._numbatma_state = _BlockState()
            _tracked = 0  # blocks run one after another: the previous block's records are gone
        return state


def thread_index():
    """Flat index of the calling thread in its block (x fastest)."""
    return _thread().thread_id


_OWN = None


def _own_frame(filename):
    """Frames of numbatma's machinery (intrinsics, the top-level numbatma modules, Numba's simulator), as
    opposed to kernel code - which includes numbatma.kernels (installed under numbatma/kernels/)."""
    global _OWN
    if _OWN is None:
        import os

        import numba.cuda.simulator as simulator

        import numbatma

        _OWN = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
                os.path.dirname(os.path.abspath(simulator.__file__)) + os.sep,
                os.path.dirname(os.path.abspath(numbatma.__file__)))
    return filename.startswith(_OWN[:2]) or filename.rpartition("/")[0] == _OWN[2] \
        or filename.rpartition("\\")[0] == _OWN[2]


def caller_site(depth=None):
    """(file, line) of the innermost frame outside numbatma's machinery and Numba's simulator: the kernel
    line that called the intrinsic. (``depth`` is ignored; kept for callers.)"""
    frame = sys._getframe(1)
    while frame is not None:  # (frames, not traceback.extract_stack: that reads source files)
        filename = frame.f_code.co_filename
        if not _own_frame(filename):
            return filename, frame.f_lineno
        frame = frame.f_back
    return "<unknown>", 0


def declared_name(site):
    """The variable the kernel line ``site`` assigns (``bar`` for ``bar = cuda.shared.array(...)``), or None."""
    import linecache
    import re

    m = re.match(r"\s*([A-Za-z_]\w*)\s*=", linecache.getline(site[0], site[1]))
    return m.group(1) if m else None


def describe_site(site):
    """``'bar' (declared at file:line)`` for the kernel line ``bar = cuda.shared.array(...)``."""
    name = declared_name(site)
    return (f"'{name}' " if name else "") + f"(declared at {site[0]}:{site[1]})"


# -- addresses -------------------------------------------------------------------------------------------------
class BarrierRef:
    """``mbarrier_ref(bars, i)`` under the simulator: the address of a barrier and a name for messages."""

    pipeline = None  # a Pipeline's barrier: the SimPipeline and "full" / "empty" (arrival-count check)
    kind = None

    def __init__(self, address, name):
        self.address = address
        self.name = name


def address_of(array, index=0):
    return int(array.__array_interface__["data"][0]) + index * array.dtype.itemsize


def describe_element(array, index):
    """``'bars[1]' (declared at file:line)`` for element ``index`` of the kernel's shared array ``bars``."""
    site = getattr(array, "__dict__", {}).get("_numbatma_site")
    if site is None:
        return f"element {index} of a {array.shape[0]}-element array"
    name = declared_name(site)
    return (f"'{name}[{index}]'" if name else f"element {index}") + f" (declared at {site[0]}:{site[1]})"


def barrier_of(bar):
    if isinstance(bar, BarrierRef):
        return bar
    if isinstance(bar, np.ndarray):
        site = getattr(bar, "__dict__", {}).get("_numbatma_site") or caller_site()
        return BarrierRef(address_of(bar), f"mbarrier {describe_site(site)}")
    raise TypeError(f"the mbarrier operand must be a shared uint64 array or mbarrier_ref(bars, i), got {bar!r}")


# -- mbarrier ----------------------------------------------------------------------------------------------------
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

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.arrivals_done = 0
            _merge(self.released, self.carried)
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


def _barrier_state(ref, op, use=True):
    """The barrier ``ref`` names. ``use``: the calling thread operates on it, so its initialisation must have
    reached this thread (happens-before: see ``_check_init_known``)."""
    state = block_state()
    b = state.barriers.get(ref.address)
    if b is None:
        raise SimulatedMisuse(
            f"{op}: thread {_who(_thread())} uses {ref.name} before its initialisation reached this thread: no "
            f"mbarrier_init of it has run (never initialised, or initialised by another thread without "
            f"fence_mbarrier_init() and a block barrier between the two); on the GPU this is undefined"
        )
    if use:
        _check_init_known(b, op)
    return b


def _check_init_known(b, op):
    """A barrier initialised by another thread may be used only after the initialisation reached this
    thread: the initialising thread's ``fence_mbarrier_init`` (or ``fence_proxy_async_shared_cta``) and then
    a block barrier (or any synchronisation that carries what it knows) - not by luck of timing."""
    me = _thread()
    if b.init_thread is me or b.init_thread is None or knowledge(me).get(("init", b)):
        return
    if b.init_fenced:
        missing = ("it fenced (fence_mbarrier_init) but no block barrier (cuda.syncthreads()) or other "
                   "synchronisation orders that before this use")
    else:
        missing = "it has not executed fence_mbarrier_init() since, so no block barrier can publish it"
    raise SimulatedMisuse(
        f"{op}: thread {_who(me)} uses {b.name} before its initialisation reached this thread: thread "
        f"{_who(b.init_thread)} initialised it at {b.init_site[0]}:{b.init_site[1]} (mbarrier_init), but {missing}. "
        f"After mbarrier_init the initialising thread runs fence_mbarrier_init() and then a block barrier before "
        f"any other thread (or a TMA copy it issues) uses the barrier; on the GPU this thread may see an "
        f"uninitialised barrier"
    )


def fence_mbarrier_init():
    """``fence.mbarrier_init``: this thread's initialisations become publishable (a block barrier after it
    passes them on to the other threads)."""
    me = _thread()
    pending = me.__dict__.get("_numbatma_inits")
    if pending:
        seen = knowledge(me)
        for b in pending:
            b.init_fenced = True
            seen[("init", b)] = 1
        me._numbatma_inits = []


def mbarrier_init(bar, count):
    ref = barrier_of(bar)
    if not 1 <= int(count) < (1 << 20):
        raise SimulatedMisuse(f"mbarrier_init: the arrival count must be in 1..2**20-1, got {count}")
    with _lock:
        state = block_state()
        old = state.barriers.get(ref.address)
        if old is not None and (old.arrivals_done or old.tx or old.waiters):
            raise SimulatedMisuse(
                f"mbarrier_init re-initialises {old.describe()}, while it is in use"
                + (f" ({old.waiters} thread(s) waiting on it)" if old.waiters else "")
                + "; on the GPU this is undefined. Re-initialise a barrier only when its phase is complete and "
                  "nobody waits on it (mbarrier_inval first)"
            )
        b = state.barriers[ref.address] = _MBarrier(int(count), ref.name)
        b.pipeline = getattr(ref, "pipeline", None)  # (a Pipeline's barrier: named in reports)
        me = _thread()
        b.init_thread, b.init_site = me, caller_site()
        me.__dict__.setdefault("_numbatma_inits", []).append(b)
        _notify(("mbarrier", ref.address))


def mbarrier_inval(bar):
    ref = barrier_of(bar)
    with _lock:
        old = block_state().barriers.pop(ref.address, None)
        if old is not None and old.waiters:
            raise SimulatedMisuse(f"mbarrier_inval of {old.describe()}, while {old.waiters} thread(s) wait on it")


def mbarrier_arrive(bar, count=1, tx=0):
    ref = barrier_of(bar)
    with _lock:
        b = _barrier_state(ref, "mbarrier_arrive")
        token = b.phase
        b.tx += int(tx)
        if int(count) > b.pending:
            raise SimulatedMisuse(
                f"mbarrier_arrive: {int(count)} arrivals on {b.describe()}; more arrivals than the phase expects "
                f"is undefined on the GPU"
            )
        if getattr(ref, "pipeline", None) is not None:
            _check_pipeline_arrival(ref, b)
        b.pending -= int(count)
        b.arrivals_done += int(count)
        _merge(b.carried, _release(_thread()))
        b._maybe_complete()
        _notify(("mbarrier", ref.address))
        return np.uint64(token)


def mbarrier_expect_tx(bar, nbytes):
    ref = barrier_of(bar)
    with _lock:
        b = _barrier_state(ref, "mbarrier_expect_tx")
        if getattr(ref, "kind", None) == "full":
            _check_pipeline_refill(ref, b, "Pipeline.load")
        b.tx += int(nbytes)


def mbarrier_complete_tx(bar, nbytes):
    """Deliver ``nbytes`` to the current phase of ``bar``; returns (barrier, phase it counted towards)."""
    ref = barrier_of(bar)
    with _lock:
        b = _barrier_state(ref, "mbarrier_complete_tx")
        phase = b.phase
        b.tx -= int(nbytes)
        b._maybe_complete()
        _notify(("mbarrier", ref.address))
        return b, phase


def _phase_done(b, parity):
    """True when the phase with ``parity`` is complete: the current (incomplete) phase has parity
    ``b.phase & 1``; the other parity names the phase just before it, which is complete."""
    return (b.phase & 1) != (int(parity) & 1)


def _observe(b, how, phase=None):
    """The calling thread saw every phase of ``b`` before ``phase`` (default: its current one) complete."""
    phase = b.phase if phase is None else phase
    me = _thread()
    seen = knowledge(me)
    _merge(seen, b.released)
    if seen.get(b, 0) < phase:
        seen[b] = phase
    me.__dict__.setdefault("_numbatma_last_wait", {})[b] = (how, phase)


def test_wait_parity(bar, parity):
    ref = barrier_of(bar)
    site = caller_site()
    with _lock:
        b = _barrier_state(ref, "mbarrier_test_wait_parity")
        done = _phase_done(b, parity)
        if done:
            _observe(b, f"a test/try wait with parity {int(parity) & 1} at {site[0]}:{site[1]}")
        return done


def test_wait_token(bar, token):
    ref = barrier_of(bar)
    site = caller_site()
    with _lock:
        b = _barrier_state(ref, "mbarrier_test_wait")
        done = b.phase > int(token)
        if done:
            _observe(b, f"a test wait with the token of phase {int(token)} at {site[0]}:{site[1]}")
        return done


def _behind_hint(b, thread, ref):
    """For a hang report: a waiter that has not seen the phase before the one it waits for fell behind - the
    phases ran ahead of it (wrong parity, or fewer arrivals per phase than threads that arrive)."""
    seen = knowledge(thread).get(b, 0)
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
    me = _thread()
    rounds = b.arrivals_by.get(me, 0)
    if rounds < 1:
        return
    pipe = ref.pipeline
    stage = (ref.address - address_of(pipe.bars)) // 8
    empty = block_state().barriers.get(address_of(pipe.bars, pipe.stages + stage))
    if empty is not None and knowledge(me).get(empty, 0) >= rounds:
        return
    raise SimulatedMisuse(
        f"{op}: thread {_who(me)} refills stage {stage} of {pipe.name} for round {rounds + 1} before it knows "
        f"the consumers released round {rounds} (phase {rounds - 1} of the stage's empty barrier: this thread "
        f"has not waited for it): the copy may overwrite the stage while they still read it. Call "
        f"producer_acquire() before loading a stage again"
    )


def _wait_on(ref, op, ready_for, what):
    site = caller_site()
    me = _thread()
    with _lock:
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
            b = block_state().barriers[ref.address]
            return f"{op}({ref.name}, {what}) at {site[0]}:{site[1]}; {b.describe()}{_behind_hint(b, me, ref)}"

        wait_until(ready, describe, ("mbarrier", ref.address))
    finally:
        with _lock:
            b.waiters -= 1
    with _lock:
        _observe(b, f"{op} with {what} at {site[0]}:{site[1]}", seen[-1])


def wait_parity(bar, parity):
    _wait_on(barrier_of(bar), "mbarrier_wait_parity", lambda b: _phase_done(b, parity), f"parity {int(parity) & 1}")


def wait_token(bar, token):
    _wait_on(barrier_of(bar), "mbarrier_wait", lambda b: b.phase > int(token), f"the token of phase {int(token)}")


# -- waiting and hang detection ------------------------------------------------------------------------------
def _live_threads(manager):
    return [t for t in threading.enumerate() if getattr(t, "_manager", None) is manager and t.is_alive()]


def wait_until(ready, describe, key):
    """Block the calling simulated thread until ``ready()``; raise SimulatedHang when every live thread of
    the block is waiting (here or in syncthreads) on something not ready."""
    me = _thread()
    manager = me._manager
    state = block_state()
    me._numbatma_ready = ready
    try:
        _wait_loop(me, manager, state, ready, describe, key)
    finally:
        me._numbatma_ready = None


def _wait_loop(me, manager, state, ready, describe, key):
    idle = 0.0
    cond = _channel(key)
    with cond:
        while not ready():
            state.waiting[me] = describe
            if idle >= 0.05:  # nothing moved for a while: is every live thread of the block stuck?
                now = time.monotonic()
                if now - state.hang_checked >= 0.05:  # (one check per block at a time, not one per thread)
                    state.hang_checked = now
                    _check_hang(me, manager, state)
            if getattr(me, "abort", False):
                raise RuntimeError("aborted: another simulated thread failed")
            start = time.monotonic()
            # Every change that can make a wait ready notifies its key, so the timeout only paces the hang
            # check and the abort test: it backs off while nothing happens, so that hundreds of waiting
            # threads do not poll the lock (and the GIL) away from the threads doing the work.
            woken = cond.wait(timeout=min(0.02 + idle, 0.25))
            idle = 0.0 if woken else idle + (time.monotonic() - start)
        state.waiting.pop(me, None)


def _check_hang(me, manager, state):
    if state.started < int(np.prod(manager._block_dim)):
        return  # a thread that has not started yet may still release the others (heavy CPU load)
    live = _live_threads(manager)
    stuck = all(t in state.waiting or getattr(t, "syncthreads_blocked", False) for t in live)
    if not stuck or any(_ready_safely(t) for t in live if t in state.waiting):
        return
    groups = {}  # the same wait of many threads (a warp of consumers) is one line, so every distinct wait shows
    for t in live:
        where = state.waiting.get(t)
        what = where() if where else "cuda.syncthreads()"
        groups.setdefault(what, []).append(tuple(t.threadIdx))
    lines = [f"  thread {who[0]}" + (f" (and {len(who) - 1} more thread(s) with the same wait)" if len(who) > 1 else "")
             + f": {what}" for what, who in groups.items()]
    state.waiting.clear()
    raise SimulatedHang(
        "every live thread of block " + str(tuple(me.blockIdx)) + " waits and none can proceed "
        "(this kernel would hang on the GPU):\n" + "\n".join(lines[:16])
        + (f"\n  ... and {len(lines) - 16} more" if len(lines) > 16 else "")
    )


def _ready_safely(thread):
    """Whether a waiting thread's condition has become true (checked by the thread that detects hangs)."""
    ready = getattr(thread, "_numbatma_ready", None)
    try:
        return bool(ready and ready())
    except Exception:  # noqa: BLE001 - its own wait loop reports the problem
        return True


# -- shared-memory hazards -------------------------------------------------------------------------------------
_tracked = 0  # fills and store reads recorded in the running block (0: reads need no check)


class SharedArray(np.ndarray):
    """Simulated shared memory: ``cuda.shared.array`` returns this view of a NumPy buffer. Every element
    access is checked against the asynchronous copies in flight (see the module docstring); writes also
    record, per thread, the bytes written since its last ``fence_proxy_async_shared_cta``."""

    def __getitem__(self, index):
        value = np.ndarray.__getitem__(self, index)
        if _tracked and not (isinstance(value, np.ndarray) and value.base is not None):  # a view reads nothing
            lo, hi = _span(self, index, value)
            _check_read(lo, hi, "reads")
        return value

    def __setitem__(self, index, value):
        np.ndarray.__setitem__(self, index, value)
        lo, hi = _span(self, index, None)
        me = _thread()
        unfenced = me.__dict__.get("_numbatma_unfenced")
        if unfenced is None:
            me._numbatma_unfenced = [[lo, hi]]
            with _lock:
                block_state().unfenced.add(me)
        else:
            _note_unfenced(unfenced, lo, hi)
        if _tracked:
            _check_read(lo, hi, "writes")
            for r in block_state().reads:
                if r.lo < hi and lo < r.hi:
                    raise SimulatedMisuse(
                        f"thread {_who(me)} writes shared bytes [{lo - r.lo}, {hi - r.lo}) of a tile that the TMA "
                        f"store issued at {r.site} by thread {_who(r.thread)} may still be reading: that thread "
                        f"must bulk_commit_group and bulk_wait_group_read (then a block barrier) before the "
                        f"tile is written again"
                    )


_MAX_RANGES = 8


def _note_unfenced(ranges, lo, hi):
    """Add [lo, hi) to a thread's unfenced byte ranges (at most _MAX_RANGES: the closest two merge)."""
    last = ranges[-1]
    if lo <= last[1] and last[0] <= hi:  # the usual case: next to (or inside) the last write
        last[0], last[1] = min(lo, last[0]), max(hi, last[1])
        return
    for r in ranges:
        if lo <= r[1] and r[0] <= hi:
            r[0], r[1] = min(lo, r[0]), max(hi, r[1])
            return
    ranges.append([lo, hi])
    if len(ranges) > _MAX_RANGES:
        ranges.sort()
        gaps = [ranges[i + 1][0] - ranges[i][1] for i in range(len(ranges) - 1)]
        i = gaps.index(min(gaps))
        ranges[i][1] = max(ranges[i][1], ranges[i + 1][1])
        del ranges[i + 1]


def _who(thread):
    return tuple(thread.threadIdx)


# -- thread lifetime -------------------------------------------------------------------------------------------
def thread_started(thread):
    """Called by each simulated thread as it starts (numbatma's BlockThread.run wrapper)."""
    state = block_state()
    with _lock:
        state.started += 1


def thread_exit(thread):
    """Called by each simulated thread when its kernel function returned: a TMA store or bulk store/reduce it
    issued and did not wait for is still in flight - on the GPU the block's shared memory is released at
    exit while the copy engine may still read it."""
    state = getattr(thread._manager, "_numbatma_state", None)
    if state is None:
        return
    with _lock:
        for r in state.reads:
            if r.thread is thread:
                how = ("it was never committed (no bulk_commit_group after it)" if r.group is None else
                       "its bulk group was never waited for (no bulk_wait_group after bulk_commit_group)")
                raise SimulatedMisuse(
                    f"thread {_who(thread)} exits with the store issued at {r.site} still in flight: {how}. The "
                    f"block's shared memory is released when it exits while the copy engine may still read the "
                    f"tile (and the data may not have reached global memory): end with bulk_commit_group() and "
                    f"bulk_wait_group(0) (or bulk_wait_group_read(0)) in the thread that issued the store"
                )


def _check_pipeline_arrival(ref, b):
    """A Pipeline's barrier: every thread that commits / releases a stage arrives once per round of the
    stage, so its n-th arrival must count towards phase n. An arrival that finds a later phase means earlier
    phases completed without it: more threads arrive than the count the pipeline was created with."""
    me = _thread()
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
        raise SimulatedMisuse(
            f"{method}: {ref.name} was created with {which}={count} (Pipeline({pipe.stages}, {counts[0]}, "
            f"{counts[1]})), but more threads arrive on it: thread {_who(me)}'s arrival #{n + 1} is arrival "
            f"#{same_round} of that round of the stage (phase {n}), which already completed after {count}. The "
            f"arrival count must equal the number of threads that call {method} for each stage; on the GPU the "
            f"extra arrivals complete later phases early (the stage is handed over before its readers are done)"
        )
    raise SimulatedMisuse(
        f"{method}: thread {_who(me)} arrives on {ref.name} for round {n + 1} of the stage while its round "
        f"{b.phase + 1} is still open ({b.arrivals_done} of {count} arrivals, {which}={count}): it arrived twice "
        f"before the others; every one of the {which} threads arrives once per round"
    )


def bounds(array):
    """Byte range [lo, hi) of an array's elements."""
    lo = hi = int(array.__array_interface__["data"][0])
    for n, st in zip(array.shape, array.strides):
        if n == 0:
            return lo, lo
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + array.itemsize


def _span(array, index, value):
    """Byte range of ``array[index]`` (``value``: the result of the read, or None)."""
    base = array.__dict__.get("_numbatma_base")
    if base is None:
        base = array._numbatma_base = int(array.__array_interface__["data"][0])
    try:
        if type(index) is not tuple:
            index = (index,)
        if len(index) == array.ndim:
            offset = 0
            for i, n, st in zip(index, array.shape, array.strides):
                i = int(i)  # a slice or an array raises TypeError: handled below
                offset += (i + n if i < 0 else i) * st
            return base + offset, base + offset + array.itemsize
    except TypeError:
        pass
    view = np.ndarray.__getitem__(array, index) if value is None else value
    if isinstance(view, np.ndarray) and view.size and np.shares_memory(view, array):
        return bounds(view)
    return bounds(array)  # fancy indexing: the whole array, conservatively


def knowledge(thread):
    """What ``thread`` knows complete: key (a barrier, or a thread's cp.async groups) -> phases complete."""
    seen = thread.__dict__.get("_numbatma_seen")
    if seen is None:
        seen = thread._numbatma_seen = {}
    return seen


def _merge(into, other):
    for key, phase in other.items():
        if into.get(key, 0) < phase:
            into[key] = phase


def _release(thread):
    """A release by ``thread`` (an arrival, a block barrier): its accesses so far are ordered before whoever
    acquires what it carries. Each thread counts its releases under the key ("clock", thread); an access made
    between release n-1 and n has epoch n, and is ordered before another thread's point exactly when that
    thread knows ("clock", thread) >= n. Returns the thread's knowledge (to carry)."""
    seen = knowledge(thread)
    key = ("clock", thread)
    seen[key] = seen.get(key, 0) + 1
    return seen


def publish_knowledge(thread, key=None):
    """Before a block barrier: what this thread knows goes into the barrier's pool, for everyone passing that
    barrier. ``key`` names the barrier instance; by default the calling thread's n-th ``syncthreads`` (every
    thread of the block passes the same n-th block barrier). Each barrier instance has its own pool: a thread
    that wakes late must not learn what others published at a later barrier."""
    if getattr(thread, "_manager", None) is None:
        return
    if key is None:
        n = thread.__dict__.get("_numbatma_syncs", 0) + 1
        thread._numbatma_syncs = n
        key = ("sync", n)
    with _lock:
        pools = block_state().sync_pool
        pool = pools.get(key)
        if pool is None:
            pool = pools[key] = {}
            # (nobody can still need the pool two instances back: this one opens only after all passed the last)
            pools.pop(key[:-1] + (key[-1] - 2,), None)
        _merge(pool, _release(thread))


def absorb_knowledge(thread, key=None):
    """After a block barrier: learn what the threads that passed it knew."""
    if getattr(thread, "_manager", None) is None:
        return
    if key is None:
        key = ("sync", thread.__dict__.get("_numbatma_syncs", 0))
    with _lock:
        _merge(knowledge(thread), block_state().sync_pool.get(key, {}))


class _Fill:
    """Shared bytes [lo, hi) an asynchronous copy writes; readable by a thread that knows one of
    ``completions`` ((key, phase): the copy completes with phase ``phase`` of ``key``)."""

    def __init__(self, lo, hi, what, completions):
        self.lo, self.hi, self.what, self.completions = lo, hi, what, completions
        self.alive = True
        self.swizzle = None  # a TMA tile load: the swizzle span (bytes, 0 = none) it wrote the bytes with
        self.readers = {}  # thread -> [epoch, lo, hi, site, verb]: its latest generic accesses of these bytes

    def visible(self, seen):
        return any(seen.get(key, 0) > phase for key, phase in self.completions)


class _StoreRead:
    """Shared bytes [lo, hi) a TMA store of ``thread`` reads until its bulk group is waited for."""

    def __init__(self, lo, hi, thread, site):
        self.lo, self.hi, self.thread, self.site = lo, hi, thread, site
        self.group = None  # set by bulk_commit_group


_LINE = 7  # fills are indexed by 128-byte line


def _fills_over(state, lo, hi):
    """The fills recorded on the lines [lo, hi) touches (each once)."""
    first, last = lo >> _LINE, (hi - 1) >> _LINE
    if first == last:
        return state.fills.get(first, ())
    found = {}
    for line in range(first, last + 1):
        for f in state.fills.get(line, ()):
            found[id(f)] = f
    return found.values()


def _track(delta):
    global _tracked
    _tracked += delta


def _check_read(lo, hi, verb, record=True):
    """A generic access of shared bytes [lo, hi) (``verb``: reads / writes) must come after the copies that
    fill them are known complete; it is recorded on those copies (``_Fill.readers``) so that a later copy into
    the same bytes can check the access is ordered before it (``_check_refill``)."""
    me = _thread()
    state = block_state()
    seen = knowledge(me)
    epoch = None
    for f in _fills_over(state, lo, hi):
        if f.lo < hi and lo < f.hi:
            if not f.visible(seen):
                raise SimulatedMisuse(f"thread {_who(me)} {verb} shared bytes [{lo - f.lo}, {hi - f.lo}) of "
                                      f"{f.what}, before that copy is known complete: {_missing_wait(me, f)}")
            if record:
                if epoch is None:
                    epoch = seen.get(("clock", me), 0) + 1
                r = f.readers.get(me)
                if r is None or r[0] != epoch:
                    f.readers[me] = [epoch, lo, hi, caller_site(), verb]
                else:  # (the common case: one more access of the same copy in the same epoch)
                    if lo < r[1]:
                        r[1] = lo
                    if hi > r[2]:
                        r[2] = hi


def _check_refill(state, lo, hi, what, completions=()):
    """A copy about to write shared bytes [lo, hi): every generic access of the bytes an earlier copy
    filled must be ordered (happens-before) before the issuing thread's current point - e.g. the consumers'
    reads of a stage before the producer refills it (consumer_release -> producer_acquire). Checked against
    the recorded accesses, not timing, so a slow producer is reported as surely as a fast one."""
    me = _thread()
    seen = None
    for f in _fills_over(state, lo, hi):
        if not (f.alive and f.readers and f.lo < hi and lo < f.hi):
            continue
        if seen is None:
            seen = knowledge(me)
        for t, (epoch, rlo, rhi, site, verb) in list(f.readers.items()):
            if t is me or not (rlo < hi and lo < rhi) or seen.get(("clock", t), 0) >= epoch:
                continue
            did = "read" if verb == "reads" else "wrote"
            hint = ""
            for key, _ in completions:
                pipe = getattr(key, "pipeline", None)
                if pipe is not None:
                    hint = (f"; Pipeline({pipe.stages}, {pipe.counts[0]}, {pipe.counts[1]}) expects "
                            f"consumer_arrivals={pipe.counts[1]} release(s) per stage: if the producer did acquire "
                            f"the stage, its empty barrier completed without this reader's release - does the count "
                            f"match the threads that call consumer_release?")
                    break
            raise SimulatedMisuse(
                f"thread {_who(me)}: {what} refills shared bytes [{max(rlo, lo) - f.lo}, {min(rhi, hi) - f.lo}) "
                f"of {f.what}, which thread {_who(t)} {did} at {site[0]}:{site[1]} with no happens-before edge from "
                f"that access to this copy: the copy may overwrite the bytes while that thread still uses them. The "
                f"reader must release the stage (consumer_release / mbarrier_arrive on the barrier the producer "
                f"waits for) and the producer wait for that release (producer_acquire / mbarrier_wait) before it "
                f"refills the stage{hint}"
            )


def _missing_wait(me, fill):
    key, phase = fill.completions[0]
    if isinstance(key, _MBarrier):
        text = (f"it completes phase {phase} (parity {phase & 1}) of {key.name}, and this thread has not waited "
                f"for that phase (nor passed a block barrier after a thread that did)")
        last = me.__dict__.get("_numbatma_last_wait", {}).get(key)
        if last is not None and last[1] <= phase:
            text += (f"; its last wait on that barrier, {last[0]}, returned for phase {last[1] - 1} - a wait on the "
                     f"parity of a completed phase returns at once with stale data (wrong parity?)")
        return text
    return ("this thread's cp.async copies complete at its cp_async_wait_group / cp_async_wait_all (other threads: "
            "after a block barrier that follows it)")


def _add_fill(lo, hi, what, completions):
    state = block_state()
    _check_refill(state, lo, hi, what, completions)
    for r in state.reads:
        if r.lo < hi and lo < r.hi:
            raise SimulatedMisuse(
                f"{what} overwrites shared bytes that the TMA store issued at {r.site} by thread {_who(r.thread)} "
                f"may still be reading: wait for it with bulk_wait_group_read (and a block barrier) first"
            )
    new = _Fill(lo, hi, what, completions)
    _track(1)
    for line in range(lo >> _LINE, ((hi - 1) >> _LINE) + 1):
        bucket = state.fills.get(line)
        if bucket is None:
            state.fills[line] = [new]
            continue
        kept = []
        for f in bucket:
            if lo <= f.lo and f.hi <= hi:  # replaced by the new copy
                if f.alive:
                    f.alive = False
                    _track(-1)
            else:
                kept.append(f)
        kept.append(new)
        state.fills[line] = kept
    for t in list(state.unfenced):  # bytes the copy replaces need no fence any more
        unfenced = t.__dict__.get("_numbatma_unfenced")
        if unfenced:
            unfenced[:] = [r for r in unfenced if not (lo <= r[0] and r[1] <= hi)]
        if not unfenced:
            t._numbatma_unfenced = None
            state.unfenced.discard(t)
    return new


def fence_proxy_async():
    me = _thread()
    if me.__dict__.get("_numbatma_inits"):  # (also orders this thread's mbarrier_init for the async proxy)
        fence_mbarrier_init()
    if me.__dict__.get("_numbatma_unfenced") is not None:
        me._numbatma_unfenced = None
        with _lock:
            block_state().unfenced.discard(me)


def _check_store_source(lo, hi, op):
    me = _thread()
    _check_read(lo, hi, f"{op} reads", record=False)
    for t in list(block_state().unfenced):
        for r in t.__dict__.get("_numbatma_unfenced") or ():
            if r[0] < hi and lo < r[1]:
                who = "this thread" if t is me else f"thread {_who(t)}"
                raise SimulatedMisuse(
                    f"thread {_who(me)}: {op} from a shared tile that {who} wrote (bytes [{max(r[0], lo) - lo}, "
                    f"{min(r[1], hi) - lo}) of it) without fence_proxy_async_shared_cta afterwards: the TMA unit "
                    f"may read the old bytes. Every writing thread fences, then a block barrier, then the store"
                )


def _add_store_read(lo, hi, site):
    state = block_state()
    me = _thread()
    state.reads.append(_StoreRead(lo, hi, me, f"{site[0]}:{site[1]}"))
    _track(1)


def bulk_commit_group():
    me = _thread()
    groups = me.__dict__.setdefault("_numbatma_bulk_groups", 0)
    with _lock:
        for r in block_state().reads:
            if r.thread is me and r.group is None:
                r.group = groups
    me._numbatma_bulk_groups = groups + 1


def bulk_wait_group(n):
    """``cp.async.bulk.wait_group(.read) n``: every bulk group of this thread but the newest ``n`` is done."""
    me = _thread()
    done_below = me.__dict__.get("_numbatma_bulk_groups", 0) - int(n)
    with _lock:
        state = block_state()
        kept = [r for r in state.reads if not (r.thread is me and r.group is not None and r.group < done_below)]
        _track(len(kept) - len(state.reads))
        state.reads = kept


def cp_async_commit_group():
    me = _thread()
    me._numbatma_cp_groups = me.__dict__.get("_numbatma_cp_groups", 0) + 1


def cp_async_wait_group(n):
    me = _thread()
    done = me.__dict__.get("_numbatma_cp_groups", 0) - int(n)
    seen = knowledge(me)
    key = ("cp.async", me)
    if seen.get(key, 0) < done:
        seen[key] = done


def cp_async_wait_all():
    cp_async_commit_group()
    cp_async_wait_group(0)


def cp_async_mbarrier_arrive(bar, counts_as_arrival):
    """The completion of this thread's prior cp.async copies arrives on ``bar`` (they are done already):
    their bytes are also known to whoever waits for the phase this arrival counts towards."""
    me = _thread()
    ref = barrier_of(bar)
    with _lock:
        b = _barrier_state(ref, "cp_async_mbarrier_arrive")
        for f in me.__dict__.get("_numbatma_cp_fills", ()):
            f.completions.append((b, b.phase))
        me._numbatma_cp_fills = []  # (bound to this phase now; later arrivals concern later copies)
        if counts_as_arrival:  # (under the same lock: the arrival counts towards that same phase)
            mbarrier_arrive(bar)


# -- named barriers -----------------------------------------------------------------------------------------
def named_barrier(barrier_id, threads, wait):
    state = block_state()
    site = caller_site()
    with _lock:
        entry = state.named.setdefault(int(barrier_id), [0, 0])
        generation = entry[1]
        pool_key = ("named", int(barrier_id), generation)
        publish_knowledge(_thread(), pool_key)
        entry[0] += 1
        if entry[0] >= int(threads):
            entry[0] = 0
            entry[1] += 1
            _notify(("named", int(barrier_id)))
    if not wait:
        return

    def ready():
        return state.named[int(barrier_id)][1] != generation

    def describe():
        n = state.named[int(barrier_id)][0]
        return f"named_barrier_sync({int(barrier_id)}, {int(threads)}) at {site[0]}:{site[1]}; {n} arrived"

    wait_until(ready, describe, ("named", int(barrier_id)))
    absorb_knowledge(_thread(), pool_key)


# -- warp-level exchange (shuffles, syncwarp) -----------------------------------------------------------
def _warp_key():
    t = _thread()
    return t.thread_id // 32, t.thread_id % 32


def warp_exchange(mask, value):
    """Every lane named in ``mask`` contributes ``value``; returns the 32 contributions (None for lanes
    outside the mask) once all of them have arrived - what a ``.sync`` warp instruction sees."""
    state = block_state()
    warp, lane = _warp_key()
    mask = int(mask) & 0xFFFFFFFF
    if not mask >> lane & 1:
        raise SimulatedMisuse(f"a warp-synchronous operation was called by lane {lane}, which its mask "
                              f"0x{mask:08x} leaves out (undefined on the GPU)")
    site = caller_site()
    with _lock:
        entry = state.warps.setdefault(warp, {"generation": 0, "values": [None] * 32, "arrived": 0,
                                                "result": None})
        generation = entry["generation"]
        entry["values"][lane] = value
        entry["arrived"] += 1
        if entry["arrived"] == bin(mask).count("1"):
            entry["result"] = (generation, list(entry["values"]))
            entry["values"] = [None] * 32
            entry["arrived"] = 0
            entry["generation"] += 1
            _notify(("warp", warp))

    def ready():
        return entry["generation"] != generation

    def describe():
        return (f"warp {warp} lane {lane} in a warp-synchronous operation (mask 0x{mask:08x}) at "
                f"{site[0]}:{site[1]}; {entry['arrived']} lanes arrived")

    wait_until(ready, describe, ("warp", warp))
    return entry["result"][1]


def group_exchange(name, size, value):
    """A ``.sync.aligned`` operation of a group of ``size`` consecutive threads (e.g. the 128 threads of a
    warpgroup for ``wgmma``): every thread of the calling thread's group contributes ``value``; returns the
    ``size`` contributions (in thread order) once all of them have arrived. ``name`` names the operation in
    hang reports."""
    state = block_state()
    me = thread_index()
    group, rank = me // size, me % size
    key = ("group", size, group)
    site = caller_site()
    with _lock:
        entry = state.warps.setdefault(key, {"generation": 0, "values": [None] * size, "arrived": 0, "result": None})
        generation = entry["generation"]
        entry["values"][rank] = value
        entry["arrived"] += 1
        if entry["arrived"] == size:
            entry["result"] = (generation, list(entry["values"]))
            entry["values"] = [None] * size
            entry["arrived"] = 0
            entry["generation"] += 1
            _notify(key)

    def ready():
        return entry["generation"] != generation

    def describe():
        return (f"{name} at {site[0]}:{site[1]}, which all {size} threads {group * size}..{group * size + size - 1} "
                f"execute together (.sync.aligned); {entry['arrived']} arrived")

    wait_until(ready, describe, key)
    return entry["result"][1]


def shfl(mask, value, src_lane):
    values = warp_exchange(mask, value)
    v = values[int(src_lane) % 32]
    return value if v is None else v


def shfl_xor(mask, value, lane_mask):
    _, lane = _warp_key()
    return shfl(mask, value, lane ^ int(lane_mask))


def shfl_down(mask, value, delta):
    _, lane = _warp_key()
    src = lane + int(delta)
    return shfl(mask, value, src) if src < 32 else (warp_exchange(mask, value), value)[1]


def shfl_up(mask, value, delta):
    _, lane = _warp_key()
    src = lane - int(delta)
    return shfl(mask, value, src) if src >= 0 else (warp_exchange(mask, value), value)[1]


def syncwarp(mask=0xFFFFFFFF):
    warp_exchange(mask, None)


# -- block-shared storage keyed by call site ----------------------------------------------------------------
def shared_allocation(site, shape, dtype):
    state = block_state()
    with _lock:
        a = state.allocations.get(site)
        if a is None:
            a = state.allocations[site] = np.zeros(shape, dtype)
        return a


def syncthreads():
    _thread().syncthreads()


# -- TMA box copies -----------------------------------------------------------------------------------------
def numpy_of(array):
    """The NumPy array (sharing memory) behind a simulated array: the simulator's device arrays and views wrap
    one (``_ary``; records ``_item``), host NumPy arrays are themselves. The one place that unwraps them."""
    a = array
    for _ in range(8):
        if isinstance(a, np.ndarray):
            return a
        inner = getattr(a, "_ary", None)
        a = getattr(a, "_item", None) if inner is None else inner
        if a is None:
            break
    raise TypeError(f"cannot reach the host memory of {type(array).__name__} in the simulator")


def _host_array(desc):
    """The NumPy array (sharing memory) behind a TensorMap's array under the simulator."""
    return numpy_of(desc.array)


def _box_index(desc, coords):
    """Per dimension: the element indices of the box (may be out of bounds) and the in-bounds mask."""
    idx = []
    for c, b, e, n in zip(coords, desc.box, desc.element_strides, desc.shape):
        i = int(c) + e * np.arange(-(-b // e)) if e > 1 else int(c) + np.arange(b)
        idx.append((i, (i >= 0) & (i < n)))
    return idx


def _tile_chunks(desc, row_bytes, nbytes):
    """Where each 16-byte chunk of the dense box (rows of ``row_bytes``) sits in the shared tile, in chunks:
    rows narrower than the swizzle span start a whole span apart, then the swizzle permutes the chunks."""
    span = int(desc.swizzle)
    c = np.arange(nbytes // 16)
    if not span:
        return c
    if row_bytes < span:  # each row takes a whole span (hardware, scripts/probe_swizzle_pad.py)
        per_row = row_bytes // 16
        c = (c // per_row) * (span // 16) + c % per_row
    return c ^ ((c >> 3) & (span // 16 - 1))


# -- operand checks the GPU build makes while typing, and the hardware's runtime rules -----------------------
# (the words of intrinsics/_define.py's typer checks: a kernel the GPU refuses fails here the same way)
def _numba_array_name(value):
    dtype = getattr(value, "dtype", None)
    ndim = getattr(value, "ndim", None)
    if dtype is None or ndim is None:
        return type(value).__name__
    flags = getattr(value, "flags", None)
    layout = "C" if flags is None or flags.c_contiguous else ("F" if flags.f_contiguous else "A")
    return f"array({np.dtype(dtype).name}, {ndim}d, {layout})"




def check_tile_operands(op, tile, desc, coords, load):
    """``tile`` a shared array of the descriptor's dtype, one integer coordinate per dimension (the typer's
    rules); for a load the innermost start coordinate a whole number of 16 bytes, and the tile aligned as TMA
    needs (the hardware's rules: the GPU stops the kernel with an illegal-instruction error)."""
    if not isinstance(tile, SharedArray):
        raise SimulatedTypingError(
            f"{op}: the shared-memory tile must be a shared-memory array (from cuda.shared.array); got "
            f"{_numba_array_name(tile)}, which is not known to live in shared memory (a kernel argument, a local "
            f"array, or a value mixed from several arrays)")
    if tile.dtype != desc.dtype and not _same_bits(tile.dtype, np.dtype(desc.dtype)):
        raise SimulatedTypingError(f"{op}: the shared tile has dtype {tile.dtype} but the descriptor moves "
                                   f"{np.dtype(desc.dtype).name} elements")
    if len(coords) != desc.rank:
        raise SimulatedTypingError(
            f"{op}: the descriptor has rank {desc.rank} (box {tuple(desc.box)}) but {len(coords)} coordinates were "
            f"given; pass one coordinate per dimension, in the array's own index order")
    for c in coords:
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
            got = np.asarray(c).dtype.name if isinstance(c, (float, np.generic)) else type(c).__name__
            raise SimulatedTypingError(f"{op}: every coordinate must be an integer, got {got}")
    itemsize = np.dtype(desc.dtype).itemsize
    if load and not getattr(desc, "interleave", 0) and (int(coords[-1]) * itemsize) % 16:
        step = 16 // int(np.gcd(16, itemsize))
        raise SimulatedMisuse(
            f"{op} at {_site_text()}: the innermost start coordinate of {tuple(int(c) for c in coords)} is "
            f"{int(coords[-1])} elements of {itemsize} bytes = {int(coords[-1]) * itemsize} bytes, not a multiple of "
            f"16 bytes; the GPU would stop the kernel with an illegal-instruction error (CUDA_ERROR_ILLEGAL_INSTRUCTION) "
            f"on this load. Start boxes at a column that is a multiple of {step}")
    align = tile_alignment(desc)
    address = int(tile.__array_interface__["data"][0])
    if address % align:
        need = "128 bytes" if align == 128 else f"{align} bytes (the repeat of its {int(desc.swizzle)}-byte swizzle)"
        site = getattr(tile, "__dict__", {}).get("_numbatma_site")
        declared = getattr(tile, "__dict__", {}).get("_numbatma_alignment")
        name = f"the shared tile {describe_site(site)}" if site else "the shared tile"
        raise SimulatedMisuse(
            f"{op} at {_site_text()}: {name} is at an address that is not a multiple of {need}, which TMA needs for "
            f"this descriptor"
            + (f" (it was declared with alignment={declared})" if declared else
               " (declared without alignment=, it may land anywhere)" if site else "")
            + f"; declare the buffer with alignment={align} and keep view offsets multiples of {align} bytes")


def _same_bits(a, b):
    """Tile and descriptor dtypes the GPU build types alike: a bfloat16 / float8 descriptor moves the bits of a
    uint16 / uint8 tile (NumPy has no such dtype of its own)."""
    return a.itemsize == b.itemsize and ({a.name, b.name} & {"bfloat16", "float8_e4m3fn", "float8_e5m2"}) \
        and {a.kind, b.kind} <= {"u", "i", "V", "f"}


def _site_text():
    site = caller_site()
    return f"{site[0]}:{site[1]}"


def tma_load(dst, desc, coords, bar):
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    check_tile_operands("tma_load", dst, desc, coords, True)
    src = _host_array(desc)
    idx = _box_index(desc, coords)
    shape = tuple(len(i) for i, _ in idx)
    fill = np.nan if (getattr(desc.oob_fill, "value", desc.oob_fill) == "nan" and desc.dtype.kind == "f") else 0
    box = np.full(shape, fill, dtype=desc.dtype)
    inb = [m for _, m in idx]
    sel = np.ix_(*[i[m] for i, m in idx])
    box[np.ix_(*[np.nonzero(m)[0] for m in inb])] = src[sel]
    raw = np.ascontiguousarray(box).view(np.uint8).reshape(-1)
    out = np.asarray(dst).reshape(-1).view(np.uint8) if dst.flags.c_contiguous else None
    footprint = int(np.prod(desc.shared_shape)) * desc.dtype.itemsize
    if out is None or out.size != footprint:
        raise SimulatedMisuse(
            f"tma_load: the shared tile holds {dst.nbytes} bytes (C-contiguous: {dst.flags.c_contiguous}) but a box "
            f"of the descriptor occupies {footprint} bytes (shared shape {desc.shared_shape})"
        )
    chunks = _tile_chunks(desc, box.shape[-1] * desc.dtype.itemsize, raw.size)
    out.reshape(-1, 16)[chunks] = raw.reshape(-1, 16)
    site = caller_site()
    with _lock:
        b, phase = mbarrier_complete_tx(bar, raw.size)
        lo, hi = bounds(out)
        fill_record = _add_fill(lo, hi, f"the tile the TMA load at {site[0]}:{site[1]} fills (coordinates {coords})",
                                [(b, phase)])
        fill_record.swizzle = int(desc.swizzle)


def tile_load_swizzles(array):
    """The TMA loads whose bytes ``array`` (a shared tile) currently holds: [(swizzle span, description)], for
    readers that interpret the bytes through a swizzle of their own (wgmma descriptors)."""
    lo, hi = bounds(array)
    with _lock:
        return [(f.swizzle, f.what) for f in _fills_over(block_state(), lo, hi)
                if f.alive and f.swizzle is not None and f.lo < hi and lo < f.hi]


def tma_store(desc, coords, src_tile, op="tma_store", combine=None):
    """A tile store (or, with ``combine(old, tile)``, a tile reduce): the tile, un-swizzled, lands in the
    in-bounds part of the box, and clipped rows are completed to 16 bytes as on the hardware."""
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    check_tile_operands(op, src_tile, desc, coords, False)
    if desc.store_overhang and not getattr(desc, "allow_store_overhang", False):
        # The GPU build refuses this at typing time (require_exact_store_target): same rule, same words.
        from numbatma.tensormap import store_overhang_error

        raise SimulatedMisuse(store_overhang_error(op, desc.dtype.name, desc.dtype.itemsize, desc.store_overhang,
                                                   desc.shape[-1]))
    dst = _host_array(desc)
    idx = _box_index(desc, coords)
    shape = tuple(len(i) for i, _ in idx)
    site = caller_site()
    with _lock:
        lo, hi = bounds(src_tile)
        _check_store_source(lo, hi, op)
        _add_store_read(lo, hi, site)
    tile = np.ascontiguousarray(src_tile).reshape(-1).view(np.uint8)
    footprint = int(np.prod(desc.shared_shape)) * desc.dtype.itemsize
    if tile.size != footprint:
        raise SimulatedMisuse(f"{op}: the shared tile holds {tile.size} bytes but a box of the descriptor "
                              f"occupies {footprint} bytes (shared shape {desc.shared_shape})")
    nbytes = int(np.prod(shape)) * desc.dtype.itemsize
    raw = tile.reshape(-1, 16)[_tile_chunks(desc, shape[-1] * desc.dtype.itemsize, nbytes)].reshape(-1)
    box = raw.view(desc.dtype).reshape(shape)
    sel = np.ix_(*[i[m] for i, m in idx])
    part = box[np.ix_(*[np.nonzero(m)[0] for _, m in idx])]
    if combine is None:
        dst[sel] = part
        _store_overhang(desc, dst, idx, box)
        return
    with _lock, np.errstate(over="ignore", invalid="ignore"):  # (each element's update is atomic on the GPU)
        dst[sel] = combine(dst[sel], part)
        _store_overhang(desc, dst, idx, box, combine)


def _store_overhang(desc, dst, idx, box, combine=None):
    """The hardware completes each innermost row a store clips to the next 16-byte boundary (see
    ``TensorMap.store_overhang``; only reached when the TensorMap allowed it): write those bytes too, into the
    memory that follows the row. Reduces do the same (observed on an H200): ``combine(old, tile)`` gives what
    lands there."""
    extra = desc.store_overhang // desc.dtype.itemsize
    inner_ok = idx[-1][1]
    if not extra or desc.element_strides[-1] != 1 or inner_ok.all() or not inner_ok[-1:].size or inner_ok[-1]:
        return  # nothing clipped at the row's end
    first = int(np.nonzero(inner_ok)[0][-1]) + 1 if inner_ok.any() else 0
    if first == 0:
        return  # the box lies entirely past the row: nothing is written
    extra = min(extra, inner_ok.size - first)
    outer = [i[m] for i, m in idx[:-1]]
    if any(o.size == 0 for o in outer):
        return
    n = dst.shape[-1]
    end = int(dst.__array_interface__["data"][0]) + sum(int(o.max()) * st for o, st in zip(outer, dst.strides)) \
        + (n + extra) * dst.strides[-1]
    root = dst
    while isinstance(root.base, np.ndarray):
        root = root.base
    limit = bounds(root)[1]
    if end > limit:
        raise SimulatedMisuse(
            f"tma_store at coordinates {tuple(int(i[0]) for i, _ in idx)}: the hardware completes the clipped rows "
            f"to 16 bytes and would write {end - limit} byte(s) past the end of the destination's memory "
            f"(TensorMap.store_overhang = {desc.store_overhang}); leave room after the last row"
        )
    wide = np.lib.stride_tricks.as_strided(dst, shape=dst.shape[:-1] + (n + extra,), strides=dst.strides)
    inner_box = np.arange(first, first + extra)
    sel = np.ix_(*outer, np.arange(n, n + extra))
    values = box[np.ix_(*[np.nonzero(m)[0] for _, m in idx[:-1]], inner_box)]
    wide[sel] = values if combine is None else combine(wide[sel], values)


# -- LDGSTS ------------------------------------------------------------------------------------------------------
def cp_async(dst, dst_index, src, src_index, nbytes):
    n = int(nbytes) // dst.dtype.itemsize
    target = _elements(dst, dst_index, n)
    target[:] = _elements(src, src_index, n)
    me = _thread()
    site = caller_site()
    with _lock:
        lo, hi = bounds(target)
        group = me.__dict__.get("_numbatma_cp_groups", 0)
        fill = _add_fill(lo, hi, f"the bytes the cp_async at {site[0]}:{site[1]} copies", [(("cp.async", me), group)])
        mine = me.__dict__.setdefault("_numbatma_cp_fills", [])
        mine.append(fill)
        if len(mine) > 64:  # only the copies not yet waited for matter to cp_async_mbarrier_arrive
            done = knowledge(me).get(("cp.async", me), 0)
            mine[:] = [f for f in mine if f.completions[0][1] >= done]


def _elements(array, index, n):
    """``n`` elements of ``array`` from ``index`` on (C order), as a plain NumPy view (no access checks)."""
    a = np.asarray(numpy_of(array))
    idx = (int(index),) if np.isscalar(index) else tuple(int(i) for i in index)
    flat = a.reshape(-1)
    if not np.shares_memory(flat, a):
        raise SimulatedMisuse("cp_async: the array must be C-contiguous")
    start = int(np.ravel_multi_index(idx, a.shape)) if len(idx) == a.ndim else idx[0]
    return flat[start:start + n]
