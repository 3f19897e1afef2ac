"""Numba type of an im2col TMA descriptor (:class:`numbatma.Im2colTensorMap`).

A type of its own, not a :class:`~numbatma._types.TensorMapType`: the tile-mode operations (``tma_load``,
``tma_store``, ...) must reject an im2col descriptor at typing time, and they test
``isinstance(ty, TensorMapType)``. It shares the descriptor data model (a pointer to the 128-byte
``struct.numbatma.CUtensorMap``), so the kernel-parameter hook passes it by value as a ``__grid_constant__``
parameter exactly like a tiled descriptor; ``by_value_descriptor = True`` tells the launch hook to hand over
its ``descriptor`` (see ``numbatma._numba_internals._prepare_numbatma_arg``).
"""
from __future__ import annotations

from numba.cuda import types
from numba.cuda.extending import register_model

from ._shapes import tile_footprint
from ._types import TensorMapModel, register_constant_attributes


class Im2colTensorMapType(types.Type):
    """Numba type of an im2col descriptor. Its key holds what typing and lowering need: dtype, rank, the
    shared tile of one load (``pixels_per_column`` x ``channels_per_pixel``) and the swizzle. The corners,
    element strides and fill live in the descriptor only (they change no code)."""

    by_value_descriptor = True

    def __init__(self, dtype, tma_dtype, rank, channels_per_pixel, pixels_per_column, swizzle):
        self.dtype = dtype
        self.tma_dtype = tma_dtype
        self.rank = int(rank)
        self.channels_per_pixel = int(channels_per_pixel)
        self.pixels_per_column = int(pixels_per_column)
        self.swizzle = int(swizzle)
        extra = ", tf32" if tma_dtype.startswith("TFLOAT32") else ""
        super().__init__(
            name=f"Im2colTensorMap({dtype}, rank={self.rank}, pixels_per_column={self.pixels_per_column}, "
                 f"channels_per_pixel={self.channels_per_pixel}, swizzle={self.swizzle}B{extra})"
        )

    @property
    def key(self):
        return (self.dtype, self.tma_dtype, self.rank, self.channels_per_pixel, self.pixels_per_column,
                self.swizzle)

    @property
    def itemsize(self):
        return self.dtype.bitwidth // 8

    @property
    def box(self):
        """The shared tile of one load before swizzle padding: ``(pixels_per_column, channels_per_pixel)``."""
        return (self.pixels_per_column, self.channels_per_pixel)

    @property
    def shared_shape(self):

        return tile_footprint(self.box, (1, 1), self.itemsize, self.swizzle)[0]

    @property
    def box_bytes(self):

        return tile_footprint(self.box, (1, 1), self.itemsize, self.swizzle)[1]


register_model(Im2colTensorMapType)(TensorMapModel)


# ``desc.box_bytes``, ``rank``, ``box``, ``shared_shape``, ``pixels_per_column``, ``channels_per_pixel`` as
# compile-time constants.
register_constant_attributes(Im2colTensorMapType, ("box_bytes", "rank", "box", "shared_shape", "pixels_per_column",
                                                   "channels_per_pixel"))
