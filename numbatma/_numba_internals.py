"""Every place numbatma reaches into numba-cuda internals, and nothing else.

Tested with numba-cuda 0.30.4 (``TESTED_RANGE``); importing numbatma with a version outside the range
raises, and ``tests/test_numba_internals.py`` checks that each hooked attribute still exists with the
expected shape, so an upstream change fails loudly instead of silently miscompiling.

The hooks, each installed by one function (:func:`install` runs 1-6, 8-9 and 11 on the GPU path, and 10 when
the debug mode is on; ``numbatma/__init__.py`` runs 7 under the simulator; 12 is applied to one kernel at a time):

1. :func:`install_grid_constant_params`. ``numba.cuda.cudadrv.nvvm.set_cuda_kernel`` (called by
   ``kernel_fixup`` for every kernel, after the return-value argument is dropped): kernel parameters whose LLVM
   type is a pointer to ``struct.numbatma.CUtensorMap`` become ``byval align 128`` and get an
   ``!nvvm.annotations !{kernel, !"grid_constant", !{i32 <1-based index>}}`` entry - the NVVM spelling of
   ``const __grid_constant__ CUtensorMap``.
2. :func:`install_descriptor_arguments`. ``numba.cuda.dispatcher._Kernel._prepare_args``: a TensorMap argument
   is handed to ``cuda.core.launch`` as its ``TensorMapDescriptor`` (128 bytes by value); a TensorMapArray as its
   device address. Either must describe memory of the launching device (:func:`_check_device`; on a prepared
   launch, of a peer it was given access to: ``numbatma.enable_peer_access``).
3. :func:`install_launch_checks`. ``numba.cuda.dispatcher._Kernel.launch``: a launch whose dynamic plus static
   shared memory exceeds 48 KiB first raises the kernel's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``
   (once per larger size and device); a kernel compiled for clusters (hook 8) checks its grid first.
4. :func:`install_shared_array_type`. ``numba.cuda.cudadecl.Cuda_shared_array``: ``cuda.shared.array`` is typed
   as :class:`numbatma._types.SharedArray`, so TMA operations can reject non-shared operands at typing time.
5. :func:`install_compile_ir`. ``numba.cuda.cudadrv.nvvm.compile_ir``: for sm_90 and older targets libNVVM
   parses the LLVM 7 IR dialect, which wants plain ``byval``; newer targets want ``byval(<type>)`` (what
   llvmlite prints). Modules holding a restricted instruction (a ``numbatma:`` marker) are first checked
   against the target (``numbatma.intrinsics._asm.check_targets``).
6. :func:`install_offline_target`. ``numba.cuda.dispatcher.get_current_device``: compiling a device function
   (``cuda.jit(device=True)``, ``overload_method`` implementations) asks the *current device* for its compute
   capability, which needs a driver. Inside :func:`offline_target` (used by ``numbatma.compile``) it answers
   with the compile target instead, so kernels built from device functions compile to PTX on machines without
   a GPU.
7. :func:`install_simulator` (simulator only; points listed by :func:`_simulator_hook_points`).
   ``numba.cuda.simulator.kernelapi.FakeCUDAShared.array`` refuses ``alignment=``, which every TMA kernel
   passes: the replacement accepts it and returns :class:`numbatma.intrinsics._sim.SharedArray` views (the
   simulator's race checks); ``numba.cuda.simulator.kernel.BlockThread.syncthreads`` is wrapped so block
   barriers pass on what each thread knows complete, and ``BlockThread.run`` so the engine sees each thread
   start and end; ``BlockManager.run`` is replaced by one that sleeps between polls; ``FakeCUDAModule`` gets
   the warp operations it lacks (``syncwarp``, ``shfl_*_sync``) and the libdevice functions kernels use;
   ``FakeCUDADevice`` reports 2 SMs and Hopper's shared-memory opt-in limit. Parity with the GPU build
   (:func:`install_simulator_launches`, points listed by :func:`_simulator_jit_points`): the simulator's
   ``cuda.jit`` (``numba.cuda.simulator.api.jit``, also bound as ``numba.cuda.jit``) takes the GPU's options
   (:data:`GPU_JIT_OPTIONS`; compile-only ones ignored); ``FakeCUDAKernel.__call__`` runs a host thread's launch
   whole under one process-wide lock (upstream supports one kernel context per process) and
   ``FakeCUDAKernel.__getitem__`` configures a copy; ``cuda.shared.array`` shapes and wgmma accumulator
   indices must be compile-time constants by numba's rule, read from the kernel's IR
   (:func:`check_constant_operand`).
8. :func:`install_clusters`. Thread-block clusters (``numbatma/cluster.py``).
   ``numba.cuda.dispatcher.LaunchConfig`` (the ``cuda.core.LaunchConfig`` that ``_Kernel.launch`` builds):
   inside :func:`cluster_launch` (what ``numbatma.with_cluster`` uses) the launch gets ``cluster=(x, y, z)`` and
   its grid divided by the cluster shape (cuda.core counts a clustered grid in clusters; numbatma's callers
   count blocks). ``numba.cuda.cudadrv.nvvm.set_launch_bounds``: a ``launch_bounds`` carrying
   ``cluster_dims`` (:class:`numbatma.cluster.ClusterLaunchBounds`) also gets the kernel's NVVM
   ``cluster_dim_{x,y,z}`` annotations (PTX ``.explicitcluster`` / ``.reqnctapercluster``); ``_Kernel.launch``
   (hook 3's wrapper) checks that the grid is a multiple of such a kernel's cluster shape.
9. :func:`install_typing_errors`. Typing errors at the user's line (``numbatma/errors.py``): the ``__call__``
   of every constraint class of ``numba.cuda.core.typeinfer`` (``CallConstraint``, ``IntrinsicCallConstraint``,
   ``SetItemConstraint``, ...; listed by :func:`_constraint_classes`; each instance has the statement's
   ``loc``) is wrapped: a constraint that fails after a numbatma typer raised
   :class:`numbatma.errors.TypingError` raises that error instead of Numba's "No implementation of function
   ..." summary, located at the statement. It relies on ``ConstraintNetwork.propagate`` calling
   ``constraint(typeinfer)`` for each constraint and on Numba's ``TypingError`` (numba.core) passing through
   numba-cuda's ``except TypingError`` (numba.cuda.core's class) unchanged; were numba-cuda to catch it, the
   message would still start with numbatma's line.
   ``numba.cuda.core.typeinfer.TypeInferer.typeof_global`` is wrapped too: a global or closure variable holding
   a plain Python function numba cannot type is refused at the statement, saying to make it a device function.
10. :func:`install_debug_mode`. GPU debug mode (``numbatma/debug.py``, installed only when ``NUMBATMA_DEBUG``
   is on): ``numba.cuda.lowering.Lower.lower_inst`` is wrapped to keep, per thread, the statement being
   lowered, so an intrinsic's codegen can name its kernel file:line and the kernel variables of its operands
   (:func:`lowering_site`); ``numba.cuda.dispatcher.CUDACache._index_key`` gets the debug settings appended,
   so the on-disk cache (``cache=True``) never hands a debug build to a normal process or the reverse.
11. :func:`install_dependent_launches`. Programmatic dependent launch (``numbatma.dependent_launch``):
   ``numba.cuda.dispatcher.launch`` (the ``cuda.core.launch`` that ``_Kernel.launch`` calls with the
   ``LaunchConfig`` it has just built for this launch) is wrapped: inside :func:`dependent_launch` the
   configuration gets ``programmatic_stream_serialization=True`` (CUDA's
   ``cudaLaunchAttributeProgrammaticStreamSerialization``: the kernel may start before the previous kernel
   on its stream has finished; it waits with ``griddepcontrol.wait``). It composes with hook 8's cluster
   launches. Prepared launches (:func:`prepare_launch`) read the same scope themselves and launch dependent
   through ``cuLaunchKernelEx`` with :func:`launch_config`'s attribute.
12. :func:`enable_disk_cache`. On-disk cache of numbatma's kernels (per kernel, not installed globally; used by
   ``numbatma.kernels`` through ``numbatma.compile.enable_disk_cache``): the dispatcher's ``_cache`` (what
   ``CUDADispatcher.enable_caching`` sets for ``cache=True``) becomes a subclass of ``numba.cuda.dispatcher.CUDACache``
   whose ``_index_key`` is upstream's ``(sig, codegen.magic_tuple(), numba_cuda.__version__, (sha256 of the
   bytecode, sha256 of X))`` with X an explicit key string instead of the cloudpickle of the closure cells (which
   holds other dispatchers and differs from process to process), plus upstream's launch-config entry and hook 10's
   debug key. Its ``_load_overload`` / ``_save_overload`` (upstream's, with the index key stored next to the data
   and compared on load, so a data file another process's save overwrote is a miss, never another kernel; any
   error is a warning and a miss, never a failed launch) also give a loaded kernel back its ``launch_bounds``,
   which ``_Kernel._rebuild`` drops (hook 3 and prepared launches read its cluster shape there). Upstream
   objects relied on: :func:`_disk_cache_hook_points`.

Prepared launches (:func:`prepare_launch`, no patching) do once what ``numba.cuda.dispatcher._Kernel.launch`` does
per launch - the arguments marshalled by ``_Kernel._prepare_args`` (hook 2 in front) - and then what cuda.core's
``launch`` does with those values, themselves: :class:`KernelParams` lays them out as cuda.core's argument holder
would (:func:`param_field`; a by-value descriptor as the descriptor's own driver ``CUtensorMap``) and a run is one
``cuLaunchKernel`` of the compiled ``CUkernel`` (``CudaPythonFunction.handle``, the handle of the cuda.core
``Kernel`` that ``_Kernel.launch`` launches) on the stream's handle (a numba ``Stream``'s ``handle``; other streams
through ``numba.cuda.cudadrv.driver._to_core_stream``); a failed launch raises numba's ``CudaAPIError``.
:meth:`PreparedLaunch.update` patches a replaced array's address at the data pointer's place, the fifth of an
array's values - checked against the array's address when prepared, and by ``tests/test_numba_internals.py``
against numba-cuda's source, as are the other names here; where the driver tells the kernel's parameter sizes
(``cuKernelGetParamInfo``) the layout is checked against them at prepare time.

Accessors (no patching): the numba-cuda private names numbatma's other modules use, so that they import them
from here only (points listed by :func:`_accessor_points`): :func:`intrinsic`
(``numba.cuda.extending._intrinsic``), :func:`make_array` / :func:`populate_array`
(``numba.cuda.np.arrayobj``), :func:`call_sreg` (``numba.cuda.nvvmutils.call_sreg``), :func:`declare_vprintf`,
:func:`string_constant`, :func:`compile_capability` (the target of the compilation running now:
``targetconfig.ConfigStack``'s flags), :func:`lowering_loc` (the statement ``Lower.lower_inst`` is lowering), and
the simulator's block of a thread: :func:`simulated_block` (a simulated
thread's ``_manager``), :func:`simulated_block_dim` / :func:`simulated_grid_dim` (its ``_block_dim`` /
``_grid_dim``), :func:`simulated_device_array` (``FakeCUDAArray``).
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
import types as _pytypes

from llvmlite import ir

from ._scalars import same_scalar
from ._shapes import check_grid
from .devices import several_devices

TESTED_RANGE = ((0, 30, 4), (0, 31, 0))  # [low, high)
_DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024
_installed = False
_offline = threading.local()
_TensorMapType = _TensorMapArrayType = _DeviceView = None  # bound by install()


def numba_cuda_version():
    from importlib.metadata import version

    parts = []
    for p in version("numba-cuda").split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_version():
    v = numba_cuda_version()
    lo, hi = TESTED_RANGE
    if not lo <= v < hi:
        raise ImportError(
            f"numbatma supports numba-cuda >= {'.'.join(map(str, lo))}, < {'.'.join(map(str, hi))} (it patches "
            f"internals that change between releases); found {'.'.join(map(str, v))}."
        )


def _patch(owner, attr, make):
    """Replace ``owner.attr`` by ``make(original)``, once: the replacement keeps the original as
    ``_numbatma_original``, and a second call finds it there and leaves it alone."""
    current = getattr(owner, attr)
    if getattr(current, "_numbatma_original", None) is not None:
        return
    replacement = make(current)
    replacement._numbatma_original = current
    setattr(owner, attr, replacement)


# -- hook 1: by-value __grid_constant__ descriptor parameters -------------------------------------
def mark_grid_constant_params(function):
    """Make every descriptor parameter of ``function`` a by-value ``__grid_constant__`` parameter.

    NVVM reads one ``grid_constant`` annotation per kernel listing all 1-based parameter indices."""
    from ._types import CUTENSORMAP_PTR

    module = function.module
    indices = []
    for index, arg in enumerate(function.args):
        if arg.type != CUTENSORMAP_PTR:
            continue
        arg.attributes.add("byval")
        arg.attributes.align = 128
        indices.append(index + 1)
    if indices:
        md = module.add_metadata(
            (
                function,
                ir.MetaDataString(module, "grid_constant"),
                module.add_metadata(tuple(ir.Constant(ir.IntType(32), i) for i in indices)),
            )
        )
        module.add_named_metadata("nvvm.annotations", md)


def _grid_constant_set_cuda_kernel(original):
    def set_cuda_kernel(function):
        mark_grid_constant_params(function)
        return original(function)

    return set_cuda_kernel


def install_grid_constant_params():
    from numba.cuda.cudadrv import nvvm

    _patch(nvvm, "set_cuda_kernel", _grid_constant_set_cuda_kernel)


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


def _dims3(d):
    """A grid or block (an int, or a tuple of 1-3 ints) as three ints."""
    if isinstance(d, tuple):
        return tuple(int(x) for x in d) + (1,) * (3 - len(d))
    return int(d), 1, 1


def launch_config(grid, block, shared_mem, dependent=False, stream=None):
    """The driver's ``CUlaunchConfig`` (``cuLaunchKernelEx``) of a prepared launch: ``grid`` and ``block`` (ints or
    tuples of 1-3 ints), ``shared_mem`` bytes of dynamic shared memory, with ``dependent`` the programmatic stream
    serialization attribute (programmatic dependent launch), on ``stream`` (a ``CUstream``; None: the legacy default
    stream). Builds nothing else, needs no GPU."""
    from cuda.bindings import driver

    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = _dims3(grid)
    config.blockDimX, config.blockDimY, config.blockDimZ = _dims3(block)
    config.sharedMemBytes = int(shared_mem)
    if dependent:
        attribute = driver.CUlaunchAttribute()
        attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attribute]
        config.numAttrs = 1
    if stream is not None:
        config.hStream = stream
    return config


def prepare_launch(dispatcher, args, grid, block, shared_mem, dependent=False, scoped=True, sources=None):
    """A :class:`PreparedLaunch`: ``run(stream=0)`` launches ``dispatcher`` with ``args`` exactly as
    ``dispatcher[grid, block, stream, shared_mem](*args)`` would, with the arguments converted once: numba's
    per-launch work (argument typing, overload lookup, marshalling of every argument) and cuda.core's (its
    argument holder, launch configuration and stream objects) are skipped, a run is one ``cuLaunchKernel``.
    None where that cannot be done faithfully (a debug or cooperative kernel, an argument numba copies back after
    the launch, a marshalled value of a kind :class:`KernelParams` does not lay out). With ``dependent``, every run
    is a programmatic dependent launch (``cuLaunchKernelEx`` with :func:`launch_config`'s attribute); without it, a
    run made inside :func:`dependent_launch` (hook 11) is one - unless ``scoped`` is False. ``sources``: the
    arguments as the caller holds them (``args`` is them as a launch passes them, e.g. a ``DeviceView``'s numba
    array), what :meth:`PreparedLaunch.update` compares with; default ``args``.

    The arguments are marshalled by numba-cuda's own ``_Kernel._prepare_args`` (hook 2 for descriptors), then laid
    out once in a :class:`KernelParams` block; where the driver tells the kernel's parameter sizes
    (``cuKernelGetParamInfo``, CUDA 12.4+) they are checked against that layout now, so a layout numba-cuda
    changed fails here, loudly, not at the launch.

    Devices: the launch belongs to the device current now (the compiled kernel is loaded there; its descriptors must
    describe that device's memory, or a peer's it may access: ``numbatma.enable_peer_access``) and every run goes
    there: in a process that sees several devices a run compares the calling thread's current context with the
    prepared one (``cuCtxGetCurrent``) and, where another is current, launches with the prepared one pushed for the
    launch (``cuCtxPushCurrent`` / ``cuCtxPopCurrent``); the stream must then be one of that device."""
    kernel = compiled_kernel(dispatcher, args)
    if kernel.debug or getattr(kernel, "cooperative", False):
        return None
    _ensure_dynamic_smem(kernel, shared_mem)
    dims = getattr(getattr(kernel, "launch_bounds", None), "cluster_dims", None)
    if dims is not None:  # (compiled cluster shape: the driver takes it from the kernel; no launch attribute)
        check_grid(grid, dims)
    cufunc = kernel._codelibrary.get_cufunc()
    device = getattr(getattr(cufunc, "device", None), "id", None)  # (the device current now: where this launches)
    sources = tuple(args if sources is None else sources)
    kernelargs, writeback, slots, descriptors = [], [], [], {}
    _prepared_device.device = device  # (hook 2 checks descriptors against it, peers allowed)
    try:
        for ty, value, source in zip(kernel.argument_types, args, sources):
            start = len(kernelargs)
            kernel._prepare_args(ty, value, 0, writeback, kernelargs)
            slot = _argument_slot(ty, source, kernelargs, start)
            if slot[0] == "descriptor":
                if slot[2] - start != 1:
                    return None
                descriptors[start] = value.driver_tensor_map()  # (what the launch passes: see KernelParams)
            slots.append(slot)
    finally:
        _prepared_device.device = None
    if writeback:  # (a host array: numba copies it to the device and back around each launch)
        return None
    params = KernelParams.build(kernelargs, descriptors)
    if params is None:
        return None
    check_params(kernel, cufunc.handle, params, slots)
    from cuda.bindings import driver

    several = device is not None and several_devices()  # (one device: every context is its; nothing to compare)
    run = ContextLaunch() if several else PreparedLaunch()
    run.dispatcher, run.kernel, run.function = dispatcher, kernel, driver.CUfunction(int(cufunc.handle))
    run.grid, run.block, run.shared_mem = _dims3(grid), _dims3(block), int(shared_mem)
    run.dependent, run.scoped, run.slots, run.params = bool(dependent), scoped, tuple(slots), params
    run.sources = run.keep_alive = sources
    run._launch, run._launch_ex = driver.cuLaunchKernel, driver.cuLaunchKernelEx
    run._stream_memo = run._dependent_memo = (None, None)
    run.device, run.context = device, None
    if several:
        err, context = driver.cuCtxGetCurrent()
        run.context = context if not err and int(context) else None
        run._current, run._push, run._pop = driver.cuCtxGetCurrent, driver.cuCtxPushCurrent, driver.cuCtxPopCurrent
    return run


class PreparedLaunch:
    """A prepared launch (:func:`prepare_launch`): ``run(stream=0)`` launches; :meth:`update` re-points it at other
    arguments of the same types. Per run: the stream's ``CUstream`` (the last stream converted is kept: the same
    stream object again costs nothing) and ``cuLaunchKernel`` with the parameter block built once
    (:class:`KernelParams`); a dependent run (``dependent``, or ``scoped`` inside :func:`dependent_launch`)
    ``cuLaunchKernelEx`` with the programmatic stream serialization attribute.

    ``stream``: what numba's launch takes (0, a numba stream, a cuda.core stream) or a raw ``CUstream`` handle (an
    int). A descriptor argument is passed from the descriptor's own encoded ``CUtensorMap``
    (:meth:`numbatma.TensorMap.driver_tensor_map`): re-pointing it in place is seen by the next run.

    ``device``: the device it was prepared on (None: unknown, offline), where every run goes. In a process that sees
    one device that is all there is to it; where it sees several, the launch is a :class:`ContextLaunch`, which
    compares the current context with the one it was prepared in (``context``) at each run."""

    __slots__ = ("dispatcher", "kernel", "function", "grid", "block", "shared_mem", "dependent", "scoped", "slots",
                 "params", "sources", "keep_alive", "_launch", "_launch_ex", "_stream_memo", "_dependent_memo",
                 "device", "context", "_current", "_push", "_pop")

    def __call__(self, stream=0):
        seen, handle = self._stream_memo
        if seen is not stream:
            handle = cu_stream(stream)
            self._stream_memo = (stream, handle)
        if self.dependent or self.scoped and getattr(_dependent, "on", False):
            seen, config = self._dependent_memo
            if seen is not handle:
                config = launch_config(self.grid, self.block, self.shared_mem, True, handle)
                self._dependent_memo = (handle, config)
            err = self._launch_ex(config, self.function, self.params.address, 0)[0]
        else:
            grid, block = self.grid, self.block
            err = self._launch(self.function, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                               self.shared_mem, handle, self.params.address, 0)[0]
        if err:
            _launch_failed(err, self)

    def update(self, sources):
        """Re-point this launch at ``sources`` (the arguments, as given to :func:`prepare_launch`, some of them
        replaced) without preparing it again: an array replaced by one of the same shape, byte strides and dtype
        gets its address patched into the parameter block, a descriptor replaced by one of the same type is passed
        instead (its own ``CUtensorMap``), a scalar of the same type is written. Returns True, or False (nothing
        changed) where it cannot: another type or layout, an argument kind it does not patch; then prepare again."""
        if type(sources) is not tuple:
            sources = tuple(sources)
        if len(sources) != len(self.sources):
            return False
        patches = None
        for new, old, slot in zip(sources, self.sources, self.slots):
            if new is old:
                continue
            kind = slot[0]
            if kind == "array":
                ptr = _array_address(new, old, slot)
                if ptr is None:
                    return False
                writes = ((slot[1] + _ARRAY_PTR, ptr),)
            elif kind == "scalar" and same_scalar(old, new):  # (not for -0.0 after 0.0, though they are ==)
                continue
            else:
                values = _patched_slot(self, slot, new)
                writes = None if values is None else self.params.writes(slot[1], values)
                if writes is None:
                    return False
            if patches is None:
                patches = list(writes)
            else:
                patches += writes
        if patches:
            fields, pointers, held = self.params.fields, self.params.pointers, self.params.held
            for at, value in patches:
                field = fields[at]
                if field is not None:  # (an array's address, a scalar)
                    field.value = value
                else:  # (a by-value descriptor: its CUtensorMap)
                    held[at] = value
                    pointers[at] = value.getPtr()
        self.sources = self.keep_alive = sources  # (the parameter block holds addresses into these)
        return True


class ContextLaunch(PreparedLaunch):
    """A :class:`PreparedLaunch` in a process that sees several devices: a run compares the calling thread's current
    context with the one the launch was prepared in (``context``: one ``cuCtxGetCurrent``) and, where another is
    current, launches with its own pushed for the launch (``cuCtxPushCurrent`` / ``cuCtxPopCurrent``): the kernel
    runs on the device it was prepared on (where it is loaded and its descriptors' memory is), whatever device is
    current. The stream must be one of that device."""

    __slots__ = ()

    def __call__(self, stream=0):
        context = self.context
        if context is None or self._current()[1] == context:
            return PreparedLaunch.__call__(self, stream)
        err = self._push(context)[0]
        if err:
            _launch_failed(err, self, True)
        try:
            PreparedLaunch.__call__(self, stream)
        except Exception as exc:  # noqa: BLE001 - a launch the driver refused: said again, with where it ran
            code = getattr(exc, "code", None)
            if code is None:
                raise
            _launch_failed(code, self, True)
        finally:
            self._pop()


def cu_stream(stream):
    """The ``CUstream`` (cuda.bindings) of a stream as a prepared run takes it: 0 / None, a numba stream, what
    numba's launch accepts besides (a cuda.core stream: ``_to_core_stream``), or a raw handle (an int)."""
    from cuda.bindings import driver

    if not stream:
        return driver.CUstream(0)
    if type(stream) is int:
        return driver.CUstream(stream)
    from numba.cuda.cudadrv.driver import Stream, _to_core_stream

    if isinstance(stream, Stream):
        return driver.CUstream(int(stream.handle or 0))
    return driver.CUstream(int(_to_core_stream(stream).handle))


def _launch_failed(err, run, elsewhere=False):
    from cuda.bindings import driver
    from numba.cuda.cudadrv.driver import CudaAPIError

    try:
        _, text = driver.cuGetErrorString(err)
    except Exception:  # noqa: BLE001 - (the error's name says enough)
        text = None
    name = getattr(run.dispatcher, "__name__", None) or getattr(getattr(run.dispatcher, "py_func", None),
                                                                  "__name__", "kernel")
    where = ""
    if elsewhere:  # (run with its own context pushed: the calling thread's current device is another)
        where = (f"; it runs on device {run.device}, where it was prepared, while the calling thread's current device "
                 f"is another: the stream must be one of device {run.device}")
    raise CudaAPIError(err, f"launching {name} (grid {run.grid}, block {run.block}, {run.shared_mem} bytes of "
                            f"dynamic shared memory) failed: {getattr(err, 'name', err)}: "
                            f"{text.decode() if text else ''}{where}")


# -- the kernel parameter block -----------------------------------------------------------------------------------
_PARAM_CTYPES = (ctypes.c_bool, ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint8,
                 ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_float, ctypes.c_double)
_NUMPY_CTYPES = {"?": ctypes.c_bool, "b": ctypes.c_int8, "h": ctypes.c_int16, "i": ctypes.c_int32,
                 "l": ctypes.c_int64, "q": ctypes.c_int64, "B": ctypes.c_uint8, "H": ctypes.c_uint16,
                 "I": ctypes.c_uint32, "L": ctypes.c_uint64, "Q": ctypes.c_uint64, "f": ctypes.c_float,
                 "d": ctypes.c_double, "e": ctypes.c_uint16}


def param_field(value):
    """``(ctypes type, value)``: how a value numba's marshalling produced travels as a kernel parameter - cuda.core's
    ``launch`` rules (its ``ParamHolder``), which numba-cuda's own launches go through: a Python bool as a C++
    bool, an int as a 64-bit integer (pointers, sizes, shapes, strides), a float as a double, a ctypes scalar as
    itself, a NumPy scalar as its own type (float16 as its bits). None for anything else (complex numbers,
    cuda.core buffers, records): such a launch is not prepared."""
    if isinstance(value, bool):  # (a C++ bool, as cuda.core's ParamHolder; numba's boolean arguments)
        return ctypes.c_bool, value
    if isinstance(value, int):
        return ctypes.c_uint64, int(value) & 0xFFFF_FFFF_FFFF_FFFF
    if isinstance(value, float):
        return ctypes.c_double, value
    if isinstance(value, ctypes._SimpleCData):
        for ctype in _PARAM_CTYPES:
            if isinstance(value, ctype):
                return ctype, value.value
        return None
    import numpy as np

    if not isinstance(value, np.generic):
        return None
    ctype = _NUMPY_CTYPES.get(value.dtype.char)
    if ctype is None:
        return None
    if value.dtype.char == "e":  # (float16: its bits, as cuda.core's __half_raw)
        return ctype, int(value.view(np.uint16))
    return ctype, value.item()


class KernelParams:
    """The parameter block of a prepared launch, built once: every value numba marshalled (an array's meminfo,
    parent, size, itemsize, data pointer, shape and strides; scalars) in one ctypes buffer, each as a ctypes field
    that :meth:`PreparedLaunch.update` writes in place, and the ``void*[]`` array the driver reads (``address``):
    entry ``i`` points at value ``i``'s bytes, or for a by-value descriptor at the descriptor's own encoded
    ``CUtensorMap`` (128 bytes; re-pointing it in place needs nothing here). ``sizes``: the bytes behind each entry;
    ``exact``: whether the kernel's parameter must be exactly that size (a Python int, 8 bytes, may fill a smaller
    integer parameter, as with cuda.core's launch)."""

    __slots__ = ("storage", "pointers", "address", "fields", "sizes", "exact", "held")

    @classmethod
    def build(cls, values, descriptors=None):
        """The block of the marshalled ``values``; ``descriptors``: {index: the ``CUtensorMap`` passed at that index
        (instead of ``values[index]``)}. None when a value is of a kind :func:`param_field` does not lay out."""
        descriptors = descriptors or {}
        layout, offset = [], 0
        for i, value in enumerate(values):
            if i in descriptors:
                layout.append(None)
                continue
            field = param_field(value)
            if field is None:
                return None
            size = ctypes.sizeof(field[0])
            offset = -(-offset // size) * size  # (natural alignment)
            layout.append((field, offset))
            offset += size
        self = cls()
        self.storage = ctypes.create_string_buffer(max(offset, 8))
        self.pointers = (ctypes.c_void_p * max(len(values), 1))()
        self.address = ctypes.addressof(self.pointers) if values else 0
        self.fields, self.sizes, self.exact, self.held = [], [], [], {}
        base = ctypes.addressof(self.storage)
        for i, entry in enumerate(layout):
            if entry is None:
                tensor_map = descriptors[i]
                self.held[i] = tensor_map
                self.pointers[i] = tensor_map.getPtr()
                self.fields.append(None)
                self.sizes.append(128)
                self.exact.append(True)
                continue
            (ctype, value), offset = entry
            field = ctype.from_buffer(self.storage, offset)
            field.value = value
            self.pointers[i] = base + offset
            self.fields.append(field)
            self.sizes.append(ctypes.sizeof(ctype))
            self.exact.append(not (ctype is ctypes.c_uint64 and isinstance(values[i], int)))
        return self

    def writes(self, start, values):
        """``[(entry, what), ...]``: how to write ``values`` (marshalled as at :meth:`build`) at entries ``start...``:
        a field's new value, or for a by-value descriptor its ``CUtensorMap``; None where a value is of another kind
        than its entry (nothing can be patched then)."""
        fields, out = self.fields, []
        for i, value in enumerate(values, start):
            if i >= len(fields):
                return None
            if fields[i] is None:
                if not hasattr(value, "getPtr"):
                    return None
                out.append((i, value))
                continue
            field = param_field(value)
            if field is None or field[0] is not type(fields[i]):
                return None
            out.append((i, field[1]))
        return out

    def value_bytes(self, i):
        """The bytes the driver reads for parameter ``i`` (for checks and tests)."""
        return ctypes.string_at(self.pointers[i], self.sizes[i])


def kernel_param_sizes(kernel, handle, expected):
    """The sizes of the compiled kernel's parameters, as the driver lays them out, remembered on the kernel; None where
    the driver cannot tell (before CUDA 12.4). The count comes from ``cuKernelGetParamCount`` (CUDA 12.9+), each size
    from ``cuKernelGetParamInfo`` on the ``CUkernel`` ``handle``; only indices that exist are asked for (an index past
    the last parameter is an API error that compute-sanitizer reports in the user's program). A driver without
    ``cuKernelGetParamCount``: the ``expected`` count (what numbatma laid out) is asked for, so a kernel with fewer
    parameters fails the check (a missing index) and one with more is not told apart."""
    sizes = getattr(kernel, "_numbatma_param_sizes", _MISSING)
    if sizes is not _MISSING:
        return sizes
    from cuda.bindings import driver

    info = getattr(driver, "cuKernelGetParamInfo", None)
    count_of = getattr(driver, "cuKernelGetParamCount", None)
    ok = driver.CUresult.CUDA_SUCCESS
    sizes = None
    try:
        count = None
        if count_of is not None:
            err, n = count_of(handle)
            count = int(n) if err == ok else None
        if info is not None:
            sizes = []
            for i in range(count if count is not None else expected):
                err, _, size = info(handle, i)
                if err != ok:
                    sizes = None if count is not None or i == 0 else sizes
                    break
                sizes.append(int(size))
    except Exception:  # noqa: BLE001 - (a driver without the entry points)
        sizes = None
    try:
        kernel._numbatma_param_sizes = sizes
    except AttributeError:  # (a kernel object that takes no attributes: asked again next time)
        pass
    return sizes


def check_params(kernel, handle, params, slots):
    """Raise RuntimeError where the parameter block does not fit the kernel's parameters as the driver lays them
    out (their count, and each one's size); nothing where the driver cannot tell. A kernel without parameters
    (``cuKernelGetParamInfo`` answers INVALID_VALUE for index 0) is not checked either."""
    sizes = kernel_param_sizes(kernel, handle, len(params.sizes))
    if sizes is None:
        return
    have = params.sizes
    bad = len(sizes) != len(have) or any(
        want != got if exact else want > got for want, got, exact in zip(sizes, have, params.exact))
    if bad:
        owners = []
        for slot in slots:
            owners += [str(slot[3])] * (slot[2] - slot[1])
        detail = ", ".join(f"{o}: {g} bytes" for o, g in zip(owners, have))
        raise RuntimeError(
            f"numbatma's prepared launch laid out {len(have)} kernel parameters ({detail}) but the compiled kernel "
            f"takes {len(sizes)} of {list(sizes)} bytes: numba-cuda marshals arguments differently from what "
            f"numbatma/_numba_internals.py expects (tested with numba-cuda {'.'.join(map(str, TESTED_RANGE[0]))}).")


_ARRAY_PTR = 4  # numba's array argument: meminfo, parent, size, itemsize, data pointer, shape..., strides...


def _argument_slot(ty, source, kernelargs, start):
    """How argument ``source`` (typed ``ty``) sits in ``kernelargs[start:]``: (kind, start, stop, ty, layout, record);
    for an array ``layout`` is (shape, byte strides, the dtype as a kernel sees it) and ``record`` the interned layout
    record of ``source`` (:func:`numbatma.layout_record`; None for a view), else both None."""
    from numba.cuda import types

    stop = len(kernelargs)
    cls = type(ty)
    if cls is _TensorMapType or getattr(cls, "by_value_descriptor", False):
        return ("descriptor", start, stop, ty, None, None)
    if isinstance(ty, types.Array) and stop - start == _ARRAY_PTR + 1 + 2 * ty.ndim:
        facts = _array_facts(source)
        if facts is not None and kernelargs[start + _ARRAY_PTR] == facts[0]:
            return ("array", start, stop, ty, facts[1], facts[2])
    elif isinstance(ty, (types.Integer, types.Float, types.Boolean, types.Complex)):
        return ("scalar", start, stop, ty, None, None)
    return ("other", start, stop, ty, None, None)


def _array_facts(array):
    """(ptr, (shape, byte strides, the dtype as a kernel sees it), interned record or None) of an array argument
    (a :class:`numbatma.DeviceView`: its own layout), or None."""
    from ._descriptor_base import DeviceView, bits_dtype, layout_record

    try:
        if type(array) is DeviceView:  # (a plan's views: their layout as it is)
            lay = array.layout
            return lay.ptr, (lay.shape, lay.strides, bits_dtype(lay.dtype)), None
        ptr, record = layout_record(array)
    except Exception:  # noqa: BLE001 - not an array numbatma reads: not patched
        return None
    return ptr, (record[0], record[1], bits_dtype(record[2])), record


def _array_address(new, old, slot):
    """The address of ``new``, replacing ``old`` in the array slot ``slot``, when its layout is the slot's; else
    None. Cheap for what re-pointing makes: a view re-made from the old one (the same shape, strides and dtype
    objects) and an array of the same interned layout record."""
    if type(new) is _DeviceView:
        if type(old) is _DeviceView and new._base is old._base:  # (re-made from it: only the address differs)
            return new._ptr
    elif slot[5] is not None:
        from ._descriptor_base import layout_record

        try:
            ptr, record = layout_record(new)
        except Exception:  # noqa: BLE001 - not an array numbatma reads
            return None
        if record is slot[5]:
            return ptr
    facts = _array_facts(new)
    return facts[0] if facts is not None and facts[1] == slot[4] else None


def _patched_slot(run, slot, new):
    """The marshalled values of the argument ``new`` in ``slot`` of ``run`` (a descriptor: its ``CUtensorMap``),
    or None (cannot patch)."""
    kind, start, stop, ty = slot[:4]
    values = []
    if kind == "descriptor":
        if getattr(new, "numba_type", None) != ty:
            return None
        _prepared_device.device = run.device  # (the checks of a launch: the argument's kind, its device)
        try:
            _prepare_numbatma_arg(ty, new, values)
        finally:
            _prepared_device.device = None
        values = [new.driver_tensor_map()]
    elif kind == "scalar":
        try:
            same_type = run.dispatcher.typeof_pyval(new) == ty
        except Exception:  # noqa: BLE001 - numba cannot type it: prepare again (which raises what numba raises)
            same_type = False
        if not same_type:
            return None
        run.kernel._prepare_args(ty, new, 0, [], values)
    else:
        return None
    return values if len(values) == stop - start else None


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



# -- hook 4: cuda.shared.array typed as a shared array ------------------------------------------------
def _shared_array_generic(original):
    def generic(self):
        from numba.cuda import types

        from ._types import SharedArray

        typer = original(self)

        def shared_typer(shape, dtype, alignment=None):
            res = typer(shape, dtype, alignment)
            if res is None and not _literal_shape(shape):  # (a computed shape: say so, at the user's line)
                from .errors import TypingError

                raise TypingError(f"cuda.shared.array: {SHAPE_RULE}; got {shape}")
            if isinstance(res, types.Array) and not isinstance(res, SharedArray):
                if isinstance(shape, types.IntegerLiteral):
                    static = (shape.literal_value,)
                else:
                    static = tuple(s.literal_value for s in shape)
                if any(s <= 0 for s in static):  # dynamic shared memory: size known only at launch
                    static = None
                declared = getattr(alignment, "literal_value", None)
                return SharedArray(res.dtype, res.ndim, res.layout, shape=static,
                                   alignment=declared if isinstance(declared, int) else None)
            return res

        return shared_typer

    return generic


def _literal_shape(shape):
    from numba.cuda import types

    if isinstance(shape, types.IntegerLiteral):
        return True
    return isinstance(shape, types.BaseTuple) and all(isinstance(s, types.IntegerLiteral) for s in shape)


def install_shared_array_type():
    from numba.cuda import cudadecl

    _patch(cudadecl.Cuda_shared_array, "generic", _shared_array_generic)


# -- hook 5: the NVVM IR dialect of the target (and restricted instructions) ------------------------------
# libNVVM parses two IR dialects: for sm_90 and older targets the LLVM 7 one, which wants a plain
# ``byval``; for sm_100 and newer the modern one, which wants ``byval(<type>)``. llvmlite prints the typed
# form (hook 1's parameters); this hook strips the type for the old dialect.
_TYPED_BYVAL = 'byval(%"struct.numbatma.CUtensorMap")'


def _nvvm_ir_for_arch(ir_text, arch):
    """Spell the descriptor ``byval`` the way libNVVM parses it for ``arch`` (e.g. ``compute_90a``)."""
    digits = "".join(ch for ch in str(arch) if ch.isdigit())
    if digits and int(digits) < 100 and isinstance(ir_text, str):
        return ir_text.replace(_TYPED_BYVAL, "byval")
    return ir_text


def _compile_ir_for_arch(original):
    def compile_ir(llvmir, **options):
        arch = options.get("arch", "")
        from numbatma.intrinsics import all_ptx
        from numbatma.intrinsics._asm import check_targets

        for module in (llvmir if isinstance(llvmir, (list, tuple)) else [llvmir]):
            if isinstance(module, str) and "numbatma:" in module:  # (only restricted instructions carry a marker)
                check_targets(module, arch, all_ptx())
        if isinstance(llvmir, (list, tuple)):
            llvmir = [_nvvm_ir_for_arch(m, arch) for m in llvmir]
        else:
            llvmir = _nvvm_ir_for_arch(llvmir, arch)
        return original(llvmir, **options)

    return compile_ir


def install_compile_ir():
    from numba.cuda.cudadrv import nvvm

    _patch(nvvm, "compile_ir", _compile_ir_for_arch)


# -- hook 6: device functions compile without a driver ------------------------------------------------
@contextlib.contextmanager
def offline_target(cc):
    """Within this block, device-function compilation targets compute capability ``cc`` (a tuple such as
    ``(9, 0, "a")``) instead of asking the driver for the current device."""
    previous = getattr(_offline, "cc", None)
    _offline.cc = tuple(cc)
    try:
        yield
    finally:
        _offline.cc = previous


def _device_for_compile(original):
    def get_current_device():
        cc = getattr(_offline, "cc", None)
        if cc is not None:
            return _pytypes.SimpleNamespace(compute_capability=cc[:2])
        return original()

    return get_current_device


def install_offline_target():
    from numba.cuda import dispatcher

    _patch(dispatcher, "get_current_device", _device_for_compile)



# -- hook 7: the simulator (shared arrays, block barriers, warp operations, device limits) ---------------
_sim_lock = threading.Lock()


def _simulator_hook_points():
    """The upstream simulator objects install_simulator patches or relies on (tests check they exist)."""
    from numba.cuda.simulator import kernel, kernelapi
    from numba.cuda.simulator.cudadrv import devices

    return {
        "FakeCUDAShared.array": (kernelapi.FakeCUDAShared, "array"),
        "FakeCUDAModule.syncthreads": (kernelapi.FakeCUDAModule, "syncthreads"),
        "BlockThread.syncthreads": (kernel.BlockThread, "syncthreads"),
        "BlockThread.run": (kernel.BlockThread, "run"),
        "BlockManager.run": (kernel.BlockManager, "run"),
        "FakeCUDADevice": (devices, "FakeCUDADevice"),
        "FakeCUDAArray": (_sim_devicearray(), "FakeCUDAArray"),
    }


def _sim_devicearray():
    from numba.cuda.simulator.cudadrv import devicearray

    return devicearray


def simulated_device_array(view):
    """A simulated device array over the NumPy array ``view`` itself (no copy; strided views allowed), as
    ``numbatma.kernel_view`` hands kernels under the simulator (a plain NumPy argument would be copied,
    and refused when not contiguous)."""
    return _sim_devicearray().FakeCUDAArray(view)


def install_simulator():
    """Under NUMBA_ENABLE_CUDASIM=1: ``cuda.shared.array(..., alignment=...)`` as on the GPU. The replacement
    keeps upstream's rules (dynamic arrays share one buffer; static ones are keyed by the calling source
    line) and takes a lock around the allocation, which upstream does not."""
    import sys
    import traceback

    import numpy as np
    from numba.cuda import types
    from numba.cuda.np import numpy_support
    from numba.cuda.simulator import kernelapi

    from numbatma.intrinsics import _sim

    shared_cls = kernelapi.FakeCUDAShared
    if getattr(shared_cls.array, "_numbatma", False):
        return

    def array(self, shape, dtype, alignment=None):
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        dtype = np.dtype(dtype)
        if shape == 0:
            count = self._dynshared_size // dtype.itemsize
            with _sim_lock:
                placed = self.__dict__.get("_numbatma_dynshared")
                if placed is None:  # one buffer for every dynamic array, placed on a multiple of 1024 bytes
                    placed = self._numbatma_dynshared = _placed_buffer(self._dynshared_size, 1024)
            raw, offset = placed
            return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).view(_sim.SharedArray)
        check_constant_operand(sys._getframe(1), "shape")
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[-1][0:2])
        with _sim_lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = _placed_zeros(shape, dtype, alignment).view(_sim.SharedArray)
                res._numbatma_site = caller  # (named in the simulator's messages)
                res._numbatma_alignment = alignment
        return res

    def _placed_zeros(shape, dtype, alignment):
        """Zeros placed as the GPU may place them: on a multiple of ``alignment`` (default: the element size)
        and never on a multiple of twice that, so a tile declared with less alignment than TMA needs is
        misaligned in every run (not only when the allocator happens to misplace it)."""
        nbytes = int(np.prod(shape)) * dtype.itemsize
        raw, offset = _placed_buffer(nbytes, max(int(alignment or dtype.itemsize), 1))
        return np.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape)

    def _placed_buffer(nbytes, align):
        """(zeroed buffer, offset): the bytes at the offset start on an odd multiple of ``align``. A bytearray,
        so that the array over it is a root (code that measures offsets from the allocation's start walks
        ``.base`` up to the first array)."""
        raw = bytearray(nbytes + 2 * align)
        address = np.frombuffer(raw, np.uint8).__array_interface__["data"][0]
        return raw, (align - address) % (2 * align)

    array._numbatma = True
    shared_cls.array = array

    # Block barriers pass on what each thread knows complete (the simulator's hazard checks, _sim.py).
    from numba.cuda.simulator import kernel as sim_kernel

    thread_cls = sim_kernel.BlockThread
    original_sync = thread_cls.syncthreads

    def syncthreads(self):
        _sim.publish_knowledge(self)
        original_sync(self)
        _sim.absorb_knowledge(self)

    thread_cls.syncthreads = syncthreads

    # Thread lifetime: the hang check waits until every thread of the block has started; a thread that
    # returns with a store still in flight is reported (_sim.thread_exit).
    original_run = thread_cls.run

    def run(self):
        try:
            _sim.thread_started(self)
        except Exception:  # noqa: BLE001 - (no simulated block: leave it to upstream)
            pass
        original_run(self)
        if self.exception is None and not self.abort:
            try:
                _sim.thread_exit(self)
            except Exception as e:  # noqa: BLE001 - reported like upstream reports a kernel's exception
                self.exception = (type(e)(f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}: {e}"),
                                  sys.exc_info()[2])
        if self.exception is not None:
            # Stay alive until the block manager has seen this exception: it looks only at live threads, so a
            # failing thread that ended at once would let the others run on and report a consequence instead.
            import time

            deadline = time.monotonic() + 10.0
            while not self.abort and time.monotonic() < deadline:
                time.sleep(0.0005)

    thread_cls.run = run

    # The block manager. Upstream's polls its threads in a loop that never blocks, so it holds the GIL but
    # for the interpreter's switch interval (5 ms): every simulated thread woken from a lock, a barrier or a
    # warp exchange then waits up to 5 ms to run, and a block whose threads wait on one another (shuffles,
    # mbarriers) can crawl - minutes instead of seconds under CPU load (seen in CI). This one has upstream's
    # contract (one BlockThread per thread of the block; release syncthreads once every live thread waits
    # there; on a thread's exception, abort the others and raise it) and sleeps between polls.
    import time as _time

    manager_cls = sim_kernel.BlockManager

    def _abort_all(threads):
        for t in threads:
            t.abort = True
            t.syncthreads_blocked = False
            t.syncthreads_event.set()

    def manager_run(self, grid_point, *args):
        def target():
            self._f(*args)

        threads = []
        for block_point in np.ndindex(*self._block_dim):
            t = thread_cls(target, self, grid_point, block_point, self._debug)
            t.start()
            threads.append(t)
        live = threads
        while live:
            blocked = 0
            for t in live:
                if t.syncthreads_blocked:
                    blocked += 1
                elif t.exception:
                    _abort_all(threads)
                    raise t.exception[0].with_traceback(t.exception[1])
            if blocked == len(live):  # every live thread waits in syncthreads: release them together
                for t in live:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
            else:
                _time.sleep(0.0002)  # (gives the GIL to the simulated threads)
            live = [t for t in live if t.is_alive()]
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    manager_run._numbatma = True
    manager_cls.run = manager_run

    # A simulated device that answers what persistent kernels ask: 2 SMs (so a persistent grid gives each
    # block several tiles), Hopper's shared-memory opt-in limit.
    from numba.cuda.simulator.cudadrv import devices as sim_devices

    sim_devices.FakeCUDADevice.MULTIPROCESSOR_COUNT = 2
    sim_devices.FakeCUDADevice.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 232448

    # cuda.libdevice functions kernels use, as NumPy (float32 in, float32 out).
    import types as pytypes

    module_cls = kernelapi.FakeCUDAModule
    if not hasattr(module_cls, "libdevice"):
        module_cls.libdevice = pytypes.SimpleNamespace(
            rintf=lambda x: np.float32(np.rint(x)), rint=np.rint, expf=lambda x: np.float32(np.exp(x)),
            exp=np.exp, fabsf=lambda x: np.float32(abs(x)), fabs=np.fabs, floorf=lambda x: np.float32(np.floor(x)),
        )

    # Warp-synchronous operations the simulator lacks (its threads are independent): syncwarp and the
    # shuffles, implemented by numbatma's simulator runtime as an exchange among the lanes of a warp.
    module_cls = kernelapi.FakeCUDAModule
    module_cls.syncwarp = staticmethod(lambda mask=0xFFFFFFFF: _sim.syncwarp(mask))
    module_cls.shfl_sync = staticmethod(lambda mask, value, src: _sim.shfl(mask, value, src))
    module_cls.shfl_xor_sync = staticmethod(lambda mask, value, lane_mask: _sim.shfl_xor(mask, value, lane_mask))
    module_cls.shfl_down_sync = staticmethod(lambda mask, value, delta: _sim.shfl_down(mask, value, delta))
    module_cls.shfl_up_sync = staticmethod(lambda mask, value, delta: _sim.shfl_up(mask, value, delta))

    install_simulator_launches()
    _install_accumulator_index_check()


# -- hook 7 (cont.): what the GPU's cuda.jit and typer decide, decided the same way in the simulator -------
# cuda.jit options of the GPU path (numba.cuda.decorators.jit's own parameters and the keywords it hands to
# numba.cuda.dispatcher._Kernel): the simulator accepts every one (compile-only ones are ignored) and, like the
# GPU path, refuses any other name. tests/test_numba_internals.py checks the list against numba-cuda.
GPU_JIT_OPTIONS = frozenset({
    "device", "inline", "forceinline", "link", "debug", "opt", "lineinfo", "cache", "launch_bounds", "lto",
    "shared_memory_carveout", "fastmath", "extensions", "max_registers", "boundscheck",
})
from .errors import INDEX_RULE, SHAPE_RULE  # noqa: E402 - (the rules both the typers and the simulator state)

_sim_launch_lock = threading.RLock()


def _simulated_jit(original):
    """The simulator's ``cuda.jit`` taking the GPU's options: ``max_registers``, ``lineinfo``, ``opt``, ``lto``,
    ``link``, ``cache``, ``launch_bounds``, ... are accepted and ignored (they change code generation, not what
    a kernel computes); ``fastmath``, ``debug`` and ``extensions`` go to the simulated kernel; a
    ``launch_bounds`` carrying a cluster shape (``numbatma.cluster_launch_bounds``) gives the kernel that
    shape, as ``numbatma.cluster_kernel`` does (a launch of a multi-CTA cluster shape is refused by
    :func:`_configured_copy`, in cluster.py's words); any other keyword is refused as the GPU's ``cuda.jit``
    refuses it."""

    def jit(func_or_sig=None, **options):
        unknown = sorted(set(options) - GPU_JIT_OPTIONS)
        if unknown:
            raise TypeError(f"cuda.jit: unknown option {unknown[0]!r} (the GPU's cuda.jit takes "
                            f"{', '.join(sorted(GPU_JIT_OPTIONS))})")
        if options.get("boundscheck"):
            raise NotImplementedError("bounds checking is not supported for CUDA")
        kept = {k: options[k] for k in ("device", "debug", "fastmath") if k in options}
        extensions = list(options.get("extensions") or ())
        bounds = options.get("launch_bounds")

        def finish(kernel):
            if extensions:
                kernel.extensions = list(extensions)
            dims = getattr(bounds, "cluster_dims", None)
            if dims is not None and not kept.get("device"):  # (what numbatma.cluster_kernel records there)
                kernel._numbatma_cluster_dims = tuple(dims)
            return kernel

        if func_or_sig is None or isinstance(func_or_sig, (str, list, tuple)) or not callable(func_or_sig):
            wrapper = original(func_or_sig, **kept) if func_or_sig is not None else None

            def decorate(fn):
                return finish(wrapper(fn) if wrapper is not None else original(fn, **kept))

            return decorate
        return finish(original(func_or_sig, **kept))

    jit._numbatma = True
    jit._numbatma_original = original
    return jit


def _serialised_launch(original):
    """``FakeCUDAKernel.__call__``: a launch from a host thread runs whole under one process-wide lock (the
    simulator keeps one kernel context per process and swaps each module's ``cuda`` global for the launch's
    simulated module, so two launches at once would see each other's blocks). A call from a simulated thread
    (a device function, or a kernel called as one) runs as before."""
    from numba.cuda.simulator import kernel as sim_kernel

    def __call__(self, *args):
        if self._device or isinstance(threading.current_thread(), sim_kernel.BlockThread):
            return original(self, *args)
        with _sim_launch_lock:
            return original(self, *args)

    __call__._numbatma = True
    return __call__


def _configured_copy(original):
    """``FakeCUDAKernel.__getitem__``: ``kernel[grid, block, ...]`` configures a copy, as the GPU's
    dispatcher does (upstream's simulator configures the kernel itself, so two threads launching one kernel
    with different grids would launch with each other's)."""
    import copy

    def __getitem__(self, configuration):
        dims = self.__dict__.get("_numbatma_cluster_dims")
        if dims is not None and dims[0] * dims[1] * dims[2] > 1:  # (cuda.jit(launch_bounds=cluster_launch_bounds))
            raise NotImplementedError(
                f"clusters of {dims} CTAs cannot run in Numba's CUDA simulator: it runs the blocks of a grid one "
                f"after another, so the CTAs of a cluster (which run together and share their shared memory) "
                f"cannot be simulated. Run this launch on a GPU (compute capability 9.0+), or use clusters of "
                f"shape (1, 1, 1) in the simulator.")
        return original(copy.copy(self), configuration)

    __getitem__._numbatma = True
    return __getitem__


def install_simulator_launches():
    """Hook 7's launch and decorator parts (see :func:`_simulator_jit_points`)."""
    from numba.cuda.simulator import kernel as sim_kernel

    _patch(sim_kernel.FakeCUDAKernel, "__call__", _serialised_launch)
    _patch(sim_kernel.FakeCUDAKernel, "__getitem__", _configured_copy)
    import numba.cuda as cuda_module
    from numba.cuda import simulator
    from numba.cuda.simulator import api

    original = api.jit
    if getattr(original, "_numbatma", False):
        return
    replacement = _simulated_jit(original)
    for module in (api, simulator, cuda_module):
        if getattr(module, "jit", None) is original:
            module.jit = replacement


def _simulator_jit_points():
    """The upstream objects :func:`install_simulator_launches` replaces (tests check they exist)."""
    from numba.cuda.simulator import api
    from numba.cuda.simulator import kernel as sim_kernel

    return {
        "simulator.api.jit": (api, "jit"),
        "FakeCUDAKernel.__call__": (sim_kernel.FakeCUDAKernel, "__call__"),
        "FakeCUDAKernel.__getitem__": (sim_kernel.FakeCUDAKernel, "__getitem__"),
        "kernel._push_kernel_context": (sim_kernel, "_push_kernel_context"),
    }


# Compile-time constants. Numba types cuda.shared.array's shape and a wgmma accumulator's index from the
# kernel's IR: a value is a compile-time constant when its variable has one definition that is a constant, a
# global or a closure variable (or another such variable; for a shape, a tuple of those) - anything else
# (an argument, arithmetic, a loop variable, two definitions from a branch) is typed as a run-time integer,
# which the GPU build refuses. The simulator runs the kernel's Python code, so it builds the same IR (numba-cuda's
# bytecode frontend, once per function) and applies the same rule to the statement being run.
_ir_cache = {}
_ir_cache_lock = threading.Lock()


def _frame_ir(frame):
    """Numba IR of the function ``frame`` runs (None when the frontend cannot build it: then nothing is
    checked)."""
    code = frame.f_code
    try:
        return _ir_cache[code]
    except KeyError:
        pass
    func_ir = None
    try:
        from numba.cuda.core import bytecode, interpreter, postproc

        cells = tuple(_pytypes.CellType(frame.f_locals.get(name)) for name in code.co_freevars)
        func = _pytypes.FunctionType(code, frame.f_globals, code.co_name, None, cells or None)
        func_id = bytecode.FunctionIdentity.from_function(func)
        func_ir = interpreter.Interpreter(func_id).interpret(bytecode.ByteCode(func_id=func_id))
        postproc.PostProcessor(func_ir).run(False)
    except Exception:  # noqa: BLE001 - code numba cannot read: the GPU build reports it; no check here
        func_ir = None
    with _ir_cache_lock:
        _ir_cache[code] = func_ir
    return func_ir


def _is_constant(func_ir, value, tuples):
    """Whether IR ``value`` (a variable) is a compile-time constant by numba's typing rule (above)."""
    from numba.cuda.core import ir as nir

    for _ in range(64):
        if isinstance(value, nir.Var):
            defs = func_ir._definitions.get(value.name, ())
            if len(defs) != 1:
                return False
            value = defs[0]
            continue
        if isinstance(value, (nir.Const, nir.Global, nir.FreeVar)):
            return True
        if tuples and isinstance(value, nir.Expr) and value.op == "build_tuple":
            return all(_is_constant(func_ir, item, False) for item in value.items)
        return False
    return False


def _statements(func_ir, line):
    from numba.cuda.core import ir as nir

    for block in func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, nir.Assign) and isinstance(stmt.value, nir.Expr) and stmt.loc.line == line:
                yield stmt.value


def _shared_array_shapes(func_ir, line):
    """The shape operands of the ``cuda.shared.array`` calls on ``line``."""
    from numba.cuda.core import ir as nir

    for expr in _statements(func_ir, line):
        if expr.op != "call":
            continue
        callee = func_ir._definitions.get(expr.func.name, ())
        if len(callee) != 1 or not (isinstance(callee[0], nir.Expr) and callee[0].op == "getattr"
                                    and callee[0].attr == "array"):
            continue
        owner = func_ir._definitions.get(callee[0].value.name, ())
        if len(owner) != 1 or not (getattr(owner[0], "attr", None) == "shared"
                                   or getattr(owner[0], "name", None) == "shared"):
            continue
        if expr.args:
            yield expr.args[0]
        else:
            yield from (v for k, v in expr.kws if k == "shape")


def _runtime_indices(func_ir, line):
    """[(name of x, index variable)] for the ``x[i]`` reads on ``line`` whose index is not a compile-time
    constant."""
    return [(expr.value.name.split(".")[0], expr.index) for expr in _statements(func_ir, line)
            if expr.op == "getitem" and not _is_constant(func_ir, expr.index, False)]


def _sim_refusal(frame, reason):
    from numbatma.intrinsics import _sim

    filename, line = frame.f_code.co_filename, frame.f_lineno
    import linecache

    source = linecache.getline(filename, line).strip()
    return _sim.SimulatedTypingError(f"{filename}:{line}: {reason}" + (f"\n    {line} | {source}" if source else ""))


def check_constant_operand(frame, what, owner=None):
    """Under the simulator: refuse, as the GPU build does while typing, the statement ``frame`` runs when an
    operand that must be a compile-time constant is not one - ``what="shape"``: the shape of a
    ``cuda.shared.array`` call; ``what="index"``: an index into ``owner`` (a wgmma accumulator). Raises
    ``SimulatedTypingError`` starting with the kernel's file:line. Frames of numbatma's own code are not
    checked. The IR is read once per line (cached); a later call costs a dictionary lookup."""
    if frame is None:
        return
    key = (frame.f_code, frame.f_lineno, what)
    found = _ir_cache.get(key)
    if found is None:
        found = _line_verdict(frame, what)
        with _ir_cache_lock:
            _ir_cache[key] = found
    if not found:
        return
    if what == "shape":
        raise _sim_refusal(frame, found)
    local = frame.f_locals  # (an index: only when the indexed variable is this accumulator)
    for name, index in found:
        if local.get(name) is owner:
            raise _sim_refusal(frame, f"accumulator[i]: {INDEX_RULE}; got the run-time index '{index}'")


def _line_verdict(frame, what):
    """For ``what="shape"``: the refusal of the line's computed shared-array shape, or ''; for ``"index"``:
    [(variable, index as spelled)] of the line's reads with a run-time index."""
    from . import errors

    func_ir = None if errors.is_internal(frame.f_code.co_filename) else _frame_ir(frame)
    if what == "index":
        return [] if func_ir is None else [(name, _describe_var(func_ir, index) or _user_name(index.name))
                                           for name, index in _runtime_indices(func_ir, frame.f_lineno)]
    if func_ir is not None:
        for shape in _shared_array_shapes(func_ir, frame.f_lineno):
            if not _is_constant(func_ir, shape, True):
                return f"cuda.shared.array: {SHAPE_RULE}; got '{_describe_var(func_ir, shape) or _user_name(shape.name)}'"
    return ""


def _install_accumulator_index_check():
    """``SimAccumulator.__getitem__`` (numbatma.intrinsics.wgmma) refuses a run-time index as the GPU's typer
    does (:func:`check_constant_operand`)."""
    import importlib
    import sys

    cls = importlib.import_module("numbatma.intrinsics.wgmma").SimAccumulator
    original = cls.__getitem__
    if getattr(original, "_numbatma_index_checked", False):
        return

    def __getitem__(self, i):
        check_constant_operand(sys._getframe(1), "index", self)
        return original(self, i)

    __getitem__._numbatma_index_checked = True
    cls.__getitem__ = __getitem__


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



# -- hook 9: typing errors at the user's line -----------------------------------------------------------
def _constraint_classes():
    """The classes of numba-cuda's type inference whose instances ``ConstraintNetwork.propagate`` calls, each
    defining its own ``__call__`` (tests check the list still holds the call constraints)."""
    from numba.cuda.core import typeinfer

    return {
        name: cls for name, cls in vars(typeinfer).items()
        if isinstance(cls, type) and name.endswith("Constraint") and "__call__" in vars(cls)
    }


def _located_constraint(original):
    from numba.core import errors as core_errors
    from numba.cuda.core import errors as cuda_errors

    from . import errors

    typing_errors = (core_errors.TypingError, cuda_errors.TypingError)

    def __call__(self, typeinfer):
        loc = getattr(self, "loc", None)
        with errors.recording() as rec:
            try:
                result = original(self, typeinfer)
            except typing_errors:
                chosen = errors.relocate(rec.errors, loc, failed=True)
                if chosen is None:
                    raise
            else:
                chosen = errors.relocate(rec.errors, loc, failed=False)
                if chosen is None:
                    return result
        outer = getattr(errors._state, "records", None)
        if outer is not None:  # (a typing nested in another: the enclosing call reports it at its own line)
            outer.append(chosen)
        raise chosen from None

    __call__._numbatma_original = original
    return __call__


def _plain_function_global(original):
    """``TypeInferer.typeof_global``: a global or closure variable holding a plain Python function that numba
    cannot type (not a ``cuda.jit`` device function, not one numba knows) is refused with numbatma's words at
    the kernel's line - saying to make it a device function - instead of "Untyped global name"."""

    def typeof_global(self, inst, target, gvar):
        try:
            return original(self, inst, target, gvar)
        except Exception as exc:
            from numba.core.errors import TypingError as NumbaTypingError
            from numba.cuda.core.errors import TypingError as CudaTypingError

            if not isinstance(gvar.value, _pytypes.FunctionType) \
                    or not isinstance(exc, (NumbaTypingError, CudaTypingError)) \
                    or isinstance(exc, _numbatma_errors().TypingError):
                raise
            name = getattr(gvar.value, "__qualname__", gvar.name)
            what = "a plain Python function" if name == gvar.name else f"the plain Python function {name}"
            raise _numbatma_errors().TypingError(
                f"'{gvar.name}' is {what}, which a kernel can neither call nor pass on "
                f"(to wgmma_map, wgmma_row_reduce, ...): make it a device function with @cuda.jit(device=True) "
                f"(inline=\"always\" for a small one)", loc=inst.loc) from None

    return typeof_global


def _numbatma_errors():
    from . import errors

    return errors


def install_typing_errors():
    for cls in _constraint_classes().values():
        call = vars(cls)["__call__"]
        if not hasattr(call, "_numbatma_original"):
            cls.__call__ = _located_constraint(call)
    from numba.cuda.core import typeinfer

    _patch(typeinfer.TypeInferer, "typeof_global", _plain_function_global)


# -- hook 10: GPU debug mode (where the statement being lowered is; cache keys) ----------------------------
_lowering = threading.local()


def _recording_lower_inst(original):
    def lower_inst(self, inst):
        stack = _lowering.__dict__.setdefault("stack", [])
        stack.append((self, inst))
        try:
            return original(self, inst)
        finally:
            stack.pop()

    lower_inst._numbatma_original = original
    return lower_inst


def _debug_hook_points():
    """The upstream objects the debug mode patches (tests check they still exist)."""
    from numba.cuda import dispatcher, lowering

    return {
        "Lower.lower_inst": (lowering.Lower, "lower_inst"),
        "CUDACache._index_key": (dispatcher.CUDACache, "_index_key"),
    }


def install_lowering_sites():
    """Record the statement each numba lowerer is lowering (what :func:`lowering_site` reads). Idempotent."""
    from numba.cuda import lowering

    current = lowering.Lower.lower_inst
    if not hasattr(current, "_numbatma_original"):
        lowering.Lower.lower_inst = _recording_lower_inst(current)


def _debug_index_key(original):
    def _index_key(self, sig, codegen):
        from . import debug

        key = original(self, sig, codegen)
        extra = debug.cache_key()
        return key if extra is None else key + (extra,)

    _index_key._numbatma_original = original
    return _index_key


def install_debug_cache_key():
    from numba.cuda import dispatcher

    current = dispatcher.CUDACache._index_key
    if not hasattr(current, "_numbatma_original"):
        dispatcher.CUDACache._index_key = _debug_index_key(current)


def _user_name(name):
    """``bar.1`` (an SSA version of ``bar``) -> ``bar``."""
    import re

    return re.sub(r"\.\d+$", "", name)


_BINOPS = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "truediv": "/", "mod": "%", "and_": "&",
           "or_": "|", "xor": "^", "lshift": "<<", "rshift": ">>"}


def _describe_var(func_ir, var, depth=0):
    """How the kernel spells the value of ``var`` (an IR variable): its own name for a user variable, else
    the expression that made the temporary (``bars[1]`` for ``mbarrier_ref(bars, 1)``); None if unknown."""
    from numba.cuda.core import ir

    if not isinstance(var, ir.var_types):
        return None
    if not var.name.startswith("$"):
        return _user_name(var.name)
    if depth > 6:
        return None
    try:
        d = func_ir.get_definition(var)
    except Exception:
        return None
    sub = lambda v: _describe_var(func_ir, v, depth + 1) or "?"  # noqa: E731
    if isinstance(d, ir.const_types):
        return repr(d.value)
    if isinstance(d, ir.global_types + ir.freevar_types):
        return d.name
    if isinstance(d, ir.var_types):
        return _describe_var(func_ir, d, depth + 1)
    if not isinstance(d, ir.expr_types):
        return None
    if d.op == "call":
        func = sub(d.func)
        args = [sub(a) for a in d.args]
        if func.split(".")[-1] == "mbarrier_ref" and len(args) == 2:
            return f"{args[0]}[{args[1]}]"
        return f"{func}({', '.join(args)})"
    if d.op == "getattr":
        return f"{sub(d.value)}.{d.attr}"
    if d.op == "static_getitem":
        index = d.index if not isinstance(d.index, slice) else (sub(d.index_var) if d.index_var else "?")
        return f"{sub(d.value)}[{index}]"
    if d.op == "getitem":
        return f"{sub(d.value)}[{sub(d.index)}]"
    if d.op in ("binop", "inplace_binop"):
        fn = getattr(d.fn, "__name__", str(d.fn))
        return f"{sub(d.lhs)} {_BINOPS.get(fn, fn)} {sub(d.rhs)}"
    if d.op == "build_tuple":
        return "(" + ", ".join(sub(v) for v in d.items) + ("," if len(d.items) == 1 else "") + ")"
    return None


def lowering_site():
    """Where the intrinsic being lowered now is called (None outside a recorded lowering): a namespace with
    ``filename``, ``line``, ``function`` (the qualified name of the kernel or device function), ``target``
    (the variable the call's result is assigned to, None for a temporary) and ``args`` (how the kernel
    spells each argument, None where unknown). Needs :func:`install_lowering_sites`."""
    from numba.cuda.core import ir

    stack = getattr(_lowering, "stack", None)
    if not stack:
        return None
    lower, inst = stack[-1]
    loc = getattr(inst, "loc", None) or getattr(lower, "loc", None)
    func_ir = getattr(lower, "func_ir", None)
    function = getattr(getattr(func_ir, "func_id", None), "func_qualname", None)
    target, args = None, ()
    if isinstance(inst, ir.assign_types):
        if not inst.target.name.startswith("$"):
            target = _user_name(inst.target.name)
        value = inst.value
        if isinstance(value, ir.expr_types) and value.op == "call" and func_ir is not None:
            args = tuple(_describe_var(func_ir, a) for a in value.args)
    return _pytypes.SimpleNamespace(
        filename=getattr(loc, "filename", None) or "<unknown>",
        line=getattr(loc, "line", None) or 0,
        function=function or "<unknown>",
        target=target,
        args=args,
    )


def install_debug_mode():
    """Hook 10: the lowering sites and the cache key of debug builds. Idempotent."""
    install_lowering_sites()
    install_debug_cache_key()


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



# -- hook 12: on-disk cache of numbatma's kernels -------------------------------------------------------------
_KeyedCache = None  # the CUDACache subclass, made on first use (numba.cuda.dispatcher is not imported before)
_cache_warned = set()


def _disk_cache_hook_points():
    """The upstream objects hook 12 relies on (tests check they exist and keep the shape the subclass mirrors)."""
    from numba.cuda import dispatcher
    from numba.cuda.core import caching

    return {
        "CUDADispatcher.enable_caching": (dispatcher.CUDADispatcher, "enable_caching"),
        "CUDADispatcher.compile": (dispatcher.CUDADispatcher, "compile"),
        "CUDACache._index_key": (dispatcher.CUDACache, "_index_key"),
        "CUDACache.load_overload": (dispatcher.CUDACache, "load_overload"),
        "Cache._index_key": (caching.Cache, "_index_key"),
        "Cache._load_overload": (caching.Cache, "_load_overload"),
        "Cache._save_overload": (caching.Cache, "_save_overload"),
        "IndexDataCacheFile.save": (caching.IndexDataCacheFile, "save"),
        "IndexDataCacheFile.load": (caching.IndexDataCacheFile, "load"),
        "_Kernel._rebuild": (dispatcher._Kernel, "_rebuild"),
    }


def _cache_warning(what, cache, exc):
    """Warn (once per process and kind of failure) that the on-disk cache could not ``what`` a kernel."""
    import warnings

    if what in _cache_warned:
        return
    _cache_warned.add(what)
    warnings.warn(
        f"numbatma: the on-disk kernel cache could not {what} {cache._name} ({type(exc).__name__}: {exc}); the "
        f"kernel is compiled instead (further such failures are not reported)", RuntimeWarning, stacklevel=3,
    )


def _keyed_cache_class():
    """numba-cuda's ``CUDACache`` with an explicit key in place of the hash of the closure cells (made once)."""
    global _KeyedCache
    if _KeyedCache is not None:
        return _KeyedCache
    import hashlib

    import numba_cuda
    from numba.cuda import dispatcher

    def sha256(data):
        return hashlib.sha256(data).hexdigest()

    class KeyedCUDACache(dispatcher.CUDACache):
        """The on-disk cache of one kernel whose identity is ``key`` (a string naming everything its code depends
        on besides the bytecode): the index key is upstream's with ``sha256(key)`` where upstream hashes a
        cloudpickle of the closure cells."""

        def __init__(self, py_func, key, targetoptions):
            super().__init__(py_func)
            self.numbatma_key = key
            self._key_digest = sha256(key.encode())
            self._code_digest = sha256(py_func.__code__.co_code)
            self._targetoptions = targetoptions  # (the dispatcher's own dict: launch_bounds as compiled)

        def _index_key(self, sig, codegen):
            # upstream (Cache._index_key): (sig, magic tuple, numba-cuda version, (bytecode hash, cells hash))
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, (self._code_digest, self._key_digest))
            if self._launch_config_key is not None:  # (CUDACache._index_key)
                key += (("launch_config", self._launch_config_key),)
            from . import debug

            extra = debug.cache_key()  # (hook 10)
            return key if extra is None else key + (extra,)

        def _load_overload(self, sig, target_context):
            if not self._enabled:
                return None
            try:
                key = self._index_key(sig, target_context.codegen())
                data = self._cache_file.load(key)
                # (stored as (key, payload): a data file that a concurrent save of another entry overwrote - the
                # index numbers data files per process - holds another key and is a miss)
                if not (isinstance(data, tuple) and len(data) == 2 and data[0] == key):
                    return None
                kernel = self._impl.rebuild(target_context, data[1])
            except Exception as exc:  # (a damaged or foreign file: compile instead)
                _cache_warning("load", self, exc)
                return None
            kernel.launch_bounds = self._targetoptions.get("launch_bounds")  # (_Kernel._rebuild drops it)
            return kernel

        def _save_overload(self, sig, data):
            if not self._enabled:
                return
            try:
                if not self._impl.check_cachable(data):
                    return
                self._impl.locator.ensure_cache_path()
                key = self._index_key(sig, data.codegen)
                self._cache_file.save(key, (key, self._impl.reduce(data)))
            except Exception as exc:  # (unwritable directory, a kernel numba cannot serialise: just no cache)
                _cache_warning("save", self, exc)

    _KeyedCache = KeyedCUDACache
    return _KeyedCache


def enable_disk_cache(dispatcher, key):
    """Turn on numba-cuda's on-disk cache for ``dispatcher`` (a ``cuda.jit`` kernel, not a device function), keyed
    by ``key`` (a non-empty string) instead of the contents of the kernel's closure cells: kernels whose code
    depends on anything besides their bytecode (closures of a factory, device functions they call) must have
    that in ``key``. Files go where ``cache=True`` puts them (``NUMBA_CACHE_DIR``, else ``__pycache__`` beside
    the kernel's source when writable, else numba's user-wide cache directory); every closure of one factory
    shares one index file, an entry per key and signature. Returns ``dispatcher``."""
    from numba.cuda import dispatcher as nbdispatcher

    if not isinstance(key, str) or not key:
        raise TypeError(f"enable_disk_cache: key must be a non-empty string, got {key!r}")
    if not isinstance(dispatcher, nbdispatcher.CUDADispatcher) or dispatcher.targetoptions.get("device"):
        raise TypeError(f"enable_disk_cache takes a cuda.jit kernel (not a device function), got {dispatcher!r}")
    dispatcher._cache = _keyed_cache_class()(dispatcher.py_func, key, dispatcher.targetoptions)
    return dispatcher


def disk_cache_key(dispatcher):
    """The key :func:`enable_disk_cache` gave ``dispatcher``, or None when it has none."""
    return getattr(getattr(dispatcher, "_cache", None), "numbatma_key", None)


# -- accessors: numba-cuda private names the other modules use ----------------------------------------------
def intrinsic(*args, **options):
    """numba-cuda's ``@intrinsic`` decorator for the CUDA target (``numba.cuda.extending._intrinsic``):
    ``intrinsic(typer)`` or ``intrinsic(target="cuda", prefer_literal=...)(typer)``."""
    from numba.cuda.extending import _intrinsic

    return _intrinsic(*args, **options)


def make_array(array_type):
    """The LLVM structure class of arrays of ``array_type`` (``numba.cuda.np.arrayobj.make_array``)."""
    from numba.cuda.np import arrayobj

    return arrayobj.make_array(array_type)


def populate_array(array, data, shape, strides, itemsize, meminfo, parent=None):
    """Fill an array structure made by :func:`make_array` (``numba.cuda.np.arrayobj.populate_array``)."""
    from numba.cuda.np import arrayobj

    return arrayobj.populate_array(array, data=data, shape=shape, strides=strides, itemsize=itemsize,
                                   meminfo=meminfo, parent=parent)


def call_sreg(builder, name):
    """Read the special register ``name`` (``"tid.x"``, ``"ntid.y"``, ...) as an i32
    (``numba.cuda.nvvmutils.call_sreg``)."""
    from numba.cuda import nvvmutils

    return nvvmutils.call_sreg(builder, name)


def declare_vprintf(module):
    """``i32 vprintf(i8* format, i8* args)`` in ``module`` (the device printf that ``print`` lowers to)."""
    from numba.cuda import nvvmutils

    return nvvmutils.declare_vprint(module)


def string_constant(context, builder, text):
    """A generic ``i8*`` to a NUL-terminated constant string (deduplicated per module)."""
    return context.insert_string_const_addrspace(builder, text)


def compile_capability():
    """The compute capability ``(major, minor[, "a"])`` the kernel being compiled now targets (the ``flags`` of
    numba-cuda's pipeline, ``targetconfig.ConfigStack``), or None outside a compilation. For lowering-time
    checks: a typer's result is cached across compilations for other targets, a codegen runs for each."""
    from numba.cuda.core import targetconfig

    flags = targetconfig.ConfigStack.top_or_none()
    cc = getattr(flags, "compute_capability", None) if flags is not None else None
    return tuple(cc) if cc else None


def lowering_loc():
    """The source location (``ir.Loc``) of the statement being lowered now, or None: read from the frame of
    ``numba.cuda.lowering.Lower.lower_inst`` (``inst.loc``) on this thread's stack. Only for errors."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "lower_inst" and "inst" in frame.f_locals:
            loc = getattr(frame.f_locals["inst"], "loc", None)
            if loc is not None:
                return loc
        frame = frame.f_back
    return None


def simulated_block(thread):
    """The simulator's manager of the block ``thread`` (a simulated thread) belongs to: the same object for
    every thread of one block, None for a thread that is not a simulated one (``BlockThread._manager``)."""
    return getattr(thread, "_manager", None)


def simulated_block_dim(manager):
    """The block shape of a simulated block (:func:`simulated_block`): ``BlockManager._block_dim``."""
    return manager._block_dim


def simulated_grid_dim(manager):
    """The grid shape of the launch a simulated block belongs to: ``BlockManager._grid_dim``."""
    return manager._grid_dim


def _accessor_points():
    """The upstream objects the accessors read (tests check they exist with the expected signatures)."""
    from numba.cuda import extending, nvvmutils
    from numba.cuda.np import arrayobj

    return {
        "extending._intrinsic": (extending, "_intrinsic"),
        "arrayobj.make_array": (arrayobj, "make_array"),
        "arrayobj.populate_array": (arrayobj, "populate_array"),
        "nvvmutils.call_sreg": (nvvmutils, "call_sreg"),
        "nvvmutils.declare_vprint": (nvvmutils, "declare_vprint"),
    }


# -- installation -------------------------------------------------------------------------------------
def _hook_points():
    """The upstream objects numbatma patches (tests check they still exist)."""
    from numba.cuda import cudadecl, dispatcher
    from numba.cuda.cudadrv import nvvm

    return {
        "nvvm.set_cuda_kernel": (nvvm, "set_cuda_kernel"),
        "_Kernel._prepare_args": (dispatcher._Kernel, "_prepare_args"),
        "_Kernel.launch": (dispatcher._Kernel, "launch"),
        "Cuda_shared_array.generic": (cudadecl.Cuda_shared_array, "generic"),
        "nvvm.compile_ir": (nvvm, "compile_ir"),
        "dispatcher.get_current_device": (dispatcher, "get_current_device"),
        "dispatcher.LaunchConfig": (dispatcher, "LaunchConfig"),
        "nvvm.set_launch_bounds": (nvvm, "set_launch_bounds"),
        "dispatcher.launch": (dispatcher, "launch"),
    }


def install():
    """Install the GPU path's hooks (1-6, 8-9, 11, and 10 in debug mode; the simulator's is
    :func:`install_simulator`). Idempotent."""
    global _installed, _TensorMapType, _TensorMapArrayType, _DeviceView
    if _installed:
        return
    check_version()
    from ._descriptor_base import DeviceView
    from ._types import TensorMapArrayType, TensorMapType

    _TensorMapType, _TensorMapArrayType, _DeviceView = TensorMapType, TensorMapArrayType, DeviceView
    for label, (owner, attr) in {**_hook_points(), **_disk_cache_hook_points()}.items():
        if not callable(getattr(owner, attr, None)):
            raise ImportError(f"numbatma: numba-cuda no longer has {label}; this numba-cuda is not supported.")
    install_grid_constant_params()  # 1
    install_descriptor_arguments()  # 2
    install_launch_checks()  # 3
    install_shared_array_type()  # 4
    install_compile_ir()  # 5
    install_offline_target()  # 6
    install_clusters()  # 8
    install_typing_errors()  # 9
    install_dependent_launches()  # 11
    from . import debug

    if debug.ENABLED:
        install_debug_mode()  # 10
    _installed = True
