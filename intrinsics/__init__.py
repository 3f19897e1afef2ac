"""numbatma.intrinsics: device-side operations for ``@cuda.jit`` kernels.

Each function emits inline PTX; its docstring names the PTX and what the caller must guarantee. The PTX of
every operation is listed, one family per module, in ``mbarrier.PTX``, ``tma.PTX`` and ``fence.PTX``.
"""
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
from .tma import bulk_commit_group, bulk_wait_group, bulk_wait_group_read, tma_load, tma_store

__all__ = [
    "bulk_commit_group",
    "bulk_wait_group",
    "bulk_wait_group_read",
    "fence_mbarrier_init",
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
    "tma_store",
]


def all_ptx():
    """Every PTX instruction description, by intrinsic name."""
    from . import fence, mbarrier, tma

    return {**mbarrier.PTX, **tma.PTX, **fence.PTX}
