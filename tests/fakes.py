"""Stand-ins for CUDA arrays on machines without a GPU: only the CUDA Array Interface is needed to build
(and compile kernels against) a TensorMap; encoding waits for the first launch."""
import numpy as np


class FakeCudaArray:
    def __init__(self, shape, dtype, strides=None, ptr=1 << 20):
        self.__cuda_array_interface__ = {
            "data": (ptr, False),
            "shape": tuple(shape),
            "strides": strides,
            "typestr": np.dtype(dtype).str,
            "version": 3,
        }

    def reshape(self, shape):
        """A C-contiguous reshape (what the kernels ask of contiguous arrays)."""
        cai = self.__cuda_array_interface__
        return FakeCudaArray(shape, np.dtype(cai["typestr"]), ptr=cai["data"][0])


# -- a torch stand-in: enough of torch.Tensor for numbatma's intake, streams and the plans -------------------------
class FakeTorchDtype:
    """``torch.float32`` etc.: compared by identity, as torch's dtypes are."""

    def __init__(self, name, itemsize, typestr):
        self.name, self.itemsize, self.typestr = name, itemsize, typestr

    def __repr__(self):
        return f"torch.{self.name}"


FAKE_TORCH_DTYPES = {name: FakeTorchDtype(name, np.dtype(t.replace("V", "u")).itemsize, t) for name, t in (
    ("float16", "<f2"), ("float32", "<f4"), ("float64", "<f8"), ("bfloat16", "<V2"), ("uint8", "|u1"),
    ("int8", "|i1"), ("int16", "<i2"), ("int32", "<i4"), ("int64", "<i8"), ("bool", "|b1"),
    ("complex64", "<c8"))}


class FakeTorchDevice:
    def __init__(self, type_, index):
        self.type, self.index = type_, index

    def __repr__(self):
        return f"device(type={self.type!r}, index={self.index})"


STRIDED = object()  # torch.strided


class FakeTorchTensor:
    """A CUDA torch tensor as numbatma sees one: ``data_ptr()``, ``shape``, ``stride()`` (elements), ``dtype``,
    ``device``, ``requires_grad``, ``layout`` and torch's own ``__cuda_array_interface__`` (the same Python steps
    as torch/_tensor.py: bfloat16 as '<V2', strides None when contiguous, data 0 when empty)."""

    def __init__(self, shape, dtype="float32", ptr=1 << 20, strides=None, device=0, requires_grad=False):
        self.shape = tuple(shape)
        self.dtype = FAKE_TORCH_DTYPES[dtype] if isinstance(dtype, str) else dtype
        self._ptr = ptr
        self._strides = tuple(strides) if strides is not None else self._c_strides()
        self.device = FakeTorchDevice("cuda", device) if device is not None else FakeTorchDevice("cpu", None)
        self.is_cuda = device is not None
        self.requires_grad = requires_grad
        self.layout = STRIDED

    def _c_strides(self):
        out, acc = [], 1
        for s in reversed(self.shape):
            out.append(acc)
            acc *= max(s, 1)
        return tuple(reversed(out))

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self):
        return self.dtype.itemsize

    def get_device(self):
        return self.device.index if self.is_cuda else -1

    def is_contiguous(self):
        expected = 1
        for s, st in zip(reversed(self.shape), reversed(self._strides)):
            if s != 1 and st != expected:
                return False
            expected *= s
        return True

    def reshape(self, shape):
        assert self.is_contiguous()
        return FakeTorchTensor(shape, self.dtype, ptr=self._ptr, device=self.device.index,
                               requires_grad=self.requires_grad)

    def set_(self, ptr=None, shape=None, strides=None):
        """In place, as torch's ``set_`` / ``resize_``: the same object, other memory or layout."""
        if ptr is not None:
            self._ptr = ptr
        if shape is not None:
            self.shape = tuple(shape)
            self._strides = tuple(strides) if strides is not None else self._c_strides()
        return self

    @property
    def __cuda_array_interface__(self):
        if not self.is_cuda:
            raise AttributeError("Can't get __cuda_array_interface__ on non-CUDA tensor type")
        if self.requires_grad:
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad.")
        typestr = self.dtype.typestr
        itemsize = self.element_size()
        shape = tuple(self.shape)
        strides = None if self.is_contiguous() else tuple(s * itemsize for s in self.stride())
        data_ptr = self.data_ptr() if self.numel() > 0 else 0
        return dict(typestr=typestr, shape=shape, strides=strides, data=(data_ptr, False), version=2)


class FakeTorchStream:
    def __init__(self, handle):
        self.cuda_stream = handle


def fake_torch(current_stream=0, raw_stream=True):
    """A module to put in ``sys.modules["torch"]``: ``Tensor``, the dtypes, ``strided``,
    ``cuda.current_stream(device)`` and (with ``raw_stream``) ``_C._cuda_getCurrentRawStream(index)``, both
    answering ``current_stream`` (a handle, or a function of the device index). ``calls`` counts the look-ups."""
    import types

    module = types.ModuleType("torch")
    module.Tensor = FakeTorchTensor
    module.strided = STRIDED
    for name, dtype in FAKE_TORCH_DTYPES.items():
        setattr(module, name, dtype)
    module.calls = {"current_stream": 0, "raw": 0}

    def handle(index):
        return current_stream(index) if callable(current_stream) else current_stream

    def current(device=None):
        module.calls["current_stream"] += 1
        return FakeTorchStream(handle(getattr(device, "index", 0)))

    def raw(index):
        module.calls["raw"] += 1
        return handle(index)

    module.cuda = types.SimpleNamespace(current_stream=current)
    if raw_stream:
        module._C = types.SimpleNamespace(_cuda_getCurrentRawStream=raw)
    return module


# -- a prepared launch without a GPU: numba's marshalling, the driver's launch recorded ---------------------------
def numba_array(shape, dtype, ptr, strides=None):
    """A numba ``DeviceNDArray`` at ``ptr`` (C-contiguous unless byte ``strides`` are given; over memory it does not
    own: no driver needed)."""
    import ctypes
    import types

    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    dtype = np.dtype(dtype)
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1:])) * dtype.itemsize for i in range(len(shape)))
    memory = types.SimpleNamespace(device_ctypes_pointer=ctypes.c_void_p(ptr))
    return DeviceNDArray(tuple(shape), strides, dtype, gpu_data=memory)


class OfflineKernel:
    """numba's compiled ``_Kernel`` as a prepared launch uses it, without a GPU: arguments are marshalled by
    numba-cuda's own ``_Kernel._prepare_args`` (numbatma's hook 2 in front of it: descriptors), which works offline
    for scalars and numba device arrays; ``handle`` stands for the ``CUkernel``."""

    debug = cooperative = False
    launch_bounds = None
    extensions = ()

    def __init__(self, argument_types, handle=0xC0FFEE):
        import types

        self.argument_types = tuple(argument_types)
        self.handle = handle
        cufunc = types.SimpleNamespace(kernel="the-core-kernel", handle=handle, name="offline")
        self._codelibrary = types.SimpleNamespace(get_cufunc=lambda: cufunc)

    def _prepare_args(self, ty, value, stream, retr, kernelargs):
        from numba.cuda import dispatcher

        return dispatcher._Kernel._prepare_args(self, ty, value, stream, retr, kernelargs)

    def marshalled(self, args):
        """What numba-cuda's launch would hand cuda.core for ``args``: the flat list of marshalled values."""
        values = []
        for ty, value in zip(self.argument_types, args):
            self._prepare_args(ty, value, 0, [], values)
        return values


class FakeDriver:
    """The driver calls of a prepared launch, without a GPU: ``cuLaunchKernel`` / ``cuLaunchKernelEx`` record each
    launch (function, grid, block, shared memory, stream handle, whether dependent, and every parameter's bytes as
    the driver copies them at the launch: ``param_sizes`` bytes from each pointer of the kernelParams array);
    ``cuKernelGetParamCount`` / ``cuKernelGetParamInfo`` answer ``param_sizes`` (``report=False``: NOT_SUPPORTED, as
    a driver before 12.4; ``count=False``: no ``cuKernelGetParamCount``, as a driver before 12.9). ``past``: the
    indices asked for that do not exist (an API error compute-sanitizer reports)."""

    def __init__(self, param_sizes, report=True, count=True):
        self.param_sizes = list(param_sizes)
        self.report, self.count = report, count
        self.calls = []
        self.queries = 0
        self.past = []
        self.blocks = {}  # (parameter block address -> its sizes: offline_gpu)

    def install(self, monkeypatch):
        from cuda.bindings import driver

        monkeypatch.setattr(driver, "cuLaunchKernel", self.launch)
        monkeypatch.setattr(driver, "cuLaunchKernelEx", self.launch_ex)
        monkeypatch.setattr(driver, "cuKernelGetParamInfo", self.param_info)
        if self.count:
            monkeypatch.setattr(driver, "cuKernelGetParamCount", self.param_count, raising=False)
        else:
            monkeypatch.delattr(driver, "cuKernelGetParamCount", raising=False)
        return self

    def _params(self, address):
        import ctypes

        sizes = self.param_sizes if self.param_sizes is not None else self.blocks[address]
        if not sizes:
            return ()
        pointers = (ctypes.c_void_p * len(sizes)).from_address(address)
        return tuple(ctypes.string_at(pointers[i], size) for i, size in enumerate(sizes))

    def launch(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        from cuda.bindings import driver

        assert extra == 0
        self.calls.append(dict(function=int(f), grid=(gx, gy, gz), block=(bx, by, bz), shared_mem=smem,
                               stream=int(stream), dependent=False, params=self._params(params)))
        return (driver.CUresult.CUDA_SUCCESS,)

    def launch_ex(self, config, f, params, extra):
        from cuda.bindings import driver

        assert extra == 0
        attrs = config.attrs[:config.numAttrs]
        serial = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        dependent = any(a.id == serial and a.value.programmaticStreamSerializationAllowed for a in attrs)
        self.calls.append(dict(function=int(f), grid=(config.gridDimX, config.gridDimY, config.gridDimZ),
                               block=(config.blockDimX, config.blockDimY, config.blockDimZ),
                               shared_mem=config.sharedMemBytes, stream=int(config.hStream), dependent=dependent,
                               params=self._params(params)))
        return (driver.CUresult.CUDA_SUCCESS,)

    def param_info(self, kernel, index):
        from cuda.bindings import driver

        self.queries += 1
        if not self.report:
            return (driver.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0, 0)
        if index >= len(self.param_sizes):
            self.past.append(index)
            return (driver.CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0)
        return (driver.CUresult.CUDA_SUCCESS, sum(self.param_sizes[:index]), self.param_sizes[index])

    def param_count(self, kernel):
        from cuda.bindings import driver

        self.queries += 1
        if not self.report:
            return (driver.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0)
        return (driver.CUresult.CUDA_SUCCESS, len(self.param_sizes))



def offline_gpu(set_attr, record=True):
    """Let plans and ``numbatma.prepare_launch`` run their real prepared launch without a GPU: ``set_attr(owner, name,
    value)`` (``monkeypatch.setattr``, or ``setattr`` for good) replaces what needs one. The compiled kernel: an
    :class:`OfflineKernel` typed from the arguments (numba-cuda's own marshalling); the dynamic shared-memory
    attribute: nothing; the SM count: 132; a descriptor's encoding: a ``CUtensorMap`` whose first word is its
    address (``cuTensorMapReplaceAddress`` writes it there), cuda.core's: a stand-in; a view's numba array: one over
    its memory (:func:`numba_array`); the launch: a :class:`FakeDriver` that reads each parameter block (its sizes
    known from the block) when ``record``, a no-op otherwise. Returns the FakeDriver (``builds``: the parameter blocks
    built so far, one per launch prepared)."""
    import ctypes

    from cuda.bindings import driver as cu

    from numbatma import DeviceView, _descriptor_base
    from numbatma import _numba_internals as internals
    from numbatma import _prepared_launch as prepared
    from numbatma.kernels import _launch

    fake = FakeDriver([])
    kernels, blocks = {}, {}

    def compiled_kernel(dispatcher, args):
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        key = (id(dispatcher), types)
        if key not in kernels:
            kernels[key] = OfflineKernel(types)
        return kernels[key]

    build = internals.KernelParams.build.__func__

    def registered_build(cls, values, descriptors=None):
        params = build(cls, values, descriptors)
        if params is not None:
            blocks[params.address] = params.sizes
            fake.builds += 1
        return params

    def driver_tensor_map(self):  # (not encoded: its address in the first word)
        if self._raw is None:
            self._raw = cu.CUtensorMap()
            ctypes.c_uint64.from_address(self._raw.getPtr()).value = self._ptr
        return self._raw

    def replace(tensor_map, address):
        ctypes.c_uint64.from_address(tensor_map.getPtr()).value = address
        return ok

    def descriptor(self):  # (cuda.core's, for numba's marshalling: a stand-in)
        self._descriptor, self._core_stale = "core", False
        return self._descriptor

    def device_array(self):  # (on a GPU: a numba array over the view, made on first launch)
        if self._device is None:
            lay = self.layout
            self._device = numba_array(lay.shape, _descriptor_base.bits_dtype(lay.dtype), lay.ptr,
                                       strides=lay.strides)
        return self._device

    ok = (cu.CUresult.CUDA_SUCCESS,)
    fake.param_sizes = None
    fake.blocks = blocks
    fake.builds = 0  # (parameter blocks built: launches prepared)
    set_attr(_launch, "sm_count", lambda *a: 132)
    set_attr(prepared, "compiled_kernel", compiled_kernel)  # (where prepare_launch looks them up)
    set_attr(prepared, "_ensure_dynamic_smem", lambda kernel, nbytes: None)
    set_attr(internals.KernelParams, "build", classmethod(registered_build))
    set_attr(_descriptor_base, "_replace_address", replace)
    set_attr(_descriptor_base.TMADescriptor, "driver_tensor_map", driver_tensor_map)
    set_attr(_descriptor_base.TMADescriptor, "descriptor", property(descriptor))
    set_attr(DeviceView, "device_array", device_array)
    set_attr(cu, "cuKernelGetParamInfo", lambda *a: (cu.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0, 0))
    set_attr(cu, "cuKernelGetParamCount", lambda *a: (cu.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0))
    if record:
        set_attr(cu, "cuLaunchKernel", fake.launch)
        set_attr(cu, "cuLaunchKernelEx", fake.launch_ex)
    else:
        set_attr(cu, "cuLaunchKernel", lambda *a: ok)
        set_attr(cu, "cuLaunchKernelEx", lambda *a: ok)
    return fake
