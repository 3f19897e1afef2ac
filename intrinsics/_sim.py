"""Runtime of the intrinsics under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs one block at a time, each thread a Python thread. This module keeps, per block: the
state of every mbarrier (keyed by its shared-memory address), named barriers, the pipelines' barrier
storage, and which threads are waiting on what - so that a wait that can never complete raises
:class:`SimulatedHang` naming the barrier, its phase, the arrivals and the transaction bytes, instead of
hanging. Asynchronous copies complete when they are issued (their bytes land at once), so a block is
hung exactly when every live thread waits and nothing it waits on can complete.

Only imported under the simulator; the GPU path never touches it.
"""
from __future__ import annotations

import threading
import time
import traceback

import numpy as np

_lock = threading.RLock()
_changed = threading.Condition(_lock)  # notified whenever a barrier, named barrier or warp exchange moves


class SimulatedHang(RuntimeError):
    """Every live thread of a block waits on something that can no longer happen."""


class SimulatedMisuse(RuntimeError):
    """An operation whose result on the GPU would be undefined (wrong byte counts, uninitialised barrier)."""


# -- per-block state ----------------------------------------------------------------------------------------
class _BlockState:
    def __init__(self):
        self.barriers = {}  # address -> _MBarrier
        self.named = {}  # id -> [arrived, generation]
        self.waiting = {}  # thread -> description (callable returning str, or None when it can progress)
        self.allocations = {}  # (file, line) -> numpy array (pipeline barrier storage)
        self.warps = {}  # warp -> exchange state of warp-synchronous operations


def _thread():
    return threading.current_thread()


def block_state():
    """The state of the current simulated block (created on first use)."""
    manager = getattr(_thread(), "_manager", None)
    if manager is None:
        raise RuntimeError("numbatma intrinsics can only run inside a kernel launched in the CUDA simulator")
    with _lock:
        state = getattr(manager, "_numbatma_state", None)
        if state is None:
            state = manager._numbatma_state = _BlockState()
        return state


def thread_index():
    """Flat index of the calling thread in its block (x fastest)."""
    return _thread().thread_id


_OWN_DIRS = None


def caller_site(depth=None):
    """(file, line) of the innermost frame outside numbatma and Numba's simulator: the kernel line that
    called the intrinsic. (``depth`` is ignored; kept for callers.)"""
    global _OWN_DIRS
    if _OWN_DIRS is None:
        import os

        import numba.cuda.simulator as simulator

        import numbatma

        here = os.path.dirname(os.path.abspath(__file__))
        _OWN_DIRS = (here + os.sep, os.path.dirname(os.path.abspath(numbatma.__file__)) + os.sep,
                     os.path.dirname(os.path.abspath(simulator.__file__)) + os.sep)
    for frame in reversed(traceback.extract_stack()[:-1]):
        if not frame.filename.startswith(_OWN_DIRS):
            return frame.filename, frame.lineno
    return "<unknown>", 0


# -- addresses -------------------------------------------------------------------------------------------------
class BarrierRef:
    """``mbarrier_ref(bars, i)`` under the simulator: the address of a barrier and a name for messages."""

    def __init__(self, address, name):
        self.address = address
        self.name = name


def address_of(array, index=0):
    return int(array.__array_interface__["data"][0]) + index * array.dtype.itemsize


def barrier_of(bar):
    if isinstance(bar, BarrierRef):
        return bar
    if isinstance(bar, np.ndarray):
        site = caller_site()
        return BarrierRef(address_of(bar), f"barrier at {site[0]}:{site[1]}")
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

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count
            self.arrivals_done = 0

    def describe(self):
        return (f"{self.name}: phase {self.phase} (parity {self.phase & 1}) waits for {self.count} arrivals "
                f"(got {self.arrivals_done}) and has {self.tx} transaction bytes outstanding")


def _barrier_state(ref, op):
    state = block_state()
    b = state.barriers.get(ref.address)
    if b is None:
        raise SimulatedMisuse(f"{op}: {ref.name} was never initialised (mbarrier_init); on the GPU this is undefined")
    return b


def mbarrier_init(bar, count):
    ref = barrier_of(bar)
    if not 1 <= int(count) < (1 << 20):
        raise SimulatedMisuse(f"mbarrier_init: the arrival count must be in 1..2**20-1, got {count}")
    with _lock:
        block_state().barriers[ref.address] = _MBarrier(int(count), ref.name)
        _changed.notify_all()


def mbarrier_inval(bar):
    ref = barrier_of(bar)
    with _lock:
        block_state().barriers.pop(ref.address, None)


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
        b.pending -= int(count)
        b.arrivals_done += int(count)
        b._maybe_complete()
        _changed.notify_all()
        return np.uint64(token)


def mbarrier_expect_tx(bar, nbytes):
    ref = barrier_of(bar)
    with _lock:
        _barrier_state(ref, "mbarrier_expect_tx").tx += int(nbytes)


def mbarrier_complete_tx(bar, nbytes):
    ref = barrier_of(bar)
    with _lock:
        b = _barrier_state(ref, "mbarrier_complete_tx")
        b.tx -= int(nbytes)
        b._maybe_complete()
        _changed.notify_all()


def _phase_done(b, parity):
    """True when the phase with ``parity`` is complete: the current (incomplete) phase has parity
    ``b.phase & 1``; the other parity names the phase just before it, which is complete."""
    return (b.phase & 1) != (int(parity) & 1)


def test_wait_parity(bar, parity):
    ref = barrier_of(bar)
    with _lock:
        return _phase_done(_barrier_state(ref, "mbarrier_test_wait_parity"), parity)


def test_wait_token(bar, token):
    ref = barrier_of(bar)
    with _lock:
        return _barrier_state(ref, "mbarrier_test_wait").phase > int(token)


def wait_parity(bar, parity):
    ref = barrier_of(bar)
    site = caller_site()

    def ready():
        return _phase_done(_barrier_state(ref, "mbarrier_wait_parity"), parity)

    def describe():
        b = block_state().barriers[ref.address]
        return f"mbarrier_wait_parity({ref.name}, parity {int(parity) & 1}) at {site[0]}:{site[1]}; {b.describe()}"

    wait_until(ready, describe)


def wait_token(bar, token):
    ref = barrier_of(bar)
    site = caller_site()

    def ready():
        return _barrier_state(ref, "mbarrier_wait").phase > int(token)

    def describe():
        b = block_state().barriers[ref.address]
        return f"mbarrier_wait({ref.name}, token of phase {int(token)}) at {site[0]}:{site[1]}; {b.describe()}"

    wait_until(ready, describe)


# -- waiting and hang detection ------------------------------------------------------------------------------
def _live_threads(manager):
    return [t for t in threading.enumerate() if getattr(t, "_manager", None) is manager and t.is_alive()]


def wait_until(ready, describe):
    """Block the calling simulated thread until ``ready()``; raise SimulatedHang when every live thread of
    the block is waiting (here or in syncthreads) on something not ready."""
    me = _thread()
    manager = me._manager
    state = block_state()
    me._numbatma_ready = ready
    try:
        _wait_loop(me, manager, state, ready, describe)
    finally:
        me._numbatma_ready = None


def _wait_loop(me, manager, state, ready, describe):
    idle = 0.0
    with _changed:
        while not ready():
            state.waiting[me] = describe
            if idle >= 0.05:  # nothing moved for a while: is every live thread of the block stuck?
                _check_hang(me, manager, state)
            if getattr(me, "abort", False):
                raise RuntimeError("aborted: another simulated thread failed")
            start = time.monotonic()
            woken = _changed.wait(timeout=0.01)
            idle = 0.0 if woken else idle + (time.monotonic() - start)
        state.waiting.pop(me, None)


def _check_hang(me, manager, state):
    live = _live_threads(manager)
    stuck = all(t in state.waiting or getattr(t, "syncthreads_blocked", False) for t in live)
    if not stuck or any(_ready_safely(t) for t in live if t in state.waiting):
        return
    lines = []
    for t in live:
        where = state.waiting.get(t)
        what = where() if where else "cuda.syncthreads()"
        lines.append(f"  thread {tuple(t.threadIdx)}: {what}")
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


# -- named barriers -----------------------------------------------------------------------------------------
def named_barrier(barrier_id, threads, wait):
    state = block_state()
    site = caller_site()
    with _lock:
        entry = state.named.setdefault(int(barrier_id), [0, 0])
        generation = entry[1]
        entry[0] += 1
        if entry[0] >= int(threads):
            entry[0] = 0
            entry[1] += 1
            _changed.notify_all()
    if not wait:
        return

    def ready():
        return state.named[int(barrier_id)][1] != generation

    def describe():
        n = state.named[int(barrier_id)][0]
        return f"named_barrier_sync({int(barrier_id)}, {int(threads)}) at {site[0]}:{site[1]}; {n} arrived"

    wait_until(ready, describe)


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
            _changed.notify_all()

    def ready():
        return entry["generation"] != generation

    def describe():
        return (f"warp {warp} lane {lane} in a warp-synchronous operation (mask 0x{mask:08x}) at "
                f"{site[0]}:{site[1]}; {entry['arrived']} lanes arrived")

    wait_until(ready, describe)
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
def _host_array(desc):
    """The NumPy array (sharing memory) behind a TensorMap's array under the simulator."""
    a = desc.array
    while not isinstance(a, np.ndarray):
        inner = getattr(a, "_ary", None)
        if inner is None:
            inner = getattr(a, "_item", None)
        if inner is None:
            raise TypeError(f"cannot reach the host memory of {type(desc.array).__name__} in the simulator")
        a = inner
    return a


def _box_index(desc, coords):
    """Per dimension: the element indices of the box (may be out of bounds) and the in-bounds mask."""
    idx = []
    for c, b, e, n in zip(coords, desc.box, desc.element_strides, desc.shape):
        i = int(c) + e * np.arange(-(-b // e)) if e > 1 else int(c) + np.arange(b)
        idx.append((i, (i >= 0) & (i < n)))
    return idx


def swizzle_chunks(nbytes, span):
    """Permutation of 16-byte chunks that TMA's ``span``-byte swizzle applies within a tile: chunk c goes to
    c ^ ((c >> 3) & (span / 16 - 1)) (16-byte chunk index XOR the 128-byte row index, modulo the span)."""
    c = np.arange(nbytes // 16)
    if not span:
        return c
    return c ^ ((c >> 3) & (span // 16 - 1))


def tma_load(dst, desc, coords, bar):
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    src = _host_array(desc)
    idx = _box_index(desc, coords)
    shape = tuple(len(i) for i, _ in idx)
    fill = np.nan if (getattr(desc.oob_fill, "value", desc.oob_fill) == "nan" and desc.dtype.kind == "f") else 0
    box = np.full(shape, fill, dtype=desc.dtype)
    inb = [m for _, m in idx]
    sel = np.ix_(*[i[m] for i, m in idx])
    box[np.ix_(*[np.nonzero(m)[0] for m in inb])] = src[sel]
    raw = np.ascontiguousarray(box).view(np.uint8).reshape(-1)
    out = dst.reshape(-1).view(np.uint8) if dst.flags.c_contiguous else None
    if out is None or out.size != raw.size:
        raise SimulatedMisuse(
            f"tma_load: the shared tile holds {dst.nbytes} bytes (C-contiguous: {dst.flags.c_contiguous}) but a box "
            f"of the descriptor is {raw.size} bytes"
        )
    span = int(desc.swizzle)
    if span:
        perm = swizzle_chunks(raw.size, span)
        out16 = out.reshape(-1, 16)
        out16[perm] = raw.reshape(-1, 16)
    else:
        out[:] = raw
    mbarrier_complete_tx(bar, raw.size)


def tma_store(desc, coords, src_tile):
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    dst = _host_array(desc)
    idx = _box_index(desc, coords)
    shape = tuple(len(i) for i, _ in idx)
    raw = np.ascontiguousarray(src_tile).reshape(-1).view(np.uint8)
    span = int(desc.swizzle)
    if span:
        perm = swizzle_chunks(raw.size, span)
        raw = raw.reshape(-1, 16)[perm].reshape(-1)
    box = raw.view(desc.dtype).reshape(shape)
    inb = [m for _, m in idx]
    dst[np.ix_(*[i[m] for i, m in idx])] = box[np.ix_(*[np.nonzero(m)[0] for m in inb])]


# -- LDGSTS ------------------------------------------------------------------------------------------------------
def cp_async(dst, dst_index, src, src_index, nbytes):
    d = dst[dst_index:] if np.isscalar(dst_index) else dst[tuple(dst_index)]
    s = src[src_index:] if np.isscalar(src_index) else src[tuple(src_index)]
    n = int(nbytes) // dst.dtype.itemsize
    dflat = np.atleast_1d(d).reshape(-1) if np.ndim(d) else None
    if dflat is None:  # a tuple index gave one element: address the memory directly
        dflat = _flat_from(dst, dst_index)
        sflat = _flat_from(src, src_index)
    else:
        sflat = np.atleast_1d(s).reshape(-1)
    dflat[:n] = sflat[:n]


def _flat_from(array, index):
    base = np.ravel_multi_index(tuple(int(i) for i in index), array.shape)
    return array.reshape(-1)[base:]
