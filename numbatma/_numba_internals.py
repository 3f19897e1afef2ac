"""The numba-cuda seam: the pinned version range, the hooks' list and installer, and the typing and codegen hooks.

Every place numbatma reaches into numba-cuda internals is in the seam modules, and nothing else is: this module
(hooks 1, 4, 5, 6, 9, the accessors, :func:`install`) and ``_launch_hooks.py`` (2, 3, 8, 11), ``_sim_hooks.py`` (7),
``_lowering_sites.py`` (10), ``_disk_cache.py`` (12), ``_prepared_launch.py`` (prepared launches); each hook below
names its module. This module re-exports their names that other modules and tests take from here
(``__all__`` of the re-exports: ``_REEXPORTED``).

Tested with numba-cuda 0.30.4 (``TESTED_RANGE``); importing numbatma with a version outside the range
raises, and ``tests/test_numba_internals.py`` checks that each hooked attribute still exists with the
expected shape, so an upstream change fails loudly instead of silently miscompiling.

The hooks, each installed by one function (:func:`install` runs 1-6, 8-9, 11 and 13 on the GPU path, and 10 when
the debug mode is on; ``numbatma/__init__.py`` runs 7 under the simulator; 12 is applied to one kernel at a time):

1. :func:`install_grid_constant_params` (this module). ``numba.cuda.cudadrv.nvvm.set_cuda_kernel`` (called by
   ``kernel_fixup`` for every kernel, after the return-value argument is dropped): kernel parameters whose LLVM
   type is a pointer to ``struct.numbatma.CUtensorMap`` become ``byval align 128`` and get an
   ``!nvvm.annotations !{kernel, !"grid_constant", !{i32 <1-based index>}}`` entry - the NVVM spelling of
   ``const __grid_constant__ CUtensorMap``.
2. :func:`install_descriptor_arguments` (``_launch_hooks.py``). ``numba.cuda.dispatcher._Kernel._prepare_args``: a TensorMap argument
   is handed to ``cuda.core.launch`` as its ``TensorMapDescriptor`` (128 bytes by value); a TensorMapArray as its
   device address. Either must describe memory of the launching device (:func:`_check_device`; on a prepared
   launch, of a peer it was given access to: ``numbatma.enable_peer_access``).
3. :func:`install_launch_checks` (``_launch_hooks.py``). ``numba.cuda.dispatcher._Kernel.launch``: a launch whose dynamic plus static
   shared memory exceeds 48 KiB first raises the kernel's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``
   (once per larger size and device); a kernel compiled for clusters (hook 8) checks its grid first.
4. :func:`install_shared_array_type` (this module). ``numba.cuda.cudadecl.Cuda_shared_array``: ``cuda.shared.array`` is typed
   as :class:`numbatma._types.SharedArray`, so TMA operations can reject non-shared operands at typing time.
5. :func:`install_compile_ir` (this module). ``numba.cuda.cudadrv.nvvm.compile_ir``: for sm_90 and older targets libNVVM
   parses the LLVM 7 IR dialect, which wants plain ``byval``; newer targets want ``byval(<type>)`` (what
   llvmlite prints). Modules holding a restricted instruction (a ``numbatma:`` marker) are first checked
   against the target (the device package's checker, ``_registry.target_checker``).
6. :func:`install_offline_target` (this module). ``numba.cuda.dispatcher.get_current_device``: compiling a device function
   (``cuda.jit(device=True)``, ``overload_method`` implementations) asks the *current device* for its compute
   capability, which needs a driver. Inside :func:`offline_target` (used by ``numbatma.compile``) it answers
   with the compile target instead, so kernels built from device functions compile to PTX on machines without
   a GPU.
7. :func:`install_simulator` (``_sim_hooks.py``; simulator only; points listed by :func:`_simulator_hook_points`).
   ``numba.cuda.simulator.kernelapi.FakeCUDAShared.array`` refuses ``alignment=``, which every TMA kernel
   passes: the replacement accepts it and returns the simulator engine's ``SharedArray`` views (``_registry.simulator``) (the
   simulator's race checks); ``numba.cuda.simulator.kernel.BlockThread.syncthreads`` is wrapped so block
   barriers pass on what each thread knows complete, and ``BlockThread.run`` so the engine sees each thread
   start and end; ``BlockManager.run`` is replaced by one that sleeps between polls and, when a thread fails, ends
   the block's other threads before it raises; ``FakeCUDAModule`` gets
   the warp operations it lacks (``syncwarp``, ``shfl_*_sync``) and the libdevice functions kernels use;
   ``FakeCUDADevice`` reports 2 SMs and Hopper's shared-memory opt-in limit. Parity with the GPU build
   (:func:`install_simulator_launches`, points listed by :func:`_simulator_jit_points`): the simulator's
   ``cuda.jit`` (``numba.cuda.simulator.api.jit``, also bound as ``numba.cuda.jit``) takes the GPU's options
   (:data:`GPU_JIT_OPTIONS`; compile-only ones ignored); ``FakeCUDAKernel.__call__`` runs a host thread's launch
   whole under one process-wide lock (upstream supports one kernel context per process) and
   ``FakeCUDAKernel.__getitem__`` configures a copy; ``cuda.shared.array`` shapes and wgmma accumulator
   indices must be compile-time constants by numba's rule, read from the kernel's IR
   (:func:`check_constant_operand`).
8. :func:`install_clusters` (``_launch_hooks.py``). Thread-block clusters (``numbatma/cluster.py``).
   ``numba.cuda.dispatcher.LaunchConfig`` (the ``cuda.core.LaunchConfig`` that ``_Kernel.launch`` builds):
   inside :func:`cluster_launch` (what ``numbatma.with_cluster`` uses) the launch gets ``cluster=(x, y, z)`` and
   its grid divided by the cluster shape (cuda.core counts a clustered grid in clusters; numbatma's callers
   count blocks). ``numba.cuda.cudadrv.nvvm.set_launch_bounds``: a ``launch_bounds`` carrying
   ``cluster_dims`` (:class:`numbatma.cluster.ClusterLaunchBounds`) also gets the kernel's NVVM
   ``cluster_dim_{x,y,z}`` annotations (PTX ``.explicitcluster`` / ``.reqnctapercluster``); ``_Kernel.launch``
   (hook 3's wrapper) checks that the grid is a multiple of such a kernel's cluster shape.
9. :func:`install_typing_errors` (this module). Typing errors at the user's line (``numbatma/errors.py``): the ``__call__``
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
10. :func:`install_debug_mode` (``_lowering_sites.py``). GPU debug mode (``numbatma/debug.py``, installed only when ``NUMBATMA_DEBUG``
   is on): ``numba.cuda.lowering.Lower.lower_inst`` is wrapped to keep, per thread, the statement being
   lowered, so an intrinsic's codegen can name its kernel file:line and the kernel variables of its operands
   (:func:`lowering_site`); ``numba.cuda.dispatcher.CUDACache._index_key`` gets the debug settings appended,
   so the on-disk cache (``cache=True``) never hands a debug build to a normal process or the reverse.
11. :func:`install_dependent_launches` (``_launch_hooks.py``). Programmatic dependent launch (``numbatma.dependent_launch``):
   ``numba.cuda.dispatcher.launch`` (the ``cuda.core.launch`` that ``_Kernel.launch`` calls with the
   ``LaunchConfig`` it has just built for this launch) is wrapped: inside :func:`dependent_launch` the
   configuration gets ``programmatic_stream_serialization=True`` (CUDA's
   ``cudaLaunchAttributeProgrammaticStreamSerialization``: the kernel may start before the previous kernel
   on its stream has finished; it waits with ``griddepcontrol.wait``). It composes with hook 8's cluster
   launches. 13. :func:`install_inline_copy` (``_inline_copy.py``). Compile time: ``InlineWorker.inline_ir`` (Numba IR-level
   inlining of ``inline="always"`` device functions) deep-copies the callee's blocks one by one, and each copy
   copies the function's whole scope again; while it runs, the blocks sharing a scope share one deepcopy memo
   (the result is what one deepcopy of the block dictionary gives). The Attention kernel's compile to PTX:
   5.6 -> 3.4 s. Upstream objects relied on: :func:`_inline_copy_hook_points`.

Prepared launches (:func:`prepare_launch`) read the same scope themselves and launch dependent
   through ``cuLaunchKernelEx`` with :func:`launch_config`'s attribute.
12. :func:`enable_disk_cache` (``_disk_cache.py``). On-disk cache of numbatma's kernels (per kernel, not installed globally; used by
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

13. :func:`install_inline_copy` (``_inline_copy.py``). Compile time: ``InlineWorker.inline_ir`` (Numba IR-level
   inlining of ``inline="always"`` device functions) deep-copies the callee's blocks one by one, and each copy
   copies the function's whole scope again; while it runs, the blocks sharing a scope share one deepcopy memo
   (the result is what one deepcopy of the block dictionary gives). The Attention kernel's compile to PTX:
   5.6 -> 3.4 s. Upstream objects relied on: :func:`_inline_copy_hook_points`.

Prepared launches (:func:`prepare_launch`, ``_prepared_launch.py``, no patching) do once what
``numba.cuda.dispatcher._Kernel.launch`` does per launch (hook 2 in front) and then launch with ``cuLaunchKernel``
themselves; that module's docstring says which numba-cuda names they rely on.

Accessors (no patching): the numba-cuda private names numbatma's other modules use, so that they import them
from here only (points listed by :func:`_accessor_points`): :func:`intrinsic`
(``numba.cuda.extending._intrinsic``), :func:`make_array` / :func:`populate_array`
(``numba.cuda.np.arrayobj``), :func:`call_sreg` (``numba.cuda.nvvmutils.call_sreg``), :func:`declare_vprintf`,
:func:`string_constant`, :func:`compile_capability` (the target of the compilation running now:
``targetconfig.ConfigStack``'s flags), :func:`lowering_loc` (the statement ``Lower.lower_inst`` is lowering), and
the simulator's block of a thread (``_sim_hooks.py``): :func:`simulated_block` (a simulated
thread's ``_manager``), :func:`simulated_block_dim` / :func:`simulated_grid_dim` (its ``_block_dim`` /
``_grid_dim``), :func:`simulated_device_array` (``FakeCUDAArray``).
"""
from __future__ import annotations

import contextlib
import threading
import types as _pytypes

from llvmlite import ir

from . import _launch_hooks, _registry
from ._disk_cache import _disk_cache_hook_points, _keyed_cache_class, disk_cache_key, enable_disk_cache
from ._launch_hooks import (
    _check_compiled_cluster_grid,
    _clustered_launch_config,
    _dependent_core_launch,
    _ensure_dynamic_smem,
    _prepare_numbatma_arg,
    _prepared_device,
    cluster_launch,
    compiled_kernel,
    current_device_id,
    dependent_launch,
    dependent_launches,
    install_clusters,
    install_dependent_launches,
    install_descriptor_arguments,
    install_launch_checks,
    max_active_clusters,
)
from ._inline_copy import _inline_copy_hook_points, install_inline_copy
from ._lowering_sites import (
    _debug_hook_points,
    _debug_index_key,
    install_debug_mode,
    install_lowering_sites,
    lowering_site,
)
from ._patching import patch as _patch
from ._prepared_launch import (
    _ARRAY_PTR,
    ContextLaunch,
    KernelParams,
    PreparedLaunch,
    check_params,
    cu_stream,
    kernel_param_sizes,
    launch_config,
    param_field,
    prepare_launch,
)
from ._sim_hooks import (
    GPU_JIT_OPTIONS,
    _is_constant,
    _simulator_hook_points,
    _simulator_jit_points,
    check_constant_operand,
    install_simulator,
    install_simulator_launches,
    simulated_block,
    simulated_block_dim,
    simulated_device_array,
    simulated_grid_dim,
)
from .errors import SHAPE_RULE

# The names of the other seam modules that numbatma's modules (cluster.py, compile.py, tensormap.py), the device
# package (intrinsics/: the simulator's block accessors, lowering_site) and tests take from here: re-exported, so
# ``numbatma._numba_internals`` stays the one door. A test that replaces a name replaces it where it is used.
_REEXPORTED = (
    "_ARRAY_PTR", "ContextLaunch", "GPU_JIT_OPTIONS", "KernelParams", "PreparedLaunch",
    "_check_compiled_cluster_grid", "_clustered_launch_config", "_debug_hook_points", "_debug_index_key",
    "_dependent_core_launch", "_disk_cache_hook_points", "_ensure_dynamic_smem", "_inline_copy_hook_points",
    "_is_constant", "_keyed_cache_class", "_prepare_numbatma_arg", "_prepared_device", "_simulator_hook_points",
    "_simulator_jit_points", "check_constant_operand", "check_params", "cluster_launch", "compiled_kernel",
    "cu_stream", "current_device_id", "dependent_launch", "dependent_launches", "disk_cache_key",
    "enable_disk_cache", "install_clusters", "install_debug_mode", "install_dependent_launches",
    "install_descriptor_arguments", "install_inline_copy", "install_launch_checks", "install_lowering_sites",
    "install_simulator", "install_simulator_launches", "kernel_param_sizes", "launch_config", "lowering_site",
    "max_active_clusters", "param_field", "prepare_launch", "simulated_block", "simulated_block_dim",
    "simulated_device_array", "simulated_grid_dim",
)

TESTED_RANGE = ((0, 30, 4), (0, 31, 0))  # [low, high)
_installed = False
_offline = threading.local()


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
        for module in (llvmir if isinstance(llvmir, (list, tuple)) else [llvmir]):
            if isinstance(module, str) and "numbatma:" in module:  # (only restricted instructions carry a marker)
                check = _registry.target_checker()  # (registered by the device package, whose PTX made the marker)
                if check is not None:
                    check(module, arch)
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
    """Install the GPU path's hooks (1-6, 8-9, 11, 13, and 10 in debug mode; the simulator's is
    :func:`install_simulator`). Idempotent."""
    global _installed
    if _installed:
        return
    check_version()
    _launch_hooks.bind_types()
    points = {**_hook_points(), **_disk_cache_hook_points(), **_inline_copy_hook_points()}
    for label, (owner, attr) in points.items():
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
    install_inline_copy()  # 13
    from . import debug

    if debug.ENABLED:
        install_debug_mode()  # 10
    _installed = True
