"""The array intake: any CUDA array read once into an :class:`ArrayLayout` (pointer, shape, byte strides, dtype).

:func:`array_layout` reads pointer, shape, byte strides and dtype from any CUDA array (CUDA Array Interface,
DLPack, the simulator's arrays; torch tensors and numba arrays through their attributes: one reader per array
class, decided on first sight) into an :class:`ArrayLayout`; :func:`layout_facts` gives the same as a plain
tuple and :func:`layout_record` as an interned record (one object per distinct layout, for the plan cache and the
prepared launches). The interface's fields are checked (:func:`_cai_facts`: a missing or ill-typed field, strides
of the wrong length or not whole elements, a mask), big-endian elements refused (:func:`check_byte_order`), and
whether the exporter marked the memory read-only is recorded (:func:`is_readonly`, ``ArrayLayout.readonly``: the
plans refuse such an output). :func:`byte_span` gives the bytes a layout's elements cover; :class:`DeviceView`
is device memory of a given layout as a kernel argument; :func:`host_view` / :func:`simulator_memory` are the
simulator's view of it. Every refusal is a :class:`TensorMapError` naming the rule and the caller's value.

What the TMA descriptors add on top (the encoder's layout rules, options, encoding) is ``_descriptor_base.py``;
the public names defined here (:class:`TensorMapError`, :class:`ArrayLayout`, :class:`DeviceView`,
:func:`array_layout`, :func:`is_readonly`, :func:`layout_facts`) are exported by :mod:`numbatma.tensormap`.
Imports nothing of numbatma but the leaf ``_env``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ._env import SIMULATING

_PUBLIC_MODULE = "numbatma.tensormap"


class TensorMapError(ValueError):
    """A TMA descriptor was asked for with arguments the hardware cannot describe."""

    __module__ = _PUBLIC_MODULE


_FP8_DTYPES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}  # ml_dtypes names (torch.float8_e4m3fn, ...)


def shape_str(shape):
    """``(4,)`` / ``(4, 8)``: a shape as Python writes a tuple (the messages' spelling)."""
    return "(" + ", ".join(str(s) for s in shape) + (",)" if len(shape) == 1 else ")")


def bits_dtype(dtype):
    """bfloat16 / float8 (which numba kernels cannot take) as uint16 / uint8: the same bits. (Decided once per
    dtype: NumPy builds ``dtype.name`` on every access.)"""
    bits = _BITS.get(dtype)
    if bits is None:
        bits = dtype
        if dtype.name == "bfloat16" or dtype.kind == "V" or dtype.name in _FP8_DTYPES:
            bits = np.dtype(f"<u{dtype.itemsize}")
        _BITS[dtype] = bits
    return bits


_BITS = {}

# -- the array intake -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArrayLayout:
    """What numbatma needs to know about a CUDA array: where it is and how it is laid out."""

    __module__ = _PUBLIC_MODULE

    ptr: int
    shape: tuple
    strides: tuple  # bytes, row-major order like shape
    dtype: np.dtype
    readonly: bool = False  # the exporter says the memory must not be written (see is_readonly)

    @property
    def name(self):
        return f"{self.dtype.name} array with shape {shape_str(self.shape)}"

    def columns(self, start, stop):
        """The layout of ``array[..., start:stop]`` (a range of the innermost axis)."""
        start, stop = max(0, int(start)), min(int(stop), self.shape[-1])
        return ArrayLayout(self.ptr + start * self.strides[-1], self.shape[:-1] + (max(0, stop - start),),
                           self.strides, self.dtype, self.readonly)

    def _shifted(self, delta):
        """This layout ``delta`` bytes further (made without the dataclass's field-by-field ``__init__``: re-pointing
        makes one per view and descriptor per call)."""
        moved = object.__new__(ArrayLayout)
        moved.__dict__.update(ptr=self.ptr + delta, shape=self.shape, strides=self.strides, dtype=self.dtype,
                              readonly=self.readonly)
        return moved


class DeviceView:
    """A strided view of device memory (the CUDA Array Interface of an :class:`ArrayLayout`) that keeps the
    array owning the memory alive. Pass it to a ``@cuda.jit`` kernel as it is, or call :meth:`device_array`
    once for a numba device array (cheaper to launch with: no conversion per launch)."""

    __module__ = _PUBLIC_MODULE

    def __init__(self, layout, owner):
        self.owner = owner
        self._base = self._layout = layout  # (the layout given; the views re-pointed from this one share it)
        self._ptr = layout.ptr
        self._cai = None
        self._device = None

    @property
    def layout(self):
        """The :class:`ArrayLayout` the view describes."""
        lay = self._layout
        if lay is None:  # (re-pointed: made on first use)
            base = self._base
            lay = self._layout = base._shifted(self._ptr - base.ptr)
        return lay

    @property
    def readonly(self):
        """Whether the memory must not be written: the layout says so, or the owner does (:func:`is_readonly`)."""
        if self.layout.readonly:
            return True
        owner = self.owner
        if owner is None or owner is self:
            return False
        try:
            return is_readonly(owner)
        except TensorMapError:  # (an owner that is no array: only keeps the memory alive)
            return False

    @property
    def __cuda_array_interface__(self):
        cai = self._cai
        if cai is None:
            lay = self.layout
            cai = self._cai = {"shape": tuple(lay.shape), "strides": tuple(lay.strides),
                               "typestr": bits_dtype(lay.dtype).str, "data": (int(lay.ptr), self.readonly),
                               "version": 3}
        return cai

    def _at(self, delta, owner):
        """This view ``delta`` bytes further, inside ``owner``: what re-pointing makes (its layout and interface are
        made when first asked for; it shares this view's base layout, which tells a prepared launch that only the
        address changed)."""
        view = object.__new__(DeviceView)
        view.__dict__.update(owner=owner, _base=self._base, _ptr=self._ptr + delta, _layout=None, _cai=None,
                             _device=None)
        return view

    def device_array(self):
        """The numba device array over the same memory (made on first call; needs the CUDA driver)."""
        if self._device is None:
            from numba import cuda

            self._device = cuda.from_cuda_array_interface(self.__cuda_array_interface__, owner=self, sync=False)
        return self._device


class _LayoutArray:
    """A CUDA-array-interface view of an :class:`ArrayLayout` (same pointer, numbatma's strides)."""

    def __init__(self, layout):
        typestr = bits_dtype(layout.dtype).str  # bfloat16 / float8: the bits (the type is given when encoding)
        self.__cuda_array_interface__ = {
            "shape": layout.shape,
            "strides": layout.strides,
            "typestr": typestr,
            "data": (layout.ptr, False),
            "version": 3,
        }


def _describe_descr(descr):
    return "fields " + ", ".join(f"{f[0]!r}: {f[1]}" for f in descr if f)


def _dtype_from_typestr(typestr, descr=None):
    """The dtype of a CUDA Array Interface ``typestr`` (``descr``: its field list); None where NumPy has none.
    (Without named fields the answer depends on ``typestr`` alone: remembered.)"""
    unnamed = descr is None or not any(f and f[0] for f in descr)
    if unnamed and isinstance(typestr, str):
        dt = _TYPESTR_DTYPES.get(typestr)
        if dt is None:
            dt = _dtype_of_typestr(typestr, descr)
            if dt is not None:
                _TYPESTR_DTYPES[typestr] = dt
        return dt
    return _dtype_of_typestr(typestr, descr)


_TYPESTR_DTYPES = {}


def _dtype_of_typestr(typestr, descr):
    try:
        dt = np.dtype(typestr)
    except TypeError:
        dt = None
    if dt is not None and dt.kind == "V" and dt.itemsize == 2:
        # bfloat16 has no typestr of its own ('<V2', descr [('', '<V2')]). A record of two bytes (named fields
        # in descr) is not bfloat16: refuse it rather than reinterpret its bytes.
        # NumPy spells records and raw bytes '|V2' (no byte order) and bfloat16 '<V2'.
        fields = [f for f in (descr or ()) if f and f[0]]
        if fields or str(typestr).startswith("|"):
            what = f"2-byte records ({_describe_descr(fields)})" if fields else f"2-byte records or raw bytes ({typestr!r})"
            raise TensorMapError(
                f"TensorMap: the array's elements are {what}, not numbers, and are not taken for bfloat16; "
                f"TMA moves integer and floating-point elements. For bfloat16 data pass an array of "
                f"ml_dtypes.bfloat16 (typestr '<V2') or of its bits (uint16)."
            )
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:  # pragma: no cover - optional
            pass
    return dt


def simulator_memory(array):
    """Under the CUDA simulator, device arrays are NumPy arrays in disguise (``_ary``); host NumPy arrays
    are accepted too. Returns the NumPy array, or None for anything else."""
    seen = 0
    while not isinstance(array, np.ndarray) and seen < 4:
        array = getattr(array, "_ary", None)
        seen += 1
    return array if isinstance(array, np.ndarray) else None


def host_view(layout, owner, dtype):
    """Under the simulator: the NumPy view (elements of ``dtype``) of the memory ``layout`` describes inside
    ``owner``."""
    host = simulator_memory(owner)
    if host is None:
        raise TensorMapError(f"cannot reach the memory of a {type(owner).__name__} in the simulator")
    base = host
    while isinstance(base.base, np.ndarray):
        base = base.base
    offset = layout.ptr - int(base.__array_interface__["data"][0])
    return np.ndarray(layout.shape, dtype, buffer=base, offset=offset, strides=layout.strides)


def _unit_dims_strides(shape, strides, itemsize):
    """The stride of a dimension of extent 1 is never used; exporters report anything there (numba: the
    contiguous value, which need not be a multiple of 16 bytes). Give such dimensions the smallest stride
    TMA accepts, so a (1, 1) view of a padded allocation is as valid as its parent."""
    out = list(strides)
    rank = len(shape)
    for i in reversed(range(rank)):
        if shape[i] != 1:
            continue
        if i == rank - 1:
            out[i] = itemsize
        else:
            span = out[i + 1] * shape[i + 1]
            out[i] = -(-span // 16) * 16
    return tuple(out)


def _c_strides(shape, itemsize):
    strides = []
    acc = itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def array_layout(array) -> ArrayLayout:
    """Read pointer, shape, byte strides and dtype from any CUDA array.

    Accepts objects with ``__cuda_array_interface__`` (numba device arrays, CuPy, PyTorch) and objects with
    ``__dlpack__`` (PyTorch bfloat16, JAX, ...). Needs no driver for the CUDA Array Interface. A plain CUDA torch
    tensor is read through its methods (``data_ptr()``, ``stride()``, ...: what its CUDA Array Interface would
    say, without building it; see :func:`layout_facts`).
    """
    if isinstance(array, ArrayLayout):
        return array
    if isinstance(array, DeviceView):
        return array.layout  # (its own dtype: a bfloat16 view stays bfloat16)
    reader = _READERS.get(type(array))
    if reader is None:
        reader = _READERS[type(array)] = _reader_for(type(array))
    if reader is _general_record:  # (one read of the interface for the layout and the read-only flag)
        return ArrayLayout(*_general_facts(array, readonly=True))
    return ArrayLayout(*layout_facts(array), is_readonly(array))


def layout_facts(array):
    """``(ptr, shape, byte strides, dtype)`` of ``array``: the fields of :func:`array_layout`'s answer as a plain
    tuple (cheaper to make: what the function forms' plan cache reads per argument and call). The one intake of
    arrays: every reader of CUDA arrays in numbatma goes through here (or through :func:`layout_record`, the same
    answer with the layout interned).

    Fast paths, the same answer as through the CUDA Array Interface (which torch builds in Python on every
    access): a CUDA ``torch.Tensor`` (the class itself, not a subclass) that does not require grad, is dense and
    not empty, of a dtype torch's interface names, is read with ``data_ptr()``, ``shape``, ``stride()`` and
    ``dtype`` (the layout part remembered per shape, strides and dtype); a numba ``DeviceNDArray`` of numbers, not
    empty, with its ``shape``, ``strides``, ``dtype`` and pointer (the layout part remembered likewise). Anything
    else: the CUDA Array Interface, then DLPack (same errors as ever). (Which reader an array's class gets is
    decided on its first sight.)"""
    ptr, record = layout_record(array)
    return ptr, record[0], record[1], record[2]


def layout_record(array):
    """``(ptr, record)``: :func:`layout_facts` of ``array`` with the layout part interned: ``record`` is
    ``(shape, byte strides, dtype, id, lo, hi)``, the same tuple for every array of that layout while it is
    remembered (up to 4096 layouts), ``id`` an int naming the layout (never reused for another one, so a key holding
    it needs no hashing of shapes), ``[ptr + lo, ptr + hi)`` the bytes the elements span (``lo == hi``: empty)."""
    reader = _READERS.get(type(array))
    if reader is None:
        reader = _READERS[type(array)] = _reader_for(type(array))
    return reader(array)


def byte_span(shape, strides, itemsize):
    """``(lo, hi)``: the bytes the elements of an array at address 0 span (``lo == hi`` for an empty array)."""
    if 0 in shape:
        return 0, 0
    lo = hi = 0
    for n, st in zip(shape, strides):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return lo, hi + itemsize


def _record(shape, strides, dtype):
    """The interned layout record of (shape, byte strides, dtype) (see :func:`layout_record`)."""
    key = (shape, strides, dtype)
    record = _RECORDS.get(key)
    if record is None:
        if len(_RECORDS) >= 4096:
            _RECORDS.clear()
        record = _RECORDS[key] = key + (next(_RECORD_IDS),) + byte_span(shape, strides, dtype.itemsize)
    return record


_RECORDS = {}
_RECORD_IDS = itertools.count()


def _general_record(array):
    ptr, shape, strides, dtype = _general_facts(array)
    return ptr, _record(shape, strides, dtype)


def _general_facts(array, readonly=False):
    """:func:`layout_facts` through the simulator's arrays, the CUDA Array Interface or DLPack (``readonly``: with
    :func:`is_readonly`'s answer as a fifth entry, read from the same interface)."""
    if isinstance(array, ArrayLayout):
        return (array.ptr, array.shape, array.strides, array.dtype) + ((array.readonly,) if readonly else ())
    if isinstance(array, DeviceView):
        lay = array.layout
        return (lay.ptr, lay.shape, lay.strides, lay.dtype) + ((array.readonly,) if readonly else ())
    if SIMULATING:
        host = simulator_memory(array)
        if host is not None:
            check_byte_order(host.dtype)
            return (int(host.__array_interface__["data"][0]), tuple(host.shape),
                    _unit_dims_strides(host.shape, tuple(host.strides), host.dtype.itemsize),
                    host.dtype) + ((not host.flags.writeable,) if readonly else ())
    try:
        cai = array.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception:  # e.g. torch refuses the CAI for bfloat16; DLPack below handles it
        cai = None
    if cai is not None:
        facts = _cai_facts(cai, array)
        return facts if readonly else facts[:4]
    if hasattr(array, "__dlpack__"):
        from cuda.core.utils import StridedMemoryView

        try:
            view = StridedMemoryView.from_any_interface(array, stream_ptr=-1)
        except (TypeError, NotImplementedError, BufferError) as exc:  # e.g. torch float8: "Unsupported ... dtype"
            raise TensorMapError(
                f"TensorMap: the {type(array).__name__} cannot be described through DLPack ({exc}). For float8 "
                f"data pass its bytes (e.g. tensor.view(torch.uint8)) with element='e4m3' or 'e5m2'."
            ) from None
        if not view.is_device_accessible:
            raise TensorMapError(
                f"TensorMap: the {type(array).__name__} lives in host memory; TMA reads and writes device "
                f"memory. Copy it to the GPU first (e.g. numba.cuda.to_device, cupy.asarray, tensor.cuda())."
            )
        try:
            dtype = np.dtype(view.dtype)
        except Exception as exc:  # e.g. a float8 tensor without ml_dtypes to name its type
            raise TensorMapError(
                f"TensorMap: the element type of the {type(array).__name__} cannot be read through DLPack ({exc}). "
                f"For float8 data pass its bytes (e.g. tensor.view(torch.uint8)) with element='e4m3' or 'e5m2'."
            ) from None
        shape = tuple(int(s) for s in view.shape)
        if view.strides is None:
            strides = _c_strides(shape, dtype.itemsize)
        else:
            strides = tuple(int(s) * dtype.itemsize for s in view.strides)
        return (int(view.ptr), shape, _unit_dims_strides(shape, strides, dtype.itemsize),
                dtype) + ((bool(getattr(view, "readonly", False)),) if readonly else ())
    raise TensorMapError(
        f"TensorMap: expected a CUDA array (numba device array, CuPy array, PyTorch tensor: anything with "
        f"__cuda_array_interface__ or __dlpack__), got {type(array).__name__}."
    )


_PLAIN_INT = frozenset((int,))  # (exactly int: not bool, whose type is bool; NumPy integers take the longer path)
_BIG_ENDIAN = (">", "!") if np.little_endian else ()


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _cai_error(array, field, rule, value):
    return TensorMapError(
        f"TensorMap: the __cuda_array_interface__ of the {type(array).__name__} is malformed: {field} must be "
        f"{rule}, got {value!r}."
    )


def _cai_facts(cai, array):
    """``(ptr, shape, byte strides, dtype, readonly)`` of a CUDA Array Interface dict ``cai`` (of ``array``), each
    field checked against the interface's rules (version 3): ``shape`` a tuple of ints >= 0, ``typestr`` a NumPy
    type string, ``data`` a pair ``(pointer: int, readonly: bool)``, ``strides`` None or one byte stride (an int,
    a multiple of the itemsize) per dimension, ``mask`` None. A malformed field is a :class:`TensorMapError` naming
    it and its value, never an error from NumPy or Python's internals."""
    try:
        shape, typestr, data = cai["shape"], cai["typestr"], cai["data"]
    except (KeyError, TypeError):
        if not isinstance(cai, dict):
            raise _cai_error(array, "the interface", "a dict", cai) from None
        field = next(f for f in ("shape", "typestr", "data") if f not in cai)
        raise TensorMapError(
            f"TensorMap: the __cuda_array_interface__ of the {type(array).__name__} has no {field!r} entry; "
            f"the interface needs 'shape', 'typestr' and 'data' (got the keys {sorted(map(str, cai))})."
        ) from None
    if type(shape) is tuple and _PLAIN_INT.issuperset(map(type, shape)):  # (the usual case: one pass in C)
        if shape and min(shape) < 0:
            raise _cai_error(array, "'shape'", "a tuple of ints >= 0", shape)
    elif not isinstance(shape, (tuple, list)) or not all(_is_int(n) and n >= 0 for n in shape):
        raise _cai_error(array, "'shape'", "a tuple of ints >= 0", shape)
    else:
        shape = tuple(int(n) for n in shape)
    if not isinstance(typestr, str):
        raise _cai_error(array, "'typestr'", "a NumPy type string such as '<f4'", typestr)
    try:
        dtype = _dtype_from_typestr(typestr, cai.get("descr"))
    except TensorMapError:
        raise
    except Exception:  # noqa: BLE001 - (NumPy's own errors for a malformed string: SyntaxError, ValueError, ...)
        dtype = None
    if dtype is None:
        raise TensorMapError(f"TensorMap: unsupported element type {typestr!r} (the interface's 'typestr' must be a "
                             f"NumPy type string such as '<f4').")
    if typestr[:1] in _BIG_ENDIAN or not dtype.isnative:
        check_byte_order(dtype, typestr)
    if (type(data) is not tuple or len(data) != 2 or type(data[0]) is not int or data[0] < 0
            or type(data[1]) is not bool):
        if (not isinstance(data, (tuple, list)) or len(data) != 2 or not _is_int(data[0]) or data[0] < 0
                or not isinstance(data[1], (bool, np.bool_))):
            raise _cai_error(array, "'data'", "a pair (pointer: an int >= 0, read-only flag: a bool)", data)
    ptr, readonly = int(data[0]), bool(data[1])
    if cai.get("mask") is not None:
        raise TensorMapError(
            f"TensorMap: the {type(array).__name__} is a masked array (its __cuda_array_interface__ has a 'mask'); "
            f"numbatma reads and writes every element: pass the array without its mask."
        )
    strides = cai.get("strides")
    itemsize = dtype.itemsize
    if strides is None:
        strides = _c_strides(shape, itemsize)
        if 1 in shape:
            strides = _unit_dims_strides(shape, strides, itemsize)
    else:
        if type(strides) is tuple and _PLAIN_INT.issuperset(map(type, strides)):
            pass
        elif not isinstance(strides, (tuple, list)) or not all(_is_int(st) for st in strides):
            raise _cai_error(array, "'strides'", "None or a tuple of ints (bytes)", strides)
        else:
            strides = tuple(int(st) for st in strides)
        if len(strides) != len(shape):
            raise TensorMapError(
                f"TensorMap: the __cuda_array_interface__ of the {type(array).__name__} is malformed: 'strides' "
                f"{strides} has {len(strides)} entries but 'shape' {shape_str(shape)} has {len(shape)}; the interface "
                f"gives one byte stride per dimension."
            )
        if 1 in shape:
            strides = _unit_dims_strides(shape, strides, itemsize)
        if itemsize > 1 and 0 not in shape and any(st % itemsize for st in strides):
            for axis, st in enumerate(strides):
                if st % itemsize:
                    raise TensorMapError(
                        f"TensorMap: stride of dimension {axis} of the {dtype.name} array with shape "
                        f"{shape_str(shape)} is {st} bytes, not a multiple of the itemsize ({itemsize} bytes): its "
                        f"elements would be misaligned. Strides must be whole elements (got byte strides {strides})."
                    )
    return ptr, shape, strides, dtype, readonly


def check_byte_order(dtype, typestr=None, who="TensorMap"):
    """Refuse big-endian (non-native) elements: GPUs and TMA move and read little-endian bytes, so a '>f4' array
    would be read as garbage. (``typestr``: the interface's spelling, which tells the byte order of a 2-byte void,
    bfloat16's typestr, that the dtype does not keep.)"""
    spelled = typestr if isinstance(typestr, str) else dtype.str
    if not dtype.isnative or (dtype.itemsize > 1 and spelled[:1] in (">", "!") and _LITTLE):
        raise TensorMapError(
            f"{who}: the array's elements are big-endian ({spelled!r}); GPUs and TMA read little-endian bytes, "
            f"so numbatma refuses them rather than read garbage. Convert the data to the native byte order first "
            f"(e.g. host.astype(host.dtype.newbyteorder('<')) before the copy to the GPU)."
        )


_LITTLE = np.little_endian


def is_readonly(array):
    """Whether ``array``'s exporter says its memory must not be written: the read-only flag of its CUDA Array
    Interface (``data[1]``), of its DLPack export (DLPack 1.0's read-only flag, through cuda.core), a NumPy array's
    ``flags.writeable`` under the simulator; an :class:`ArrayLayout`'s ``readonly``; a :class:`DeviceView` is
    read-only when its layout or its owner is. numba device arrays and torch tensors are always writable (their
    interfaces say so). Raises :class:`TensorMapError` for what is not an array (as :func:`array_layout`). Decided
    per array class where the class alone answers (numba, torch: no interface is built)."""
    read = _READONLY.get(type(array))
    if read is None:
        read = _READONLY[type(array)] = _readonly_reader(type(array))
    return read(array)


_READONLY = {}  # array class -> its read-only reader


def _never(array):
    return False


def _readonly_reader(cls):
    import sys

    if issubclass(cls, ArrayLayout):
        return lambda layout: layout.readonly
    if issubclass(cls, DeviceView):
        return lambda view: view.readonly
    if SIMULATING:
        return _general_readonly
    if cls.__name__ == "DeviceNDArray" and cls.__module__ == "numba.cuda.cudadrv.devicearray":
        return _never  # (numba's interface: always (ptr, False))
    torch = sys.modules.get("torch")
    if torch is not None and cls is getattr(torch, "Tensor", None):
        return _never  # (torch's interface: always (ptr, False); its tensors are writable)
    return _general_readonly


def _general_readonly(array):
    if SIMULATING:
        host = simulator_memory(array)
        if host is not None:
            return not host.flags.writeable
    try:
        cai = array.__cuda_array_interface__
    except Exception:  # noqa: BLE001 - (no interface, or one the exporter refuses: DLPack below)
        cai = None
    if cai is not None:
        return _cai_facts(cai, array)[4]
    if hasattr(array, "__dlpack__"):
        from cuda.core.utils import StridedMemoryView

        try:
            view = StridedMemoryView.from_any_interface(array, stream_ptr=-1)
        except Exception:  # noqa: BLE001 - (the intake says what is wrong with it)
            layout_facts(array)
            raise
        if not view.is_device_accessible:
            layout_facts(array)  # (raises the intake's error: host memory is no CUDA array)
        return bool(getattr(view, "readonly", False))
    layout_facts(array)  # (raises the intake's error for what is not an array)
    return False


_READERS = {}  # array class -> its reader of (ptr, record) (decided on first sight: _reader_for)
# torch dtype name -> the typestr torch's __cuda_array_interface__ gives it (torch/_tensor.py; bfloat16 as
# ml_dtypes spells it). Dtypes not listed (complex, float8, ...) take the general path.
_TORCH_TYPESTRS = {
    "float16": "<f2", "float32": "<f4", "float64": "<f8", "bfloat16": "<V2", "uint8": "|u1", "int8": "|i1",
    "uint16": "<u2", "int16": "<i2", "uint32": "<u4", "int32": "<i4", "uint64": "<u8", "int64": "<i8",
    "bool": "|b1",
}


def _reader_for(cls):
    """The reader of arrays of class ``cls`` for :func:`layout_record`: the fast one of a CUDA torch tensor or a numba
    device array (see :func:`layout_facts`) or the general one. (torch is never imported here: a torch tensor means
    torch is loaded.)"""
    import sys

    if SIMULATING:
        return _general_record
    if cls.__name__ == "DeviceNDArray" and cls.__module__ == "numba.cuda.cudadrv.devicearray":
        return _numba_record
    torch = sys.modules.get("torch")
    if (torch is None or cls is not getattr(torch, "Tensor", None)
            or not all(hasattr(cls, m) for m in ("data_ptr", "stride"))):
        return _general_record
    dtypes = {}
    for name, typestr in _TORCH_TYPESTRS.items():
        torch_dtype = getattr(torch, name, None)
        dtype = _dtype_from_typestr(typestr) if torch_dtype is not None else None
        if dtype is not None and (dtype.kind != "V" or dtype.name == "bfloat16"):  # (else: no ml_dtypes)
            dtypes[torch_dtype] = dtype
    strided = getattr(torch, "strided", None)
    known = {}  # (shape, element strides, torch dtype) -> its record

    def read(t):
        if t.requires_grad or not t.is_cuda or t.layout is not strided:
            return _general_record(t)  # (which raises what torch's interfaces raise)
        key = (t.shape, t.stride(), t.dtype)
        record = known.get(key)
        if record is None:
            dtype = dtypes.get(t.dtype)
            shape = tuple(t.shape)
            if dtype is None or 0 in shape:  # (empty: the interface's ptr 0 and strides; rare)
                return _general_record(t)
            item = dtype.itemsize
            strides = _unit_dims_strides(shape, tuple(s * item for s in t.stride()), item)
            if len(known) >= 4096:
                known.clear()
            record = known[key] = _record(shape, strides, dtype)
        return t.data_ptr(), record

    return read


def _numba_record(a):
    """:func:`layout_record` of a numba ``DeviceNDArray`` (of numbers or bfloat16, not empty) from its attributes:
    what its CUDA Array Interface says (the record remembered per shape, strides and dtype)."""
    dtype, shape, strides = a.dtype, a.shape, a.strides
    record = _NUMBA_KNOWN.get((shape, strides, dtype))
    if record is None:
        plain = (dtype.kind in "biuf" and dtype.isnative) or dtype.name == "bfloat16"  # (what the interface's
        # typestr reads back as it; big-endian: the general path, which refuses it)
        if not plain or 0 in shape:
            return _general_record(a)
        if len(_NUMBA_KNOWN) >= 4096:
            _NUMBA_KNOWN.clear()
        fixed = _unit_dims_strides(shape, strides, dtype.itemsize) if 1 in shape else strides
        record = _NUMBA_KNOWN[(shape, strides, dtype)] = _record(shape, fixed, dtype)
    return a.device_ctypes_pointer.value or 0, record


_NUMBA_KNOWN = {}  # (shape, strides, dtype) -> record
