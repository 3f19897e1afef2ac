"""Host side: TMA descriptors for tiled views of CUDA arrays (:class:`TensorMap`, :class:`TensorMapArray`).

Everything here speaks the array's own index order (NumPy/row-major: the last axis is the innermost,
contiguous one). The driver wants the reverse (innermost first); that reversal happens in one place,
:meth:`TensorMap._driver_args`.

Validation runs in Python before any driver call, so every rule is reported in the user's terms, and
it needs no GPU: a descriptor can be built (and kernels compiled against it) on a machine without a
driver. Encoding happens lazily, the first time the descriptor is launched or its bytes are asked for.

What every descriptor mode shares (the array intake, the option enums, the layout rules, the encoding path)
lives in ``numbatma/_descriptor_base.py``; this module adds the tiled mode (box, element strides, interleave,
float8 elements, store overhang) and exports the public names.
"""
from __future__ import annotations

import math

import numpy as np

from ._descriptor_base import (  # noqa: F401  (the public names are exported from here)
    FP8_ELEMENTS,
    MAX_ELEMENT_STRIDE,
    MAX_RANK,
    SUPPORTED_DTYPES,
    ArrayLayout,
    DeviceView,
    Interleave,
    L2Promotion,
    OOBFill,
    Swizzle,
    TensorMapError,
    TMADescriptor,
    _dtype_name,
    _FP8_DTYPES,
    _FP8_NAMES,
    array_layout,
    bits_dtype,
    byte_span,
    flag_option,
    host_view,
    int_tuple,
    is_readonly,
    layout_facts,
    layout_record,
    numba_dtype,
    shape_str,
    validate_layout,
    validate_oob_fill,
)
from ._env import SIMULATING
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
    "layout_facts",
    "layout_record",
    "byte_span",
    "is_readonly",
]

_MAX_BOX = 256


def layout_view(layout, owner):
    """A view of the memory ``layout`` describes inside ``owner`` that a :class:`TensorMap` accepts and that
    keeps ``layout``'s dtype (bfloat16 included): a :class:`DeviceView`, or under the CUDA simulator a NumPy
    view of the same memory."""
    if not SIMULATING:
        return DeviceView(layout, owner)
    return host_view(layout, owner, layout.dtype)


def kernel_view(layout, owner):
    """A ``@cuda.jit`` kernel argument viewing the memory ``layout`` describes (an :class:`ArrayLayout`, e.g.
    ``array_layout(x).columns(a, b)``) inside the array ``owner``: a :class:`DeviceView` (no copy, no
    synchronisation, no driver needed until launch), or under the CUDA simulator a simulated device array
    over the same memory. bfloat16 is viewed as uint16 (the same bits; kernels move or convert them)."""
    if not SIMULATING:
        return DeviceView(layout, owner)
    view = host_view(layout, owner, bits_dtype(layout.dtype))
    from ._numba_internals import simulated_device_array

    return simulated_device_array(view)


class TensorMap(TMADescriptor):
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

    _WHO = "TensorMap"
    _MODE = "Tiled"  # cuTensorMapEncodeTiled

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
        self._take_options(swizzle, oob_fill, l2_promotion, interleave, tf32)
        self.allow_store_overhang = flag_option("TensorMap", "allow_store_overhang", allow_store_overhang)
        self._attach(layout, array)
        rank = len(layout.shape)
        if not 1 <= rank <= MAX_RANK:
            raise TensorMapError(
                f"TensorMap: the {layout.name} has rank {rank}; TMA descriptors describe rank 1 to 5."
            )
        def counted():
            return f"the {layout.name} has {rank} dimensions"

        self.box = int_tuple("TensorMap", "box", box, rank, counted)
        self.element_strides = (
            (1,) * rank
            if element_strides is None
            else int_tuple("TensorMap", "element_strides", element_strides, rank, counted)
        )
        self.element = _fp8_element(layout, element)
        self.tma_dtype = _validate(layout, self.box, self.element_strides, self.swizzle, self.oob_fill,
                                   self.interleave, self.tf32, self.element)

    # -- facts -------------------------------------------------------------------------------------
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

            nb_dtype = numba_dtype(self.dtype)
            self._numba_type = TensorMapType(
                nb_dtype, self.tma_dtype, self.box, self.element_strides, int(self.swizzle), int(self.interleave),
                self.store_overhang, self.allow_store_overhang, self.element,
            )
        return self._numba_type

    def __repr__(self):
        return (
            f"TensorMap({self.dtype.name}{shape_str(self.shape)}, box={shape_str(self.box)}, "
            f"swizzle={self.swizzle.name}, oob_fill={self.oob_fill.name})"
        )

    # -- encoding (the path itself: TMADescriptor.descriptor / to_bytes) ----------------------------
    def _mode_args(self):
        """cuTensorMapEncodeTiled's ``boxDim`` (innermost first)."""
        return dict(box=tuple(reversed(self.box)))

    def _encode_mode_args(self, driver, args):
        return ([driver.cuuint32_t(b) for b in args["box"]],)

    def _core_descriptor(self, view, **options):
        return view.as_tensor_map(self.box, **options)


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
    implied = _FP8_DTYPES.get(_dtype_name(dtype))
    if element is None:
        return implied
    if not isinstance(element, str) or element not in FP8_ELEMENTS:
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
    """Check every documented cuTensorMapEncodeTiled rule (the layout rules every mode shares, then the box's);
    return the driver data type name."""
    tma_dtype = validate_layout("TensorMap", layout, interleave=interleave, tf32=tf32, element=element)
    dtype = layout.dtype
    itemsize = dtype.itemsize
    for axis, b in enumerate(box):
        if not 1 <= b <= _MAX_BOX:
            raise TensorMapError(
                f"TensorMap: box {shape_str(box)} has {b} along dimension {axis}; every box dimension must be "
                f"in 1..{_MAX_BOX}."
            )
    for axis, e in enumerate(element_strides):
        if not 1 <= e <= MAX_ELEMENT_STRIDE:
            raise TensorMapError(
                f"TensorMap: element_strides {shape_str(element_strides)} has {e} along dimension {axis}; "
                f"element strides must be in 1..{MAX_ELEMENT_STRIDE}."
            )
    inner_bytes = box[-1] * itemsize
    if interleave == Interleave.NONE and element_strides[-1] != 1:
        raise TensorMapError(
            f"TensorMap: element_strides {shape_str(element_strides)} asks for a step of {element_strides[-1]} "
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
    validate_oob_fill("TensorMap", layout, oob_fill, tma_dtype)
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
        if SIMULATING:  # the simulator reads the TensorMap objects (descriptor.py edits them): no bytes
            self.device_array = None
            return
        raw = np.frombuffer(b"".join(t.to_bytes() for t in tensormaps), dtype=np.uint8).reshape(len(tensormaps), 128)
        here = cuda.get_current_device().id  # (where the bytes go, and kernels reading them run: checked at launch)
        from .devices import peer_access_enabled

        for i, t in enumerate(tensormaps):
            if t._device_id is not None and not peer_access_enabled(here, t._device_id):
                raise TensorMapError(
                    f"TensorMapArray: item {i} describes memory of device {t._device_id}, but the array of descriptors "
                    f"is made on device {here} (the current device), where the kernels reading it run. Make it with "
                    f"device {t._device_id} current (with cuda.gpus[{t._device_id}]: or "
                    f"torch.cuda.device({t._device_id})), or call numbatma.enable_peer_access({here}, {t._device_id})."
                )
        self.device_array = cuda.to_device(raw)
        self._device_id = here
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
