"""Shared-memory hazards of the simulator engine: the bytes asynchronous copies fill, stores and wgmma operands read.

Part of the engine (``_sim.py`` re-exports every public name here; families reach them only through
``_define.sim()``, as the engine API that ``_sim.py``'s docstring lists). Shared arrays are :class:`SharedArray`
views whose every element access is checked against the copies in flight (``add_fill``), the stores still
reading (``add_store_read``), the asynchronous operand reads (``add_operand_read``) and each thread's
knowledge; generic writes not yet fenced for the async proxy are recorded per thread (``proxy_fence``). The
records live in the engine's per-block state (``_sim.block_state()``); the engine resets ``_tracked`` when a
block starts. Only imported under the simulator.
"""
from __future__ import annotations

import numpy as np

_sim = None  # the engine (intrinsics/_sim.py), bound by bind_engine() as the engine finishes loading


def bind_engine():
    """Called once by the engine at the end of its import: bind ``_sim`` to it. (The engine imports this module to
    re-export its names, so an import of the engine here at module level would close an import circle.)"""
    global _sim
    from numbatma.intrinsics import _sim  # noqa: F401 (binds the global)


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
        me = _sim.current_thread()
        unfenced = me.__dict__.get("_numbatma_unfenced")
        if unfenced is None:
            me._numbatma_unfenced = [[lo, hi]]
            with _sim.lock:
                _sim.block_state().unfenced.add(me)
        else:
            _note_unfenced(unfenced, lo, hi)
        if _tracked:
            _check_read(lo, hi, "writes")
            for r in _sim.block_state().reads:
                if r.lo < hi and lo < r.hi:
                    raise _sim.SimulatedMisuse(
                        f"thread {_sim.who(me)} writes shared bytes [{lo - r.lo}, {hi - r.lo}) of a tile that the TMA "
                        f"store issued at {r.site} by thread {_sim.who(r.thread)} may still be reading: that thread "
                        f"must bulk_commit_group and bulk_wait_group_read (then a block barrier) before the "
                        f"tile is written again"
                    )
            reads = _sim.block_state().operand_reads  # (replaced, never changed in place: no lock to look)
            if reads and any(r.lo < hi and lo < r.hi for r in reads):
                with _sim.lock:
                    _check_operand_reads(_sim.block_state(), lo, hi, None)


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
        return _sim.bounds(view)
    return _sim.bounds(array)  # fancy indexing: the whole array, conservatively


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
    return [f for f in _fills_over(_sim.block_state(), lo, hi) if f.alive and f.lo < hi and lo < f.hi]


def _track(delta):
    global _tracked
    _tracked += delta


def _check_read(lo, hi, verb, record=True):
    """A generic access of shared bytes [lo, hi) (``verb``: reads / writes) must come after the copies that
    fill them are known complete; it is recorded on those copies (``_Fill.readers``) so that a later copy into
    the same bytes can check the access is ordered before it (``_check_refill``)."""
    me = _sim.current_thread()
    state = _sim.block_state()
    seen = _sim.knowledge(me)
    epoch = None
    for f in _fills_over(state, lo, hi):
        if f.lo < hi and lo < f.hi:
            if not f.visible(seen):
                raise _sim.SimulatedMisuse(f"thread {_sim.who(me)} {verb} shared bytes [{lo - f.lo}, {hi - f.lo}) of "
                                      f"{f.what}, before that copy is known complete: {_missing_wait(me, f)}")
            if record:
                if epoch is None:
                    epoch = seen.get(("clock", me), 0) + 1
                r = f.readers.get(me)
                if r is None or r[0] != epoch:
                    f.readers[me] = [epoch, lo, hi, _sim.caller_site(), verb]
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
    me = _sim.current_thread()
    seen = None
    for f in _fills_over(state, lo, hi):
        if not (f.alive and f.readers and f.lo < hi and lo < f.hi):
            continue
        if seen is None:
            seen = _sim.knowledge(me)
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
            raise _sim.SimulatedMisuse(
                f"thread {_sim.who(me)}: {what} refills shared bytes [{max(rlo, lo) - f.lo}, {min(rhi, hi) - f.lo}) "
                f"of {f.what}, which thread {_sim.who(t)} {did} at {site[0]}:{site[1]} with no happens-before edge "
                f"from that access to this copy: the copy may overwrite the bytes while that thread still uses them. "
                f"The reader must release the stage (consumer_release / mbarrier_arrive on the barrier the producer "
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
    state = _sim.block_state()
    _check_refill(state, lo, hi, what, completions)
    for r in state.reads:
        if r.lo < hi and lo < r.hi:
            raise _sim.SimulatedMisuse(
                f"{what} overwrites shared bytes that the TMA store issued at {r.site} by thread {_sim.who(r.thread)} "
                f"may still be reading: wait for it with bulk_wait_group_read (and a block barrier) first"
            )
    if state.operand_reads:
        _check_operand_reads(state, lo, hi, what)
    new = _Fill(lo, hi, what, completions)
    state.fills_version += 1
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
    me = _sim.current_thread()
    unfenced = me.__dict__.get("_numbatma_unfenced")
    if unfenced is not None:
        me._numbatma_unfenced = None
        epoch = _sim.knowledge(me).get(("clock", me), 0) + 1
        site = _sim.caller_site()
        with _sim.lock:  # (add_fill drops fenced ranges a copy replaces)
            fenced = me.__dict__.get("_numbatma_fenced") or []
            fenced = [r for r in fenced if not any(u[0] <= r[0] and r[1] <= u[1] for u in unfenced)]
            fenced.extend([u[0], u[1], epoch, site] for u in unfenced)
            me._numbatma_fenced = fenced[-_MAX_FENCED:]
            state = _sim.block_state()
            state.unfenced.discard(me)
            state.fenced.add(me)


def check_store_source(lo, hi, op, name=None):
    """The async proxy (a store ``op``, a wgmma operand) reads shared bytes [lo, hi): the copies that fill
    them must be known complete, and every thread's generic writes to them fenced (``proxy_fence``) by a fence
    ordered (happens-before) before this point. Call it under ``lock``."""
    me = _sim.current_thread()
    _check_read(lo, hi, f"{op} reads", record=False)
    for t in list(_sim.block_state().unfenced):
        for r in t.__dict__.get("_numbatma_unfenced") or ():
            if r[0] < hi and lo < r[1]:
                holder = "this thread" if t is me else f"thread {_sim.who(t)}"
                raise _sim.SimulatedMisuse(
                    f"thread {_sim.who(me)}: {op} from a shared tile that {holder} wrote (bytes [{max(r[0], lo) - lo}, "
                    f"{min(r[1], hi) - lo}) of it) without fence_proxy_async_shared_cta afterwards: the TMA unit "
                    f"may read the old bytes. Every writing thread fences, then a block barrier, then the store"
                    + (f" (the tile: {name})" if name else "")
                )
    seen = None
    for t in list(_sim.block_state().fenced):
        if t is me:  # (program order)
            continue
        for r in t.__dict__.get("_numbatma_fenced") or ():
            if r[0] < hi and lo < r[1]:
                if seen is None:
                    seen = _sim.knowledge(me)
                if seen.get(("clock", t), 0) < r[2]:
                    raise _sim.SimulatedMisuse(
                        f"thread {_sim.who(me)}: {op} from a shared tile that thread {_sim.who(t)} wrote (bytes "
                        f"[{max(r[0], lo) - lo}, {min(r[1], hi) - lo}) of it) and fenced at {r[3][0]}:{r[3][1]} "
                        f"(fence_proxy_async_shared_cta), but no synchronisation orders that fence before this "
                        f"read: the writer fences *before* the block barrier (or the arrival) that this thread "
                        f"passes after it; a fence after the barrier leaves the async proxy free to read the old bytes"
                        + (f" (the tile: {name})" if name else "")
                    )


def add_store_read(lo, hi, site, name=None):
    """A store of the calling thread (issued at kernel line ``site``) reads shared bytes [lo, hi) until its
    bulk group is waited for (``commit_store_reads``, ``retire_store_reads``). Call it under ``lock``."""
    state = _sim.block_state()
    me = _sim.current_thread()
    text = f"{site[0]}:{site[1]}" + (f" (from {name})" if name else "")
    state.reads.append(_StoreRead(lo, hi, me, text))
    _track(1)


def commit_store_reads(thread, group):
    """``thread``'s stores not yet in a bulk group join its group number ``group``."""
    with _sim.lock:
        for r in _sim.block_state().reads:
            if r.thread is thread and r.group is None:
                r.group = group


def retire_store_reads(thread, below):
    """``thread``'s bulk groups numbered below ``below`` are done: their stores read no more."""
    with _sim.lock:
        state = _sim.block_state()
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
    state = _sim.block_state()
    me = _sim.current_thread()
    with _sim.lock:
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
    me = _sim.current_thread()
    retired = me.__dict__.get("_numbatma_retired")
    if retired is None:
        retired = me._numbatma_retired = {}
    start = retired.get(owner, 0)
    if below <= start:
        return
    retired[owner] = below
    epoch = _sim.knowledge(me).get(("clock", me), 0) + 1
    with _sim.lock:
        retirements = _sim.block_state().retirements
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
            me = _sim.current_thread()
            seen = _sim.knowledge(me)
        done = r.done
        if me in done:
            continue
        member = me in state.operand_owners.get(r.owner, ())
        if not member and any(seen.get(("clock", t), 0) >= e for t, e in done.items()):
            continue
        if writer is None:  # a generic write: the kernel line
            site = _sim.caller_site()
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
            why = (f"thread {_sim.who(t)} retired it (wgmma_wait_group), but no synchronisation orders that wait "
                   f"before this write - e.g. the stage was released (mbarrier_arrive / consumer_release) before the "
                   f"wgmma_wait_group that retires the wgmma reading it. Release a stage only after that wait")
        raise _sim.SimulatedMisuse(
            f"thread {_sim.who(me)}: {writer} writes {where} while {r.reader} may still read them: {why}")

