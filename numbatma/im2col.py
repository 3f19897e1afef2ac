"""Host side: TMA descriptors in im2col mode (``cuTensorMapEncodeIm2col``) for convolution inputs.

An im2col descriptor describes a channels-last activation tensor, ``(N, W, C)``, ``(N, H, W, C)`` or
``(N, D, H, W, C)`` (array index order, channels innermost). One load (``intrinsics.tma_load_im2col``) gathers
``pixels_per_column`` pixels, ``channels_per_pixel`` channels each, into a shared tile of shape
``(pixels_per_column, channels_per_pixel)``: a slab of the im2col matrix of a convolution.

The pixels of one load are those of a *bounding box* over the spatial dimensions, visited W fastest, then H,
then D, then the next image (N). Along each spatial axis the box runs from ``pixel_box_lower_corner[i]``
to ``shape[i] - 1 + pixel_box_upper_corner[i]`` (both inclusive, spatial axes in array order), shifted by the
load's filter offsets. A stride-1 convolution with padding ``p`` and a filter of ``R`` taps along an axis
uses ``lower = -p`` and ``upper = p - (R - 1) * dilation``; pixels outside the tensor read as ``oob_fill``.

Everything here speaks the array's own index order; the driver's innermost-first order appears in
:meth:`Im2colTensorMap._driver_args` only. Validation runs in Python before any driver call.
"""
from __future__ import annotations

import math
import numbers

from ._descriptor_base import (
    MAX_ELEMENT_STRIDE,
    Interleave,
    L2Promotion,
    OOBFill,
    Swizzle,
    TensorMapError,
    array_layout,
    int_tuple,
    numba_dtype,
    shape_str,
    validate_layout,
    validate_oob_fill,
)
from .tensormap import TensorMap

__all__ = ["Im2colTensorMap"]

# Driver limits (cuTensorMapEncodeIm2col): corner offsets by rank, channels and pixels per load.
_CORNER_RANGE = {3: (-32768, 32767), 4: (-128, 127), 5: (-16, 15)}
_MAX_CHANNELS = 256
_MAX_PIXELS = 1024
_LAYOUT_NAMES = {3: "NWC", 4: "NHWC", 5: "NDHWC"}
_SPATIAL_NAMES = {3: ("W",), 4: ("H", "W"), 5: ("D", "H", "W")}


def _ints(name, value, count, what):
    if value is None:
        return (0,) * count
    unit = "spatial dimension" if "spatial" in what else "dimension"
    return int_tuple("Im2colTensorMap", name, value, count, what, unit)


def _positive_int(name, value, hi):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TensorMapError(f"Im2colTensorMap: {name} must be an integer, got {value!r}.")
    value = int(value)
    if not 1 <= value <= hi:
        raise TensorMapError(f"Im2colTensorMap: {name} is {value}; it must be in 1..{hi}.")
    return value


class Im2colTensorMap(TensorMap):
    """A TMA descriptor (``CUtensorMap``, im2col mode) over a channels-last activation tensor.

    ``Im2colTensorMap(x, channels_per_pixel=C, pixels_per_column=P, pixel_box_lower_corner=lo,
    pixel_box_upper_corner=hi)`` describes loads of ``P`` pixels x ``C`` channels of the rank 3-5 array ``x``
    (``NWC``, ``NHWC`` or ``NDHWC``; channels innermost and contiguous). The corners (one entry per spatial
    dimension, array order: ``(D, H, W)``, ``(H, W)`` or ``(W,)``) bound the pixels a load visits: along spatial
    axis ``i`` from ``lo[i]`` to ``shape[i] - 1 + hi[i]``, both inclusive, shifted by the load's offsets.

    Options (as :class:`TensorMap`):
      * ``element_strides``: per-dimension traversal step (array order, one per dimension); the spatial ones in
        1..8 step through the bounding box (a strided convolution); those of N and C must be 1.
      * ``swizzle``: :class:`Swizzle`; ``channels_per_pixel * itemsize`` must fit the swizzle span.
      * ``oob_fill``: :class:`OOBFill` for pixels outside the tensor; ``l2_promotion``: :class:`L2Promotion`;
        ``tf32``: encode float32 as TFLOAT32.

    In a kernel, ``desc.shared_shape == (P, C)`` (rows padded to the swizzle span when narrower, as for
    tiled maps), ``desc.box_bytes == P * C * itemsize`` (the transaction bytes of one load), and
    ``desc.pixels_per_column`` / ``desc.channels_per_pixel`` / ``desc.rank`` are compile-time constants.
    Passed to kernels by value like a :class:`TensorMap`. Load-only: im2col stores are not offered.
    """

    _WHO = "Im2colTensorMap"
    _MODE = "Im2col"  # cuTensorMapEncodeIm2col

    def __init__(
        self,
        array,
        *,
        channels_per_pixel,
        pixels_per_column,
        pixel_box_lower_corner=None,
        pixel_box_upper_corner=None,
        element_strides=None,
        swizzle=Swizzle.NONE,
        oob_fill=OOBFill.ZERO,
        l2_promotion=L2Promotion.NONE,
        tf32=False,
    ):
        layout = array_layout(array)
        rank = len(layout.shape)
        if rank not in _CORNER_RANGE:
            raise TensorMapError(
                f"Im2colTensorMap: the {layout.name} has rank {rank}; im2col descriptors describe rank 3 to 5 "
                f"channels-last arrays (NWC, NHWC or NDHWC), channels innermost."
            )
        self._take_options(swizzle, oob_fill, l2_promotion, Interleave.NONE, tf32)
        self._attach(layout, array)
        itemsize = layout.dtype.itemsize
        spatial = _SPATIAL_NAMES[rank]
        nsp = rank - 2
        kind = _LAYOUT_NAMES[rank]
        self.pixel_box_lower_corner = _ints(
            "pixel_box_lower_corner", pixel_box_lower_corner, nsp,
            f"the {kind} array has {nsp} spatial dimension{'s' if nsp > 1 else ''} ({', '.join(spatial)})")
        self.pixel_box_upper_corner = _ints(
            "pixel_box_upper_corner", pixel_box_upper_corner, nsp,
            f"the {kind} array has {nsp} spatial dimension{'s' if nsp > 1 else ''} ({', '.join(spatial)})")
        lo_lim, hi_lim = _CORNER_RANGE[rank]
        for which, corner in (("pixel_box_lower_corner", self.pixel_box_lower_corner),
                              ("pixel_box_upper_corner", self.pixel_box_upper_corner)):
            for axis, v in zip(spatial, corner):
                if not lo_lim <= v <= hi_lim:
                    raise TensorMapError(
                        f"Im2colTensorMap: {which} {shape_str(corner)} has {v} along {axis}; for a rank-{rank} "
                        f"({kind}) array each corner offset must be in {lo_lim}..{hi_lim} (the driver's range)."
                    )
        for i, axis in enumerate(spatial):
            extent = self.shape[1 + i] + self.pixel_box_upper_corner[i] - self.pixel_box_lower_corner[i]
            if extent < 1:
                raise TensorMapError(
                    f"Im2colTensorMap: the bounding box is empty along {axis}: it runs from "
                    f"pixel_box_lower_corner {self.pixel_box_lower_corner[i]} to {axis}-1 + pixel_box_upper_corner = "
                    f"{self.shape[1 + i] - 1 + self.pixel_box_upper_corner[i]}; the box needs at least one pixel "
                    f"along every spatial dimension (the filter is larger than the padded input?)."
                )
        self.channels_per_pixel = _positive_int(
            "channels_per_pixel", channels_per_pixel, _MAX_CHANNELS)
        self.pixels_per_column = _positive_int("pixels_per_column", pixels_per_column, _MAX_PIXELS)
        row_bytes = self.channels_per_pixel * itemsize
        if row_bytes % 16:
            raise TensorMapError(
                f"Im2colTensorMap: channels_per_pixel is {self.channels_per_pixel} {layout.dtype.name} elements = "
                f"{row_bytes} bytes; TMA needs a multiple of 16 bytes ({16 // math.gcd(16, itemsize)} "
                f"{layout.dtype.name} elements) per pixel."
            )
        if self.swizzle != Swizzle.NONE and row_bytes > int(self.swizzle):
            raise TensorMapError(
                f"Im2colTensorMap: channels_per_pixel is {self.channels_per_pixel} {layout.dtype.name} elements = "
                f"{row_bytes} bytes, wider than the {int(self.swizzle)}-byte span of swizzle={self.swizzle.name}; "
                f"with swizzling, channels_per_pixel * itemsize must be <= the swizzle span. Use "
                f"channels_per_pixel <= {int(self.swizzle) // itemsize} or a wider swizzle."
            )
        if element_strides is None:
            self.element_strides = (1,) * rank
        else:
            self.element_strides = _ints("element_strides", element_strides, rank,
                                         f"the {kind} array has {rank} dimensions")
        for axis, (e, name) in enumerate(zip(self.element_strides, ("N",) + spatial + ("C",))):
            if name in ("N", "C"):
                if e != 1:
                    raise TensorMapError(
                        f"Im2colTensorMap: element_strides {shape_str(self.element_strides)} asks for a step of {e} "
                        f"along {name} (dimension {axis}); in im2col mode only the spatial dimensions "
                        f"({', '.join(spatial)}) take a traversal stride, so the {name} entry must be 1."
                    )
            elif not 1 <= e <= MAX_ELEMENT_STRIDE:
                raise TensorMapError(
                    f"Im2colTensorMap: element_strides {shape_str(self.element_strides)} has {e} along {name} "
                    f"(dimension {axis}); element strides must be in 1..{MAX_ELEMENT_STRIDE}."
                )
        # The layout rules every mode shares (dtype, alignment, extents, byte strides, oob_fill vs dtype).
        self.tma_dtype = validate_layout(self._WHO, layout, interleave=Interleave.NONE, tf32=self.tf32)
        validate_oob_fill(self._WHO, layout, self.oob_fill, self.tma_dtype)
        self.box = (self.pixels_per_column, self.channels_per_pixel)  # the shared tile of one load

    # -- facts -------------------------------------------------------------------------------------
    @property
    def spatial_shape(self):
        """The spatial extents (array order: ``(W,)``, ``(H, W)`` or ``(D, H, W)``)."""
        return tuple(self.shape[1:-1])

    @property
    def bounding_box(self):
        """Per spatial dimension (array order) the inclusive range ``(first, last)`` of pixel positions a load
        with zero offsets visits: ``(lower, extent - 1 + upper)``."""
        return tuple((lo, n - 1 + hi) for lo, n, hi in
                     zip(self.pixel_box_lower_corner, self.spatial_shape, self.pixel_box_upper_corner))

    @property
    def store_overhang(self):  # pragma: no cover - im2col maps are load-only
        return 0

    @property
    def numba_type(self):
        """The kernel-side Numba type (:class:`numbatma._im2col_type.Im2colTensorMapType`)."""
        if self._numba_type is None:
            from ._im2col_type import Im2colTensorMapType

            self._numba_type = Im2colTensorMapType(
                numba_dtype(self.dtype), self.tma_dtype, self.rank, self.channels_per_pixel,
                self.pixels_per_column, int(self.swizzle),
            )
        return self._numba_type

    @property
    def _tile_steps(self):
        return (1, 1)  # (the element strides step through the bounding box, not the tile)

    def __repr__(self):
        return (
            f"Im2colTensorMap({self.dtype.name}{shape_str(self.shape)}, pixels_per_column={self.pixels_per_column}, "
            f"channels_per_pixel={self.channels_per_pixel}, lower={shape_str(self.pixel_box_lower_corner)}, "
            f"upper={shape_str(self.pixel_box_upper_corner)}, swizzle={self.swizzle.name}, "
            f"oob_fill={self.oob_fill.name})"
        )

    # -- encoding (the path itself: TMADescriptor.descriptor / to_bytes) ----------------------------
    def _mode_args(self):
        """cuTensorMapEncodeIm2col's corners (W first), channels and pixels."""
        return dict(
            lower=tuple(reversed(self.pixel_box_lower_corner)),
            upper=tuple(reversed(self.pixel_box_upper_corner)),
            channels=self.channels_per_pixel,
            pixels=self.pixels_per_column,
        )

    def _encode_mode_args(self, driver, args):
        return list(args["lower"]), list(args["upper"]), args["channels"], args["pixels"]

    def _core_descriptor(self, view, **options):
        from cuda.core._tensor_map import TensorMapDescriptor

        # cuda.core takes row-major order and reverses (corners included), like numbatma.
        return TensorMapDescriptor._from_im2col(view, self.pixel_box_lower_corner, self.pixel_box_upper_corner,
                                                self.channels_per_pixel, self.pixels_per_column, **options)


def gather(x, coords, offsets, *, lower, upper, channels, pixels, element_strides=None, nan_fill=False):
    """The im2col gather of one load, in NumPy (the simulator's semantics; PTX ISA "im2col mode").

    ``coords`` (array order ``(n, [d, [h,]] w, c)``) name the first pixel in the offset-free bounding box and the
    first channel; ``offsets`` (one per spatial dimension, array order) shift the box and every pixel. Pixels
    are visited W fastest: a spatial position steps by its element stride and, past the box's last position,
    returns to the box's first position (the lower corner) while the next-outer one steps; past the outermost
    spatial dimension the image index n steps by 1. Pixels (or channels) outside the tensor read as the fill.
    """
    import numpy as np

    x = np.asarray(x)
    rank = x.ndim
    nsp = rank - 2
    es = (1,) * rank if element_strides is None else tuple(element_strides)
    spatial = x.shape[1:-1]
    first = [int(lower[i]) for i in range(nsp)]
    last = [spatial[i] - 1 + int(upper[i]) for i in range(nsp)]
    n = int(coords[0])
    pos = [int(c) for c in coords[1:-1]]
    c0 = int(coords[-1])
    off = [int(o) for o in offsets]
    fill = np.nan if nan_fill else 0
    out = np.full((pixels, channels), fill, dtype=x.dtype)
    ch = c0 + np.arange(channels)
    ch_ok = (ch >= 0) & (ch < x.shape[-1])
    for k in range(pixels):
        actual = [p + o for p, o in zip(pos, off)]
        if 0 <= n < x.shape[0] and all(0 <= a < s for a, s in zip(actual, spatial)):
            out[k, ch_ok] = x[(n, *actual)][ch[ch_ok]]
        # advance: W fastest, wrapping inside the bounding box, then the next image
        i = nsp - 1
        while True:
            if i < 0:
                n += 1
                break
            pos[i] += es[1 + i]
            if pos[i] <= last[i]:
                break
            pos[i] = first[i]
            i -= 1
    return out
