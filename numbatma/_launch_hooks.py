"""The launch path's hooks: descriptor arguments (2), shared-memory limit (3), clusters (8), dependent launches (11).

Hook 2 passes descriptors and checks their device, hook 3 raises a kernel's dynamic shared-memory limit (and checks a
cluster kernel's grid), hook 8 launches in clusters, hook 11 makes launches programmatic dependent ones.

A seam module (numba-cuda private names: ``numba.cuda.dispatcher._Kernel``'s ``_prepare_args`` and ``launch``, the
``LaunchConfig`` and ``launch`` it calls, ``nvvm.set_launch_bounds``, a compiled kernel's ``_codelibrary``). The
hooks are numbered and described in ``numbatma/_numba_internals.py``'s docstring, which installs them;
``tests/test_numba_internals.py`` checks the upstream names. Prepared launches (``_prepared_launch.py``) reuse hook
2's marshalling, hook 3's limit and hook 11's scope.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

from llvmlite import ir

from ._patching import patch as _patch
from ._shapes import check_grid
from .devices import several_devices

_DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024
_TensorMapType = _TensorMapArrayType = _DeviceView = None  # bound by bind_types() (numbatma._numba_internals.install)


def bind_types():
    """Bind the Numba types of descriptors and the view class the launch path compares with (on the GPU path only:
    the types register Numba data models)."""
    global _TensorMapType, _TensorMapArrayType, _DeviceView
    from ._descriptor_base import DeviceView
    from ._types import TensorMapArrayType, TensorMapType

    _TensorMapType, _TensorMapArrayType, _DeviceView = TensorMapType, TensorMapArrayType, DeviceView


def by_value_descriptor(ty):
    """Whether kernel parameter type ``ty`` is a descriptor passed by value (tiled or im2col)."""
    cls = type(ty)
    return cls is _TensorMapType or getattr(cls, "by_value_descriptor", False)


# -- hook 2: descriptor arguments at launch ----------------------------------------------------------
def _prepare_numbatma_arg(ty, val, kernelargs):
    """Append a descriptor argument; False for any other argument. On the launch path: keep it cheap."""
    cls = type(ty)
    if cls is _TensorMapType or getattr(cls, "by_value_descriptor", False):  # tiled or im2col descriptor
        desc = getattr(val, "_descriptor", _MISSING)
        if desc is _MISSING:
            _wrong_argument(ty, val)
        if desc is None or val._core_stale:  # (not encoded yet, or re-pointed since)
            desc = val.descriptor
        if getattr(val, "_device_id", None) is not None and several_devices():  # (one device: nothing to compare)
            _check_device(val, ty)
        kernelargs.append(desc)
        return True
    if cls is _TensorMapArrayType:
        if not hasattr(val, "tensormaps"):
            _wrong_argument(ty, val)
        if getattr(val, "_device_id", None) is not None and several_devices():
            _check_device(val, ty)
        kernelargs.append(ctypes.c_uint64(val.address))
        return True
    return False


_MISSING = object()


def current_device_id():
    """The ordinal of the device numba's own launches of this thread go to: numba's context (``get_context``: the
    current driver context, or one numba makes on device 0 when none is current). Not
    :func:`numbatma.devices.current_device`, which reads the driver's current context and answers None when there is
    none: here a launch is under way, so numba's answer is the one that holds."""
    from numba.cuda.cudadrv.devices import get_context

    return get_context().device.id


# The device of the prepared launch being built or patched (prepare_launch, PreparedLaunch.update), per thread: hook 2
# checks descriptors against it and accepts those of a peer the device may access (numbatma.enable_peer_access).
# Unset for numba's own launches, which pass cuda.core's descriptor: bound to its array's device, so no peers there.
_prepared_device = threading.local()


def _check_device(val, ty):
    """A descriptor (or array of descriptors) launched on another device than its memory's: TensorMapError, naming
    both devices and the fix. On a prepared launch's device (``_prepared_device``) a TensorMap of a peer's memory
    passes once ``numbatma.enable_peer_access(device, peer)`` was called."""
    prepared = getattr(_prepared_device, "device", None)
    current = current_device_id() if prepared is None else prepared
    have = val._device_id
    if have == current:
        return
    from ._descriptor_base import TensorMapError, TMADescriptor
    from .devices import peer_access_enabled

    kind = type(val).__name__
    peer = isinstance(val, TMADescriptor) and peer_access_enabled(current, have)
    if peer and prepared is not None:
        return
    if peer:
        fix = (f" Peer access from device {current} to device {have} is enabled, but numba's own launch passes "
               f"cuda.core's descriptor, which is bound to device {have}: launch through numbatma.prepare_launch (or a "
               f"numbatma.kernels plan) to use device {have}'s memory from device {current}.")
    elif isinstance(val, TMADescriptor):
        fix = (f" To read and write it from device {current} over NVLink instead, call "
               f"numbatma.enable_peer_access({current}, {have}) and launch through numbatma.prepare_launch (or a "
               f"numbatma.kernels plan).")
    else:
        fix = ""
    where = "the prepared launch runs" if prepared is not None else "the kernel launches"
    raise TensorMapError(
        f"{kind}: this {kind} describes memory of device {have}, but {where} on device {current}; TMA would read "
        f"device {have}'s addresses on device {current}. Build the {kind} from an array on device {current}, or "
        f"launch with device {have} current (with cuda.gpus[{have}]: or torch.cuda.device({have})).{fix}"
    )


def _wrong_argument(ty, val):
    """A launch argument that is not what the compiled kernel's parameter (``ty``) takes."""
    from ._descriptor_base import TensorMapError

    want = "numbatma.TensorMapArray" if type(ty) is _TensorMapArrayType else "numbatma.TensorMap"
    shape = getattr(val, "shape", None)
    got = type(val).__name__ + (f" of shape {tuple(shape)}" if shape is not None else "")
    raise TensorMapError(
        f"kernel argument: the kernel was compiled for a {want} ({ty}) here but got a {got}; pass the "
        f"{want.split('.')[1]} built from the array, not the array itself."
    )


def _descriptor_prepare_args(original):
    def _prepare_args(self, ty, val, stream, retr, kernelargs):
        if _prepare_numbatma_arg(ty, val, kernelargs):
            return
        return original(self, ty, val, stream, retr, kernelargs)

    return _prepare_args


def install_descriptor_arguments():
    from numba.cuda import dispatcher

    _patch(dispatcher._Kernel, "_prepare_args", _descriptor_prepare_args)


# -- hook 3: > 48 KiB dynamic shared memory (and the launch's cluster-grid check) ------------------------
def _ensure_dynamic_smem(kernel, nbytes):
    """Raise the kernel's dynamic shared memory limit to ``nbytes`` on the current device (numba-cuda loads kernels
    through cuLibrary, once per device: the handle is that device's CUkernel, ``cuKernelSetAttribute`` with the
    device). What each device was granted is kept per device (``_numbatma_dynamic_smem``: {device ordinal: bytes}):
    a launch on another device raises that device's limit too."""
    from .devices import current_device

    granted = getattr(kernel, "_numbatma_dynamic_smem", None)
    if granted is None:
        granted = kernel._numbatma_dynamic_smem = {}
    have = granted.get(current_device())
    if have is not None and nbytes <= have:
        return
    from cuda.bindings import driver

    cufunc = kernel._codelibrary.get_cufunc()
    static = int(cufunc.attrs.shared)
    device_id = cufunc.device.id
    if device_id not in granted:  # without the attribute, static + dynamic may reach 48 KiB
        granted[device_id] = _DEFAULT_DYNAMIC_SMEM_LIMIT - static
        if nbytes <= granted[device_id]:
            return
    err, limit = driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device_id
    )
    if err == driver.CUresult.CUDA_SUCCESS and nbytes + static > limit:
        raise ValueError(
            f"launch asks for {nbytes} bytes of dynamic shared memory; with the kernel's {static} bytes of "
            f"static shared memory that exceeds this device's per-block opt-in maximum of {limit} bytes."
        )
    (res,) = driver.cuKernelSetAttribute(
        driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        int(nbytes),
        cufunc.handle,
        driver.CUdevice(device_id),
    )
    if res != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes}) failed: {res.name}")
    granted[device_id] = nbytes


def compiled_kernel(dispatcher, args):
    """The compiled kernel (numba-cuda's ``_Kernel``) that launching ``dispatcher`` with ``args`` runs (compiling
    it now if needed)."""
    return dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in args))


def max_active_clusters(dispatcher, args, block, shared_mem, dims):
    """How many clusters of shape ``dims`` of this kernel can be resident on the current GPU at once
    (``cuOccupancyMaxActiveClusters``), with ``block`` threads and ``shared_mem`` bytes of dynamic shared
    memory per CTA. The kernel's dynamic shared-memory limit is raised first, as a launch would."""
    from cuda.bindings import driver

    kernel = compiled_kernel(dispatcher, args)
    _ensure_dynamic_smem(kernel, shared_mem)
    cufunc = kernel._codelibrary.get_cufunc()
    err, function = driver.cuKernelGetFunction(cufunc.handle)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuKernelGetFunction failed: {err.name}")
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = int(dims[0]), int(dims[1]), int(dims[2])
    config.blockDimX, config.blockDimY, config.blockDimZ = int(block), 1, 1
    config.sharedMemBytes = int(shared_mem)
    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = map(int, dims)
    config.attrs = [attribute]
    config.numAttrs = 1
    err, count = driver.cuOccupancyMaxActiveClusters(function, config)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed: {err.name}")
    return int(count)


def _checked_launch(original):
    from numba.cuda import config

    def launch(self, args, griddim, blockdim, stream=0, sharedmem=0):
        _check_compiled_cluster_grid(self, griddim)
        if sharedmem and not config.ENABLE_CUDASIM:
            _ensure_dynamic_smem(self, sharedmem)
        return original(self, args, griddim, blockdim, stream, sharedmem)

    return launch


def install_launch_checks():
    from numba.cuda import dispatcher

    _patch(dispatcher._Kernel, "launch", _checked_launch)


# -- hook 8: thread-block clusters ---------------------------------------------------------------------
_cluster = threading.local()


@contextlib.contextmanager
def cluster_launch(dims):
    """Kernel launches made by this thread within the block run in clusters of shape ``dims`` (an
    ``(x, y, z)`` tuple; None: no launch attribute)."""
    previous = getattr(_cluster, "dims", None)
    _cluster.dims = dims
    try:
        yield
    finally:
        _cluster.dims = previous


def _clustered_launch_config(original):
    """Wrap cuda.core's LaunchConfig as numba-cuda's launch calls it (keywords only): add the cluster shape of
    the enclosing :func:`cluster_launch`, with the grid (in blocks) converted to clusters."""

    def LaunchConfig(*args, **kwargs):
        dims = getattr(_cluster, "dims", None)
        if dims is not None and not args:
            _cluster.dims = None  # one launch per cluster_launch block
            grid = kwargs["grid"]
            kwargs["grid"] = tuple(g // c for g, c in zip(grid, dims))
            kwargs["cluster"] = tuple(dims)
        return original(*args, **kwargs)

    LaunchConfig._numbatma_original = original
    return LaunchConfig


def add_cluster_annotations(kernel, dims):
    """NVVM ``cluster_dim_x/y/z`` annotations of ``kernel`` (an LLVM function): PTX ``.reqnctapercluster``."""
    module = kernel.module
    annotations = module.add_named_metadata("nvvm.annotations")  # (the existing node, if there is one)
    for axis, d in zip("xyz", dims):
        annotations.add(module.add_metadata(
            (kernel, ir.MetaDataString(module, "cluster_dim_" + axis), ir.Constant(ir.IntType(32), int(d)))
        ))


def _launch_bounds_with_cluster(original):
    def set_launch_bounds(kernel, launch_bounds):
        original(kernel, launch_bounds)
        dims = getattr(launch_bounds, "cluster_dims", None)
        if dims is not None:
            add_cluster_annotations(kernel, dims)

    return set_launch_bounds


def _check_compiled_cluster_grid(kernel, griddim):
    dims = getattr(getattr(kernel, "launch_bounds", None), "cluster_dims", None)
    if dims is not None:
        check_grid(griddim, dims)


def install_clusters():
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import nvvm

    _patch(dispatcher, "LaunchConfig", _clustered_launch_config)
    _patch(nvvm, "set_launch_bounds", _launch_bounds_with_cluster)


# -- hook 11: programmatic dependent launch ------------------------------------------------------------------
_dependent = threading.local()


@contextlib.contextmanager
def dependent_launch(enabled=True):
    """Kernel launches made by this thread within the block (through numba, ``kernel[grid, block, stream,
    smem](*args)``, and prepared ones, :func:`prepare_launch`) are programmatic dependent launches when
    ``enabled`` (``False``: not, e.g. for one launch inside an enclosing block). Blocks nest."""
    previous = getattr(_dependent, "on", False)
    _dependent.on = bool(enabled)
    try:
        yield
    finally:
        _dependent.on = previous


def dependent_launches():
    """Whether launches made by this thread now are programmatic dependent launches (:func:`dependent_launch`)."""
    return getattr(_dependent, "on", False)


def _dependent_core_launch(original):
    """Wrap cuda.core's ``launch(stream, config, kernel, *args)`` as numba-cuda's ``_Kernel.launch`` calls it,
    with the ``LaunchConfig`` it has just built for this one launch: inside :func:`dependent_launch` that
    configuration gets ``programmatic_stream_serialization=True``."""

    def launch(stream, config, kernel, *args):
        if getattr(_dependent, "on", False):
            config.programmatic_stream_serialization = True
        return original(stream, config, kernel, *args)

    return launch


def install_dependent_launches():
    from numba.cuda import dispatcher

    _patch(dispatcher, "launch", _dependent_core_launch)
