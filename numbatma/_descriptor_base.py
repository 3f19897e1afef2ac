"""What every host TMA descriptor shares: :class:`TMADescriptor`, the base of :class:`numbatma.TensorMap` (tiled
mode, ``tensormap.py``) and, through it, of :class:`numbatma.Im2colTensorMap` (im2col mode, ``im2col.py``).

Here, once (the array itself is read by ``_intake.py``: :func:`array_layout`, :class:`ArrayLayout`):

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

The public names defined here (the option enums, ``SUPPORTED_DTYPES``) and those of ``_intake.py`` are exported
by :mod:`numbatma.tensormap`, which is where users import them from; this module also re-exports the intake's
names that ``tensormap.py``, ``im2col.py`` and the launch modules take from here. Imports nothing of numbatma
but ``_intake`` and the leaves ``_env``, ``_shapes`` and ``devices`` (where each descriptor's device comes from:
:func:`numbatma.array_device` of its array; it is recorded on every encoding path and checked at launch).
"""
from __future__ import annotations

import enum

import numpy as np

from ._intake import (  # noqa: F401  (re-exported: tensormap.py, im2col.py and the launch modules import them here)
    _FP8_DTYPES,
    _PUBLIC_MODULE,
    ArrayLayout,
    DeviceView,
    TensorMapError,
    _LayoutArray,
    array_layout,
    bits_dtype,
    byte_span,
    check_byte_order,
    host_view,
    is_readonly,
    layout_facts,
    layout_record,
    shape_str,
)
from ._shapes import tile_footprint
from .devices import array_device, enter_device, leave_device, pointer_device, register_reader


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


def numba_dtype(dtype):
    """The Numba element type kernels see for a descriptor of ``dtype`` data (bfloat16 and float8: their bits)."""
    from numba.cuda import types

    if dtype.name == "bfloat16":
        # Shared tiles of bfloat16 data are declared with a 16-bit integer dtype in Numba kernels.
        return types.uint16
    if dtype.name == "bool" or dtype.itemsize == 1 and dtype.kind in "Vf":  # (float8: its bits)
        return types.uint8
    return getattr(types, dtype.name)


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
