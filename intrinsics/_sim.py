"""The simulator *engine* under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs one block at a time, each thread a Python thread. This module keeps, per block, what every
instruction family shares: which threads are waiting on what - so that a wait that can never complete raises
:class:`SimulatedHang` naming each thread's wait, instead of hanging -, what each thread *knows* complete
(passed on through arrivals and block barriers), and the shared-memory bytes asynchronous copies touch.
Asynchronous copies move their bytes when they are issued, so a block is hung exactly when every live thread
waits and nothing it waits on can complete.

What is asynchronous on the GPU stays checkable: every copy in flight is recorded with the shared-memory
bytes it touches and what completes it (a barrier phase, a bulk group, a cp.async group). Shared arrays in
the simulator are :class:`SharedArray` views that check each read and write against those records and each
thread's knowledge, so a kernel that reads a tile before waiting for it, waits on the wrong parity,
overwrites a tile a TMA store is still reading, or stores a tile written without ``fence.proxy.async`` gets
:class:`SimulatedMisuse` naming the access, instead of a result that depends on timing.

The semantics of the instructions live beside them, in their family modules (``mbarrier.py``: barrier phases
and waits; ``tma.py``: tile copies; ``async_copy.py``: cp.async; ``bulk.py``: bulk copies and bulk groups;
``warp.py``: named barriers; ``fence.py``: fences; ...), and reach this engine through ``_define.sim()``. This
module imports no family module. The engine API - the only names of this module a family module uses:

* errors: ``SimulatedHang``, ``SimulatedMisuse``, ``SimulatedTypingError``;
* state: ``lock`` (the engine's one re-entrant lock: hold it while reading or changing shared records),
  ``block_local(name, factory=dict)`` (a family's own per-block state, created on first use; raises outside a
  simulated kernel), ``shared_allocation(site, shape, dtype)`` (block-shared storage keyed by call site);
* threads and sites: ``current_thread()``, ``thread_index()``, ``block_size()``, ``who(thread)`` (its
  threadIdx, for messages), ``caller_site()``, ``describe_site(site)``, ``describe_element(array, index)``,
  ``declared_site(array)``, ``call_argument(site, op, position)``, ``describe_array(array, site, op, position)``
  (an operand as messages name it: its variable, the kernel's spelling, where it was declared);
* waiting: ``wait_until(ready, describe, key)`` (sleep on channel ``key`` until ``ready`` returns true; part of
  the hang check), ``notify(key)`` (wake the threads waiting on ``key``: after every change that can make a wait
  ready), ``syncthreads()``;
* knowledge (happens-before): ``knowledge(thread)`` (key -> phases the thread knows complete),
  ``merge(into, other)``, ``release(thread)`` (count a release of the thread's accesses; returns what it carries),
  ``publish_knowledge(thread, key)`` / ``absorb_knowledge(thread, key)`` (both sides of a barrier instance);
* memory: ``numpy_of(array)``, ``bounds(array)``, ``address_of(array, index=0)``, ``BarrierRef``,
  ``barrier_of(bar)``, ``SharedArray``;
* hazards: ``add_fill(lo, hi, what, completions)`` (a copy writes shared bytes [lo, hi); readable once one of
  ``completions``, pairs (completion key, phase), is known complete; returns the fill record: its
  ``completions`` list may grow, ``swizzle`` may be set), ``live_fills(lo, hi)``, ``check_store_source(lo, hi,
  op)`` (the async proxy reads shared bytes: fills complete, generic writes fenced by fences ordered before it), ``add_store_read(lo, hi,
  site)`` (a store reads shared bytes until its bulk group is waited for), ``commit_store_reads(thread, group)``,
  ``retire_store_reads(thread, below)``, ``proxy_fence()`` (``fence.proxy.async``: this thread's generic writes
  are visible to the async proxy);
* asynchronous operand reads (wgmma): ``add_operand_read(lo, hi, owner, group, array, base, reader)`` (the
  threads of ``owner``, e.g. a warpgroup, issue a read of shared bytes [lo, hi) that lasts until their group
  ``group`` is retired; every member calls it before the issue completes), ``retire_operand_reads(owner,
  below)`` (the calling thread waited for the owner's groups below ``below``). Until a group is retired in the
  writing thread - or, for a thread outside the owner, until a retiring wait is ordered (happens-before) before
  the write - a copy into the bytes (``add_fill``) or a generic write of them is ``SimulatedMisuse`` naming the
  array, the reader's line and the write's; so is a thread that returns with its owner's reads not retired (a
  ``group_exchange`` that some thread of the group cannot join - the block is smaller, or it returned - is
  ``SimulatedHang`` at once);
* arithmetic: ``reduce_elements(kind, old, new)`` (the one element-wise reduction of tile and bulk reduces);
* exchange: ``warp_exchange(mask, value)``, ``group_exchange(name, size, value)``, the warp shuffles
  ``shfl(mask, value, lane)``, ``shfl_xor``, ``shfl_down``, ``shfl_up`` and ``syncwarp(mask)``.

A *completion key* (the first element of a completion pair) is a hashable object of the family that completes
the copy (an mbarrier, a thread's cp.async groups): ``knowledge`` maps it to the number of its phases known
complete, and it explains itself in messages with ``missing_wait(thread, phase)`` (what ``thread`` has not
waited for) and, optionally, ``refill_hint()`` (a hint appended when a refill races a reader, or "").

``numbatma/_numba_internals.py`` installs ``SharedArray``, ``publish_knowledge`` / ``absorb_knowledge``,
``thread_started`` / ``thread_exit``, ``syncwarp`` and ``shfl`` / ``shfl_xor`` / ``shfl_down`` / ``shfl_up``
into Numba's simulator. Only imported under the simulator; the GPU path never touches it.
"""
from __future__ import annotations

import functools
import sys
import threading
import time

import numpy as np

from numbatma._numba_internals import simulated_block, simulated_block_dim  # (numba's simulator threads)

lock = threading.RLock()


def _channel(key):
    """The condition (on the one lock) that threads waiting on ``key`` sleep on: a barrier's address, a named
    barrier, a warp. Waking only those threads (not every waiting thread of the block) keeps a block of
    hundreds of simulated threads from convoying on the lock."""
    channels = _block_state().channels
    cond = channels.get(key)
    if cond is None:
        cond = channels[key] = threading.Condition(lock)
    return cond


def notify(key):
    """Wake the threads waiting on channel ``key`` (``wait_until``); call it under ``lock``."""
    cond = _block_state().channels.get(key)
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
        self.local = {}  # name -> a family's own state (block_local)
        self.waiting = {}  # thread -> description (callable returning str, or None when it can progress)
        self.allocations = {}  # (file, line) -> numpy array (pipeline barrier storage)
        self.warps = {}  # warp -> exchange state of warp-synchronous operations
        self.fills = {}  # 128-byte line -> [_Fill]: shared bytes copies write, until a thread may read them
        self.unfenced = set()  # threads with shared writes not yet followed by fence.proxy.async
        self.fenced = set()  # threads with fenced shared writes (their fences' epochs: see proxy_fence)
        self.reads = []  # _StoreRead: shared bytes a TMA store still reads, until its group is waited for
        self.operand_reads = []  # _OperandRead: shared bytes an async reader (wgmma) reads until its group retires
        self.retirements = {}  # (owner, group) -> {thread: epoch of the wait that retired the group in it}
        self.operand_owners = {}  # owner -> the threads that issue its asynchronous reads
        self.exited = set()  # flat indices of the threads of the block that have returned
        self.sync_pool = {}  # barrier instance -> knowledge published there (key -> phases known complete)
        self.hang_checked = 0.0  # time of the last hang check
        self.channels = {}  # key -> threading.Condition (see _channel)
        self.started = 0  # threads of the block that have started (a hang needs every one started)


def _thread():
    return threading.current_thread()


def current_thread():
    """The calling simulated thread (families keep per-thread state as ``_numbatma_*`` attributes of it)."""
    return threading.current_thread()


def _block_state():
    """The state of the current simulated block (created on first use)."""
    manager = simulated_block(_thread())
    if manager is None:
        raise RuntimeError("numbatma intrinsics can only run inside a kernel launched in the CUDA simulator")
    state = getattr(manager, "_numbatma_state", None)
    if state is not None:
        return state
    with lock:
        state = getattr(manager, "_numbatma_state", None)
        if state is None:
            global _tracked
            state = manager._numbatma_state = _BlockState()
            _tracked = 0  # blocks run one after another: the previous block's records are gone
        return state


def block_local(name, factory=dict):
    """A family's own state for the running block under ``name`` (``factory()`` on first use): e.g. the
    mbarriers by address. Raises RuntimeError outside a kernel launched in the simulator."""
    local = _block_state().local
    value = local.get(name)
    if value is None:
        with lock:
            value = local.get(name)
            if value is None:
                value = local[name] = factory()
    return value


def thread_index():
    """Flat index of the calling thread in its block (x fastest)."""
    return _thread().thread_id


def block_size():
    """The number of threads of the running block."""
    return int(np.prod(simulated_block_dim(simulated_block(_thread()))))


def who(thread):
    """A thread as messages name it: its threadIdx."""
    return tuple(thread.threadIdx)


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


def _declared_name(site):
    """The variable the kernel line ``site`` assigns (``bar`` for ``bar = cuda.shared.array(...)``), or None."""
    import linecache
    import re

    m = re.match(r"\s*([A-Za-z_]\w*)\s*=", linecache.getline(site[0], site[1]))
    return m.group(1) if m else None


def describe_site(site):
    """``'bar' (declared at file:line)`` for the kernel line ``bar = cuda.shared.array(...)``."""
    name = _declared_name(site)
    return (f"'{name}' " if name else "") + f"(declared at {site[0]}:{site[1]})"


def declared_site(array):
    """(file, line) of the ``cuda.shared.array`` call that declared ``array`` or the array it is a view of;
    None for an array not declared in simulated shared memory."""
    a = array
    for _ in range(8):
        site = getattr(a, "__dict__", {}).get("_numbatma_site")
        if site is not None:
            return site
        a = getattr(a, "base", None)
        if not isinstance(a, np.ndarray):
            return None
    return None


def call_argument(site, op, position):
    """How the kernel line ``site`` spells positional argument ``position`` of its call to ``op`` (by the
    called name; else of the line's outermost call), or None (source not readable). Read once per site."""
    return _call_argument(tuple(site), op, position)


@functools.lru_cache(maxsize=4096)
def _call_argument(site, op, position):
    import ast
    import linecache

    text = ""
    for k in range(6):  # (a call may continue on the next lines)
        text += linecache.getline(site[0], site[1] + k)
        try:
            tree = ast.parse(text.strip())
            break
        except SyntaxError:
            continue
    else:
        return None
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    named = [c for c in calls if getattr(c.func, "id", getattr(c.func, "attr", None)) == op]
    call = (named or calls or [None])[0]
    if call is None or len(call.args) <= position:
        return None
    return ast.get_source_segment(text.strip(), call.args[position])


def describe_array(array, site, op, position):
    """An array operand as messages name it: ``'tile' (declared at file:line)``; a view: ``'ring[s]' (a view of
    'ring', declared at file:line)``; an array not in shared memory: ``'glob'`` - ``site`` is the kernel line
    of the call to ``op``, the operand its positional argument ``position``."""
    spelled = call_argument(site, op, position) if site else None
    declared = declared_site(array)
    if declared is None:
        return f"'{spelled}'" if spelled else "the operand"
    name = _declared_name(declared)
    where = f"declared at {declared[0]}:{declared[1]}"
    if spelled is None or spelled == name:
        return f"'{name or spelled}' ({where})" if (name or spelled) else f"the array {where}"
    return f"'{spelled}' (a view of '{name}', {where})" if name else f"'{spelled}' ({where})"


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
    name = _declared_name(site)
    return (f"'{name}[{index}]'" if name else f"element {index}") + f" (declared at {site[0]}:{site[1]})"


def barrier_of(bar):
    if isinstance(bar, BarrierRef):
        return bar
    if isinstance(bar, np.ndarray):
        site = getattr(bar, "__dict__", {}).get("_numbatma_site") or caller_site()
        return BarrierRef(address_of(bar), f"mbarrier {describe_site(site)}")
    raise TypeError(f"the mbarrier operand must be a shared uint64 array or mbarrier_ref(bars, i), got {bar!r}")


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


# -- waiting and hang detection ------------------------------------------------------------------------------
def _live_threads(manager):
    return [t for t in threading.enumerate() if simulated_block(t) is manager and t.is_alive()]


def wait_until(ready, describe, key):
    """Block the calling simulated thread until ``ready()``; raise SimulatedHang when every live thread of
    the block is waiting (here or in syncthreads) on something not ready. ``key`` names the channel the
    changes that can make it ready are notified on (``notify``); ``describe()`` says what it waits for."""
    me = _thread()
    manager = simulated_block(me)
    state = _block_state()
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
    if state.started < int(np.prod(simulated_block_dim(manager))):
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
    lines = [f"  thread {ids[0]}" + (f" (and {len(ids) - 1} more thread(s) with the same wait)" if len(ids) > 1 else "")
             + f": {what}" for what, ids in groups.items()]
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


# -- thread lifetime -------------------------------------------------------------------------------------------
def thread_started(thread):
    """Called by each simulated thread as it starts (numbatma's BlockThread.run wrapper)."""
    state = _block_state()
    with lock:
        state.started += 1


def thread_exit(thread):
    """Called by each simulated thread when its kernel function returned: a TMA store or bulk store/reduce it
    issued and did not wait for is still in flight - on the GPU the block's shared memory is released at
    exit while the copy engine may still read it."""
    state = getattr(simulated_block(thread), "_numbatma_state", None)
    if state is None:
        return
    with lock:
        me = thread.thread_id
        state.exited.add(me)
        for key, entry in state.warps.items():
            what = entry.get("what")
            if what is None or not entry["arrived"] or not what[3] * what[2] <= me < what[3] * what[2] + what[2]:
                continue
            name, site, size, group = what
            raise SimulatedHang(
                f"{name} at {site[0]}:{site[1]}, which all {size} threads {group * size}..{group * size + size - 1} "
                f"execute together (.sync.aligned): {entry['arrived']} of them wait in it, but thread {who(thread)} "
                f"returned without executing it - this kernel would hang on the GPU (or compute garbage). Issue it "
                f"from the whole group of {size} threads (not under `if tid == 0`)"
            )
        for r in [r for r in state.operand_reads
                  if thread not in r.done and thread in state.operand_owners.get(r.owner, ())]:
            raise SimulatedMisuse(
                f"thread {who(thread)} returns with {r.reader} still in flight (reading bytes [{r.lo - r.base}, "
                f"{r.hi - r.base}) of {r.array}): no wait retired its group (wgmma_commit_group after it, then "
                f"wgmma_wait_group). The block's shared memory is released when it exits while the tensor cores may "
                f"still read it"
            )
        for r in state.reads:
            if r.thread is thread:
                how = ("it was never committed (no bulk_commit_group after it)" if r.group is None else
                       "its bulk group was never waited for (no bulk_wait_group after bulk_commit_group)")
                raise SimulatedMisuse(
                    f"thread {who(thread)} exits with the store issued at {r.site} still in flight: {how}. The "
                    f"block's shared memory is released when it exits while the copy engine may still read the "
                    f"tile (and the data may not have reached global memory): end with bulk_commit_group() and "
                    f"bulk_wait_group(0) (or bulk_wait_group_read(0)) in the thread that issued the store"
                )


def syncthreads():
    _thread().syncthreads()


# -- knowledge: what each thread knows complete (happens-before) ------------------------------------------------
def knowledge(thread):
    """What ``thread`` knows complete: completion key (a barrier, a thread's cp.async groups) -> phases
    complete."""
    seen = thread.__dict__.get("_numbatma_seen")
    if seen is None:
        seen = thread._numbatma_seen = {}
    return seen


def merge(into, other):
    """Knowledge ``other`` joins ``into`` (per key, the larger count of phases)."""
    for key, phase in other.items():
        if into.get(key, 0) < phase:
            into[key] = phase


def release(thread):
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
    if simulated_block(thread) is None:
        return
    if key is None:
        n = thread.__dict__.get("_numbatma_syncs", 0) + 1
        thread._numbatma_syncs = n
        key = ("sync", n)
    with lock:
        pools = _block_state().sync_pool
        pool = pools.get(key)
        if pool is None:
            pool = pools[key] = {}
            # (nobody can still need the pool two instances back: this one opens only after all passed the last)
            pools.pop(key[:-1] + (key[-1] - 2,), None)
        merge(pool, release(thread))


def absorb_knowledge(thread, key=None):
    """After a block barrier: learn what the threads that passed it knew."""
    if simulated_block(thread) is None:
        return
    if key is None:
        key = ("sync", thread.__dict__.get("_numbatma_syncs", 0))
    with lock:
        merge(knowledge(thread), _block_state().sync_pool.get(key, {}))


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
            with lock:
                _block_state().unfenced.add(me)
        else:
            _note_unfenced(unfenced, lo, hi)
        if _tracked:
            _check_read(lo, hi, "writes")
            for r in _block_state().reads:
                if r.lo < hi and lo < r.hi:
                    raise SimulatedMisuse(
                        f"thread {who(me)} writes shared bytes [{lo - r.lo}, {hi - r.lo}) of a tile that the TMA "
                        f"store issued at {r.site} by thread {who(r.thread)} may still be reading: that thread "
                        f"must bulk_commit_group and bulk_wait_group_read (then a block barrier) before the "
                        f"tile is written again"
                    )
            reads = _block_state().operand_reads  # (replaced, never changed in place: no lock to look)
            if reads and any(r.lo < hi and lo < r.hi for r in reads):
                with lock:
                    _check_operand_reads(_block_state(), lo, hi, None)


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


class _Fill:
    """Shared bytes [lo, hi) an asynchronous copy writes; readable by a thread that knows one of
    ``completions`` ((key, phase): the copy completes with phase ``phase`` of completion key ``key``)."""

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
        self.group = None  # set by commit_store_reads (bulk_commit_group)


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


def live_fills(lo, hi):
    """The fill records of copies whose bytes [lo, hi) overlaps and still holds (not replaced by a later copy
    of the same bytes), e.g. to ask which swizzle a TMA load wrote them with. Call it under ``lock``."""
    return [f for f in _fills_over(_block_state(), lo, hi) if f.alive and f.lo < hi and lo < f.hi]


def _track(delta):
    global _tracked
    _tracked += delta


def _check_read(lo, hi, verb, record=True):
    """A generic access of shared bytes [lo, hi) (``verb``: reads / writes) must come after the copies that
    fill them are known complete; it is recorded on those copies (``_Fill.readers``) so that a later copy into
    the same bytes can check the access is ordered before it (``_check_refill``)."""
    me = _thread()
    state = _block_state()
    seen = knowledge(me)
    epoch = None
    for f in _fills_over(state, lo, hi):
        if f.lo < hi and lo < f.hi:
            if not f.visible(seen):
                raise SimulatedMisuse(f"thread {who(me)} {verb} shared bytes [{lo - f.lo}, {hi - f.lo}) of "
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
                refill_hint = getattr(key, "refill_hint", None)
                hint = refill_hint() if refill_hint is not None else ""
                if hint:
                    break
            raise SimulatedMisuse(
                f"thread {who(me)}: {what} refills shared bytes [{max(rlo, lo) - f.lo}, {min(rhi, hi) - f.lo}) "
                f"of {f.what}, which thread {who(t)} {did} at {site[0]}:{site[1]} with no happens-before edge from "
                f"that access to this copy: the copy may overwrite the bytes while that thread still uses them. The "
                f"reader must release the stage (consumer_release / mbarrier_arrive on the barrier the producer "
                f"waits for) and the producer wait for that release (producer_acquire / mbarrier_wait) before it "
                f"refills the stage{hint}"
            )


def _missing_wait(me, fill):
    """What ``me`` has not waited for, in the words of the fill's (first) completion key."""
    key, phase = fill.completions[0]
    return key.missing_wait(me, phase)


def add_fill(lo, hi, what, completions):
    """An asynchronous copy (``what``, for messages) writes shared bytes [lo, hi), readable by a thread that
    knows one of ``completions`` complete: [(completion key, phase)]. Checks first that every recorded access
    of bytes an earlier copy filled there is ordered before this point, and that no store still reads them.
    Returns the fill record. Call it under ``lock``."""
    state = _block_state()
    _check_refill(state, lo, hi, what, completions)
    for r in state.reads:
        if r.lo < hi and lo < r.hi:
            raise SimulatedMisuse(
                f"{what} overwrites shared bytes that the TMA store issued at {r.site} by thread {who(r.thread)} "
                f"may still be reading: wait for it with bulk_wait_group_read (and a block barrier) first"
            )
    if state.operand_reads:
        _check_operand_reads(state, lo, hi, what)
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
    for t in list(state.fenced):
        fenced = t.__dict__.get("_numbatma_fenced")
        if fenced:
            fenced[:] = [r for r in fenced if not (lo <= r[0] and r[1] <= hi)]
        if not fenced:
            state.fenced.discard(t)
    return new


_MAX_FENCED = 16  # fenced ranges kept per thread (the oldest go first: a missed report, never a false one)


def proxy_fence():
    """``fence.proxy.async`` of the calling thread: its generic writes to shared memory so far are visible to
    the async proxy - for a reader that the fence is ordered before (a later store or wgmma from those bytes,
    after a block barrier or an arrival that follows the fence). The fenced ranges keep the fence's epoch, so a
    fence that comes only after the synchronisation the reader relies on is reported (``check_store_source``)."""
    me = _thread()
    unfenced = me.__dict__.get("_numbatma_unfenced")
    if unfenced is not None:
        me._numbatma_unfenced = None
        epoch = knowledge(me).get(("clock", me), 0) + 1
        site = caller_site()
        with lock:  # (add_fill drops fenced ranges a copy replaces)
            fenced = me.__dict__.get("_numbatma_fenced") or []
            fenced = [r for r in fenced if not any(u[0] <= r[0] and r[1] <= u[1] for u in unfenced)]
            fenced.extend([u[0], u[1], epoch, site] for u in unfenced)
            me._numbatma_fenced = fenced[-_MAX_FENCED:]
            state = _block_state()
            state.unfenced.discard(me)
            state.fenced.add(me)


def check_store_source(lo, hi, op, name=None):
    """The async proxy (a store ``op``, a wgmma operand) reads shared bytes [lo, hi): the copies that fill
    them must be known complete, and every thread's generic writes to them fenced (``proxy_fence``) by a fence
    ordered (happens-before) before this point. Call it under ``lock``."""
    me = _thread()
    _check_read(lo, hi, f"{op} reads", record=False)
    for t in list(_block_state().unfenced):
        for r in t.__dict__.get("_numbatma_unfenced") or ():
            if r[0] < hi and lo < r[1]:
                holder = "this thread" if t is me else f"thread {who(t)}"
                raise SimulatedMisuse(
                    f"thread {who(me)}: {op} from a shared tile that {holder} wrote (bytes [{max(r[0], lo) - lo}, "
                    f"{min(r[1], hi) - lo}) of it) without fence_proxy_async_shared_cta afterwards: the TMA unit "
                    f"may read the old bytes. Every writing thread fences, then a block barrier, then the store"
                    + (f" (the tile: {name})" if name else "")
                )
    seen = None
    for t in list(_block_state().fenced):
        if t is me:  # (program order)
            continue
        for r in t.__dict__.get("_numbatma_fenced") or ():
            if r[0] < hi and lo < r[1]:
                if seen is None:
                    seen = knowledge(me)
                if seen.get(("clock", t), 0) < r[2]:
                    raise SimulatedMisuse(
                        f"thread {who(me)}: {op} from a shared tile that thread {who(t)} wrote (bytes "
                        f"[{max(r[0], lo) - lo}, {min(r[1], hi) - lo}) of it) and fenced at {r[3][0]}:{r[3][1]} "
                        f"(fence_proxy_async_shared_cta), but no synchronisation orders that fence before this "
                        f"read: the writer fences *before* the block barrier (or the arrival) that this thread "
                        f"passes after it; a fence after the barrier leaves the async proxy free to read the old bytes"
                        + (f" (the tile: {name})" if name else "")
                    )


def add_store_read(lo, hi, site, name=None):
    """A store of the calling thread (issued at kernel line ``site``) reads shared bytes [lo, hi) until its
    bulk group is waited for (``commit_store_reads``, ``retire_store_reads``). Call it under ``lock``."""
    state = _block_state()
    me = _thread()
    text = f"{site[0]}:{site[1]}" + (f" (from {name})" if name else "")
    state.reads.append(_StoreRead(lo, hi, me, text))
    _track(1)


def commit_store_reads(thread, group):
    """``thread``'s stores not yet in a bulk group join its group number ``group``."""
    with lock:
        for r in _block_state().reads:
            if r.thread is thread and r.group is None:
                r.group = group


def retire_store_reads(thread, below):
    """``thread``'s bulk groups numbered below ``below`` are done: their stores read no more."""
    with lock:
        state = _block_state()
        kept = [r for r in state.reads if not (r.thread is thread and r.group is not None and r.group < below)]
        _track(len(kept) - len(state.reads))
        state.reads = kept


class _OperandRead:
    """Shared bytes [lo, hi) that an asynchronous reader of thread group ``owner`` (a wgmma's shared operand)
    reads from its issue until group ``group`` of that owner is retired; ``done`` (shared by the records of one
    group) maps each thread that retired the group to the epoch of its retiring wait."""

    def __init__(self, lo, hi, owner, group, array, base, reader, done):
        self.lo, self.hi, self.owner, self.group = lo, hi, owner, group
        self.array, self.base, self.reader, self.done = array, base, reader, done


def add_operand_read(lo, hi, owner, group, array, base, reader):
    """An asynchronous read issued together by the threads of group ``owner`` (e.g. a warpgroup: every member
    calls this, before the issue completes) reads shared bytes [lo, hi) of ``array`` (its name for messages;
    ``base``: its address, so messages give offsets into it) until the owner's group number ``group`` is retired
    (``retire_operand_reads``). ``reader`` says what reads, for messages ("the B operand of the wgmma issued at
    f:12"). Until then any write of the bytes - a copy (``add_fill``) or a generic write - is misuse; after it,
    a write by another thread must be ordered (happens-before) after a retiring wait. An older read of the same
    owner whose bytes the new one covers is dropped (its group retires no later)."""
    state = _block_state()
    me = _thread()
    with lock:
        state.operand_owners.setdefault(owner, set()).add(me)
        reads = state.operand_reads
        for r in reads:
            if r.owner == owner and r.group == group and r.lo == lo and r.hi == hi:
                return  # (another member recorded it)
        kept = [r for r in reads if not (r.owner == owner and r.group < group and lo <= r.lo and r.hi <= hi)]
        _track(len(kept) - len(reads) + 1)
        done = state.retirements.setdefault((owner, group), {})
        kept.append(_OperandRead(lo, hi, owner, group, array, base, reader, done))
        state.operand_reads = kept


def retire_operand_reads(owner, below):
    """The calling thread waited for ``owner``'s groups numbered below ``below`` (e.g. ``wgmma.wait_group``):
    their reads are done as far as this thread (and whoever it releases to afterwards) is concerned."""
    me = _thread()
    retired = me.__dict__.get("_numbatma_retired")
    if retired is None:
        retired = me._numbatma_retired = {}
    start = retired.get(owner, 0)
    if below <= start:
        return
    retired[owner] = below
    epoch = knowledge(me).get(("clock", me), 0) + 1
    with lock:
        retirements = _block_state().retirements
        for g in range(start, below):
            done = retirements.get((owner, g))
            if done is not None:
                done[me] = epoch


def _check_operand_reads(state, lo, hi, writer):
    """A write of shared bytes [lo, hi) (``writer`` says which, for messages) must not land on bytes an
    asynchronous reader still reads: its group retired in this thread (a member of the owner), or, for another
    thread, a retiring wait ordered (happens-before) before this point. Call it under ``lock``."""
    me = None
    for r in state.operand_reads:
        if not (r.lo < hi and lo < r.hi):
            continue
        if me is None:
            me = _thread()
            seen = knowledge(me)
        done = r.done
        if me in done:
            continue
        member = me in state.operand_owners.get(r.owner, ())
        if not member and any(seen.get(("clock", t), 0) >= e for t, e in done.items()):
            continue
        if writer is None:  # a generic write: the kernel line
            site = caller_site()
            writer = f"the st.shared at {site[0]}:{site[1]}"
        where = f"bytes [{max(lo, r.lo) - r.base}, {min(hi, r.hi) - r.base}) of {r.array}"
        if member or not done:
            why = ((f"this thread has not executed the wait that retires it (wgmma_wait_group covering that "
                    f"wgmma's commit group)" if member else
                    f"no thread of the issuing warpgroup has executed the wait that retires it yet")
                   + ": the tensor cores may still be reading the old bytes. Wait for the group (wgmma_wait_group) "
                     "before the bytes are written again")
        else:
            t, e = next(iter(done.items()))
            why = (f"thread {who(t)} retired it (wgmma_wait_group), but no synchronisation orders that wait before "
                   f"this write - e.g. the stage was released (mbarrier_arrive / consumer_release) before the "
                   f"wgmma_wait_group that retires the wgmma reading it. Release a stage only after that wait")
        raise SimulatedMisuse(f"thread {who(me)}: {writer} writes {where} while {r.reader} may still read them: {why}")


# -- element-wise reductions (tile reduces in tma.py, bulk reduces in bulk.py) -----------------------------------
def reduce_elements(kind, old, new):
    """``old <kind> new`` element-wise with PTX semantics (NumPy arrays of the element dtype): add (integers
    wrap around, floats round to the element type), min, max, inc (``old >= new ? 0 : old + 1``), dec
    (``old == 0 or old > new ? new : old - 1``), and, or, xor.

    min/max of floats follow np.fmin / np.fmax: PTX min/max without ``.NaN`` return the non-NaN operand when
    one operand is NaN - what an H100 does through the tile reduce (float16, bfloat16) and the bulk reduce (float16):
    scripts/probe_reduce_nan.py, tests/test_gpu_reduce_nan.py."""
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "add":
            return old + new
        if kind in ("min", "max"):
            if old.dtype.kind == "f" or old.dtype.name == "bfloat16":
                pick = np.fmin if kind == "min" else np.fmax
                work = np.float64 if old.dtype.itemsize == 8 else np.float32
                return pick(old.astype(work), new.astype(work)).astype(old.dtype)
            return np.minimum(old, new) if kind == "min" else np.maximum(old, new)
        if kind == "inc":
            return np.where(old >= new, old.dtype.type(0), old + old.dtype.type(1))
        if kind == "dec":
            return np.where((old == 0) | (old > new), new, old - old.dtype.type(1))
        bitwise = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}.get(kind)
        if bitwise is None:
            raise ValueError(kind)
        return bitwise(old, new)


# -- warp-level exchange (shuffles, syncwarp) -----------------------------------------------------------
def _warp_key():
    t = _thread()
    return t.thread_id // 32, t.thread_id % 32


def warp_exchange(mask, value):
    """Every lane named in ``mask`` contributes ``value``; returns the 32 contributions (None for lanes
    outside the mask) once all of them have arrived - what a ``.sync`` warp instruction sees."""
    state = _block_state()
    warp, lane = _warp_key()
    mask = int(mask) & 0xFFFFFFFF
    if not mask >> lane & 1:
        raise SimulatedMisuse(f"a warp-synchronous operation was called by lane {lane}, which its mask "
                              f"0x{mask:08x} leaves out (undefined on the GPU)")
    site = caller_site()
    with lock:
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
            notify(("warp", warp))

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
    state = _block_state()
    me = thread_index()
    group, rank = me // size, me % size
    key = ("group", size, group)
    site = caller_site()
    with lock:
        threads = block_size()
        gone = sorted(i for i in state.exited if group * size <= i < group * size + size)
        if group * size + size > threads or gone:
            raise SimulatedHang(
                f"{name} at {site[0]}:{site[1]}, which all {size} threads {group * size}..{group * size + size - 1} "
                f"execute together (.sync.aligned): thread {who(_thread())} executes it, but "
                + (f"the block has only {threads} threads" if gone == [] else
                   f"{len(gone)} of them already returned (thread index {gone[0]}{', ...' if len(gone) > 1 else ''})")
                + f" - this kernel would hang on the GPU (or compute garbage). Issue it from the whole group of "
                  f"{size} threads (not under `if tid == 0`)"
            )
        entry = state.warps.setdefault(key, {"generation": 0, "values": [None] * size, "arrived": 0, "result": None})
        entry["what"] = (name, site, size, group)
        generation = entry["generation"]
        entry["values"][rank] = value
        entry["arrived"] += 1
        if entry["arrived"] == size:
            entry["result"] = (generation, list(entry["values"]))
            entry["values"] = [None] * size
            entry["arrived"] = 0
            entry["generation"] += 1
            notify(key)

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
    state = _block_state()
    with lock:
        a = state.allocations.get(site)
        if a is None:
            a = state.allocations[site] = np.zeros(shape, dtype)
        return a
