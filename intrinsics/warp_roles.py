"""Building blocks of warp-specialized tensor-core kernels: roles and register budgets, named-barrier turns,
persistent tile orders, the (lagged) release of pipeline stages and the TMA-store tail.

A warp-specialized kernel runs ``1 + consumers`` warpgroups of 128 threads: warpgroup 0 produces (one elected
thread issues the TMA loads of a :class:`Pipeline`), warpgroups ``1..consumers`` compute (wgmma) and store.
Each block is a ``cuda.jit(device=True, inline="always")`` function, or a factory of one where a value must be a
compile-time constant (a register count, a barrier's thread count, a wait depth): after inlining the kernel is
the code written out by hand. They are built from public intrinsics only, so the simulator runs them with those
intrinsics' semantics. Host-side helpers (``register_budget``, ``persistent_grid``, the ``.py_func`` of the tile
orders) are plain Python.

Named barriers (ids 0..15; 0 is ``cuda.syncthreads()``): consumer warpgroup ``c`` synchronises its own 128
threads on id ``1 + c`` (:func:`warpgroup_sync`); :func:`pingpong` takes the ids after those by default
(``1 + consumers ..``), :func:`tile_handoff` the one after pingpong's (``1 + 2 consumers``), :func:`store_warp`
the ``2 consumers`` after that (``2 + 2 consumers ..``).

docs/tensor_cores.md ("Building blocks for warp-specialized kernels") shows a kernel written with them;
kernels/gemm.py and kernels/attention.py are built on them.
"""
from __future__ import annotations

import functools
from collections import namedtuple

from numba import cuda

from .fence import fence_proxy_async_shared_cta
from .tma import bulk_commit_group, bulk_wait_group_read
from .warp import named_barrier_arrive, named_barrier_sync, setmaxnreg_dec, setmaxnreg_inc
from .wgmma import wgmma_wait_group

__all__ = ["WARPGROUP", "REGISTER_FILE", "RegisterBudget", "register_budget", "warp_specialize", "warpgroup_sync",
           "PingPong", "pingpong", "tile_origin", "persistent_item", "persistent_share", "persistent_grid",
           "wait_release", "LaggedRelease", "lagged_release", "store_release", "StoreBuffers", "store_buffers",
           "TileHandoff", "tile_handoff", "StoreWarp", "store_warp"]

PTX = {}  # (no instruction of its own: every block is made of other families' intrinsics)

WARPGROUP = 128  # threads of a warpgroup (4 warps): the unit of wgmma and of setmaxnreg
REGISTER_FILE = 65536  # 32-bit registers of an SM's register file, all a CTA of 1 per SM may hold
_MAX_PER_THREAD = 248  # the largest multiple of 8 a thread may hold at launch (the ISA's limit is 255)


# -- roles and register budgets ---------------------------------------------------------------------------------
RegisterBudget = namedtuple("RegisterBudget", "launch producer consumer consumers threads")
RegisterBudget.__doc__ = """Registers per thread of a warp-specialized kernel: ``launch`` (the kernel's
``cuda.jit(max_registers=launch)``: every thread at launch), ``producer`` (warpgroup 0 after
``setmaxnreg_dec``), ``consumer`` (each consumer warpgroup after ``setmaxnreg_inc``); ``threads`` per block."""


def register_budget(consumers, producer=40, register_file=REGISTER_FILE):
    """The register budgets of a kernel with one producer warpgroup and ``consumers`` consumer warpgroups, so
    that the block holds the whole register file and setmaxnreg only moves registers between warpgroups:

    * ``launch`` = the register file over the block's ``128 (1 + consumers)`` threads, rounded down to a
      multiple of 8 (at most 248): 168 for 2 consumers (168 x 384 = 64,512 <= 65,536);
    * ``consumer`` = what the producer gives back, shared by the consumers:
      ``(launch x threads - producer x 128) / (consumers x 128)``, rounded down to a multiple of 8, at most
      256: ``(64,512 - 40 x 128) / 256 = 232`` for 2 consumers and a producer of 40.

    ``producer``: a multiple of 8 in 24..256, no more than ``launch``. Raises ``ValueError`` when a rule is
    broken or the budgets cannot fit (``producer x 128 + consumers x consumer x 128 <= launch x threads``)."""
    if not isinstance(consumers, int) or not 1 <= consumers <= 7:
        raise ValueError(f"register_budget: consumers must be an int in 1..7 (8 warpgroups at most), got {consumers!r}")
    if not isinstance(producer, int) or producer % 8 or not 24 <= producer <= 256:
        raise ValueError(f"register_budget: producer must be a multiple of 8 in 24..256 (setmaxnreg's rule), "
                         f"got {producer!r}")
    threads = WARPGROUP * (1 + consumers)
    launch = min(_MAX_PER_THREAD, register_file // threads // 8 * 8)
    if producer > launch:
        raise ValueError(f"register_budget: producer={producer} is more than the {launch} registers each of the "
                         f"{threads} threads has at launch; setmaxnreg_dec can only lower it")
    consumer = min(256, (launch * threads - producer * WARPGROUP) // (consumers * WARPGROUP) // 8 * 8)
    if consumer < launch:
        raise ValueError(f"register_budget: with producer={producer}, {consumers} consumer warpgroups get {consumer} "
                         f"registers, fewer than the {launch} they start with; lower the producer's budget")
    assert producer * WARPGROUP + consumers * consumer * WARPGROUP <= launch * threads <= register_file
    return RegisterBudget(launch, producer, consumer, consumers, threads)


@functools.lru_cache(maxsize=None)
def warp_specialize(budget, producer, consumer):
    """A device function ``run(args)`` that splits the block into its roles, for a kernel built with
    ``cuda.jit(max_registers=budget.launch)`` and ``budget.threads`` threads: warpgroup 0 lowers its register
    limit to ``budget.producer`` (``setmaxnreg_dec``) and calls ``producer(args)``; consumer warpgroup
    ``c = threadIdx.x // 128 - 1`` raises its limit to ``budget.consumer`` (``setmaxnreg_inc``) and calls
    ``consumer(c, args)``. ``args``: one tuple of what the roles need (a :class:`Pipeline`, shared arrays,
    descriptors, sizes; a closure cannot take ``*args`` when inlined). ``producer`` and ``consumer`` are
    ``cuda.jit(device=True, inline="always")`` functions returning nothing. Every thread calls ``run`` once.

    What ptxas keeps warp-uniform (the uniform datapath, no extra registers) depends on where values are made:
    compute what both roles share (tile counts, this CTA's share of the work) before ``run`` and pass it in
    ``args``; calling each role's body in its branch (rather than returning a role and branching on it again)
    keeps the tile arithmetic uniform too - the GEMM's left the uniform datapath otherwise (~130 more vector
    instructions). Large per-role values are best made inside the role: values live across setmaxnreg may be
    spilled."""
    low, high = budget.producer, budget.consumer

    @cuda.jit(device=True, inline="always")
    def run(args):
        wg = cuda.threadIdx.x // WARPGROUP
        if wg == 0:
            setmaxnreg_dec(low)
            producer(args)
        else:
            setmaxnreg_inc(high)
            consumer(wg - 1, args)

    return run


@cuda.jit(device=True, inline="always")
def warpgroup_sync(c):
    """Synchronise the 128 threads of consumer warpgroup ``c`` (named barrier ``1 + c``; ``bar.sync``)."""
    named_barrier_sync(1 + c, WARPGROUP)


# -- ping-pong: consumer warpgroups take turns -------------------------------------------------------------------
PingPong = namedtuple("PingPong", "start wait_turn pass_turn finish")
PingPong.__doc__ = """The four device functions of :func:`pingpong`: ``start(c, active)``, ``wait_turn(c)``,
``pass_turn(c)``, ``finish(c, active)``."""


@functools.lru_cache(maxsize=None)
def pingpong(consumers=2, first_barrier=None):
    """Turns between ``consumers`` consumer warpgroups (a ring: consumer ``c`` hands over to ``c + 1``, the last to
    consumer 0), so that one's non-tensor-core work (a softmax, an epilogue) runs under the others' wgmma. Named
    barrier ``first_barrier + c`` (default ``1 + consumers``, after the :func:`warpgroup_sync` ids) is consumer
    ``c``'s turn; each has 256 participants: ``c`` waiting (``bar.sync``) and ``c - 1`` handing over
    (``bar.arrive``).

    * ``start(c, active)``: once before the loop; the last consumer hands the first turn to consumer 0.
    * ``wait_turn(c)`` before issuing, ``pass_turn(c)`` after issuing (then wait for the wgmma as usual).
    * ``finish(c, active)``: once after the loop; consumer 0 takes the last hand-over, balancing ``start``.

    ``active``: whether this CTA has any work (all consumers of the CTA agree); a consumer that takes a turn every
    item keeps the ring balanced."""
    if first_barrier is None:
        first_barrier = 1 + consumers
    if not isinstance(consumers, int) or consumers < 2 or first_barrier < 1 or first_barrier + consumers > 16:
        raise ValueError(f"pingpong: needs consumers >= 2 (an int) and barrier ids {first_barrier}.."
                         f"{first_barrier + consumers - 1} within 1..15, got consumers={consumers!r}, "
                         f"first_barrier={first_barrier!r}")
    last = consumers - 1
    pair = 2 * WARPGROUP

    @cuda.jit(device=True, inline="always")
    def start(c, active):
        if c == last and active:
            named_barrier_arrive(first_barrier, pair)

    @cuda.jit(device=True, inline="always")
    def wait_turn(c):
        named_barrier_sync(first_barrier + c, pair)

    @cuda.jit(device=True, inline="always")
    def pass_turn(c):
        named_barrier_arrive(first_barrier + (c + 1) % consumers, pair)

    @cuda.jit(device=True, inline="always")
    def finish(c, active):
        if c == 0 and active:
            named_barrier_sync(first_barrier, pair)

    return PingPong(start, wait_turn, pass_turn, finish)


# -- persistent tile orders --------------------------------------------------------------------------------------
def _tile_origin(t, tiles_m, tiles_n, group_m):
    """(tile row, tile column) of tile ``t`` of a ``tiles_m x tiles_n`` grid in the grouped raster order: tiles run
    down ``group_m`` tile rows (fewer in the last group), then across, so consecutive tiles (the CTAs running at
    once) share rows of A and columns of B in L2. ``t`` in ``0 .. tiles_m * tiles_n - 1``; a bijection."""
    per_group = group_m * tiles_n
    group = t // per_group
    first_m = group * group_m
    rows_here = min(tiles_m - first_m, group_m)
    r = t - group * per_group
    return first_m + r % rows_here, r // rows_here


#: Device function (and host function: ``tile_origin.py_func``); see ``_tile_origin``.
tile_origin = cuda.jit(device=True, inline="always")(_tile_origin)
tile_origin.__doc__ = _tile_origin.__doc__


@cuda.jit(device=True, inline="always")
def persistent_item(r, snake):
    """The work item this CTA takes in round ``r`` of a persistent loop (``G = gridDim.x`` CTAs): ``r G + c``
    (``c = blockIdx.x``), or with ``snake`` true ``r G + G - 1 - c`` in the odd rounds - with items ordered
    longest first (causal attention) every CTA's total comes out nearly even. Items past the last are the
    caller's to skip (only in the last round)."""
    g = cuda.gridDim.x
    if snake and r % 2 == 1:
        return r * g + g - 1 - cuda.blockIdx.x
    return r * g + cuda.blockIdx.x


@cuda.jit(device=True, inline="always")
def persistent_share(ntiles):
    """This CTA's share of ``ntiles`` work items in a persistent grid: ``(first, step, mine)``; the CTA takes
    items ``first + i * step`` for ``i`` in ``range(mine)`` (``first = blockIdx.x``, ``step = gridDim.x``).
    The host side is :func:`persistent_grid`."""
    first = cuda.blockIdx.x
    step = cuda.gridDim.x
    mine = (ntiles - first + step - 1) // step
    return first, step, mine


def persistent_grid(items, sms=None, ctas_per_sm=1):
    """Host side: the blocks of a persistent grid - enough to fill ``sms`` SMs (``ctas_per_sm`` each), never more
    than there are ``items`` (at least 1). ``sms``: by default the current device's SM count
    (:func:`numbatma.devices.sm_count`; pass ``sm_count(d)`` for the device a launch will run on)."""
    if sms is None:
        from numbatma.devices import sm_count

        sms = sm_count()
    for what, value in (("items", items), ("sms", sms), ("ctas_per_sm", ctas_per_sm)):
        if not isinstance(value, int) or value < (0 if what == "items" else 1):
            raise ValueError(f"persistent_grid: {what} must be an int >= {0 if what == 'items' else 1}, got {value!r}")
    return max(1, min(items, sms * ctas_per_sm))


# -- releasing pipeline stages -----------------------------------------------------------------------------------
LaggedRelease = namedtuple("LaggedRelease", "step drain")
LaggedRelease.__doc__ = """The two device functions of :func:`lagged_release`: ``acc = step(pipe, acc, i, lane)``
after each committed wgmma group, ``acc = drain(pipe, acc, lane)`` after the last."""


def _release_local(pipe):
    pipe.consumer_release()


_release_local = cuda.jit(device=True, inline="always")(_release_local)


@functools.lru_cache(maxsize=None)
def wait_release(lag, release=None):
    """A device function ``acc = wait(pipe, acc, lane)``: wait until at most ``lag`` (0..7) wgmma groups are
    pending (``wgmma_wait_group(lag)`` on ``acc``) and lane 0 of each warp gives the oldest stage of ``pipe`` back
    (``release(pipe)``: by default ``pipe.consumer_release()``). Unconditional, so that ptxas sees every wgmma
    waited for on every path: a loop whose first ``lag`` steps are written out before it (as attention's "overlap"
    schedule does) uses this inside it rather than :func:`lagged_release`'s ``step`` - a wait under a branch
    ptxas cannot decide makes it serialize every wgmma of the kernel (warning C7513)."""
    if not isinstance(lag, int) or not 0 <= lag <= 7:
        raise ValueError(f"wait_release: lag must be an int in 0..7 (wgmma.wait_group's range), got {lag!r}")
    give_back = _release_local if release is None else release

    @cuda.jit(device=True, inline="always")
    def wait(pipe, acc, lane):
        acc = wgmma_wait_group(lag, acc)
        if lane == 0:
            give_back(pipe)
        return acc

    return wait


@functools.lru_cache(maxsize=None)
def lagged_release(lag, release=None):
    """The consumer side of a :class:`Pipeline` read by wgmma, keeping ``lag`` (0..7) groups in flight: call
    ``acc = step(pipe, acc, i, lane)`` right after committing the group of this thread's ``i``-th stage (``i``
    from 0, per tile or per kernel): from ``i = lag`` on it waits until at most ``lag`` groups are pending
    (``wgmma_wait_group(lag)``) and lane 0 of each warp gives the oldest stage back (``release(pipe)``: by
    default ``pipe.consumer_release()``; the pipeline's ``consumer_arrivals`` counts warps). After the last
    stage, ``acc = drain(pipe, acc, lane)`` waits for every group and releases the stages still held - the
    caller guarantees at least ``lag`` stages were stepped (``lag`` 0 or 1: any number >= 1). ``lag = 1`` (with
    2+ stages) keeps the next k-step's loads landing while this one multiplies; ``lag = 0`` for one stage."""
    if not isinstance(lag, int) or not 0 <= lag <= 7:
        raise ValueError(f"lagged_release: lag must be an int in 0..7 (wgmma.wait_group's range), got {lag!r}")
    give_back = _release_local if release is None else release
    wait = wait_release(lag, release)

    @cuda.jit(device=True, inline="always")
    def step(pipe, acc, i, lane):
        if i >= lag:
            acc = wait(pipe, acc, lane)
        return acc

    @cuda.jit(device=True, inline="always")
    def drain(pipe, acc, lane):
        if lag > 0:
            acc = wgmma_wait_group(0, acc)
            if lane == 0:
                for _ in range(lag):
                    give_back(pipe)
        return acc

    return LaggedRelease(step, drain)


@functools.lru_cache(maxsize=None)
def store_release(lag):
    """A device function ``release(pipe, i)`` for the consumer side of a :class:`Pipeline` whose stage ``i``
    (counted from 0 by this thread) was just TMA-stored: commit the stores issued as one bulk group; from the
    ``lag``-th stage on, wait until at most ``lag`` groups are still reading shared memory
    (``cp.async.bulk.wait_group.read lag``: the store of stage ``i - lag`` has read its tile) and release the
    oldest stage to the producer. ``lag = 0``: each stage is released once its own store has read it; ``1``:
    the store stays in flight while the next stage is computed. Call ``bulk_wait_group(0)`` once at the end.
    (CuTe DSL calls this a TMA-store pipeline.)"""

    @cuda.jit(device=True, inline="always")
    def release(pipe, i):
        bulk_commit_group()
        if i >= lag:
            bulk_wait_group_read(lag)
            pipe.consumer_release()

    return release


# -- the TMA-store tail of an epilogue ---------------------------------------------------------------------------
StoreBuffers = namedtuple("StoreBuffers", "acquire publish")
StoreBuffers.__doc__ = """The two device functions of :func:`store_buffers`: ``acquire(c, tw)`` before writing a
buffer, ``publish(c, tw)`` after (True in the thread that then TMA-stores it and commits)."""


@functools.lru_cache(maxsize=None)
def store_buffers(count, wait_in_publish=False):
    """An epilogue's rotating shared buffers (``count`` per consumer warpgroup, 1..8), written by a warpgroup
    (``wgmma_store``) and TMA-stored by its first thread: the buffer of chunk ``j`` is ``j % count``.

    * ``acquire(c, tw)`` before writing the next buffer of consumer warpgroup ``c`` (``tw`` = thread in the
      warpgroup): thread 0 waits until the store that last read this buffer (``count`` chunks ago) has read it
      (``bulk_wait_group_read(count - 1)``), then the warpgroup synchronises (:func:`warpgroup_sync`).
    * ``publish(c, tw)`` after writing it: ``fence.proxy.async.shared::cta`` (the generic-proxy writes become
      visible to TMA), the warpgroup synchronises; returns ``tw == 0``: that thread issues ``tma_store`` (only
      inside the destination: see ``numbatma.kernels``' exact stores) and ``bulk_commit_group()``.

    ``wait_in_publish=True`` (``count`` >= 2): one barrier per chunk instead of two. ``publish``'s thread 0 waits,
    before the barrier, until the stores up to ``count - 1`` chunks back have read their buffers
    (``bulk_wait_group_read(count - 2)``), so after that barrier the next chunk's buffer is free and ``acquire``
    does nothing. The wait comes one chunk earlier than ``acquire``'s (the store it waits for was issued a
    chunk ago rather than two): the right trade where a chunk takes long to compute (attention backward's dQ:
    one per query block), not for a burst of chunks (a GEMM epilogue).

    The caller guarantees thread 0 commits one bulk group per chunk and calls ``bulk_wait_group(0)`` before
    the kernel ends."""
    if not isinstance(count, int) or not 1 <= count <= 8:
        raise ValueError(f"store_buffers: count must be an int in 1..8, got {count!r}")
    if wait_in_publish and count < 2:
        raise ValueError("store_buffers: wait_in_publish needs count >= 2 (with one buffer the next chunk's "
                         "store must wait for the last one to be read before it is written: acquire's barrier)")
    pending = count - 1
    earlier = count - 2  # (wait_in_publish: the stores that may still be reading when a chunk is published)

    if wait_in_publish:
        @cuda.jit(device=True, inline="always")
        def acquire(c, tw):
            pass  # (the last publish's barrier came after the read of this buffer's previous store)

        @cuda.jit(device=True, inline="always")
        def publish(c, tw):
            fence_proxy_async_shared_cta()
            if tw == 0:
                bulk_wait_group_read(earlier)
            warpgroup_sync(c)
            return tw == 0

        return StoreBuffers(acquire, publish)

    @cuda.jit(device=True, inline="always")
    def acquire(c, tw):
        if tw == 0:
            bulk_wait_group_read(pending)
        warpgroup_sync(c)

    @cuda.jit(device=True, inline="always")
    def publish(c, tw):
        fence_proxy_async_shared_cta()
        warpgroup_sync(c)
        return tw == 0

    return StoreBuffers(acquire, publish)


# -- a shared tile written by ordinary stores, then read by wgmma or TMA ------------------------------------------
TileHandoff = namedtuple("TileHandoff", "own all")
TileHandoff.__doc__ = """The two device functions of :func:`tile_handoff`: ``own(c)`` (consumer warpgroup ``c``'s
threads) and ``all()`` (every consumer warpgroup's)."""


@functools.lru_cache(maxsize=None)
def tile_handoff(consumers=2, barrier=None):
    """Hand a shared-memory tile that consumer warpgroups wrote with ordinary stores (``wgmma_store``, plain
    shared-array writes) to the asynchronous proxy that reads it next (a wgmma operand, a TMA store):
    ``fence.proxy.async.shared::cta`` (the writes become visible to it), then a barrier.

    * ``own(c)``: consumer warpgroup ``c``'s 128 threads (:func:`warpgroup_sync`) - the tile is the warpgroup's own;
    * ``all()``: the threads of all ``consumers`` warpgroups (``bar.sync`` on named barrier ``barrier``, default
      ``1 + 2 consumers``: after :func:`warpgroup_sync`'s and :func:`pingpong`'s ids) - each wrote part of a tile
      that each reads whole (numbatma.kernels.AttentionBackward: the two halves of dSᵀ, both read by dQ = dS K).

    Every consumer warpgroup calls ``all()`` the same number of times."""
    if barrier is None:
        barrier = 1 + 2 * consumers
    if not isinstance(consumers, int) or consumers < 1 or not isinstance(barrier, int) or not 1 <= barrier <= 15:
        raise ValueError(f"tile_handoff: needs consumers >= 1 (an int) and a barrier id in 1..15, got "
                         f"consumers={consumers!r}, barrier={barrier!r}")
    threads = consumers * WARPGROUP

    @cuda.jit(device=True, inline="always")
    def own(c):
        fence_proxy_async_shared_cta()
        warpgroup_sync(c)

    @cuda.jit(device=True, inline="always")
    def every_consumer():
        fence_proxy_async_shared_cta()
        named_barrier_sync(barrier, threads)

    return TileHandoff(own, every_consumer)


# -- a store warp: TMA stores / reduce-adds issued for the consumers ---------------------------------------------
StoreWarp = namedtuple("StoreWarp", "acquire publish free take")
StoreWarp.__doc__ = """The four device functions of :func:`store_warp`: the consumers' ``acquire(c)`` /
``publish(c)`` around writing their buffer, the store warp's ``free(lane)`` / ``take(c)`` around storing it."""


@functools.lru_cache(maxsize=None)
def store_warp(consumers=2, first_barrier=None):
    """Consumer warpgroups hand a shared buffer each to one **store warp** (a warp of the producer warpgroup) that
    issues its TMA stores or reduce-adds, so that a consumer never waits for a TMA issue, a bulk-group wait or a
    barrier of its own warpgroup - FA3's and FA4's dQ writer in the attention backward. Two named barriers per
    consumer ``c``, each of 160 threads (the warpgroup's 128 and the store warp's 32): "full"
    ``first_barrier + c`` and "empty" ``first_barrier + consumers + c`` (default ``first_barrier``:
    ``2 + 2 consumers``, after :func:`tile_handoff`'s id).

    * consumer ``c``, per chunk: ``acquire(c)`` (``bar.sync`` empty: the store warp has read its last chunk out of
      the buffer), write the buffer (``wgmma_store``...), ``publish(c)`` (``fence.proxy.async.shared::cta``, then
      ``bar.arrive`` full: no wait).
    * the store warp (all 32 lanes), per round of chunks (one from each consumer): ``free(lane)`` - lane 0, the lane
      that issues the stores, waits until every store it issued has read its buffer (``bulk_wait_group_read(0)``),
      the warp meets (``cuda.syncwarp()``), then ``bar.arrive`` empty for every consumer - and per consumer ``c``
      ``take(c)`` (``bar.sync`` full: its chunk is written and visible to the async proxy), after which lane 0
      issues its stores and ``bulk_commit_group()``.

    Every consumer makes one ``acquire`` and one ``publish`` per round, the store warp one ``free`` and a ``take``
    per consumer - the same count, or the kernel hangs (every consumer and the store warp walk the same schedule);
    lane 0 calls ``bulk_wait_group(0)`` before the kernel ends. A chunk may be several buffers written between one
    ``acquire`` and one ``publish``."""
    if first_barrier is None:
        first_barrier = 2 + 2 * consumers
    if (not isinstance(consumers, int) or consumers < 1 or not isinstance(first_barrier, int) or first_barrier < 1
            or first_barrier + 2 * consumers > 16):
        raise ValueError(f"store_warp: needs consumers >= 1 (an int) and barrier ids {first_barrier}.."
                         f"{first_barrier + 2 * consumers - 1} within 1..15, got consumers={consumers!r}, "
                         f"first_barrier={first_barrier!r}")
    full, empty = first_barrier, first_barrier + consumers
    threads = WARPGROUP + 32

    @cuda.jit(device=True, inline="always")
    def acquire(c):
        named_barrier_sync(empty + c, threads)

    @cuda.jit(device=True, inline="always")
    def publish(c):
        fence_proxy_async_shared_cta()
        named_barrier_arrive(full + c, threads)

    @cuda.jit(device=True, inline="always")
    def free(lane):
        if lane == 0:
            bulk_wait_group_read(0)
        cuda.syncwarp()
        for c in range(consumers):
            named_barrier_arrive(empty + c, threads)

    @cuda.jit(device=True, inline="always")
    def take(c):
        named_barrier_sync(full + c, threads)

    return StoreWarp(acquire, publish, free, take)
