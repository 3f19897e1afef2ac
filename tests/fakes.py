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
