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
  simulated kernel), ``shared_allocation(site, shape, dtype)`` (block-shared storage keyed by call site),
  ``block_state()`` (the running block's records: for ``_sim_memory.py`` only);
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
* hazards (defined in ``_sim_memory.py``, re-exported here): ``add_fill(lo, hi, what, completions)`` (a copy
  writes shared bytes [lo, hi); readable once one of ``completions``, pairs (completion key, phase), is known
  complete; returns the fill record: its ``completions`` list may grow, ``swizzle`` may be set),
  ``live_fills(lo, hi)``, ``check_store_source(lo, hi, op)`` (the async proxy reads shared bytes: fills complete,
  generic writes fenced by fences ordered before it), ``add_store_read(lo, hi, site)`` (a store reads shared
  bytes until its bulk group is waited for), ``commit_store_reads(thread, group)``,
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

from numbatma import errors
from numbatma._numba_internals import simulated_block, simulated_block_dim  # (numba's simulator threads)
from numbatma.intrinsics import _sim_memory  # (the shared-memory hazards: re-exported below)

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


# The simulator's exceptions are the host's (numbatma/errors.py: public as numbatma.SimulatedHang & co.).
SimulatedHang = errors.SimulatedHang
SimulatedMisuse = errors.SimulatedMisuse
SimulatedTypingError = errors.SimulatedTypingError


# -- per-block state ----------------------------------------------------------------------------------------
class _BlockState:
    def __init__(self):
        self.local = {}  # name -> a family's own state (block_local)
        self.waiting = {}  # thread -> description (callable returning str, or None when it can progress)
        self.allocations = {}  # (file, line) -> numpy array (pipeline barrier storage)
        self.warps = {}  # warp -> exchange state of warp-synchronous operations
        self.fills = {}  # 128-byte line -> [_sim_memory._Fill]: shared bytes copies write, until a thread may read them
        self.fills_version = 0  # bumped by every add_fill (what caches of the fills compare)
        self.swizzle_cache = {}  # (lo, hi) -> (fills_version, tma.tile_load_swizzles' answer)
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
            state = manager._numbatma_state = _BlockState()
            _sim_memory._tracked = 0  # blocks run one after another: the previous block's records are gone
        return state


def block_state():
    """The running block's record (``_BlockState``: its fills, store reads, operand reads, fenced and unfenced
    writers), for the shared-memory hazards (``_sim_memory.py``); raises RuntimeError outside a simulated kernel."""
    return _block_state()


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
def wake_block(manager):
    """Wake every thread of ``manager``'s block that waits on a channel (``wait_until``), at once: called once the
    block manager has set their ``abort`` flags, so that they end now rather than at their wait's next timeout
    (up to 0.25 s; a failed launch waits for its threads to end)."""
    state = getattr(manager, "_numbatma_state", None)
    if state is None:
        return
    with lock:
        for cond in state.channels.values():
            cond.notify_all()


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


# -- shared-memory hazards (intrinsics/_sim_memory.py; re-exported: part of the engine API) ----------------------
SharedArray = _sim_memory.SharedArray
live_fills = _sim_memory.live_fills
add_fill = _sim_memory.add_fill
proxy_fence = _sim_memory.proxy_fence
check_store_source = _sim_memory.check_store_source
add_store_read = _sim_memory.add_store_read
commit_store_reads = _sim_memory.commit_store_reads
retire_store_reads = _sim_memory.retire_store_reads
add_operand_read = _sim_memory.add_operand_read
retire_operand_reads = _sim_memory.retire_operand_reads


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


class Contributions(list):
    """What :func:`group_exchange` gives back: the group's contributions in thread order - one object, the same for
    every thread of the group at that exchange - and :meth:`once`, which computes a value the whole group shares
    (the 64 x N product of a ``wgmma``) for the first thread that asks and hands it to the others."""

    def __init__(self, values):
        super().__init__(values)
        self._memo = {}
        self._lock = threading.Lock()

    def once(self, key, compute):
        """``compute()``, evaluated once per ``key`` for this exchange (a thread that finds it computed takes it)."""
        with self._lock:
            if key not in self._memo:
                self._memo[key] = compute()
            return self._memo[key]


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
            entry["result"] = (generation, Contributions(entry["values"]))
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
    """``bar.warp.sync``: the lanes of ``mask`` meet, and - as PTX guarantees memory ordering among the threads
    taking part - each learns what the others knew (a release of each lane's accesses so far, as at a block
    barrier): a lane's shared-memory reads before it are ordered before another lane's release after it (e.g. lane
    0's arrival on a pipeline's empty barrier)."""
    thread = _thread()
    carried = None
    if simulated_block(thread) is not None:
        with lock:
            carried = dict(release(thread))
    values = warp_exchange(mask, carried)
    if carried is not None:
        with lock:
            mine = knowledge(thread)
            for other in values:
                if other is not None:
                    merge(mine, other)


# -- block-shared storage keyed by call site ----------------------------------------------------------------
def shared_allocation(site, shape, dtype):
    state = _block_state()
    with lock:
        a = state.allocations.get(site)
        if a is None:
            a = state.allocations[site] = np.zeros(shape, dtype)
        return a


_sim_memory.bind_engine()  # (the hazards module reads the engine through its API: the names above)
