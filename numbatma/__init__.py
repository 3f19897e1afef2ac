"""numbatma: Hopper/Blackwell TMA kernels in Python with Numba-CUDA.

Host side (this package): :class:`TensorMap` describes boxes of a CUDA array for the Tensor Memory
Accelerator and is passed to ``@cuda.jit`` kernels by value. Device side: :mod:`numbatma.intrinsics`.
Ready-made kernels: :mod:`numbatma.kernels`.
"""
from ._env import SIMULATING
from .tensormap import (
    SUPPORTED_DTYPES,
    Interleave,
    L2Promotion,
    OOBFill,
    Swizzle,
    TensorMap,
    TensorMapArray,
    TensorMapError,
    aligned_columns,
    array_layout,
    byte_span,
    is_readonly,
    kernel_view,
    layout_facts,
    layout_record,
    layout_view,
)

__version__ = "0.1.0"

if SIMULATING:
    from . import _numba_internals

    _numba_internals.install_simulator()
else:
    from . import _numba_internals
    from ._types import SharedArray, TensorMapArrayType, TensorMapType

    _numba_internals.install()

    from numba.cuda.extending import typeof_impl as _typeof_impl

    @_typeof_impl.register(TensorMap)
    def _typeof_tensormap(val, c):
        return val.numba_type

    @_typeof_impl.register(TensorMapArray)
    def _typeof_tensormap_array(val, c):
        return val.numba_type

from .cluster import cluster_kernel, cluster_launch_bounds, max_active_clusters, with_cluster  # noqa: E402
from .devices import array_device, enable_peer_access, peer_access_enabled  # noqa: E402
from .errors import SimulatedHang, SimulatedMisuse, SimulatedTypingError  # noqa: E402 (the simulator's exceptions)
from .im2col import Im2colTensorMap  # noqa: E402
from .launch import dependent_launch, prepare_launch  # noqa: E402
from .views import ArrayLayout, DeviceView, launch_argument  # noqa: E402
from . import autotune  # noqa: E402 (the module: numbatma.autotune.tune, time_launch, bucket; docs/autotune.md)


__all__ = [
    "SUPPORTED_DTYPES",
    "Interleave",
    "L2Promotion",
    "OOBFill",
    "Swizzle",
    "TensorMap",
    "TensorMapArray",
    "TensorMapError",
    "aligned_columns",
    "array_layout",
    "layout_facts",
    "layout_record",
    "byte_span",
    "is_readonly",
    "kernel_view",
    "layout_view",
    "Im2colTensorMap",
    "cluster_kernel",
    "cluster_launch_bounds",
    "max_active_clusters",
    "array_device",
    "enable_peer_access",
    "peer_access_enabled",
    "dependent_launch",
    "prepare_launch",
    "with_cluster",
    "ArrayLayout",
    "DeviceView",
    "launch_argument",
    "SimulatedHang",
    "SimulatedMisuse",
    "SimulatedTypingError",
    "autotune",
]
