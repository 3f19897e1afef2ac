"""Thread-block clusters (sm_90+): the CTA's place in its cluster, distributed shared memory (DSMEM)
addresses, remote mbarrier arrivals, the cluster barrier and the cluster-scope fence.

A kernel runs in clusters when it is launched through ``numbatma.with_cluster(kernel, dims)`` (or compiled
with ``numbatma.cluster_kernel(dims)``); any other launch runs in clusters of one CTA, where every operation
here still works (rank 0 of 1).

Addresses: ``mapa_shared`` / ``mapa_barrier`` return a 32-bit ``shared::cluster`` address of a variable in
the shared memory of CTA ``rank`` of the cluster. Such an address is used with the ``*_cluster`` operations
here (``st_cluster_u32``, ``ld_cluster_u32``, ``mbarrier_arrive_cluster``, ...) and with the cluster copies of
``intrinsics/cluster_copy.py``; byte offsets may be added to it (``addr + 4 * i``) within the variable.

Under the simulator a cluster is one CTA (Numba's simulator runs blocks one after another): rank 0 of 1,
``clusterid() == blockIdx``; ``mapa_*`` to rank 0 gives the variable's own address; the cluster barrier is a
block barrier; a rank other than 0 raises ``SimulatedMisuse``.
"""
from __future__ import annotations

import threading

from numbatma._numba_internals import simulated_block, simulated_grid_dim  # (numba's simulator threads)

from . import mbarrier
from ._asm import Ptx
from ._define import SIMULATING, barrier_address, device_op, emit_only, sim, to_u32

__all__ = [
    "barrier_cluster_arrive",
    "barrier_cluster_arrive_relaxed",
    "barrier_cluster_wait",
    "cluster_ctaid",
    "cluster_ctarank",
    "cluster_nctaid",
    "cluster_nctarank",
    "cluster_sync",
    "clusterid",
    "fence_acq_rel_cluster",
    "ld_cluster_f32",
    "ld_cluster_u32",
    "mapa_barrier",
    "mapa_shared",
    "mbarrier_arrive_cluster",
    "mbarrier_arrive_cluster_cta",
    "mbarrier_wait_parity_cluster",
    "nclusterid",
    "st_cluster_f32",
    "st_cluster_u32",
]

# -- the PTX ------------------------------------------------------------------------------------------
def _sreg(name):
    return Ptx(f"mov.u32 $value, %{name};", out=("value", "b32"), memory=False)


CTARANK = _sreg("cluster_ctarank")
NCTARANK = _sreg("cluster_nctarank")
CTAID = tuple(_sreg(f"cluster_ctaid.{a}") for a in "xyz")
NCTAID = tuple(_sreg(f"cluster_nctaid.{a}") for a in "xyz")
CLUSTERID = tuple(_sreg(f"clusterid.{a}") for a in "xyz")
NCLUSTERID = tuple(_sreg(f"nclusterid.{a}") for a in "xyz")
MAPA = Ptx("mapa.shared::cluster.u32 $remote, $addr, $rank;", ins=(("addr", "b32"), ("rank", "b32")),
           out=("remote", "b32"), memory=False)
ARRIVE_REMOTE = Ptx("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [$bar];", ins=(("bar", "b32"),))
ARRIVE_REMOTE_CTA = Ptx("mbarrier.arrive.shared::cluster.b64 _, [$bar];", ins=(("bar", "b32"),))
WAIT_PARITY_CLUSTER = Ptx(
    "{ .reg .pred p; NBTMA_WAIT_PARITY_CLUSTER: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, "
    "[$bar], $parity; @!p bra NBTMA_WAIT_PARITY_CLUSTER; }",
    ins=(("bar", "b32"), ("parity", "b32")),
)
BARRIER_ARRIVE = Ptx("barrier.cluster.arrive.release;")
BARRIER_ARRIVE_RELAXED = Ptx("barrier.cluster.arrive.relaxed;")
BARRIER_WAIT = Ptx("barrier.cluster.wait.acquire;")
CLUSTER_SYNC = Ptx("barrier.cluster.arrive.release; barrier.cluster.wait.acquire;")
FENCE_ACQ_REL = Ptx("fence.acq_rel.cluster;")
ST_U32 = Ptx("st.shared::cluster.u32 [$addr], $value;", ins=(("addr", "b32"), ("value", "b32")))
ST_F32 = Ptx("st.shared::cluster.f32 [$addr], $value;", ins=(("addr", "b32"), ("value", "f32")))
LD_U32 = Ptx("ld.shared::cluster.u32 $value, [$addr];", ins=(("addr", "b32"),), out=("value", "b32"))
LD_F32 = Ptx("ld.shared::cluster.f32 $value, [$addr];", ins=(("addr", "b32"),), out=("value", "f32"))

if not SIMULATING:
    from numba.cuda import types

    from numbatma._types import MBarrierRefType, SharedArray

    from ._define import fail, require_barrier, require_int, require_shared, shared_address

    _U32x3 = None

    def _u32x3():
        global _U32x3
        if _U32x3 is None:
            _U32x3 = types.UniTuple(types.uint32, 3)
        return _U32x3

    def _read_sreg(ptx):
        def codegen(context, builder, sig, args):
            return ptx.emit(builder)

        return codegen

    def _read_sreg3(ptxs):
        def codegen(context, builder, sig, args):
            return context.make_tuple(builder, sig.return_type, [p.emit(builder) for p in ptxs])

        return codegen

    def _require_address(op, what, ty):
        if isinstance(ty, (SharedArray, MBarrierRefType)) or isinstance(ty, types.Array):
            fail(op, f"{what} must be a shared::cluster address (the uint32 from mapa_shared / mapa_barrier), "
                     f"got {ty}; translate the variable first, e.g. mapa_barrier(bar, rank)")
        require_int(op, what, ty)


# -- simulator semantics --------------------------------------------------------------------------------
def _sim_thread():
    sim().block_local("cluster_windows")  # (raises outside a simulated kernel)
    return threading.current_thread()


def sim_windows():
    """shared::cluster addresses handed out by mapa_* in the running block: base -> (array or None, name) (also
    read by bulk.py's cluster copies)."""
    return sim().block_local("cluster_windows")


def _sim_check_rank(op, rank):
    if int(rank) != 0:
        raise sim().SimulatedMisuse(
            f"{op}: rank {int(rank)} is not a CTA of this cluster, which has 1 CTA (cluster_nctarank() == 1); on "
            f"the GPU this is undefined. The simulator runs clusters of one CTA only (Numba's simulator runs the "
            f"blocks of a grid one after another): run kernels that use other CTAs' shared memory on a GPU."
        )


def _sim_mapa_shared(array, rank):
    _sim_check_rank("mapa_shared", rank)
    s = sim()
    base = s.address_of(array)
    site = getattr(array, "__dict__", {}).get("_numbatma_site")
    with s.lock:
        sim_windows()[base] = (array, f"shared array {s.describe_site(site)}" if site else "shared array")
    return base


def _sim_mapa_barrier(bar, rank):
    _sim_check_rank("mapa_barrier", rank)
    s = sim()
    ref = s.barrier_of(bar)
    with s.lock:
        sim_windows()[ref.address] = (None, ref.name)
    return ref.address


def _sim_resolve(op, addr, nbytes):
    """The (array, byte offset) a shared::cluster address from mapa_shared points into."""
    import numpy as np

    addr = int(addr)
    s = sim()
    with s.lock:
        for base, (array, name) in sim_windows().items():
            if array is None:
                continue
            size = array.size * array.dtype.itemsize
            if base <= addr and addr + nbytes <= base + size:
                if (addr - base) % nbytes:
                    raise s.SimulatedMisuse(f"{op}: address {addr:#x} is not {nbytes}-byte aligned ({name})")
                return np.asarray(array).reshape(-1).view(np.uint8), addr - base
    raise s.SimulatedMisuse(
        f"{op}: address {addr:#x} is not inside a shared array translated with mapa_shared in this CTA (pass the "
        f"uint32 that mapa_shared(array, rank) returned, plus a byte offset within the array)"
    )


def _sim_store(op, dtype):
    def store(addr, value):
        import numpy as np

        raw, off = _sim_resolve(op, addr, 4)
        raw[off:off + 4].view(dtype)[0] = np.array(value).astype(dtype)

    return store


def _sim_load(op, dtype):
    def load(addr):
        raw, off = _sim_resolve(op, addr, 4)
        return raw[off:off + 4].view(dtype)[0].copy()

    return load


def _sim_arrive_cluster(addr, op="mbarrier_arrive_cluster"):
    s = sim()
    with s.lock:
        entry = sim_windows().get(int(addr))
    if entry is None or entry[0] is not None:
        raise s.SimulatedMisuse(
            f"{op}: address {int(addr):#x} is not an mbarrier translated with mapa_barrier in "
            f"this CTA (pass the uint32 that mapa_barrier(bar, rank) returned)"
        )
    mbarrier.sim_arrive(s.BarrierRef(int(addr), entry[1]))


def _sim_cluster_arrive(op):
    t = _sim_thread()
    if getattr(t, "_numbatma_cluster_arrived", False):
        raise sim().SimulatedMisuse(
            f"{op}: this thread already arrived at the cluster barrier and has not waited (barrier_cluster_wait) "
            f"since; arriving twice in one phase is undefined on the GPU"
        )
    t._numbatma_cluster_arrived = True


def _sim_cluster_wait():
    t = _sim_thread()
    if not getattr(t, "_numbatma_cluster_arrived", False):
        raise sim().SimulatedMisuse(
            "barrier_cluster_wait: this thread has not arrived (barrier_cluster_arrive) since its last wait; "
            "waiting without arriving is undefined on the GPU"
        )
    t._numbatma_cluster_arrived = False
    sim().syncthreads()  # a cluster of one CTA: the cluster barrier is the block barrier


def _sim_cluster_sync():
    _sim_cluster_arrive("cluster_sync")
    _sim_cluster_wait()


def _sim_rank(value):
    _sim_thread()
    return value


def _sim_ids(which):
    def read():
        t = _sim_thread()
        if which == "clusterid":
            return tuple(int(v) for v in t.blockIdx)
        if which == "nclusterid":
            return tuple(int(v) for v in simulated_grid_dim(simulated_block(t)))
        return (0, 0, 0) if which == "ctaid" else (1, 1, 1)

    return read


# -- special registers ----------------------------------------------------------------------------------
@device_op(simulate=lambda: _sim_rank(0))
def cluster_ctarank(typingctx):
    """``mov.u32 r, %cluster_ctarank;`` - this CTA's rank in its cluster (uint32, ``0 <= rank <
    cluster_nctarank()``; x fastest over ``cluster_ctaid()``)."""
    return types.uint32(), _read_sreg(CTARANK)


@device_op(simulate=lambda: _sim_rank(1))
def cluster_nctarank(typingctx):
    """``mov.u32 r, %cluster_nctarank;`` - the number of CTAs in this cluster (uint32)."""
    return types.uint32(), _read_sreg(NCTARANK)


@device_op(simulate=_sim_ids("ctaid"))
def cluster_ctaid(typingctx):
    """``mov.u32 r, %cluster_ctaid.{x,y,z};`` - this CTA's position in its cluster, a (x, y, z) tuple of
    uint32 (``blockIdx % cluster dims`` per axis)."""
    return _u32x3()(), _read_sreg3(CTAID)


@device_op(simulate=_sim_ids("nctaid"))
def cluster_nctaid(typingctx):
    """``mov.u32 r, %cluster_nctaid.{x,y,z};`` - the cluster's shape (x, y, z) in CTAs (uint32)."""
    return _u32x3()(), _read_sreg3(NCTAID)


@device_op(simulate=_sim_ids("clusterid"))
def clusterid(typingctx):
    """``mov.u32 r, %clusterid.{x,y,z};`` - this cluster's position in the grid of clusters (x, y, z) (uint32;
    ``blockIdx // cluster dims`` per axis)."""
    return _u32x3()(), _read_sreg3(CLUSTERID)


@device_op(simulate=_sim_ids("nclusterid"))
def nclusterid(typingctx):
    """``mov.u32 r, %nclusterid.{x,y,z};`` - the grid's shape in clusters (x, y, z) (uint32; ``gridDim //
    cluster dims`` per axis)."""
    return _u32x3()(), _read_sreg3(NCLUSTERID)


# -- distributed shared memory addresses ----------------------------------------------------------------
@device_op(simulate=_sim_mapa_shared)
def mapa_shared(typingctx, array, rank):
    """``mapa.shared::cluster.u32 d, a, rank;`` - the shared::cluster address (uint32) of ``array``'s first
    element in the shared memory of CTA ``rank`` of this cluster (the same variable, in that CTA).

    The caller guarantees ``0 <= rank < cluster_nctarank()`` and that CTA ``rank`` is running while the
    address is used (its shared memory is gone once it exits: end with ``cluster_sync()`` when other CTAs
    access yours)."""
    op = "mapa_shared"
    require_shared(op, "the array", array)
    require_int(op, "the CTA rank", rank)

    def codegen(context, builder, sig, args):
        addr = shared_address(context, builder, sig.args[0], args[0])
        return MAPA.emit(builder, addr=addr, rank=to_u32(context, builder, sig.args[1], args[1]))

    return types.uint32(array, rank), codegen


@device_op(simulate=_sim_mapa_barrier)
def mapa_barrier(typingctx, bar, rank):
    """``mapa.shared::cluster.u32 d, a, rank;`` for an mbarrier operand (a shared uint64 array - its element
    0 - or ``mbarrier_ref(bars, i)``): the shared::cluster address of that barrier in CTA ``rank``, for
    ``mbarrier_arrive_cluster`` and the cluster copies. Same guarantees as ``mapa_shared``."""
    op = "mapa_barrier"
    require_barrier(op, bar)
    require_int(op, "the CTA rank", rank)

    def codegen(context, builder, sig, args):
        addr = barrier_address(context, builder, sig.args[0], args[0])
        return MAPA.emit(builder, addr=addr, rank=to_u32(context, builder, sig.args[1], args[1]))

    return types.uint32(bar, rank), codegen


@device_op(simulate=_sim_arrive_cluster)
def mbarrier_arrive_cluster(typingctx, addr):
    """``mbarrier.arrive.release.cluster.shared::cluster.b64 _, [addr];`` - arrive once on the mbarrier at
    shared::cluster address ``addr`` (from ``mapa_barrier``; possibly another CTA's), releasing this thread's
    prior writes at cluster scope to the threads that then wait on that barrier. Returns nothing (a remote
    arrive has no state token). The barrier was initialised (and made visible with ``fence_mbarrier_init``
    plus a cluster barrier) before any CTA arrives on it."""
    _require_address("mbarrier_arrive_cluster", "the barrier address", addr)

    def codegen(context, builder, sig, args):
        ARRIVE_REMOTE.emit(builder, bar=to_u32(context, builder, sig.args[0], args[0]))
        return context.get_dummy_value()

    return types.void(addr), codegen


@device_op(simulate=lambda addr: _sim_arrive_cluster(addr, "mbarrier_arrive_cluster_cta"))
def mbarrier_arrive_cluster_cta(typingctx, addr):
    """``mbarrier.arrive.shared::cluster.b64 _, [addr];`` - :func:`mbarrier_arrive_cluster` with the default
    semantics, release at *CTA* scope: for handing back a buffer this thread only *read* (a consumer giving a
    stage back to the producer of another CTA that multicasts into it - CUTLASS's remote arrive), where no write
    of this thread must become visible to the other CTA. ptxas emits no memory barrier for it; the cluster-scope
    release of :func:`mbarrier_arrive_cluster` costs a ``MEMBAR.ALL.GPU`` before every arrive (measured: a
    multicast attention pipeline released that way ran 38% slower on an H100). The caller guarantees the reads
    have completed (``wgmma_wait_group`` for a wgmma operand) and, as for :func:`mbarrier_arrive_cluster`, that
    the barrier was initialised and made visible cluster-wide before."""
    _require_address("mbarrier_arrive_cluster_cta", "the barrier address", addr)

    def codegen(context, builder, sig, args):
        ARRIVE_REMOTE_CTA.emit(builder, bar=to_u32(context, builder, sig.args[0], args[0]))
        return context.get_dummy_value()

    return types.void(addr), codegen


@device_op(simulate=lambda bar, parity: mbarrier.sim_wait_parity(bar, parity))
def mbarrier_wait_parity_cluster(typingctx, bar, parity):
    """Block until the phase with parity ``parity`` of this CTA's barrier ``bar`` has completed, acquiring at
    *cluster* scope: a loop over ``mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [bar], parity;``.
    Use it (instead of ``mbarrier_wait_parity``, which acquires at CTA scope) when other CTAs arrive on the
    barrier with ``mbarrier_arrive_cluster`` and the waiter then reads what they wrote (e.g. into this CTA's
    shared memory with ``st_cluster_u32``)."""
    require_barrier("mbarrier_wait_parity_cluster", bar)
    require_int("mbarrier_wait_parity_cluster", "parity", parity)

    def codegen(context, builder, sig, args):
        from . import _debug

        if _debug.enabled():
            _debug.wait_parity(context, builder, "mbarrier_wait_parity_cluster",
                               barrier_address(context, builder, sig.args[0], args[0]),
                               to_u32(context, builder, sig.args[1], args[1]), cluster=True)
            return context.get_dummy_value()
        WAIT_PARITY_CLUSTER.emit(builder, bar=barrier_address(context, builder, sig.args[0], args[0]),
                                 parity=to_u32(context, builder, sig.args[1], args[1]))
        return context.get_dummy_value()

    return types.void(bar, parity), codegen


def _store_codegen(ptx, value_type):
    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[1], sig.args[1], value_type)
        ptx.emit(builder, addr=to_u32(context, builder, sig.args[0], args[0]), value=value)
        return context.get_dummy_value()

    return codegen


def _load_codegen(ptx):
    def codegen(context, builder, sig, args):
        return ptx.emit(builder, addr=to_u32(context, builder, sig.args[0], args[0]))

    return codegen


def _require_number(op, ty):
    if not isinstance(ty, (types.Integer, types.Float, types.Boolean)):
        fail(op, f"the value must be a number, got {ty}")


@device_op(simulate=_sim_store("st_cluster_u32", "uint32"))
def st_cluster_u32(typingctx, addr, value):
    """``st.shared::cluster.u32 [addr], value;`` - store ``value`` (converted to uint32) at shared::cluster
    address ``addr`` (``mapa_shared(array, rank)`` plus a 4-byte aligned byte offset inside the array; possibly
    another CTA's shared memory). A weak store: order it before the reader's load with ``cluster_sync()``, or
    a release (``mbarrier_arrive_cluster``, ``barrier_cluster_arrive``) the reader acquires."""
    _require_address("st_cluster_u32", "the address", addr)
    _require_number("st_cluster_u32", value)
    return types.void(addr, value), _store_codegen(ST_U32, types.uint32)


@device_op(simulate=_sim_store("st_cluster_f32", "float32"))
def st_cluster_f32(typingctx, addr, value):
    """``st.shared::cluster.f32 [addr], value;`` - as ``st_cluster_u32``, storing ``value`` as a float32."""
    _require_address("st_cluster_f32", "the address", addr)
    _require_number("st_cluster_f32", value)
    return types.void(addr, value), _store_codegen(ST_F32, types.float32)


@device_op(simulate=_sim_load("ld_cluster_u32", "uint32"))
def ld_cluster_u32(typingctx, addr):
    """``ld.shared::cluster.u32 v, [addr];`` - load a uint32 from shared::cluster address ``addr`` (4-byte
    aligned; possibly another CTA's shared memory). A weak load: the writer's store is ordered before it by a
    cluster barrier or a release/acquire pair."""
    _require_address("ld_cluster_u32", "the address", addr)
    return types.uint32(addr), _load_codegen(LD_U32)


@device_op(simulate=_sim_load("ld_cluster_f32", "float32"))
def ld_cluster_f32(typingctx, addr):
    """``ld.shared::cluster.f32 v, [addr];`` - as ``ld_cluster_u32``, loading a float32."""
    _require_address("ld_cluster_f32", "the address", addr)
    return types.float32(addr), _load_codegen(LD_F32)


# -- cluster barrier and fence ---------------------------------------------------------------------------
@device_op(simulate=lambda: _sim_cluster_arrive("barrier_cluster_arrive"))
def barrier_cluster_arrive(typingctx):
    """``barrier.cluster.arrive.release;`` - arrive at the cluster barrier (does not wait), releasing this
    thread's prior memory accesses at cluster scope. Every non-exited thread of every CTA of the cluster
    arrives once, then waits with ``barrier_cluster_wait()``, before arriving again. Divergent code may call
    it (the non-``.aligned`` form)."""
    return types.void(), emit_only(BARRIER_ARRIVE)


@device_op(simulate=lambda: _sim_cluster_arrive("barrier_cluster_arrive_relaxed"))
def barrier_cluster_arrive_relaxed(typingctx):
    """``barrier.cluster.arrive.relaxed;`` - arrive without memory ordering (use when the barrier only
    separates phases of execution, e.g. "every CTA of the cluster has started"). Same rules as
    ``barrier_cluster_arrive``."""
    return types.void(), emit_only(BARRIER_ARRIVE_RELAXED)


@device_op(simulate=_sim_cluster_wait)
def barrier_cluster_wait(typingctx):
    """``barrier.cluster.wait.acquire;`` - wait until every non-exited thread of the cluster has arrived
    (``barrier_cluster_arrive*``), acquiring what the arrivals released. The caller arrived first."""
    return types.void(), emit_only(BARRIER_WAIT)


@device_op(simulate=_sim_cluster_sync)
def cluster_sync(typingctx):
    """``barrier.cluster.arrive.release; barrier.cluster.wait.acquire;`` - the cluster-wide
    ``syncthreads``: every non-exited thread of every CTA of the cluster calls it; after it, every write made
    before it (to any CTA's shared memory, or global memory) is visible. Call it before the first access to
    another CTA's shared memory (so that CTA has started and initialised it) and before exiting while other
    CTAs may still access yours."""
    return types.void(), emit_only(CLUSTER_SYNC)


@device_op(simulate=lambda: None)
def fence_acq_rel_cluster(typingctx):
    """``fence.acq_rel.cluster;`` - a lightweight acquire-release fence at cluster scope: orders this
    thread's memory accesses before it against those after it, as observed by the threads of the cluster
    (pair it with a flag or a relaxed arrive). No-op in the simulator (its memory is sequentially
    consistent)."""
    return types.void(), emit_only(FENCE_ACQ_REL)


PTX = {
    "cluster_ctarank": CTARANK,
    "cluster_nctarank": NCTARANK,
    **{f"cluster_ctaid.{a}": p for a, p in zip("xyz", CTAID)},
    **{f"cluster_nctaid.{a}": p for a, p in zip("xyz", NCTAID)},
    **{f"clusterid.{a}": p for a, p in zip("xyz", CLUSTERID)},
    **{f"nclusterid.{a}": p for a, p in zip("xyz", NCLUSTERID)},
    "mapa_shared": MAPA,
    "mbarrier_arrive_cluster": ARRIVE_REMOTE,
    "mbarrier_arrive_cluster_cta": ARRIVE_REMOTE_CTA,
    "mbarrier_wait_parity_cluster": WAIT_PARITY_CLUSTER,
    "barrier_cluster_arrive": BARRIER_ARRIVE,
    "barrier_cluster_arrive_relaxed": BARRIER_ARRIVE_RELAXED,
    "barrier_cluster_wait": BARRIER_WAIT,
    "cluster_sync": CLUSTER_SYNC,
    "fence_acq_rel_cluster": FENCE_ACQ_REL,
    "st_cluster_u32": ST_U32,
    "st_cluster_f32": ST_F32,
    "ld_cluster_u32": LD_U32,
    "ld_cluster_f32": LD_F32,
}
