"""TMA tensor loads in im2col mode (``cp.async.bulk.tensor ... .im2col``): convolution inputs gathered as
rows of the im2col matrix, with a :class:`numbatma.Im2colTensorMap`.

One load fills a shared tile of shape ``desc.shared_shape == (pixels_per_column, channels_per_pixel)``: the
pixels of the descriptor's bounding box visited W fastest, then H, then D, then N, starting at the pixel
``coords`` names, each pixel's ``channels_per_pixel`` channels from channel ``coords[-1]`` on. ``offsets``
(one per spatial dimension) are the filter tap: they shift the bounding box and every pixel.

Coordinates and offsets are given in the array's own index order (``(n, h, w, c)`` and ``(r, s)`` for NHWC);
the PTX wants the innermost first, and the reversal happens here.
"""
from __future__ import annotations

from ._asm import Ptx
from ._define import (
    SIMULATING,
    barrier_address,
    descriptor_address,
    device_op,
    fail,
    require_barrier,
    require_int,
    require_tile_matches,
    shared_address,
    sim,
    to_i32,
)
from .mbarrier import sim_complete_tx
from .tma import host_array, tile_chunks

__all__ = ["tma_load_im2col"]

RANKS = (3, 4, 5)


def _coord_list(rank):
    return ", ".join(f"$c{i}" for i in range(rank))


def _offset_list(rank):
    return ", ".join(f"$o{i}" for i in range(rank - 2))


# -- the PTX: one description per rank ---------------------------------------------------------------
LOAD_IM2COL = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes "
        f"[$dst], [$tmap, {{{_coord_list(r)}}}], [$bar], {{{_offset_list(r)}}};",
        ins=(("dst", "b32"), ("tmap", "b64"))
        + tuple((f"c{i}", "b32") for i in range(r))
        + (("bar", "b32"),)
        + tuple((f"o{i}", "b16") for i in range(r - 2)),
    )
    for r in RANKS
}

if not SIMULATING:
    from numba.cuda import types

    from numbatma._im2col_type import Im2colTensorMapType


OP = "tma_load_im2col"


def _require_im2col(desc):
    if not isinstance(desc, Im2colTensorMapType):
        from numbatma._types import TensorMapType

        if isinstance(desc, TensorMapType):
            fail(OP, f"the descriptor is a tiled TensorMap ({desc}); im2col loads need a numbatma.Im2colTensorMap "
                     f"(cuTensorMapEncodeIm2col). Use tma_load for tiled boxes.")
        fail(OP, f"the descriptor operand must be a numbatma.Im2colTensorMap, got {desc}")


def _require_tile(tile, desc):
    require_tile_matches(OP, tile, desc, "one im2col load of the descriptor",
                         f": pixels_per_column {desc.pixels_per_column} x channels_per_pixel {desc.channels_per_pixel}")


def _int_tuple(what, ty, count, rank, names):
    """A tuple of ``count`` integers (a bare integer when count is 1); returns the element types."""
    if count == 1 and isinstance(ty, types.Integer):
        return (ty,)
    if not isinstance(ty, types.BaseTuple):
        fail(OP, f"{what} must be a tuple of {count} integers ({names}), got {ty}")
    if len(ty) != count:
        fail(OP, f"the descriptor has rank {rank}, so {what} must have {count} entries ({names}), got {len(ty)}")
    for t in ty:
        require_int(OP, f"every entry of {what}", t)
    return tuple(ty)


_COORD_NAMES = {3: "n, w, c", 4: "n, h, w, c", 5: "n, d, h, w, c"}
_OFFSET_NAMES = {3: "w", 4: "h, w", 5: "d, h, w"}


def _operands(context, builder, ty, value, prefix, convert):
    if isinstance(ty, types.Integer):
        vals = [(ty, value)]
    else:
        vals = [(t, builder.extract_value(value, i)) for i, t in enumerate(ty)]
    vals = [convert(context, builder, t, v) for t, v in vals]
    return {f"{prefix}{i}": v for i, v in enumerate(reversed(vals))}  # innermost first


def _to_i16(context, builder, t, v):
    return context.cast(builder, v, t, types.uint16)


def _simulate(dst, desc, coords, offsets, bar):
    """Simulator semantics: the NumPy gather of ``numbatma.im2col.gather``, delivered like a tile load."""
    import numpy as np

    from numbatma.im2col import gather

    s = sim()
    rank = desc.rank
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    offsets = (offsets,) if np.isscalar(offsets) else tuple(offsets)
    if len(coords) != rank or len(offsets) != rank - 2:
        raise s.SimulatedMisuse(
            f"{OP}: the descriptor has rank {rank}: give {rank} coordinates ({_COORD_NAMES[rank]}) and {rank - 2} "
            f"offsets ({_OFFSET_NAMES[rank]}); got {len(coords)} and {len(offsets)}"
        )
    for o in offsets:
        if not 0 <= int(o) <= 0xFFFF:
            raise s.SimulatedMisuse(
                f"{OP}: offset {int(o)} does not fit the instruction's unsigned 16-bit offset operand; offsets are "
                f"filter taps (0, 1, ... times the dilation) added to the bounding box and the pixel position"
            )
    src = host_array(desc)
    tile = gather(
        src, coords, offsets,
        lower=desc.pixel_box_lower_corner, upper=desc.pixel_box_upper_corner,
        channels=desc.channels_per_pixel, pixels=desc.pixels_per_column, element_strides=desc.element_strides,
        nan_fill=(desc.oob_fill.value == "nan" and desc.dtype.kind == "f"),
    )
    raw = np.ascontiguousarray(tile).view(np.uint8).reshape(-1)
    out = np.asarray(dst).reshape(-1).view(np.uint8) if dst.flags.c_contiguous else None
    footprint = int(np.prod(desc.shared_shape)) * desc.dtype.itemsize
    if out is None or out.size != footprint:
        raise s.SimulatedMisuse(
            f"{OP}: the shared tile holds {dst.nbytes} bytes (C-contiguous: {dst.flags.c_contiguous}) but one load "
            f"of the descriptor occupies {footprint} bytes (shared shape {desc.shared_shape})"
        )
    chunks = tile_chunks(desc, desc.channels_per_pixel * desc.dtype.itemsize, raw.size)
    out.reshape(-1, 16)[chunks] = raw.reshape(-1, 16)
    site = s.caller_site()
    with s.lock:
        b, phase = sim_complete_tx(bar, raw.size)
        lo, hi = s.bounds(out)
        s.add_fill(lo, hi, f"the tile the im2col load at {site[0]}:{site[1]} fills (coordinates {coords}, "
                           f"offsets {offsets})", [(b, phase)])


@device_op(simulate=_simulate)
def tma_load_im2col(typingctx, dst, desc, coords, offsets, bar):
    """Start a TMA load in im2col mode: ``desc.pixels_per_column`` pixels x ``desc.channels_per_pixel`` channels of
    the channels-last tensor of ``desc`` into the shared tile ``dst``; completion is signalled on ``bar`` as
    ``desc.box_bytes`` transaction bytes.

    Emits the ``cp.async.bulk.tensor`` load in ``.im2col`` mode of the descriptor's rank r = 3, 4, 5 (PTX below):
    the coordinates go innermost first, ``{c, w, (h, (d,)) n}``, the offsets as ``{w_off, (h_off, (d_off))}``.

    ``coords`` = ``(n, [d, [h,]] w, c)`` in array order: the first pixel, a position in the offset-free bounding
    box (``desc``'s lower corner .. extent - 1 + upper corner along each spatial axis; may be negative: padding),
    and the first channel. ``offsets`` = one unsigned 16-bit filter tap per spatial dimension (array order; a
    plain integer for rank 3), added to the bounding box and to every pixel. Pixels run W fastest, wrapping
    inside the box to the next row, plane and image; pixels outside the tensor read as the descriptor's fill.

    The caller guarantees: one thread issues it; ``bar`` expects the bytes (``mbarrier_arrive_expect_tx`` with
    ``desc.box_bytes`` per load) in the phase being waited on; ``dst`` is aligned to 128 bytes (``8 * swizzle``
    with a swizzle); the start pixel lies inside the bounding box; nobody reads ``dst`` before waiting on
    ``bar``. Typing checks: ``desc`` is an Im2colTensorMap; ``dst`` is a C-contiguous shared array of its dtype,
    exactly one load in size when its shape is static; ``coords`` has ``rank`` integers and ``offsets``
    ``rank - 2``.
    """
    _require_im2col(desc)
    _require_tile(dst, desc)
    rank = desc.rank
    _int_tuple("coords", coords, rank, rank, _COORD_NAMES[rank])
    _int_tuple("offsets", offsets, rank - 2, rank, _OFFSET_NAMES[rank])
    require_barrier(OP, bar)

    def codegen(context, builder, sig, args):
        LOAD_IM2COL[rank].emit(
            builder,
            dst=shared_address(context, builder, sig.args[0], args[0]),
            tmap=descriptor_address(builder, args[1]),
            bar=barrier_address(context, builder, sig.args[4], args[4]),
            **_operands(context, builder, sig.args[2], args[2], "c", to_i32),
            **_operands(context, builder, sig.args[3], args[3], "o", _to_i16),
        )
        return context.get_dummy_value()

    return types.void(dst, desc, coords, offsets, bar), codegen


PTX = {f"tma_load_im2col(rank={r})": p for r, p in LOAD_IM2COL.items()}
