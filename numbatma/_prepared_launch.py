"""Prepared launches: numba's per-launch marshalling done once into a parameter block, each run one ``cuLaunchKernel``.

A seam module (numba-cuda private names: ``_Kernel._prepare_args``, ``_codelibrary``, ``CudaPythonFunction.handle``,
checked by ``tests/test_numba_internals.py``). No patching.

Prepared launches (:func:`prepare_launch`, no patching) do once what ``numba.cuda.dispatcher._Kernel.launch`` does
per launch - the arguments marshalled by ``_Kernel._prepare_args`` (hook 2 in front) - and then what cuda.core's
``launch`` does with those values, themselves: :class:`KernelParams` lays them out as cuda.core's argument holder
would (:func:`param_field`; a by-value descriptor as the descriptor's own driver ``CUtensorMap``) and a run is one
``cuLaunchKernel`` of the compiled ``CUkernel`` (``CudaPythonFunction.handle``, the handle of the cuda.core
``Kernel`` that ``_Kernel.launch`` launches) on the stream's raw ``CUstream`` handle (an int: what
:func:`numbatma.streams.stream_handle` makes of any stream, once, before the launch); a failed launch raises numba's
``CudaAPIError``.
:meth:`PreparedLaunch.update` patches a replaced array's address at the data pointer's place, the fifth of an
array's values - checked against the array's address when prepared, and by ``tests/test_numba_internals.py``
against numba-cuda's source, as are the other names here; where the driver tells the kernel's parameter sizes
(``cuKernelGetParamInfo``) the layout is checked against them at prepare time.
"""
from __future__ import annotations

import ctypes

from . import _launch_hooks as _hooks
from ._launch_hooks import (
    _MISSING,
    _dependent,
    _ensure_dynamic_smem,
    _prepare_numbatma_arg,
    _prepared_device,
    compiled_kernel,
)
from ._scalars import same_scalar
from ._shapes import check_grid
from .devices import several_devices


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
    arguments of the same types. Per run: the stream handle's ``CUstream`` (the last one made is kept: the same
    handle again costs one int comparison) and ``cuLaunchKernel`` with the parameter block built once
    (:class:`KernelParams`); a dependent run (``dependent``, or ``scoped`` inside :func:`dependent_launch`)
    ``cuLaunchKernelEx`` with the programmatic stream serialization attribute.

    ``stream``: a raw ``CUstream`` handle (an int; 0: the legacy default stream), what ``Plan.stream_for`` and
    :func:`numbatma.streams.stream_handle` return. Any other stream :func:`numbatma.streams.stream_handle` takes is
    turned into its handle here (a caller of a prepared launch of its own may pass one). A descriptor argument is passed from the descriptor's own encoded ``CUtensorMap``
    (:meth:`numbatma.TensorMap.driver_tensor_map`): re-pointing it in place is seen by the next run.

    ``device``: the device it was prepared on (None: unknown, offline), where every run goes. In a process that sees
    one device that is all there is to it; where it sees several, the launch is a :class:`ContextLaunch`, which
    compares the current context with the one it was prepared in (``context``) at each run."""

    __slots__ = ("dispatcher", "kernel", "function", "grid", "block", "shared_mem", "dependent", "scoped", "slots",
                 "params", "sources", "keep_alive", "_launch", "_launch_ex", "_stream_memo", "_dependent_memo",
                 "device", "context", "_current", "_push", "_pop")

    def __call__(self, stream=0):
        seen, handle = self._stream_memo
        if seen is not stream and seen != stream:  # (a handle: the same int, or an equal one read again)
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
    """The driver's ``CUstream`` (cuda.bindings) of a stream handle (an int), or of any stream
    :func:`numbatma.streams.stream_handle` takes (0 / None, a numba, torch, CuPy or cuda.core stream, an object with
    ``__cuda_stream__``): the handle made once, here at the driver call."""
    from cuda.bindings import driver

    from .streams import stream_handle

    return driver.CUstream(stream if type(stream) is int and stream >= 0 else stream_handle(stream))


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
            f"numbatma/_prepared_launch.py expects (this is numba-cuda {_numba_cuda_version()}; the tested range is "
            f"numbatma._numba_internals.TESTED_RANGE).")


def _numba_cuda_version():
    from importlib.metadata import version

    return version("numba-cuda")


_ARRAY_PTR = 4  # numba's array argument: meminfo, parent, size, itemsize, data pointer, shape..., strides...


def _argument_slot(ty, source, kernelargs, start):
    """How argument ``source`` (typed ``ty``) sits in ``kernelargs[start:]``: (kind, start, stop, ty, layout, record);
    for an array ``layout`` is (shape, byte strides, the dtype as a kernel sees it) and ``record`` the interned layout
    record of ``source`` (:func:`numbatma.layout_record`; None for a view), else both None."""
    from numba.cuda import types

    stop = len(kernelargs)
    if _hooks.by_value_descriptor(ty):
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
    view = _hooks._DeviceView
    if type(new) is view:
        if type(old) is view and new._base is old._base:  # (re-made from it: only the address differs)
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
