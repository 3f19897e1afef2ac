"""numbatma.intrinsics: device-side operations for ``@cuda.jit`` kernels.

Each function emits inline PTX; its docstring names the PTX and what the caller must guarantee. The PTX of
every operation is listed, one family per module, in ``mbarrier.PTX``, ``tma.PTX``, ``fence.PTX``,
``async_copy.PTX`` (LDGSTS), ``warp.PTX`` and ``pipeline.PTX``; ``all_ptx()`` gathers them.
"""
from .async_copy import (
    cp_async,
    cp_async_commit_group,
    cp_async_mbarrier_arrive,
    cp_async_mbarrier_arrive_noinc,
    cp_async_wait_all,
    cp_async_wait_group,
    memcpy_async,
    memcpy_async_mbarrier,
)
from .cache import l2_policy_evict_first, l2_policy_evict_last, l2_policy_evict_normal
from .fence import fence_mbarrier_init, fence_proxy_async_shared_cta, tensormap_acquire
from .mbarrier import (
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_arrive_n,
    mbarrier_complete_tx,
    mbarrier_expect_tx,
    mbarrier_init,
    mbarrier_inval,
    mbarrier_ref,
    mbarrier_test_wait,
    mbarrier_test_wait_parity,
    mbarrier_try_wait_parity,
    mbarrier_wait,
    mbarrier_wait_parity,
)
from .pipeline import Pipeline
from .smem import shared_view
from .tma import (
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    tma_load,
    tma_load_hinted,
    tma_prefetch,
    tma_prefetch_hinted,
    tma_reduce,
    tma_reduce_hinted,
    tma_store,
    tma_store_hinted,
)
from .warp import elect_one_sync, named_barrier_arrive, named_barrier_sync, setmaxnreg_dec, setmaxnreg_inc

__all__ = [
    "Pipeline",
    "cp_async",
    "cp_async_commit_group",
    "cp_async_mbarrier_arrive",
    "cp_async_mbarrier_arrive_noinc",
    "cp_async_wait_all",
    "cp_async_wait_group",
    "memcpy_async",
    "memcpy_async_mbarrier",
    "elect_one_sync",
    "named_barrier_arrive",
    "named_barrier_sync",
    "setmaxnreg_dec",
    "setmaxnreg_inc",
    "shared_view",
    "bulk_commit_group",
    "bulk_wait_group",
    "bulk_wait_group_read",
    "fence_mbarrier_init",
    "l2_policy_evict_first",
    "l2_policy_evict_last",
    "l2_policy_evict_normal",
    "fence_proxy_async_shared_cta",
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
    "tensormap_acquire",
    "tma_load",
    "tma_load_hinted",
    "tma_prefetch",
    "tma_prefetch_hinted",
    "tma_reduce",
    "tma_reduce_hinted",
    "tma_store",
    "tma_store_hinted",
]


# Modules that list their public names in __all__ (one PTX family each).
from . import bulk, cluster, cluster_copy, descriptor, im2col, mma, swizzle  # noqa: E402
from . import wgmma as _wgmma_family  # noqa: E402  (the name wgmma is the intrinsic)

_LISTED_FAMILIES = (bulk, cluster, cluster_copy, descriptor, im2col, mma, swizzle, _wgmma_family)
for _module in _LISTED_FAMILIES:
    for _name in _module.__all__:
        globals()[_name] = getattr(_module, _name)
    __all__ += list(_module.__all__)
del _module


def all_ptx():
    """Every PTX instruction description, by intrinsic name."""
    from . import async_copy, cache, fence, mbarrier, pipeline, tma, warp

    return {**mbarrier.PTX, **tma.PTX, **fence.PTX, **async_copy.PTX, **warp.PTX, **pipeline.PTX, **cache.PTX,
            **bulk.PTX, **cluster.PTX, **cluster_copy.PTX, **descriptor.PTX, **im2col.PTX, **mma.PTX,
            **_wgmma_family.PTX}
