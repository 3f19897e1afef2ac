"""Host side: TMA descriptors for tiled views of CUDA arrays.

Everything here speaks the array's own index order (NumPy/row-major: the last axis is the innermost,
contiguous one). The driver wants the reverse (innermost first); that reversal happens in one place,
:meth:`TensorMap._driver_args`.

Validation runs in Python before any driver call, so every rule is reported in the user's terms, and
it needs no GPU: a descriptor can be built (and kernels compiled against it) on a machine without a
driver. Encoding happens lazily, the first time the descriptor is launched or its bytes are asked for.
"""
from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass

import numpy as np

from ._shapes import tile_footprint  # noqa: F401  (re-exported: numbatma.tensormap.tile_footprint)

__all__ = [
    "TensorMap",
    "TensorMapArray",
    "TensorMapError",
    "Swizzle",
    "OOBFill",
    "L2Promotion",
    "Interleave",
    "SUPPORTED_DTYPES",
    "aligned_columns",
    "kernel_view",
    "layout_view",
    "DeviceView",
]


class TensorMapError(ValueError):
    """A TMA descriptor was asked for with arguments the hardware cannot describe."""


class Swizzle(enum.IntEnum):
    """Shared-memory swizzle pattern; the value is the swizzle span in bytes."""

    NONE = 0
    B32 = 32
    B64 = 64
    B128 = 128


class OOBFill(enum.Enum):
    """What a load writes for elements outside the array: zeros, or NaN (floating-point types only)."""

    ZERO = "zero"
    NAN = "nan"


class L2Promotion(enum.IntEnum):
    """L2 sector promotion of the loads; the value is the promotion size in bytes."""

    NONE = 0
    B64 = 64
    B128 = 128
    B256 = 256


class Interleave(enum.IntEnum):
    """Interleaved (NC/xHWx style) layouts; the value is the interleave width in bytes."""

    NONE = 0
    B16 = 16
    B32 = 32


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

_MAX_RANK = 5
_MAX_BOX = 256
_MAX_ELEMENT_STRIDE = 8
_MAX_DIM = 1 << 32
_MAX_STRIDE = 1 << 40


def _shape_str(shape):
    return "(" + ", ".join(str(s) for s in shape) + (",)" if len(shape) == 1 else ")")


@dataclass(frozen=True)
class ArrayLayout:
    """What numbatma needs to know about a CUDA array: where it is and how it is laid out."""

    ptr: int
    shape: tuple
    strides: tuple  # bytes, row-major order like shape
    dtype: np.dtype

    @property
    def name(self):
        return f"{self.dtype.name} array with shape {_shape_str(self.shape)}"

    def columns(self, start, stop):
        """The layout of ``array[..., start:stop]`` (a range of the innermost axis)."""
        start, stop = max(0, int(start)), min(int(stop), self.shape[-1])
        return ArrayLayout(self.ptr + start * self.strides[-1], self.shape[:-1] + (max(0, stop - start),),
                           self.strides, self.dtype)


def _describe_descr(descr):
    return "fields " + ", ".join(f"{f[0]!r}: {f[1]}" for f in descr if f)


def _dtype_from_typestr(typestr, descr=None):
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


_SIMULATING = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _simulator_memory(array):
    """Under the CUDA simulator, device arrays are NumPy arrays in disguise (``_ary``); host NumPy arrays
    are accepted too. Returns the NumPy array, or None for anything else."""
    seen = 0
    while not isinstance(array, np.ndarray) and seen < 4:
        array = getattr(array, "_ary", None)
        seen += 1
    return array if isinstance(array, np.ndarray) else None


class _LayoutArray:
    """A CUDA-array-interface view of an :class:`ArrayLayout` (same pointer, numbatma's strides)."""

    def __init__(self, layout):
        typestr = _bits_dtype(layout.dtype).str  # bfloat16 / float8: the bits (the type is given when encoding)
        self.__cuda_array_interface__ = {
            "shape": layout.shape,
            "strides": layout.strides,
            "typestr": typestr,
            "data": (layout.ptr, False),
            "version": 3,
        }


class DeviceView:
    """A strided view of device memory (the CUDA Array Interface of an :class:`ArrayLayout`) that keeps the
    array owning the memory alive. Pass it to a ``@cuda.jit`` kernel as it is, or call :meth:`device_array`
    once for a numba device array (cheaper to launch with: no conversion per launch)."""

    def __init__(self, layout, owner):
        self.owner = owner
        self.layout = layout
        dtype = _bits_dtype(layout.dtype)
        self.__cuda_array_interface__ = {"shape": tuple(layout.shape), "strides": tuple(layout.strides),
                                         "typestr": dtype.str, "data": (int(layout.ptr), False), "version": 3}
        self._device = None

    def device_array(self):
        """The numba device array over the same memory (made on first call; needs the CUDA driver)."""
        if self._device is None:
            from numba import cuda

            self._device = cuda.from_cuda_array_interface(self.__cuda_array_interface__, owner=self, sync=False)
        return self._device


def _bits_dtype(dtype):
    """bfloat16 / float8 (which numba kernels cannot take) as uint16 / uint8: the same bits."""
    if dtype.name == "bfloat16" or dtype.kind == "V" or dtype.name in _FP8_DTYPES:
        return np.dtype(f"<u{dtype.itemsize}")
    return dtype


def layout_view(layout, owner):
    """A view of the memory ``layout`` describes inside ``owner`` that a :class:`TensorMap` accepts and that
    keeps ``layout``'s dtype (bfloat16 included): a :class:`DeviceView`, or under the CUDA simulator a NumPy
    view of the same memory."""
    if not _SIMULATING:
        return DeviceView(layout, owner)
    return _host_view(layout, owner, layout.dtype)


def _host_view(layout, owner, dtype):
    host = _simulator_memory(owner)
    if host is None:
        raise TensorMapError(f"cannot reach the memory of a {type(owner).__name__} in the simulator")
    base = host
    while isinstance(base.base, np.ndarray):
        base = base.base
    offset = layout.ptr - int(base.__array_interface__["data"][0])
    return np.ndarray(layout.shape, dtype, buffer=base, offset=offset, strides=layout.strides)


def kernel_view(layout, owner):
    """A ``@cuda.jit`` kernel argument viewing the memory ``layout`` describes (an :class:`ArrayLayout`, e.g.
    ``array_layout(x).columns(a, b)``) inside the array ``owner``: a :class:`DeviceView` (no copy, no
    synchronisation, no driver needed until launch), or under the CUDA simulator a simulated device array
    over the same memory. bfloat16 is viewed as uint16 (the same bits; kernels move or convert them)."""
    if not _SIMULATING:
        return DeviceView(layout, owner)
    view = _host_view(layout, owner, _bits_dtype(layout.dtype))
    from ._numba_internals import simulated_device_array

    return simulated_device_array(view)


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


def array_layout(array) -> ArrayLayout:
    """Read pointer, shape, byte strides and dtype from any CUDA array.

    Accepts objects with ``__cuda_array_interface__`` (numba device arrays, CuPy, PyTorch) and objects with
    ``__dlpack__`` (PyTorch bfloat16, JAX, ...). Needs no driver for the CUDA Array Interface.
    """
    if isinstance(array, ArrayLayout):
        return array
    if isinstance(array, DeviceView):
        return array.layout  # (its own dtype: a bfloat16 view stays bfloat16)
    if _SIMULATING:
        host = _simulator_memory(array)
        if host is not None:
            return ArrayLayout(int(host.__array_interface__["data"][0]), tuple(host.shape),
                               _unit_dims_strides(host.shape, tuple(host.strides), host.dtype.itemsize), host.dtype)
    try:
        cai = array.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception:  # e.g. torch refuses the CAI for bfloat16; DLPack below handles it
        cai = None
    if cai is not None:
        shape = tuple(int(s) for s in cai["shape"])
        dtype = _dtype_from_typestr(cai["typestr"], cai.get("descr"))
        if dtype is None:
            raise TensorMapError(f"TensorMap: unsupported element type {cai['typestr']!r}.")
        strides = cai.get("strides")
        if strides is None:
            strides = _c_strides(shape, dtype.itemsize)
        ptr = int(cai["data"][0])
        strides = _unit_dims_strides(shape, tuple(int(s) for s in strides), dtype.itemsize)
        return ArrayLayout(ptr, shape, strides, dtype)
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
        return ArrayLayout(int(view.ptr), shape, _unit_dims_strides(shape, strides, dtype.itemsize), dtype)
    raise TensorMapError(
        f"TensorMap: expected a CUDA array (numba device array, CuPy array, PyTorch tensor: anything with "
        f"__cuda_array_interface__ or __dlpack__), got {type(array).__name__}."
    )


def _c_strides(shape, itemsize):
    strides = []
    acc = itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def _as_tuple(name, value, rank, layout_name):
    if isinstance(value, (bool, np.bool_)):  # (True is an int to Python: box=True is not a box of 1)
        raise TensorMapError(f"TensorMap: {name} must be a tuple of integers, got {value!r}.")
    if isinstance(value, (int, np.integer)):
        value = (int(value),)
    try:
        value = tuple(value)
    except TypeError:
        raise TensorMapError(f"TensorMap: {name} must be a tuple of integers, got {value!r}.") from None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in value):
        raise TensorMapError(f"TensorMap: {name} must be a tuple of integers, got {value!r}.")
    if len(value) != rank:
        raise TensorMapError(
            f"TensorMap: {name} {_shape_str(value)} has {len(value)} entries but the {layout_name} has "
            f"{rank} dimensions; give one entry per dimension, in the array's own index order."
        )
    return tuple(int(v) for v in value)


def _coerce_enum(enum_cls, value, what):
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        key = value.strip().upper()
        aliases = {"NONE": "NONE", "0": "NONE"}
        for member in enum_cls:
            names = {member.name, str(member.value).upper(), f"{member.value}B".upper(), f"B{member.value}"}
            if key in names or aliases.get(key) == member.name:
                return member
    else:
        try:
            return enum_cls(value)
        except ValueError:
            pass
    choices = ", ".join(f"{enum_cls.__name__}.{m.name}" for m in enum_cls)
    raise TensorMapError(f"TensorMap: {what} {value!r} is not one of {choices}.")


class TensorMap:
    """A TMA descriptor (``CUtensorMap``, tiled mode) for boxes of a CUDA array.

    ``TensorMap(array, box)`` describes boxes of shape ``box`` (array index order, e.g. ``(rows, cols)``)
    of ``array``. Pass it to a ``@cuda.jit`` kernel like any argument: it travels **by value** as a
    ``__grid_constant__`` parameter (no allocation, no copy per launch), and its Numba type carries rank,
    dtype, box and swizzle, so ``desc.box_bytes`` / ``desc.shared_shape`` are compile-time constants in the
    kernel.

    Options:
      * ``swizzle``: :class:`Swizzle` (or 0/32/64/128). The innermost box row must fit the swizzle span.
      * ``oob_fill``: :class:`OOBFill` ``ZERO`` (default) or ``NAN`` (floating-point dtypes only).
      * ``l2_promotion``: :class:`L2Promotion`.
      * ``element_strides``: per-axis traversal step in 1..8 (loads every k-th element).
      * ``interleave``: :class:`Interleave` for interleaved layouts (rank >= 3).
      * ``tf32``: encode a float32 array as TFLOAT32 (values rounded to tf32 on load).
      * ``element``: ``"e4m3"`` or ``"e5m2"`` for float8 data held in a 1-byte array (uint8/int8 holding the
        float8 bits, or a float8_e4m3fn / float8_e5m2 array, whose element is then implied). TMA moves the
        bytes (UINT8); the element is part of the kernel type, so ``wgmma_desc`` reads the tile as float8.
      * ``allow_store_overhang``: only for a store/reduce target whose rows are not a whole number of
        16-byte units (:attr:`store_overhang` > 0). A TMA store writes whole 16-byte units, so a box that
        reaches a row's end also writes the bytes up to the next 16-byte boundary, *outside* the array
        (a neighbour's data in a view of a larger array). Kernels refuse to store through such a
        descriptor (a typing error; the simulator reports it too) unless you pass ``True`` here, stating
        that those bytes are yours to overwrite (e.g. the padding of a pitched allocation). The exact
        alternative is what :mod:`numbatma.kernels` do: describe the 16-byte-aligned part of the rows
        (:func:`aligned_columns`) for the stores and write the last few elements with ordinary stores.

    The array must stay alive while kernels use the descriptor (the TensorMap keeps a reference).
    """

    def __init__(
        self,
        array,
        box,
        *,
        swizzle=Swizzle.NONE,
        oob_fill=OOBFill.ZERO,
        l2_promotion=L2Promotion.NONE,
        element_strides=None,
        interleave=Interleave.NONE,
        tf32=False,
        allow_store_overhang=False,
        element=None,
    ):
        layout = array_layout(array)
        self.swizzle = _coerce_enum(Swizzle, swizzle, "swizzle")
        self.oob_fill = _coerce_enum(OOBFill, oob_fill, "oob_fill")
        self.l2_promotion = _coerce_enum(L2Promotion, l2_promotion, "l2_promotion")
        self.interleave = _coerce_enum(Interleave, interleave, "interleave")
        self.tf32 = bool(tf32)
        if not isinstance(allow_store_overhang, (bool, np.bool_)):
            raise TensorMapError(
                f"TensorMap: allow_store_overhang must be True or False, got {allow_store_overhang!r}."
            )
        self.allow_store_overhang = bool(allow_store_overhang)
        self.shape = layout.shape
        self.strides = layout.strides
        self.dtype = layout.dtype
        rank = len(layout.shape)
        if not 1 <= rank <= _MAX_RANK:
            raise TensorMapError(
                f"TensorMap: the {layout.name} has rank {rank}; TMA descriptors describe rank 1 to 5."
            )
        self.box = _as_tuple("box", box, rank, layout.name)
        self.element_strides = (
            (1,) * rank
            if element_strides is None
            else _as_tuple("element_strides", element_strides, rank, layout.name)
        )
        self.element = _fp8_element(layout, element)
        self.tma_dtype = _validate(layout, self.box, self.element_strides, self.swizzle, self.oob_fill,
                                   self.interleave, self.tf32, self.element)
        self._layout = layout
        self._array = array
        self._numba_type = None
        self._descriptor = None  # cuda.core TensorMapDescriptor, encoded on first launch
        self._device_id = None  # the device of the array, known once encoded (checked at launch)
        self._raw = None  # 128 bytes from cuTensorMapEncodeTiled, encoded on first request

    # -- facts -------------------------------------------------------------------------------------
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
    def store_overhang(self):
        """Bytes a TMA tile *store* (or reduce) writes past the last element of an innermost row when its box
        reaches the row's end: the hardware completes the row to the next 16-byte boundary (observed on an
        H200 and an H100, and in plain CUDA C++: ``scripts/probe_store_clip.py``). 0 when the innermost extent
        is a whole number of 16-byte units. Those bytes are outside the array: padding of a pitched
        allocation, or a neighbour's data. See ``allow_store_overhang``."""
        return store_overhang(self.shape[-1], self.dtype.itemsize)

    @property
    def numba_type(self):
        """The kernel-side Numba type (use it in explicit signatures, e.g. for ``cuda.compile_ptx``)."""
        if self._numba_type is None:
            from ._types import TensorMapType

            nb_dtype = _numba_dtype(self.dtype)
            self._numba_type = TensorMapType(
                nb_dtype, self.tma_dtype, self.box, self.element_strides, int(self.swizzle), int(self.interleave),
                self.store_overhang, self.allow_store_overhang, self.element,
            )
        return self._numba_type

    @property
    def shared_shape(self):
        """Shape of the shared-memory tile one load fills: ``ceil(box / element_strides)`` per axis, except
        that with a swizzle wider than the box's rows each row takes a whole swizzle span (see
        :func:`tile_footprint`)."""
        return tile_footprint(self.box, self.element_strides, self.dtype.itemsize, int(self.swizzle))[0]

    @property
    def box_bytes(self):
        """Bytes one tile load delivers to shared memory (its mbarrier transaction count)."""
        return tile_footprint(self.box, self.element_strides, self.dtype.itemsize, int(self.swizzle))[1]

    @property
    def shared_alignment(self):
        """Alignment (bytes) the shared tile needs: the swizzle's repeat (8 rows of its span: 256, 512 or
        1024 bytes), so the pattern starts with the tile; 128 without swizzle."""
        return 8 * int(self.swizzle) if int(self.swizzle) else 128

    def __repr__(self):
        return (
            f"TensorMap({self.dtype.name}{_shape_str(self.shape)}, box={_shape_str(self.box)}, "
            f"swizzle={self.swizzle.name}, oob_fill={self.oob_fill.name})"
        )

    # -- re-pointing -------------------------------------------------------------------------------
    def repoint(self, array):
        """Point this descriptor at another array of exactly the same shape, strides and dtype, without
        re-encoding it (``cuTensorMapReplaceAddress``)."""
        layout = array_layout(array)
        if (layout.shape, layout.strides, layout.dtype) != (self.shape, self.strides, self.dtype):
            raise TensorMapError(
                f"TensorMap.repoint: the new array must have the layout the descriptor was built for: "
                f"{self._layout.name} with byte strides {self.strides}; got {layout.name} with byte strides "
                f"{layout.strides}. Build a new TensorMap for a different layout."
            )
        _check_address(layout, self.interleave)
        if self._descriptor is not None:
            self._descriptor.replace_address(array)
        if self._raw is not None:
            from cuda.bindings import driver

            _check(driver.cuTensorMapReplaceAddress(self._raw, layout.ptr), "cuTensorMapReplaceAddress")
        self._layout = layout
        self._array = array
        return self

    # -- encoding ----------------------------------------------------------------------------------
    def _driver_args(self):
        """Arguments of cuTensorMapEncodeTiled, innermost dimension first."""
        rev = lambda t: tuple(reversed(t))  # noqa: E731
        return dict(
            rank=self.rank,
            address=self._layout.ptr,
            dims=rev(self.shape),
            strides=rev(self.strides)[1:],
            box=rev(self.box),
            element_strides=rev(self.element_strides),
        )

    @property
    def descriptor(self):
        """The ``cuda.core.TensorMapDescriptor`` passed by value at launch (encoded on first use)."""
        if self._descriptor is None:
            from cuda.core._tensor_map import (
                TensorMapDataType,
                TensorMapInterleave,
                TensorMapL2Promotion,
                TensorMapOOBFill,
                TensorMapSwizzle,
            )
            from cuda.core.utils import StridedMemoryView

            # With extent-1 dimensions, encode the strides numbatma validated (see array_layout).
            source = _LayoutArray(self._layout) if 1 in self.shape else self._array
            view = StridedMemoryView.from_any_interface(source, stream_ptr=-1)
            self._device_id = getattr(view, "device_id", None)  # (checked at launch)
            self._descriptor = view.as_tensor_map(
                self.box,
                element_strides=self.element_strides,
                data_type=getattr(TensorMapDataType, self.tma_dtype),
                interleave=_CORE_INTERLEAVE[self.interleave](TensorMapInterleave),
                swizzle=_CORE_SWIZZLE[self.swizzle](TensorMapSwizzle),
                l2_promotion=_CORE_L2[self.l2_promotion](TensorMapL2Promotion),
                oob_fill=(
                    TensorMapOOBFill.NAN_REQUEST_ZERO_FMA if self.oob_fill == OOBFill.NAN else TensorMapOOBFill.NONE
                ),
            )
        return self._descriptor

    def to_bytes(self) -> bytes:
        """The 128-byte ``CUtensorMap`` (encoded with ``cuTensorMapEncodeTiled``), e.g. to store it in
        global memory. Needs the CUDA driver."""
        if self._raw is None:
            from cuda.bindings import driver

            a = self._driver_args()
            u64 = driver.cuuint64_t
            u32 = driver.cuuint32_t
            err, tmap = driver.cuTensorMapEncodeTiled(
                getattr(driver.CUtensorMapDataType, "CU_TENSOR_MAP_DATA_TYPE_" + self.tma_dtype),
                a["rank"],
                a["address"],
                [u64(d) for d in a["dims"]],
                [u64(s) for s in a["strides"]],
                [u32(b) for b in a["box"]],
                [u32(e) for e in a["element_strides"]],
                getattr(driver.CUtensorMapInterleave, _DRV_INTERLEAVE[self.interleave]),
                getattr(driver.CUtensorMapSwizzle, _DRV_SWIZZLE[self.swizzle]),
                getattr(driver.CUtensorMapL2promotion, _DRV_L2[self.l2_promotion]),
                getattr(
                    driver.CUtensorMapFloatOOBfill,
                    "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"
                    if self.oob_fill == OOBFill.NAN
                    else "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
                ),
            )
            _check(err, "cuTensorMapEncodeTiled")
            self._raw = tmap
        return b"".join(int(w).to_bytes(8, "little") for w in self._raw.opaque)


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


def _check(err, what):
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise TensorMapError(f"{what} failed: {err.name}: {msg.decode() if msg else ''}")


def _numba_dtype(dtype):
    from numba.cuda import types

    if dtype.name == "bfloat16":
        # Shared tiles of bfloat16 data are declared with a 16-bit integer dtype in Numba kernels.
        return types.uint16
    if dtype.name == "bool" or dtype.itemsize == 1 and dtype.kind in "Vf":  # (float8: its bits)
        return types.uint8
    return getattr(types, dtype.name)


def _check_address(layout, interleave):
    align = 32 if interleave == Interleave.B32 else 16
    if layout.ptr % align:
        raise TensorMapError(
            f"TensorMap: the {layout.name} starts at address 0x{layout.ptr:x}, which is not {align}-byte "
            f"aligned; TMA needs the global address to be a multiple of {align} bytes. A slice that starts "
            f"mid-row often causes this: describe the whole array and move the box coordinates instead."
        )


def store_overhang(extent, itemsize):
    """Bytes past the end of a row of ``extent`` elements that a TMA store reaching the row's end writes."""
    return -(extent * itemsize) % 16


def aligned_columns(extent, itemsize):
    """How many leading elements of a row of ``extent`` elements fill whole 16-byte units: the part of the
    row that TMA stores can write exactly. The remaining ``extent - aligned_columns(...)`` elements (fewer
    than 16 bytes) need ordinary stores."""
    return extent * itemsize // 16 * 16 // itemsize


def store_overhang_error(op, dtype_name, itemsize, overhang, extent=None):
    """The message for a TMA store or reduce through a descriptor whose rows end ``overhang`` bytes short of a
    16-byte boundary and whose TensorMap did not allow that (``allow_store_overhang``)."""
    per16 = max(1, 16 // itemsize)
    if extent is None:
        rows = (f"the destination's rows are not a whole number of 16-byte units (a multiple of {per16} "
                f"{dtype_name} elements)")
    else:
        rows = (f"the destination's rows are {extent} {dtype_name} elements = {extent * itemsize} bytes, not a "
                f"multiple of 16 bytes")
    elems = overhang // itemsize
    return (
        f"{op}: {rows}; a TMA store writes whole 16-byte units, so a box that reaches the end of a row also "
        f"writes the {overhang} bytes ({elems} element{'s' if elems != 1 else ''}) after it, which lie outside "
        f"the array (a neighbour's data in a view of a larger array). Store the 16-byte-aligned part with TMA "
        f"(a TensorMap of dst[..., :numbatma.aligned_columns(n, itemsize)]) and the last elements of each row "
        f"with ordinary stores, as numbatma.kernels do; or, if those bytes are yours to overwrite (padding), "
        f"build the TensorMap with allow_store_overhang=True."
    )


def _fp8_element(layout, element):
    """The float8 element ("e4m3" / "e5m2") of a TensorMap, or None: given, or implied by a float8 array."""
    dtype = layout.dtype
    implied = _FP8_DTYPES.get(dtype.name)
    if element is None:
        return implied
    if element not in FP8_ELEMENTS:
        raise TensorMapError(f"TensorMap: element must be 'e4m3' or 'e5m2' (float8 data for wgmma) or None, got "
                             f"{element!r}.")
    if implied is not None and implied != element:
        raise TensorMapError(f"TensorMap: element={element!r} but the {layout.name} holds {dtype.name} "
                             f"({implied}) values; leave element out (the array's float8 type is used) or pass "
                             f"element={implied!r}.")
    if implied is None and not (dtype.itemsize == 1 and dtype.kind in "uiV"):
        raise TensorMapError(f"TensorMap: element={element!r} describes float8 data, one byte per element: the "
                             f"array must hold the float8 bits as uint8 or int8 (or be a float8 array), but the "
                             f"{layout.name} has {dtype.itemsize}-byte {dtype.name} elements. Convert the values to "
                             f"{_FP8_NAMES[element]} first and pass that array (or its bytes viewed as uint8).")
    return element


def _validate(layout, box, element_strides, swizzle, oob_fill, interleave, tf32, element=None):
    """Check every documented cuTensorMapEncodeTiled rule; return the driver data type name."""
    name = layout.name
    rank = len(layout.shape)
    dtype = layout.dtype
    if not 1 <= rank <= _MAX_RANK:
        raise TensorMapError(f"TensorMap: the {name} has rank {rank}; TMA descriptors describe rank 1 to 5.")
    tma_dtype = _TMA_DTYPE.get(dtype.name)
    if tma_dtype is None and (element is not None or dtype.name in _FP8_DTYPES):
        tma_dtype = "UINT8"  # float8 bytes (the Hopper TMA has no float8 type: it moves bits)
    if tma_dtype is None:
        raise TensorMapError(
            f"TensorMap: dtype {dtype.name} of the {name} has no TMA data type. Supported dtypes: "
            f"{', '.join(SUPPORTED_DTYPES)}."
        )
    if tf32:
        if dtype.name != "float32":
            raise TensorMapError(f"TensorMap: tf32=True needs a float32 array; the array is {dtype.name}.")
        tma_dtype = "TFLOAT32"
    itemsize = dtype.itemsize
    if interleave != Interleave.NONE and rank < 3:
        raise TensorMapError(
            f"TensorMap: interleave={interleave.name} needs an array of rank 3 to 5; the {name} has rank {rank}."
        )
    _check_address(layout, interleave)
    for axis, d in enumerate(layout.shape):
        if not 1 <= d <= _MAX_DIM:
            raise TensorMapError(
                f"TensorMap: dimension {axis} of the {name} is {d}; TMA needs every dimension in 1..2**32."
            )
    if layout.strides[-1] != itemsize:
        raise TensorMapError(
            f"TensorMap: the innermost (last) dimension of the {name} has a stride of {layout.strides[-1]} "
            f"bytes; TMA needs it contiguous ({itemsize} bytes, one {dtype.name}). Make the array contiguous "
            f"(e.g. .copy()) or transpose it so the contiguous axis is last."
        )
    stride_align = 32 if interleave == Interleave.B32 else 16
    axis_names = {rank - 2: "row stride"} if rank >= 2 else {}
    for axis in range(rank - 1):
        st = layout.strides[axis]
        what = axis_names.get(axis, f"stride of dimension {axis}")
        if st <= 0:
            raise TensorMapError(
                f"TensorMap: {what} of the {name} is {st} bytes; TMA needs positive strides."
            )
        if st % stride_align:
            hint = ""
            if axis == rank - 2:
                pad_elems = -(-st // stride_align) * stride_align // itemsize
                hint = f" Pad the rows to {pad_elems} elements." if pad_elems * itemsize % stride_align == 0 else ""
            raise TensorMapError(
                f"TensorMap: {what} of the {name} is {st} bytes; TMA needs every stride except the innermost "
                f"to be a multiple of {stride_align} bytes.{hint}"
            )
        if st >= _MAX_STRIDE:
            raise TensorMapError(
                f"TensorMap: {what} of the {name} is {st} bytes; TMA needs strides below 2**40 bytes."
            )
    for axis, b in enumerate(box):
        if not 1 <= b <= _MAX_BOX:
            raise TensorMapError(
                f"TensorMap: box {_shape_str(box)} has {b} along dimension {axis}; every box dimension must be "
                f"in 1..{_MAX_BOX}."
            )
    for axis, e in enumerate(element_strides):
        if not 1 <= e <= _MAX_ELEMENT_STRIDE:
            raise TensorMapError(
                f"TensorMap: element_strides {_shape_str(element_strides)} has {e} along dimension {axis}; "
                f"element strides must be in 1..{_MAX_ELEMENT_STRIDE}."
            )
    inner_bytes = box[-1] * itemsize
    if interleave == Interleave.NONE and element_strides[-1] != 1:
        raise TensorMapError(
            f"TensorMap: element_strides {_shape_str(element_strides)} asks for a step of {element_strides[-1]} "
            f"along the innermost dimension; TMA ignores the innermost element stride unless the layout is "
            f"interleaved, so it must be 1. Load the full rows and pick every {element_strides[-1]}-th element "
            f"in the kernel instead."
        )
    if interleave == Interleave.NONE:
        if inner_bytes % 16:
            raise TensorMapError(
                f"TensorMap: the innermost box dimension is {box[-1]} {dtype.name} elements = {inner_bytes} "
                f"bytes; TMA needs it to be a multiple of 16 bytes ({16 // math.gcd(16, itemsize)} "
                f"{dtype.name} elements)."
            )
        if swizzle != Swizzle.NONE and inner_bytes > int(swizzle):
            raise TensorMapError(
                f"TensorMap: the innermost box dimension is {box[-1]} {dtype.name} elements = {inner_bytes} "
                f"bytes, wider than the {int(swizzle)}-byte span of swizzle={swizzle.name}; with swizzling, "
                f"box[-1] * itemsize must be <= the swizzle span. Use box[-1] <= {int(swizzle) // itemsize} "
                f"or a wider swizzle."
            )
    else:
        if interleave == Interleave.B32 and swizzle != Swizzle.B32:
            raise TensorMapError(
                f"TensorMap: interleave=B32 requires swizzle=B32 (the driver's rule); got swizzle={swizzle.name}."
            )
    if oob_fill == OOBFill.NAN and tma_dtype not in _FLOAT_TMA_DTYPES:
        raise TensorMapError(
            f"TensorMap: oob_fill=NAN needs a floating-point dtype; the {name} holds {dtype.name}. "
            f"Use oob_fill=ZERO."
        )
    return tma_dtype


class TensorMapArray:
    """Several descriptors of one layout stored in global memory (e.g. one per batch item or per group).

    Pass it to a kernel and pick one with ``numbatma.intrinsics.tensormap_acquire(descs, i)``, which emits
    the documented ``fence.proxy.tensormap::generic.acquire.gpu`` before the descriptor is used. Needs the
    CUDA driver (descriptors are encoded and copied to the device here).
    """

    def __init__(self, tensormaps):
        if isinstance(tensormaps, TensorMap) or not hasattr(tensormaps, "__iter__"):
            raise TensorMapError(
                f"TensorMapArray: expected a sequence of TensorMaps (e.g. a list), got {type(tensormaps).__name__}."
            )
        tensormaps = list(tensormaps)
        if not tensormaps:
            raise TensorMapError("TensorMapArray: needs at least one TensorMap.")
        for i, t in enumerate(tensormaps):
            if not isinstance(t, TensorMap):
                raise TensorMapError(f"TensorMapArray: item {i} is a {type(t).__name__}, not a TensorMap.")
        first = tensormaps[0].numba_type
        for i, t in enumerate(tensormaps):
            if t.numba_type != first:
                raise TensorMapError(
                    f"TensorMapArray: every descriptor must have the same kernel type; item 0 is {first}, "
                    f"item {i} is {t.numba_type}."
                )
        from numba import cuda

        self.tensormaps = tensormaps
        self._numba_type = None
        self._device_id = None
        if _SIMULATING:  # the simulator reads the TensorMap objects (descriptor.py edits them): no bytes
            self.device_array = None
            return
        raw = np.frombuffer(b"".join(t.to_bytes() for t in tensormaps), dtype=np.uint8).reshape(len(tensormaps), 128)
        self.device_array = cuda.to_device(raw)
        self._device_id = cuda.get_current_device().id  # (checked at launch)
        self._numba_type = None

    def __len__(self):
        return len(self.tensormaps)

    @property
    def numba_type(self):
        if self._numba_type is None:
            from ._types import TensorMapArrayType

            self._numba_type = TensorMapArrayType(self.tensormaps[0].numba_type)
        return self._numba_type

    @property
    def address(self):
        return int(self.device_array.__cuda_array_interface__["data"][0])
