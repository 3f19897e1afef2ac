"""What every host TMA descriptor shares: :class:`TMADescriptor`, the base of :class:`numbatma.TensorMap` (tiled
mode, ``tensormap.py``) and, through it, of :class:`numbatma.Im2colTensorMap` (im2col mode, ``im2col.py``).

Here, once:

* the array intake: :func:`array_layout` reads pointer, shape, byte strides and dtype from any CUDA array
  (CUDA Array Interface, DLPack, the simulator's arrays; torch tensors through their methods), into an
  :class:`ArrayLayout` (:func:`layout_facts`: the same as a plain tuple). The interface's fields are checked
  (:func:`_cai_facts`: a missing or ill-typed field, strides of the wrong length or not whole elements, a mask),
  big-endian elements refused (:func:`check_byte_order`), and whether the exporter marked the memory read-only is
  recorded (:func:`is_readonly`, ``ArrayLayout.readonly``: the plans refuse such an output);
* the element mapping: NumPy dtype -> driver data type (``_TMA_DTYPE``; float8 travels as its bytes), and the
  element type kernels see (:func:`numba_dtype`);
* the options every mode takes (``swizzle``, ``oob_fill``, ``l2_promotion``, ``interleave``: :func:`coerce_enum`;
  ``tf32``: :func:`flag_option`, True or False only) and the
  layout rules of every ``cuTensorMapEncode*`` (data type, address and stride alignment, extents, fill):
  :func:`validate_layout` and :func:`validate_oob_fill`, whose messages start with the descriptor's class name;
* the encoding, one path per product: the by-value 128-byte ``TensorMapDescriptor`` through cuda.core
  (:attr:`TMADescriptor.descriptor`) and the raw 128 bytes through ``cuTensorMapEncode<Mode>``
  (:meth:`TMADescriptor.to_bytes`). A mode supplies only its own arguments (:meth:`TMADescriptor._mode_args`,
  :meth:`TMADescriptor._core_descriptor`);
* re-pointing (``cuTensorMapReplaceAddress``), the facts of the shared tile, the simulator's view of memory.

Everything speaks the array's own index order (NumPy/row-major: the last axis is the innermost, contiguous one).
The driver wants the reverse; that reversal happens in one place, :meth:`TMADescriptor._driver_args`.

The public names defined here (:class:`TensorMapError`, the option enums, :class:`ArrayLayout`,
:class:`DeviceView`, :func:`array_layout`, :func:`is_readonly`, ``SUPPORTED_DTYPES``) are exported by :mod:`numbatma.tensormap`,
which is where users import them from. Imports nothing of numbatma but the leaves ``_env``, ``_shapes`` and
``devices`` (where each descriptor's device comes from: :func:`numbatma.array_device` of its array; it is recorded
on every encoding path and checked at launch).
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

import numpy as np

from ._env import SIMULATING
from ._shapes import tile_footprint
from .devices import array_device, enter_device, leave_device, pointer_device, register_reader

_PUBLIC_MODULE = "numbatma.tensormap"


class TensorMapError(ValueError):
    """A TMA descriptor was asked for with arguments the hardware cannot describe."""

    __module__ = _PUBLIC_MODULE


class Swizzle(enum.IntEnum):
    """Shared-memory swizzle pattern; the value is the swizzle span in bytes."""

    __module__ = _PUBLIC_MODULE
    NONE = 0
    B32 = 32
    B64 = 64
    B128 = 128


class OOBFill(enum.Enum):
    """What a load writes for elements outside the array: zeros, or NaN (floating-point types only)."""

    __module__ = _PUBLIC_MODULE
    ZERO = "zero"
    NAN = "nan"


class L2Promotion(enum.IntEnum):
    """L2 sector promotion of the loads; the value is the promotion size in bytes."""

    __module__ = _PUBLIC_MODULE
    NONE = 0
    B64 = 64
    B128 = 128
    B256 = 256


class Interleave(enum.IntEnum):
    """Interleaved (NC/xHWx style) layouts; the value is the interleave width in bytes."""

    __module__ = _PUBLIC_MODULE
    NONE = 0
    B16 = 16
    B32 = 32


# -- elements ---------------------------------------------------------------------------------------------------
# numpy dtype name -> driver CUtensorMapDataType suffix. TMA moves bits: signed 8/16-bit integers travel
# as UINT8/UINT16 (identical bytes; OOB fill zero is the same). tf32=True turns float32 into TFLOAT32.
_TMA_DTYPE = {
    "uint8": "UINT8",
    "int8": "UINT8",
    "bool": "UINT8",
    "uint16": "UINT16",
    "int16": "UINT16",
    "uint32": "UINT32",
    "int32": "INT32",
    "uint64": "UINT64",
    "int64": "INT64",
    "float16": "FLOAT16",
    "bfloat16": "BFLOAT16",
    "float32": "FLOAT32",
    "float64": "FLOAT64",
}
SUPPORTED_DTYPES = tuple(_TMA_DTYPE)
# float8 data: TMA moves the bytes (UINT8); ``element`` (in the Numba type) tells wgmma how to read them.
FP8_ELEMENTS = ("e4m3", "e5m2")
_FP8_DTYPES = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}  # ml_dtypes names (torch.float8_e4m3fn, ...)
_FP8_NAMES = {v: k for k, v in _FP8_DTYPES.items()}
_FLOAT_TMA_DTYPES = {"FLOAT16", "BFLOAT16", "FLOAT32", "FLOAT64", "TFLOAT32", "FLOAT32_FTZ", "TFLOAT32_FTZ"}

# -- driver limits shared by every mode ------------------------------------------------------------------------------
MAX_RANK = 5
MAX_ELEMENT_STRIDE = 8
# The driver encodes extents up to 2**32 (cuTensorMapEncode*: globalDim in 1..2**32), but the coordinates of a TMA
# load or store are signed 32-bit (PTX: tensorCoords .s32), so no box can start at an index from 2**31 on: an axis of
# more than 2**31 elements cannot be reached whole. numbatma's rule: every extent in 1..2**31.
_MAX_DIM = 1 << 31
_MAX_STRIDE = 1 << 40


def shape_str(shape):
    """``(4,)`` / ``(4, 8)``: a shape as Python writes a tuple (the messages' spelling)."""
    return "(" + ", ".join(str(s) for s in shape) + (",)" if len(shape) == 1 else ")")


def numba_dtype(dtype):
    """The Numba element type kernels see for a descriptor of ``dtype`` data (bfloat16 and float8: their bits)."""
    from numba.cuda import types

    if dtype.name == "bfloat16":
        # Shared tiles of bfloat16 data are declared with a 16-bit integer dtype in Numba kernels.
        return types.uint16
    if dtype.name == "bool" or dtype.itemsize == 1 and dtype.kind in "Vf":  # (float8: its bits)
        return types.uint8
    return getattr(types, dtype.name)


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


# -- arguments ---------------------------------------------------------------------------------------------------
def int_tuple(who, name, value, count, what, unit="dimension"):
    """``value`` (an int, or a sequence of ``count`` ints; bools refused) as a tuple of ints. ``what`` says why
    ``count`` entries, e.g. ``"the float32 array with shape (4, 8) has 2 dimensions"`` (or a function that makes
    it: the message is needed only on an error); ``unit`` is what one entry stands for."""
    given = value
    if isinstance(value, (bool, np.bool_, str, bytes)):  # (True is an int to Python: box=True is not a box of 1;
        # a string is a sequence of characters, not of extents)
        raise TensorMapError(f"{who}: {name} must be a tuple of integers, got {value!r}.")
    if isinstance(value, (int, np.integer)):
        value = (int(value),)
    try:
        value = tuple(value)
    except TypeError:
        raise TensorMapError(f"{who}: {name} must be a tuple of integers, got {value!r}.") from None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in value):
        raise TensorMapError(f"{who}: {name} must be a tuple of integers, got {given!r}.")
    if len(value) != count:
        raise TensorMapError(
            f"{who}: {name} {shape_str(value)} has {len(value)} entries but {what() if callable(what) else what}; "
            f"give one entry per {unit}, in "
            f"the array's own index order."
        )
    return tuple(int(v) for v in value)


def flag_option(who, name, value):
    """A boolean option: ``True`` / ``False`` (or NumPy's ``bool_``) as a bool; anything else (``"no"``, ``1``,
    ``None``) is a :class:`TensorMapError` naming the option and the value (a truthy string is not True)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TensorMapError(f"{who}: {name} must be True or False, got {value!r} (a {type(value).__name__}).")


def coerce_enum(enum_cls, value, what, who="TensorMap"):
    """``value`` as a member of ``enum_cls``: the member, its name or value (``"128B"``, ``"B128"``, ``128``; an int,
    not a bool or a float)."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, (bool, np.bool_, float, np.floating)):
        pass  # (False == 0 and 128.0 == 128 to Python: not spellings of an option)
    elif isinstance(value, str):
        key = value.strip().upper()
        aliases = {"NONE": "NONE", "0": "NONE"}
        for member in enum_cls:
            names = {member.name, str(member.value).upper(), f"{member.value}B".upper(), f"B{member.value}"}
            if key in names or aliases.get(key) == member.name:
                return member
    elif isinstance(value, (int, np.integer)):
        try:
            return enum_cls(int(value))
        except ValueError:
            pass
    choices = ", ".join(f"{enum_cls.__name__}.{m.name}" for m in enum_cls)
    raise TensorMapError(f"{who}: {what} {value!r} is not one of {choices}.")


# -- the layout rules of every cuTensorMapEncode* ------------------------------------------------------------------
def check_address(who, layout, interleave):
    align = 32 if interleave == Interleave.B32 else 16
    if layout.ptr % align:
        raise TensorMapError(
            f"{who}: the {layout.name} starts at address 0x{layout.ptr:x}, which is not {align}-byte "
            f"aligned; TMA needs the global address to be a multiple of {align} bytes. A slice that starts "
            f"mid-row often causes this: describe the whole array and move the box coordinates instead."
        )


def validate_layout(who, layout, *, interleave, tf32, element=None):
    """The rules every mode shares, in order: rank, data type (``tf32``, float8 ``element``), interleave rank,
    address alignment, extents, innermost stride, the other strides. Returns the driver data type name."""
    rank = len(layout.shape)
    dtype = layout.dtype
    dname = _dtype_name(dtype)
    if not 1 <= rank <= MAX_RANK:
        raise TensorMapError(f"{who}: the {layout.name} has rank {rank}; TMA descriptors describe rank 1 to 5.")
    if not dtype.isnative:
        check_byte_order(dtype, who=who)
    tma_dtype = _TMA_DTYPE.get(dname)
    if tma_dtype is None and (element is not None or dname in _FP8_DTYPES):
        tma_dtype = "UINT8"  # float8 bytes (the Hopper TMA has no float8 type: it moves bits)
    if tma_dtype is None:
        raise TensorMapError(
            f"{who}: dtype {dname} of the {layout.name} has no TMA data type. Supported dtypes: "
            f"{', '.join(SUPPORTED_DTYPES)}."
        )
    if tf32:
        if dname != "float32":
            raise TensorMapError(f"{who}: tf32=True needs a float32 array; the array is {dname}.")
        tma_dtype = "TFLOAT32"
    itemsize = dtype.itemsize
    if interleave != Interleave.NONE and rank < 3:
        raise TensorMapError(
            f"{who}: interleave={interleave.name} needs an array of rank 3 to 5; the {layout.name} has rank {rank}."
        )
    check_address(who, layout, interleave)
    for axis, d in enumerate(layout.shape):
        if not 1 <= d <= _MAX_DIM:
            raise TensorMapError(
                f"{who}: dimension {axis} of the {layout.name} is {d}; TMA needs every dimension in 1..2**31 "
                f"(its coordinates are signed 32-bit: elements from index 2**31 on cannot be addressed). "
                f"Split the array along that axis into parts of at most 2**31 elements."
            )
    if layout.strides[-1] != itemsize:
        raise TensorMapError(
            f"{who}: the innermost (last) dimension of the {layout.name} has a stride of {layout.strides[-1]} "
            f"bytes; TMA needs it contiguous ({itemsize} bytes, one {dname}). Make the array contiguous "
            f"(e.g. .copy()) or transpose it so the contiguous axis is last."
        )
    stride_align = 32 if interleave == Interleave.B32 else 16
    axis_names = {rank - 2: "row stride"} if rank >= 2 else {}
    for axis in range(rank - 1):
        st = layout.strides[axis]
        what = axis_names.get(axis, f"stride of dimension {axis}")
        if st <= 0:
            raise TensorMapError(
                f"{who}: {what} of the {layout.name} is {st} bytes; TMA needs positive strides."
            )
        if st % stride_align:
            hint = ""
            if axis == rank - 2:
                pad_elems = -(-st // stride_align) * stride_align // itemsize
                hint = f" Pad the rows to {pad_elems} elements." if pad_elems * itemsize % stride_align == 0 else ""
            raise TensorMapError(
                f"{who}: {what} of the {layout.name} is {st} bytes; TMA needs every stride except the innermost "
                f"to be a multiple of {stride_align} bytes.{hint}"
            )
        if st >= _MAX_STRIDE:
            raise TensorMapError(
                f"{who}: {what} of the {layout.name} is {st} bytes; TMA needs strides below 2**40 bytes."
            )
    return tma_dtype


_DTYPE_NAMES = {}


def _dtype_name(dtype):
    """``dtype.name``, remembered per dtype (NumPy builds the string on every access: microseconds)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def validate_oob_fill(who, layout, oob_fill, tma_dtype):
    if oob_fill == OOBFill.NAN and tma_dtype not in _FLOAT_TMA_DTYPES:
        raise TensorMapError(
            f"{who}: oob_fill=NAN needs a floating-point dtype; the {layout.name} holds {layout.dtype.name}. "
            f"Use oob_fill=ZERO."
        )


# -- encoding: the driver's and cuda.core's spellings of the options ---------------------------------------------
_DRV_SWIZZLE = {
    Swizzle.NONE: "CU_TENSOR_MAP_SWIZZLE_NONE",
    Swizzle.B32: "CU_TENSOR_MAP_SWIZZLE_32B",
    Swizzle.B64: "CU_TENSOR_MAP_SWIZZLE_64B",
    Swizzle.B128: "CU_TENSOR_MAP_SWIZZLE_128B",
}
_DRV_INTERLEAVE = {
    Interleave.NONE: "CU_TENSOR_MAP_INTERLEAVE_NONE",
    Interleave.B16: "CU_TENSOR_MAP_INTERLEAVE_16B",
    Interleave.B32: "CU_TENSOR_MAP_INTERLEAVE_32B",
}
_DRV_L2 = {
    L2Promotion.NONE: "CU_TENSOR_MAP_L2_PROMOTION_NONE",
    L2Promotion.B64: "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
    L2Promotion.B128: "CU_TENSOR_MAP_L2_PROMOTION_L2_128B",
    L2Promotion.B256: "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
}
_DRV_OOB = {
    OOBFill.ZERO: "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
    OOBFill.NAN: "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA",
}
_CORE_SWIZZLE = {
    Swizzle.NONE: lambda e: e.NONE,
    Swizzle.B32: lambda e: e.SWIZZLE_32B,
    Swizzle.B64: lambda e: e.SWIZZLE_64B,
    Swizzle.B128: lambda e: e.SWIZZLE_128B,
}
_CORE_INTERLEAVE = {
    Interleave.NONE: lambda e: e.NONE,
    Interleave.B16: lambda e: e.INTERLEAVE_16B,
    Interleave.B32: lambda e: e.INTERLEAVE_32B,
}
_CORE_L2 = {
    L2Promotion.NONE: lambda e: e.NONE,
    L2Promotion.B64: lambda e: e.L2_64B,
    L2Promotion.B128: lambda e: e.L2_128B,
    L2Promotion.B256: lambda e: e.L2_256B,
}
_CORE_OOB = {
    OOBFill.ZERO: lambda e: e.NONE,
    OOBFill.NAN: lambda e: e.NAN_REQUEST_ZERO_FMA,
}


def check_driver(err, what):
    """Raise :class:`TensorMapError` unless the driver call ``what`` returned CUDA_SUCCESS."""
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise TensorMapError(f"{what} failed: {err.name}: {msg.decode() if msg else ''}")


class TMADescriptor:
    """A TMA descriptor (``CUtensorMap``) of a CUDA array: what every mode shares.

    A mode's ``__init__`` reads the array (:func:`array_layout`), calls :meth:`_take_options` and
    :meth:`_attach`, checks its own arguments and the shared layout rules (:func:`validate_layout`,
    :func:`validate_oob_fill`) and sets ``tma_dtype``, ``box`` (the shared tile of one load) and
    ``element_strides``. It defines:

    * ``_WHO``: the class name its messages start with; ``_MODE``: the driver's mode (``cuTensorMapEncode<_MODE>``);
    * :meth:`_mode_args`: its arguments of ``cuTensorMapEncode<_MODE>`` between the strides and the element
      strides (driver order), and :meth:`_encode_mode_args`, those values as the binding takes them;
    * :meth:`_core_descriptor`: the cuda.core call that encodes the by-value descriptor;
    * ``_tile_steps``: the traversal steps of the shared tile (for ``shared_shape`` / ``box_bytes``);
    * ``numba_type``, ``store_overhang`` and ``__repr__``.
    """

    _WHO: str  # e.g. "TensorMap"
    _MODE: str  # e.g. "Tiled"
    _core_stale = False  # (see _attach)

    def _take_options(self, swizzle, oob_fill, l2_promotion, interleave, tf32):
        self.swizzle = coerce_enum(Swizzle, swizzle, "swizzle", self._WHO)
        self.oob_fill = coerce_enum(OOBFill, oob_fill, "oob_fill", self._WHO)
        self.l2_promotion = coerce_enum(L2Promotion, l2_promotion, "l2_promotion", self._WHO)
        self.interleave = coerce_enum(Interleave, interleave, "interleave", self._WHO)
        self.tf32 = flag_option(self._WHO, "tf32", tf32)

    def _attach(self, layout, array):
        """Describe ``array`` (read as ``layout``); nothing is encoded until a launch or :meth:`to_bytes`."""
        self.shape = layout.shape
        self.strides = layout.strides
        self.dtype = layout.dtype
        self._layout = layout  # (sets _ptr: see the property)
        self._array = array
        self._numba_type = None
        self._descriptor = None  # cuda.core TensorMapDescriptor, encoded on first launch through numba
        self._core_stale = False  # (re-pointed since _descriptor was encoded: its address is replaced on next use)
        self._device_id = None  # the device of the array (array_device), recorded when encoded (checked at launch)
        self._raw = None  # the driver's CUtensorMap (cuTensorMapEncode<_MODE>), encoded on first request

    # -- facts -------------------------------------------------------------------------------------
    @property
    def _layout(self):
        """The :class:`ArrayLayout` described now (after a re-point by :meth:`_moved`: made on first use)."""
        lay = self._layout_now
        if lay is None:
            base = self._layout_base
            lay = self._layout_now = base._shifted(self._ptr - base.ptr)
        return lay

    @_layout.setter
    def _layout(self, layout):
        self._layout_base = self._layout_now = layout
        self._ptr = layout.ptr

    @property
    def rank(self):
        return len(self.shape)

    @property
    def itemsize(self):
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def array(self):
        """The array the descriptor currently points at."""
        return self._array

    @property
    def _tile_steps(self):
        return self.element_strides

    @property
    def shared_shape(self):
        """Shape of the shared-memory tile one load fills: ``ceil(box / element_strides)`` per axis (im2col:
        ``(pixels_per_column, channels_per_pixel)``), except that with a swizzle wider than the tile's rows each
        row takes a whole swizzle span (see :func:`numbatma.tensormap.tile_footprint`)."""
        return tile_footprint(self.box, self._tile_steps, self.dtype.itemsize, int(self.swizzle))[0]

    @property
    def box_bytes(self):
        """Bytes one load delivers to shared memory (its mbarrier transaction count)."""
        return tile_footprint(self.box, self._tile_steps, self.dtype.itemsize, int(self.swizzle))[1]

    @property
    def shared_alignment(self):
        """Alignment (bytes) the shared tile needs: the swizzle's repeat (8 rows of its span: 256, 512 or
        1024 bytes), so the pattern starts with the tile; 128 without swizzle."""
        return 8 * int(self.swizzle) if int(self.swizzle) else 128

    # -- re-pointing -------------------------------------------------------------------------------
    def repoint(self, array):
        """Point this descriptor at another array of exactly the same shape, strides and dtype, without
        re-encoding it (``cuTensorMapReplaceAddress`` on the driver's encoded ``CUtensorMap``, which prepared launches
        pass: they see the new address at their next run; the cuda.core descriptor numba's own launches take gets it
        when it is next used)."""
        layout = array_layout(array)
        if (layout.shape, layout.strides, layout.dtype) != (self.shape, self.strides, self.dtype):
            raise TensorMapError(
                f"{self._WHO}.repoint: the new array must have the layout the descriptor was built for: "
                f"{self._layout.name} with byte strides {self.strides}; got {layout.name} with byte strides "
                f"{layout.strides}. Build a new {self._WHO} for a different layout."
            )
        check_address(self._WHO, layout, self.interleave)
        device = self._device_id
        if device is not None:
            new = array_device(array)
            if new is not None and new != device:
                raise TensorMapError(
                    f"{self._WHO}.repoint: the new array is on device {new} but this {self._WHO} describes memory of "
                    f"device {device} (and launches there); a descriptor stays with its device. Build a new "
                    f"{self._WHO} for the array on device {new}."
                )
        self._moved(array, layout.ptr)
        self._layout = layout
        return self

    def _moved(self, array, ptr):
        """:meth:`repoint` to ``array`` at address ``ptr`` (the caller has checked that the array has this
        descriptor's shape, strides and dtype; the address is checked here). The layout object is made when first
        asked for."""
        if ptr & 15 or self.interleave is Interleave.B32:
            lay = self._layout
            check_address(self._WHO, lay._shifted(ptr - lay.ptr), self.interleave)
        if self._raw is not None:
            replace = _replace_address
            if replace is None:
                replace = _address_replacer()
            err = replace(self._raw, ptr)[0]
            if err:
                check_driver(err, "cuTensorMapReplaceAddress")
        if self._descriptor is not None:
            self._core_stale = True
        self._ptr = ptr
        self._layout_now = None
        self._array = array
        return self

    # -- encoding ----------------------------------------------------------------------------------
    def _mode_args(self):
        """The mode's arguments of ``cuTensorMapEncode<_MODE>`` (a dict in driver order, innermost first)."""
        raise NotImplementedError

    def _encode_mode_args(self, driver, args):
        """The values of :meth:`_mode_args` (in ``args``) as the ``cuda.bindings`` call takes them."""
        raise NotImplementedError

    def _core_descriptor(self, view, **options):
        """Encode through cuda.core: the mode's factory called with ``view`` (a ``StridedMemoryView``), the
        mode's own arguments and ``options`` (element strides, data type, interleave, swizzle, L2, fill)."""
        raise NotImplementedError

    def _driver_args(self):
        """Arguments of ``cuTensorMapEncode<_MODE>``, innermost dimension first."""
        rev = lambda t: tuple(reversed(t))  # noqa: E731
        args = dict(
            rank=self.rank,
            address=self._layout.ptr,
            dims=rev(self.shape),
            strides=rev(self.strides)[1:],
        )
        args.update(self._mode_args())
        args["element_strides"] = rev(self.element_strides)
        return args

    @property
    def descriptor(self):
        """The ``cuda.core.TensorMapDescriptor`` numba's own launches pass by value (hook 2; encoded on first use
        through cuda.core, which calls ``cuTensorMapEncode<mode>``; cuda.core's launcher accepts only that type by
        value). Prepared launches pass :meth:`driver_tensor_map` instead."""
        if self._core_stale:  # (re-pointed since encoded: cuda.core replaces the address now, in its device's context)
            context = enter_device(self._device_id)
            try:
                self._descriptor.replace_address(_LayoutArray(self._layout))
            finally:
                leave_device(context)
            self._core_stale = False
        if self._descriptor is None:
            from cuda.core._tensor_map import (
                TensorMapDataType,
                TensorMapInterleave,
                TensorMapL2Promotion,
                TensorMapOOBFill,
                TensorMapSwizzle,
            )
            from cuda.core.utils import StridedMemoryView

            # cuda.core encodes for the current device only (it refuses an array of another device, and binds the
            # descriptor to the context current then): encode with the array's device current.
            device = array_device(self._array)
            context = enter_device(device)
            try:
                # With extent-1 dimensions, encode the strides numbatma validated (see array_layout).
                source = _LayoutArray(self._layout) if 1 in self.shape else self._array
                view = StridedMemoryView.from_any_interface(source, stream_ptr=-1)
                self._descriptor = self._core_descriptor(
                    view,
                    element_strides=self.element_strides,
                    data_type=getattr(TensorMapDataType, self.tma_dtype),
                    interleave=_CORE_INTERLEAVE[self.interleave](TensorMapInterleave),
                    swizzle=_CORE_SWIZZLE[self.swizzle](TensorMapSwizzle),
                    l2_promotion=_CORE_L2[self.l2_promotion](TensorMapL2Promotion),
                    oob_fill=_CORE_OOB[self.oob_fill](TensorMapOOBFill),
                )
            finally:
                leave_device(context)
            self._device_id = device if device is not None else getattr(view, "device_id", None)  # (checked at launch)
        return self._descriptor

    def driver_tensor_map(self):
        """The driver's ``CUtensorMap`` (cuda.bindings) of this descriptor, encoded with ``cuTensorMapEncodeTiled`` /
        ``cuTensorMapEncodeIm2col`` on first use and kept: :meth:`repoint` re-points it in place. What prepared
        launches pass by value (its 128 bytes, read at each launch) and :meth:`to_bytes` returns. Needs the CUDA
        driver. Records the array's device (``_device_id``, checked at launch). ``cuTensorMapEncode*`` takes no device
        or context (the 128 bytes hold the address and the layout; the same bytes serve any device that can reach
        the memory) but may answer CUDA_ERROR_INVALID_CONTEXT without one: it is called with the array's device
        current."""
        if self._raw is None:
            from cuda.bindings import driver

            device = array_device(self._array)
            context = enter_device(device)
            try:
                self._raw = self._encode_driver(driver)
            finally:
                leave_device(context)
            if device is not None:
                self._device_id = device
        return self._raw

    def _encode_driver(self, driver):
        """``cuTensorMapEncode<_MODE>`` of this descriptor: the driver's ``CUtensorMap``."""
        a = self._driver_args()
        encode = "cuTensorMapEncode" + self._MODE
        # Rank 1 has no global strides, but the driver refuses a NULL array (which is what an empty list
        # becomes: CUDA_ERROR_INVALID_VALUE, seen on an H100): pass one it does not read (the row's bytes
        # rounded up to 16, a valid stride if it were read).
        strides = a["strides"] or (-(-self.shape[0] * self.dtype.itemsize // 16) * 16,)
        err, tmap = getattr(driver, encode)(
            getattr(driver.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + self.tma_dtype),
            a["rank"],
            a["address"],
            [driver.cuuint64_t(d) for d in a["dims"]],
            [driver.cuuint64_t(s) for s in strides],
            *self._encode_mode_args(driver, a),
            [driver.cuuint32_t(e) for e in a["element_strides"]],
            getattr(driver.CUtensorMapInterleave, _DRV_INTERLEAVE[self.interleave]),
            getattr(driver.CUtensorMapSwizzle, _DRV_SWIZZLE[self.swizzle]),
            getattr(driver.CUtensorMapL2promotion, _DRV_L2[self.l2_promotion]),
            getattr(driver.CUtensorMapFloatOOBfill, _DRV_OOB[self.oob_fill]),
        )
        check_driver(err, encode)
        return tmap

    def to_bytes(self) -> bytes:
        """The 128-byte ``CUtensorMap`` (encoded with ``cuTensorMapEncodeTiled`` / ``cuTensorMapEncodeIm2col``),
        e.g. to store it in global memory (a :class:`numbatma.TensorMapArray`). Needs the CUDA driver."""
        return b"".join(int(w).to_bytes(8, "little") for w in self.driver_tensor_map().opaque)


_replace_address = None  # (cuda.bindings' cuTensorMapReplaceAddress, looked up on first use)


def _address_replacer():
    global _replace_address
    from cuda.bindings import driver

    _replace_address = driver.cuTensorMapReplaceAddress
    return _replace_address


# -- the device of numbatma's own array-like objects (numbatma.array_device) -----------------------------------------
def _view_device(view):
    owner = view.owner
    if owner is not None:
        device = array_device(owner)
        if device is not None:
            return device
    return pointer_device(view._ptr)


def _descriptor_device(descriptor):
    device = descriptor._device_id
    return device if device is not None else array_device(descriptor._array)


register_reader(DeviceView, _view_device)
register_reader(ArrayLayout, lambda layout: pointer_device(layout.ptr))
register_reader(TMADescriptor, _descriptor_device)
