"""Fences between the generic proxy (ordinary loads/stores), the async proxy (TMA) and the tensormap
proxy (descriptors)."""
from __future__ import annotations

from ._asm import Ptx
from ._define import SIMULATING, check_descriptor_index, descriptor_address, device_op, emit_only, fail, sim
from .descriptor import ACQUIRE
from .mbarrier import sim_fence_inits

__all__ = ["fence_mbarrier_init", "fence_proxy_async_shared_cta", "tensormap_acquire"]

PROXY_ASYNC_SHARED_CTA = Ptx("fence.proxy.async.shared::cta;")
MBARRIER_INIT = Ptx("fence.mbarrier_init.release.cluster;")
TENSORMAP_ACQUIRE = ACQUIRE["gpu"]  # declared once, with the descriptor family's release/acquire fences

if not SIMULATING:
    from llvmlite import ir
    from numba.cuda import types

    from numbatma._types import CUTENSORMAP_PTR, TensorMapArrayType


@device_op(simulate=lambda: sim_fence_proxy_async())
def fence_proxy_async_shared_cta(typingctx):
    """``fence.proxy.async.shared::cta;`` - make this thread's ordinary writes to shared memory visible
    to the async proxy. Every thread that wrote a tile executes it before the block barrier that precedes a
    TMA store of that tile."""
    return types.void(), emit_only(PROXY_ASYNC_SHARED_CTA)


@device_op(simulate=lambda: sim_fence_mbarrier_init())
def fence_mbarrier_init(typingctx):
    """``fence.mbarrier_init.release.cluster;`` - make preceding ``mbarrier_init`` visible to the async
    proxy and to other CTAs of the cluster. Use after initialising barriers, before the block barrier."""
    return types.void(), emit_only(MBARRIER_INIT)


@device_op(simulate=lambda descs, i: check_descriptor_index("tensormap_acquire", descs, i))
def tensormap_acquire(typingctx, descs, index):
    """Descriptor ``index`` of a :class:`numbatma.TensorMapArray` (descriptors in global memory), after
    ``fence.proxy.tensormap::generic.acquire.gpu [addr], 128;`` so the TMA unit sees its current bytes.

    The caller guarantees ``0 <= index < len(descs)``. Returns a descriptor usable with ``tma_load`` /
    ``tma_store`` like a by-value one."""
    if not isinstance(descs, TensorMapArrayType):
        fail("tensormap_acquire", f"expected a numbatma.TensorMapArray, got {descs}")
    if not isinstance(index, types.Integer):
        fail("tensormap_acquire", f"the index must be an integer, got {index}")

    def codegen(context, builder, sig, args):
        base, idx = args
        idx64 = context.cast(builder, idx, sig.args[1], types.uint64)
        addr = builder.add(base, builder.mul(idx64, ir.Constant(ir.IntType(64), 128)))
        ptr = builder.inttoptr(addr, CUTENSORMAP_PTR)
        TENSORMAP_ACQUIRE.emit(builder, tmap=descriptor_address(builder, ptr))
        return ptr

    return descs.element(descs, index), codegen


# -- simulator semantics ----------------------------------------------------------------------------------------
def sim_fence_proxy_async():
    """``fence.proxy.async.shared::cta``: this thread's generic writes to shared memory become visible to the
    async proxy (the engine's proxy-fence record), and it also orders the thread's ``mbarrier_init``."""
    sim_fence_inits()
    sim().proxy_fence()


def sim_fence_mbarrier_init():
    """``fence.mbarrier_init``: this thread's barrier initialisations become publishable (the mbarrier family
    keeps them: a block barrier after the fence passes them on to the other threads)."""
    sim_fence_inits()


PTX = {
    "fence_proxy_async_shared_cta": PROXY_ASYNC_SHARED_CTA,
    "fence_mbarrier_init": MBARRIER_INIT,
    "tensormap_acquire": TENSORMAP_ACQUIRE,
}
