"""Pipelines: a ring of shared-memory stages, each guarded by a *full* and an *empty* mbarrier, with the
stage index and phase parity tracked for you.

::

    pipe = Pipeline(STAGES, 1, CONSUMERS)    # in the kernel body, by every thread of the block

    # producer (one thread for TMA):                # consumer (CONSUMERS threads):
    s = pipe.producer_acquire()                     s = pipe.consumer_wait()
    pipe.load(bufs[s], desc, (row, col))            ... read bufs[s] ...
    pipe.producer_commit()                          pipe.consumer_release()

``Pipeline(stages, producer_arrivals, consumer_arrivals)`` puts ``2*stages`` mbarriers in shared memory;
thread (0, 0, 0) initialises them (full: ``producer_arrivals`` arrivals, empty: ``consumer_arrivals``),
then ``fence.mbarrier_init`` and a block barrier. Create it directly in the kernel body (not in a device
function that returns it): its state (producer stage/phase, consumer stage/phase, release stage) lives in
the creating function's registers.

Transaction bytes are never written by hand: ``pipe.load`` raises the stage's expected byte count by
``desc.box_bytes`` (``mbarrier.expect_tx``) right before the TMA load that delivers them, and
``producer_commit`` then arrives. The arrival is pending until the commit, so the phase cannot complete
early, and a tile whose size differs from the descriptor's box is a typing error (from ``tma_load``).

Producers:

* TMA (one thread): ``producer_acquire`` -> ``load``... -> ``producer_commit`` (``producer_arrivals=1``).
* LDGSTS (many threads): every producer thread calls ``producer_acquire``, issues ``cp_async`` copies
  into the stage and calls ``producer_commit_async`` (``cp.async.mbarrier.arrive.noinc``);
  ``producer_arrivals`` = number of producer threads.

Consumers call ``consumer_wait`` (returns the stage to read) and, when done with the *oldest* stage they
hold, ``consumer_release``. Releases go in order and may lag waits (e.g. release a stage only after a
TMA store from it has read it, ``bulk_wait_group_read``).

Parity convention: a fresh barrier is in phase 0; the producer's first pass over the ring waits on the
empty barriers' parity 1, which counts as complete, so no stage is "released" by hand at start-up.
"""
from __future__ import annotations

import functools
import inspect

from numba import cuda

from numbatma.errors import TypingError

from . import _debug
from ._asm import Ptx
from ._define import SIMULATING, device_op, require_int, require_literal_int, sim
from .async_copy import cp_async_mbarrier_arrive_noinc
from .cluster import mapa_barrier, mbarrier_arrive_cluster_cta
from .cluster_copy import tma_load_multicast
from .fence import sim_fence_mbarrier_init
from .mbarrier import mbarrier_arrive, mbarrier_expect_tx, mbarrier_wait_parity, sim_init
from .tma import tma_load, tma_load_hinted

__all__ = ["Pipeline"]

# State slots of a pipeline (32-bit each). A debug build (NUMBATMA_DEBUG=1) adds two: the address of the text
# naming the pipeline and where it was created, for the messages of its bounded waits.
BASE, PSTAGE, PPHASE, CSTAGE, CPHASE, RSTAGE = range(6)
ORIGIN_LO, ORIGIN_HI = 6, 7
_NSLOTS = 8 if _debug.enabled() else 6
MAX_STAGES = 64


def _init_ptx(stages):
    """PTX run by every thread at pipeline creation: thread (0,0,0) initialises the 2*stages barriers."""
    lines = [
        "{ .reg .pred p; .reg .b32 a, b;",
        "mov.u32 a, %tid.x; mov.u32 b, %tid.y; or.b32 a, a, b; mov.u32 b, %tid.z; or.b32 a, a, b;",
        "setp.eq.u32 p, a, 0;",
    ]
    for s in range(stages):
        lines.append(f"@p mbarrier.init.shared::cta.b64 [$base+{8 * s}], $producers;")
    for s in range(stages):
        lines.append(f"@p mbarrier.init.shared::cta.b64 [$base+{8 * (stages + s)}], $consumers;")
    lines.append("@p fence.mbarrier_init.release.cluster; }")
    return Ptx(" ".join(lines), ins=(("base", "b32"), ("producers", "b32"), ("consumers", "b32")))


INIT_EXAMPLE = _init_ptx(2)  # shown by all_ptx(); the real text has one init per barrier

if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.core.imputils import lower_getattr
    from numba.cuda.datamodel import models
    from numba.cuda.extending import overload_method, register_model
    from numba.cuda.typing.templates import AttributeTemplate, infer_getattr

    from numbatma._types import mbarrier_ref as _mbarrier_ref_type

    I32 = ir.IntType(32)
    _STATE = ir.ArrayType(I32, _NSLOTS)

    class PipelineType(types.Type):
        """A pipeline of ``stages`` stages (a compile-time constant)."""

        def __init__(self, stages):
            self.stages = stages
            super().__init__(name=f"numbatma.Pipeline(stages={stages})")

    @register_model(PipelineType)
    class _PipelineModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, _STATE.as_pointer())

    @infer_getattr
    class _PipelineAttributes(AttributeTemplate):
        key = PipelineType

        def resolve_stages(self, pipe):
            return types.intp

    @lower_getattr(PipelineType, "stages")
    def _lower_stages(context, builder, ty, value):
        return context.get_constant(types.intp, ty.stages)

    def _slot(builder, state, index):
        return builder.gep(state, [ir.Constant(I32, 0), ir.Constant(I32, index)])


class SimPipeline:
    """``Pipeline`` under the CUDA simulator: each thread's own state; the block's barriers are shared
    per call site (like a static shared array). The methods are the functions below, as on the GPU."""

    def __init__(self, stages, producer_arrivals, consumer_arrivals, site):
        s = sim()
        self.stages = int(stages)
        self.name = f"pipeline {s.describe_site(site)}"
        if not 1 <= self.stages <= MAX_STAGES:  # (the GPU typer's check, same words, at the kernel's line)
            raise s.SimulatedTypingError(f"{site[0]}:{site[1]}: Pipeline: the number of stages must be in "
                                         f"1..{MAX_STAGES}, got {self.stages}; the {self.name}")
        bars = s.shared_allocation(("Pipeline",) + site, (2 * self.stages,), "uint64")
        self.bars = bars
        self.state = [0] * _NSLOTS
        self.counts = (int(producer_arrivals), int(consumer_arrivals))
        if s.thread_index() == 0:
            for i in range(self.stages):
                sim_init(self.barrier(i, "full"), producer_arrivals)
                sim_init(self.barrier(self.stages + i, "empty"), consumer_arrivals)
            sim_fence_mbarrier_init()  # (as the GPU code does: fence.mbarrier_init, then the block barrier)
        s.syncthreads()

    def barrier(self, index, kind):
        s = sim()
        stage = index if kind == "full" else index - self.stages
        ref = s.BarrierRef(s.address_of(self.bars, index), f"{kind} barrier of stage {stage} of {self.name}")
        ref.pipeline, ref.kind = self, kind
        return ref


def _sim_pipeline(stages, producer_arrivals, consumer_arrivals):
    return SimPipeline(stages, producer_arrivals, consumer_arrivals, sim().caller_site())


@device_op(prefer_literal=True, simulate=_sim_pipeline)
def Pipeline(typingctx, stages, producer_arrivals, consumer_arrivals):  # noqa: N802 - reads like a class
    """Create a pipeline of ``stages`` (a constant, 1..64) shared-memory stages; collective: every thread
    of the block calls it (it ends with a block barrier).

    Emits, for thread (0,0,0) (a predicate from ``%tid``): an ``mbarrier.init`` of each full barrier with
    ``producer_arrivals`` and of each empty barrier with ``consumer_arrivals``, then the cluster-scope
    ``fence.mbarrier_init`` (PTX below, shown for 2 stages: one init per barrier); then a block barrier
    (``llvm.nvvm.barrier0``, as ``cuda.syncthreads()``) for all threads. The caller guarantees
    the arrival counts match how many threads call ``producer_commit*`` / ``consumer_release`` per stage."""
    op = "Pipeline"
    n = require_literal_int(op, "the number of stages", stages, 1, MAX_STAGES)
    for what, ty in (("producer_arrivals", producer_arrivals), ("consumer_arrivals", consumer_arrivals)):
        require_int(op, what, ty)
        if isinstance(ty, types.IntegerLiteral):  # a barrier expecting 0 (or 2**20+) arrivals is undefined
            require_literal_int(op, what, ty, 1, (1 << 20) - 1)
    init = _init_ptx(n)

    def codegen(context, builder, sig, args):
        module = builder.module
        bars = cgutils.add_global_variable(
            module, ir.ArrayType(ir.IntType(64), 2 * n), module.get_unique_name("numbatma_pipeline_bars"), 3
        )
        bars.linkage = "internal"
        bars.align = 8
        bars.initializer = ir.Constant(bars.type.pointee, ir.Undefined)
        base = builder.ptrtoint(bars, I32)
        state = cgutils.alloca_once(builder, _STATE, name="numbatma_pipeline_state")
        builder.store(ir.Constant(_STATE, [0] * _NSLOTS), state)
        builder.store(base, _slot(builder, state, BASE))
        if _debug.enabled():
            origin = builder.ptrtoint(_debug.pipeline_origin(context, builder), ir.IntType(64))
            builder.store(builder.trunc(origin, I32), _slot(builder, state, ORIGIN_LO))
            builder.store(builder.trunc(builder.lshr(origin, ir.Constant(ir.IntType(64), 32)), I32),
                          _slot(builder, state, ORIGIN_HI))
        init.emit(
            builder,
            base=base,
            producers=context.cast(builder, args[1], sig.args[1], types.uint32),
            consumers=context.cast(builder, args[2], sig.args[2], types.uint32),
        )
        sync = cgutils.get_or_insert_function(module, ir.FunctionType(ir.VoidType(), ()), "llvm.nvvm.barrier0")
        builder.call(sync, ())
        return state

    return PipelineType(n)(stages, producer_arrivals, consumer_arrivals), codegen


# -- state access (private) ----------------------------------------------------------------------------
@device_op(prefer_literal=True, simulate=lambda pipe, slot: pipe.state[slot])
def _get(typingctx, pipe, slot):
    index = slot.literal_value

    def codegen(context, builder, sig, args):
        return builder.load(_slot(builder, args[0], index))

    return types.int32(pipe, slot), codegen


def _sim_set(pipe, slot, value):
    pipe.state[slot] = int(value)


@device_op(prefer_literal=True, simulate=_sim_set)
def _set(typingctx, pipe, slot, value):
    index = slot.literal_value

    def codegen(context, builder, sig, args):
        builder.store(context.cast(builder, args[2], sig.args[2], types.int32), _slot(builder, args[0], index))
        return context.get_dummy_value()

    return types.void(pipe, slot, value), codegen


@device_op(simulate=lambda pipe, stage: pipe.barrier(int(stage), "full"))
def _full(typingctx, pipe, stage):
    """The full barrier of ``stage``."""

    def codegen(context, builder, sig, args):
        base = builder.load(_slot(builder, args[0], BASE))
        s = context.cast(builder, args[1], sig.args[1], types.int32)
        return builder.add(base, builder.mul(s, ir.Constant(I32, 8)))

    return _mbarrier_ref_type(pipe, stage), codegen


@device_op(simulate=lambda pipe, stage: pipe.barrier(pipe.stages + int(stage), "empty"))
def _empty(typingctx, pipe, stage):
    """The empty barrier of ``stage``."""
    n = pipe.stages

    def codegen(context, builder, sig, args):
        base = builder.load(_slot(builder, args[0], BASE))
        s = context.cast(builder, args[1], sig.args[1], types.int32)
        return builder.add(base, builder.mul(builder.add(s, ir.Constant(I32, n)), ir.Constant(I32, 8)))

    return _mbarrier_ref_type(pipe, stage), codegen


@device_op(prefer_literal=True)
def _debug_wait(typingctx, pipe, kind, stage, parity):
    """Debug builds only: the bounded wait of ``producer_acquire`` (kind 1: the empty barrier of ``stage``) or
    ``consumer_wait`` (kind 0: the full barrier), which prints the pipeline, stage and parity and traps when
    it times out (``_debug.pipeline_wait``)."""
    which = kind.literal_value
    n = pipe.stages

    def codegen(context, builder, sig, args):
        state = args[0]
        base = builder.load(_slot(builder, state, BASE))
        s = context.cast(builder, args[2], sig.args[2], types.int32)
        index = s if which == 0 else builder.add(s, ir.Constant(I32, n))
        bar = builder.add(base, builder.mul(index, ir.Constant(I32, 8)))
        lo = builder.zext(builder.load(_slot(builder, state, ORIGIN_LO)), ir.IntType(64))
        hi = builder.zext(builder.load(_slot(builder, state, ORIGIN_HI)), ir.IntType(64))
        origin = builder.inttoptr(builder.or_(lo, builder.shl(hi, ir.Constant(ir.IntType(64), 32))),
                                  ir.IntType(8).as_pointer())
        parity_value = context.cast(builder, args[3], sig.args[3], types.uint32)
        _debug.pipeline_wait(context, builder, "consumer_wait" if which == 0 else "producer_acquire",
                             "full" if which == 0 else "empty", s, bar, parity_value, origin)
        return context.get_dummy_value()

    return types.void(pipe, kind, stage, parity), codegen


# -- the methods: plain Python over the primitives above (the same code runs in the simulator) ----------
def producer_acquire(pipe):
    """Wait until the producer's next stage is free (its empty barrier completed the previous round);
    return its index. ``mbarrier.try_wait.parity`` loop on the empty barrier with parity ``phase ^ 1``."""
    s = _get(pipe, PSTAGE)
    mbarrier_wait_parity(_empty(pipe, s), _get(pipe, PPHASE) ^ 1)
    return s


def load(pipe, tile, desc, coords):
    """TMA-load the box of ``desc`` at ``coords`` into ``tile`` (part of the acquired stage); the stage's
    full barrier expects ``desc.box_bytes`` more bytes. Runs ``mbarrier_expect_tx`` on that barrier, then
    ``tma_load`` (their PTX: their docstrings). One thread (the one that commits)."""
    bar = _full(pipe, _get(pipe, PSTAGE))
    mbarrier_expect_tx(bar, desc.box_bytes)
    tma_load(tile, desc, coords, bar)


def load_hinted(pipe, tile, desc, coords, policy):
    """``load`` with an L2 cache policy (``l2_policy_evict_first()`` ...): ``mbarrier.expect_tx`` then
    ``cp.async.bulk.tensor...complete_tx::bytes.L2::cache_hint``."""
    bar = _full(pipe, _get(pipe, PSTAGE))
    mbarrier_expect_tx(bar, desc.box_bytes)
    tma_load_hinted(tile, desc, coords, bar, policy)


def load_multicast(pipe, tile, desc, coords, mask):
    """``load`` for a thread-block cluster: one TMA load of the box into ``tile`` of every CTA named in
    ``mask`` (``tma_load_multicast``), completing on the same stage's full barrier in each of them. This CTA's
    full barrier expects ``desc.box_bytes`` times the number of CTAs in ``mask``: the caller guarantees the
    symmetric split of a shared operand - every CTA of ``mask`` issues one multicast of the same byte count
    into this stage (each loads its share and receives the others'). The pipelines of those CTAs run in step:
    their consumers release each stage to all of them (``consumer_release_remote``), and the barriers were
    initialised cluster-wide (``cluster_sync()`` after creating the pipeline) before the first multicast."""
    bar = _full(pipe, _get(pipe, PSTAGE))
    mbarrier_expect_tx(bar, desc.box_bytes * cuda.popc(mask))
    tma_load_multicast(tile, desc, coords, bar, mask)


@cuda.jit(device=True)
def _advance_producer(pipe):
    s = _get(pipe, PSTAGE) + 1
    if s == pipe.stages:
        s = 0
        _set(pipe, PPHASE, _get(pipe, PPHASE) ^ 1)
    _set(pipe, PSTAGE, s)


def producer_commit(pipe):
    """Arrive on the stage's full barrier (``mbarrier.arrive``) and move to the next stage. The phase
    completes when every producer arrived and all expected TMA bytes landed."""
    mbarrier_arrive(_full(pipe, _get(pipe, PSTAGE)))
    _advance_producer(pipe)


def producer_commit_async(pipe):
    """LDGSTS producers: ``cp.async.mbarrier.arrive.noinc`` on the stage's full barrier (this thread's
    arrival happens when its ``cp_async`` copies land), then move to the next stage."""
    cp_async_mbarrier_arrive_noinc(_full(pipe, _get(pipe, PSTAGE)))
    _advance_producer(pipe)


def consumer_wait(pipe):
    """Wait until the consumer's next stage is full; return its index and move on.
    ``mbarrier.try_wait.parity`` loop on the full barrier (acquire: the stage's data is visible after)."""
    s = _get(pipe, CSTAGE)
    mbarrier_wait_parity(_full(pipe, s), _get(pipe, CPHASE))
    n = s + 1
    if n == pipe.stages:
        n = 0
        _set(pipe, CPHASE, _get(pipe, CPHASE) ^ 1)
    _set(pipe, CSTAGE, n)
    return s


def consumer_release(pipe):
    """Give the oldest stage this thread waited for back to the producer (``mbarrier.arrive`` on its empty
    barrier). Every one of the ``consumer_arrivals`` threads calls it once per stage."""
    s = _get(pipe, RSTAGE)
    mbarrier_arrive(_empty(pipe, s))
    s += 1
    if s == pipe.stages:
        s = 0
    _set(pipe, RSTAGE, s)


def consumer_release_remote(pipe, rank):
    """In a thread-block cluster whose producers multicast into each other's stages: arrive on the empty
    barrier, in CTA ``rank`` of the cluster, of the stage that this thread's next ``consumer_release`` gives
    back (``mapa`` + ``mbarrier.arrive.shared::cluster``: release at CTA scope - the stage was only read, and a
    cluster-scope release would cost a ``MEMBAR.ALL.GPU`` per arrive), without moving on; then call
    ``consumer_release`` for this CTA's own barrier. Count these arrivals in ``consumer_arrivals`` of every
    CTA's pipeline (e.g. 8 local + 8 remote warps)."""
    mbarrier_arrive_cluster_cta(mapa_barrier(_empty(pipe, _get(pipe, RSTAGE)), rank))


def _debug_producer_acquire(pipe):
    """``producer_acquire`` of a debug build: the wait is bounded (``_debug_wait``)."""
    s = _get(pipe, PSTAGE)
    _debug_wait(pipe, 1, s, _get(pipe, PPHASE) ^ 1)
    return s


def _debug_consumer_wait(pipe):
    """``consumer_wait`` of a debug build: the wait is bounded (``_debug_wait``)."""
    s = _get(pipe, CSTAGE)
    _debug_wait(pipe, 0, s, _get(pipe, CPHASE))
    n = s + 1
    if n == pipe.stages:
        n = 0
        _set(pipe, CPHASE, _get(pipe, CPHASE) ^ 1)
    _set(pipe, CSTAGE, n)
    return s


METHODS = {
    "producer_acquire": producer_acquire,
    "load": load,
    "load_multicast": load_multicast,
    "consumer_release_remote": consumer_release_remote,
    "load_hinted": load_hinted,
    "producer_commit": producer_commit,
    "producer_commit_async": producer_commit_async,
    "consumer_wait": consumer_wait,
    "consumer_release": consumer_release,
}


def _typer_returning(impl, name):
    """An overload typer with ``impl``'s signature (numba checks they agree) that always picks ``impl``. Numba
    binds a call's arguments to that signature before typing it; a call with the wrong number of arguments is
    refused with numbatma's words (``_MethodSignature``), at the kernel's line, instead of Python's "too many
    positional arguments"."""

    @functools.wraps(impl)
    def typer(*args):
        return impl

    base = inspect.signature(impl)
    typer.__signature__ = _MethodSignature(list(base.parameters.values()), method=name)
    return typer


class _MethodSignature(inspect.Signature):
    """The signature of a ``Pipeline`` method's overload: binding the wrong number of arguments raises a
    :class:`numbatma.errors.TypingError` that says how to call the method."""

    __slots__ = ("_method",)

    def __init__(self, *args, method=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._method = method

    def replace(self, **changes):
        out = super().replace(**changes)
        out._method = self._method
        return out

    def bind(self, *args, **kwargs):
        try:
            return super().bind(*args, **kwargs)
        except TypeError as exc:
            params = list(self.parameters)[1:]
            call = f"pipe.{self._method}({', '.join(params)})"
            takes = f"takes {len(params)} argument(s) ({', '.join(params)})" if params else "takes no arguments"
            raise TypingError(
                f"Pipeline.{self._method} {takes}, got {len(args) - 1 + len(kwargs)} ({exc}); call it as "
                f"{call}") from None


def _sim_method(name, impl):
    """``impl`` as a ``SimPipeline`` method: a call with the wrong number of arguments is refused with the GPU
    build's words (``_MethodSignature``) after the kernel's file:line."""
    signature = _MethodSignature(list(inspect.signature(impl).parameters.values()), method=name)
    count = len(signature.parameters)

    @functools.wraps(impl)
    def method(*args, **kwargs):
        if len(args) + len(kwargs) != count:
            try:
                signature.bind(*args, **kwargs)
            except TypingError as exc:
                site = sim().caller_site()
                raise sim().SimulatedTypingError(f"{site[0]}:{site[1]}: {exc.reason}") from None
        return impl(*args, **kwargs)

    return method


if SIMULATING:
    for _name, _impl in METHODS.items():
        setattr(SimPipeline, _name, _sim_method(_name, _impl))
else:
    if _debug.enabled():  # (the process is a debug one: the bounded waits replace the plain ones)
        METHODS = {**METHODS, "producer_acquire": _debug_producer_acquire, "consumer_wait": _debug_consumer_wait}
    for _name, _impl in METHODS.items():
        overload_method(PipelineType, _name, target="cuda")(_typer_returning(_impl, _name))

def _methods_doc():
    """The ``Methods`` section of ``help(Pipeline)``: each method's call and the first sentence of its docstring."""
    import inspect

    lines = ["", "    Methods (``pipe = Pipeline(...)`` in a kernel):", ""]
    for name, impl in sorted(METHODS.items()):
        params = list(inspect.signature(impl).parameters)[1:]
        first = " ".join((impl.__doc__ or "").split()).split(". ")[0].rstrip(".")
        lines.append(f"    * ``pipe.{name}({', '.join(params)})``: {first}.")
    return "\n".join(lines) + "\n"


try:
    Pipeline.__doc__ = (Pipeline.__doc__ or "").rstrip() + "\n" + _methods_doc()
except (AttributeError, TypeError):  # (an object whose __doc__ is read-only)
    pass

PTX = {"Pipeline (init, 2 stages shown)": INIT_EXAMPLE}
