"""Launching kernels in thread-block clusters (compute capability 9.0+).

Two forms:

* launch time: ``numbatma.with_cluster(kernel, (cx, cy, cz))[grid, block]`` or
  ``[grid, block, stream, shared_mem](*args)`` launches ``kernel`` (a ``@cuda.jit`` kernel) with that cluster
  shape - the ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`` launch attribute (numba-cuda has no spelling for it:
  ``numbatma._numba_internals`` hook 8 adds it to the launch).
* compile time: ``@numbatma.cluster_kernel((cx, cy, cz))`` above ``@cuda.jit`` (or
  ``@cuda.jit(launch_bounds=numbatma.cluster_launch_bounds((cx, cy, cz)))``) compiles the shape into the kernel
  (NVVM ``cluster_dim_{x,y,z}`` -> PTX ``.explicitcluster`` / ``.reqnctapercluster``); every launch of it,
  including a plain ``kernel[grid, block]``, then runs in clusters of that shape.

``grid`` is always counted in blocks (as in ``kernel[grid, block]`` and CUDA's ``cudaLaunchKernelEx``) and must
be a multiple of the cluster shape on every axis. A cluster holds at most 8 CTAs (the portable maximum).

Under the simulator (``NUMBA_ENABLE_CUDASIM=1``) only clusters of one CTA run: Numba's simulator runs the
blocks of a grid one after another, so CTAs of one cluster could never run together.

This module uses the seam ``numbatma._numba_internals`` (cluster launches, occupancy); the seam never imports
this module: the grid check both need (``check_grid``) lives in the leaf ``numbatma._shapes``.
"""
from __future__ import annotations

import math
import numbers

from . import _numba_internals
from ._env import SIMULATING
from ._shapes import check_grid  # noqa: F401  (numbatma.cluster.check_grid; the launch hook checks with it too)

MAX_CLUSTER_SIZE = 8  # the portable maximum (16 needs cudaFuncAttributeNonPortableClusterSizeAllowed)

__all__ = ["MAX_CLUSTER_SIZE", "cluster_kernel", "cluster_launch_bounds", "max_active_clusters", "with_cluster"]


def cluster_shape(dims):
    """``dims`` (an int or a tuple of 1-3 positive ints) as an ``(x, y, z)`` tuple; raise on a shape no GPU can
    launch."""
    if isinstance(dims, numbers.Integral) and not isinstance(dims, bool):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)) or not 1 <= len(dims) <= 3:
        raise TypeError(f"the cluster shape must be an int or a tuple of 1 to 3 ints (x, y, z), got {dims!r}")
    for d in dims:
        if not isinstance(d, numbers.Integral) or isinstance(d, bool):
            raise TypeError(f"the cluster shape must hold ints, got {dims!r}")
    shape = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    if any(d < 1 for d in shape):
        raise ValueError(f"every cluster dimension must be at least 1, got {tuple(dims)}")
    if math.prod(shape) > MAX_CLUSTER_SIZE:
        raise ValueError(
            f"a cluster of shape {shape} holds {math.prod(shape)} CTAs; the portable maximum is {MAX_CLUSTER_SIZE}"
        )
    return shape


class ClusterLaunchBounds(tuple):
    """``launch_bounds`` for ``cuda.jit`` that also carries a compile-time cluster shape: a tuple of the
    ordinary bounds (``(max_threads_per_block, min_blocks_per_sm, max_blocks_per_cluster)``, any prefix) with
    ``cluster_dims``. ``numbatma._numba_internals`` (hook 8) turns ``cluster_dims`` into the kernel's NVVM
    ``cluster_dim_{x,y,z}`` annotations."""

    def __new__(cls, bounds, cluster_dims):
        self = super().__new__(cls, bounds)
        self.cluster_dims = cluster_dims
        return self

    def __reduce__(self):
        return ClusterLaunchBounds, (tuple(self), self.cluster_dims)

    def __repr__(self):
        return f"cluster_launch_bounds({self.cluster_dims}, {tuple(self) or None})"


def cluster_launch_bounds(dims, launch_bounds=None):
    """``launch_bounds=`` for ``cuda.jit`` that compiles the cluster shape ``dims`` into the kernel, together
    with the ordinary ``launch_bounds`` (an int or a tuple of up to three ints)."""
    shape = cluster_shape(dims)
    if launch_bounds is None:
        bounds = ()
    elif isinstance(launch_bounds, numbers.Integral):
        bounds = (int(launch_bounds),)
    else:
        bounds = tuple(launch_bounds)
    return ClusterLaunchBounds(bounds, shape)


def compiled_cluster_dims(kernel):
    """The compile-time cluster shape of a ``cuda.jit`` kernel (``cluster_kernel``), or None."""
    if SIMULATING:
        return getattr(kernel, "_numbatma_cluster_dims", None)
    options = getattr(kernel, "targetoptions", None) or {}
    return getattr(options.get("launch_bounds"), "cluster_dims", None)


def cluster_kernel(dims):
    """Decorator (above ``@cuda.jit`` without signatures): compile the kernel for clusters of shape ``dims``.
    Every launch of it runs in such clusters; ``grid`` must be a multiple of ``dims`` on every axis."""
    shape = cluster_shape(dims)

    def wrap(kernel):
        if SIMULATING:
            if math.prod(shape) > 1:
                return _SimulatedClusterKernel(kernel, shape)
            kernel._numbatma_cluster_dims = shape
            return kernel
        options = getattr(kernel, "targetoptions", None)
        if options is None or not hasattr(kernel, "overloads"):
            raise TypeError(f"cluster_kernel decorates a @cuda.jit kernel, got {kernel!r}")
        if options.get("device"):
            raise TypeError("cluster_kernel decorates a kernel, not a device function (cuda.jit(device=True))")
        if kernel.overloads:
            raise ValueError(
                "cluster_kernel must be applied before the kernel is compiled: put it above a @cuda.jit without "
                "signatures, or pass launch_bounds=numbatma.cluster_launch_bounds(dims) to cuda.jit"
            )
        bounds = options.get("launch_bounds")
        if isinstance(bounds, ClusterLaunchBounds):
            if bounds.cluster_dims != shape:
                raise ValueError(f"the kernel already has the cluster shape {bounds.cluster_dims}, not {shape}")
            return kernel
        options["launch_bounds"] = cluster_launch_bounds(shape, bounds)
        return kernel

    return wrap


def max_active_clusters(kernel, args, block, shared_mem, dims):
    """How many clusters of shape ``dims`` of ``kernel`` (a ``cuda.jit`` kernel, compiled now for ``args`` if
    needed) fit on the current GPU at once, with ``block`` threads and ``shared_mem`` bytes of dynamic shared
    memory per CTA (``cuOccupancyMaxActiveClusters``). A persistent kernel launched in clusters should size its
    grid with this, not with the SM count: a cluster's CTAs must share one GPC, so SMs left over in a GPC stay
    idle, and clusters beyond this number wait for a second wave."""
    _require_cluster_device()
    return _numba_internals.max_active_clusters(kernel, args, block, shared_mem, cluster_shape(dims))


def _require_cluster_device():
    from numba import cuda

    cc = cuda.get_current_device().compute_capability
    if tuple(cc) < (9, 0):
        raise RuntimeError(
            f"thread-block clusters need a GPU of compute capability 9.0 or newer; this one is {cc[0]}.{cc[1]}"
        )


class with_cluster:
    """``with_cluster(kernel, (cx, cy, cz))[grid, block]`` / ``[grid, block, stream, shared_mem](*args)``:
    launch a ``@cuda.jit`` kernel in thread-block clusters of that shape. ``grid`` counts blocks and must be a
    multiple of the cluster shape per axis (ValueError before launching otherwise); the cluster holds at most
    8 CTAs; the GPU must be of compute capability 9.0+. Dynamic shared memory above 48 KiB works as for any
    numbatma launch. A kernel compiled with ``cluster_kernel`` takes only its own shape."""

    def __init__(self, kernel, dims):
        self.kernel = kernel
        self.dims = cluster_shape(dims)
        compiled = compiled_cluster_dims(kernel)
        if compiled is not None and tuple(compiled) != self.dims:
            raise ValueError(f"the kernel was compiled for clusters of shape {tuple(compiled)} (cluster_kernel); "
                             f"it cannot be launched with clusters of shape {self.dims}")
        self._compiled = compiled is not None

    def __getitem__(self, config):
        if not isinstance(config, tuple) or len(config) not in (2, 3, 4):
            raise ValueError("launch configuration: [grid, block] or [grid, block, stream, shared_mem]")
        check_grid(config[0], self.dims)
        if SIMULATING and math.prod(self.dims) > 1:
            raise NotImplementedError(_SIM_MESSAGE.format(shape=self.dims))
        configured = self.kernel[config]
        if SIMULATING:
            return configured
        dims = None if self._compiled else self.dims

        def launch(*args):
            _require_cluster_device()
            with _numba_internals.cluster_launch(dims):
                return configured(*args)

        return launch

    def __repr__(self):
        return f"with_cluster({self.kernel!r}, {self.dims})"


_SIM_MESSAGE = (
    "clusters of {shape} CTAs cannot run in Numba's CUDA simulator: it runs the blocks of a grid one after "
    "another, so the CTAs of a cluster (which run together and share their shared memory) cannot be simulated. "
    "Run this launch on a GPU (compute capability 9.0+), or use clusters of shape (1, 1, 1) in the simulator."
)


class _SimulatedClusterKernel:
    """A ``cluster_kernel`` with more than one CTA per cluster, under the simulator: launching it raises."""

    def __init__(self, kernel, shape):
        self._kernel = kernel
        self._numbatma_cluster_dims = shape

    def __getitem__(self, config):
        raise NotImplementedError(_SIM_MESSAGE.format(shape=self._numbatma_cluster_dims))

    def __getattr__(self, name):
        return getattr(self._kernel, name)
