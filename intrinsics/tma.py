"""TMA tensor copies in tile mode (``cp.async.bulk.tensor``), reduce-stores (``cp.reduce.async.bulk.tensor``),
L2 prefetches of a box (``cp.async.bulk.prefetch.tensor``) and their bulk-group completion.

Coordinates are given in the array's own index order, like the descriptor's box (``(row, col)`` for a
2-D array); the PTX wants the innermost coordinate first, and the reversal happens here. Coordinates are
element offsets of the box's first element and may be negative or run past the end: the hardware fills
out-of-bounds elements of a load (zero or NaN, as the descriptor says) and drops them on a store.
"""
from __future__ import annotations

import numpy as np

from numbatma._shapes import tile_alignment

from . import _debug, bulk, mbarrier
from ._asm import Ptx
from ._define import (
    SIMULATING,
    barrier_address,
    coords_types,
    descriptor_address,
    device_op,
    emit_only,
    fail,
    require_barrier,
    require_exact_store_target,
    require_int,
    require_literal_int,
    require_tensormap,
    require_tile_matches,
    shared_address,
    sim,
    to_i32,
    to_u32,
)

__all__ = [
    "bulk_commit_group",
    "bulk_wait_group",
    "bulk_wait_group_read",
    "tma_load",
    "tma_load_hinted",
    "tma_prefetch",
    "tma_prefetch_hinted",
    "tma_reduce",
    "tma_reduce_hinted",
    "tma_store",
    "tma_store_hinted",
]

RANKS = (1, 2, 3, 4, 5)


def coord_list(rank):
    """``$c0, $c1, ...``: the coordinate operands of a rank-``rank`` tensor copy (also cluster_copy.py)."""
    return ", ".join(f"$c{i}" for i in range(rank))


def coord_ins(rank):
    """The b32 input operands ``c0..c{rank-1}`` of a rank-``rank`` tensor copy (also cluster_copy.py)."""
    return tuple((f"c{i}", "b32") for i in range(rank))


# -- the PTX: one description per rank ---------------------------------------------------------------
LOAD_TILE = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        f"[$dst], [$tmap, {{{coord_list(r)}}}], [$bar];",
        ins=(("dst", "b32"), ("tmap", "b64")) + coord_ins(r) + (("bar", "b32"),),
    )
    for r in RANKS
}
STORE_TILE = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.global.shared::cta.tile.bulk_group [$tmap, {{{coord_list(r)}}}], [$src];",
        ins=(("tmap", "b64"),) + coord_ins(r) + (("src", "b32"),),
    )
    for r in RANKS
}
# The same copies with an L2 cache policy (a 64-bit handle from createpolicy, see cache.py).
LOAD_TILE_HINT = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
        f"[$dst], [$tmap, {{{coord_list(r)}}}], [$bar], $policy;",
        ins=(("dst", "b32"), ("tmap", "b64")) + coord_ins(r) + (("bar", "b32"), ("policy", "b64")),
    )
    for r in RANKS
}
STORE_TILE_HINT = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.global.shared::cta.tile.bulk_group.L2::cache_hint "
        f"[$tmap, {{{coord_list(r)}}}], [$src], $policy;",
        ins=(("tmap", "b64"),) + coord_ins(r) + (("src", "b32"), ("policy", "b64")),
    )
    for r in RANKS
}
# Reduce-stores: each element of the box in global memory becomes ``old <op> tile element``.
REDUCE_OPS = ("add", "min", "max", "inc", "dec", "and", "or", "xor")
REDUCE_TILE = {
    (op, r): Ptx(
        f"cp.reduce.async.bulk.tensor.{r}d.global.shared::cta.{op}.tile.bulk_group "
        f"[$tmap, {{{coord_list(r)}}}], [$src];",
        ins=(("tmap", "b64"),) + coord_ins(r) + (("src", "b32"),),
    )
    for op in REDUCE_OPS
    for r in RANKS
}
REDUCE_TILE_HINT = {
    (op, r): Ptx(
        f"cp.reduce.async.bulk.tensor.{r}d.global.shared::cta.{op}.tile.bulk_group.L2::cache_hint "
        f"[$tmap, {{{coord_list(r)}}}], [$src], $policy;",
        ins=(("tmap", "b64"),) + coord_ins(r) + (("src", "b32"), ("policy", "b64")),
    )
    for op in REDUCE_OPS
    for r in RANKS
}
# The element types (the descriptor's TMA data type) each reduction is defined for (PTX ISA,
# cp.reduce.async.bulk.tensor: "valid combinations of .redOp and element type").
REDUCE_TYPES = {
    "add": ("UINT32", "INT32", "UINT64", "FLOAT32", "FLOAT16", "BFLOAT16"),
    "min": ("UINT32", "INT32", "UINT64", "INT64", "FLOAT16", "BFLOAT16"),
    "max": ("UINT32", "INT32", "UINT64", "INT64", "FLOAT16", "BFLOAT16"),
    "inc": ("UINT32",),
    "dec": ("UINT32",),
    # (PTX lists b64 too, but on an H200 a bitwise reduce through an INT64 descriptor stopped the kernel with
    # an illegal-instruction error while UINT64 worked: scripts/probe_reduce_ops.py; INT64 is refused here)
    "and": ("UINT32", "INT32", "UINT64"),
    "or": ("UINT32", "INT32", "UINT64"),
    "xor": ("UINT32", "INT32", "UINT64"),
}
# TMA data type -> the array dtypes that give it (for messages).
_TMA_TYPE_NAMES = {
    "UINT8": "uint8/int8/bool", "UINT16": "uint16/int16", "UINT32": "uint32", "INT32": "int32",
    "UINT64": "uint64", "INT64": "int64", "FLOAT16": "float16", "BFLOAT16": "bfloat16", "FLOAT32": "float32",
    "FLOAT64": "float64", "TFLOAT32": "float32 with tf32=True",
}
# L2 prefetch of a box: no shared memory, no completion.
PREFETCH_TILE = {
    r: Ptx(
        f"cp.async.bulk.prefetch.tensor.{r}d.L2.global.tile [$tmap, {{{coord_list(r)}}}];",
        ins=(("tmap", "b64"),) + coord_ins(r),
    )
    for r in RANKS
}
PREFETCH_TILE_HINT = {
    r: Ptx(
        f"cp.async.bulk.prefetch.tensor.{r}d.L2.global.tile.L2::cache_hint [$tmap, {{{coord_list(r)}}}], $policy;",
        ins=(("tmap", "b64"),) + coord_ins(r) + (("policy", "b64"),),
    )
    for r in RANKS
}
COMMIT_GROUP = Ptx("cp.async.bulk.commit_group;")
WAIT_GROUP = Ptx("cp.async.bulk.wait_group $n;", imm=("n",))
WAIT_GROUP_READ = Ptx("cp.async.bulk.wait_group.read $n;", imm=("n",))

if not SIMULATING:
    from numba.cuda import types


def _coord_operands(context, builder, sig_coords, coords_value, rank):
    """Lower a coordinate tuple (array order) to PTX operands c0..c{rank-1} (innermost first)."""
    if isinstance(sig_coords, types.Integer):
        vals = [(sig_coords, coords_value)]
    else:
        vals = [(t, builder.extract_value(coords_value, i)) for i, t in enumerate(sig_coords)]
    vals = [to_i32(context, builder, t, v) for t, v in vals]
    return {f"c{i}": v for i, v in enumerate(reversed(vals))}


def _debug_checks(context, builder, op, desc, sig_coords, coords_value, coords_index, tile=None, tile_index=None,
                  load=False):
    """Debug mode (``NUMBATMA_DEBUG=1``) only: the runtime checks of ``_debug.check_tma`` before the copy."""
    if isinstance(sig_coords, types.Integer):
        coords = [(sig_coords, coords_value)]
    else:
        coords = [(t, builder.extract_value(coords_value, i)) for i, t in enumerate(sig_coords)]
    _debug.check_tma(context, builder, op, desc, coords, tile=tile, load=load, coords_index=coords_index,
                     tile_index=tile_index)


def _policy_operand(context, builder, sig, args, index):
    if len(sig.args) <= index:
        return {}
    return {"policy": context.cast(builder, args[index], sig.args[index], types.uint64)}


def tile_load(op, ptx, dst, desc, coords, bar, policy=None, mask=None):
    """Typing checks and lowering of a tile load (``ptx`` by rank), with an L2 policy operand or a multicast
    CTA mask (``cluster_copy.tma_load_multicast``) as the last argument if given: (signature, codegen)."""
    require_tensormap(op, desc)
    require_tile_matches(op, dst, desc)
    coords_types(op, desc, coords)
    require_barrier(op, bar)
    operands = (dst, desc, coords, bar)
    if policy is not None:
        require_int(op, "the cache policy", policy)
        operands += (policy,)
    if mask is not None:
        require_int(op, "the CTA mask", mask)
        operands += (mask,)
    rank = desc.rank

    def codegen(context, builder, sig, args):
        if _debug.enabled():
            _debug_checks(context, builder, op, desc, sig.args[2], args[2], 2, load=True, tile_index=0,
                          tile=shared_address(context, builder, sig.args[0], args[0]))
        last = _policy_operand(context, builder, sig, args, 4)
        if mask is not None:
            last = {"mask": to_u32(context, builder, sig.args[4], args[4])}
        ptx[rank].emit(
            builder,
            dst=shared_address(context, builder, sig.args[0], args[0]),
            tmap=descriptor_address(builder, args[1]),
            bar=barrier_address(context, builder, sig.args[3], args[3]),
            **last,
            **_coord_operands(context, builder, sig.args[2], args[2], rank),
        )
        return context.get_dummy_value()

    return types.void(*operands), codegen


def _tile_store(op, ptx, desc, coords, src, policy=None, arg_shift=0):
    """Typing checks and lowering of a tile store (``ptx`` by rank), with an L2 policy operand if given
    (``arg_shift``: how many arguments of the kernel's call come before the descriptor)."""
    require_tensormap(op, desc)
    require_exact_store_target(op, desc)
    coords_types(op, desc, coords)
    require_tile_matches(op, src, desc)
    operands = (desc, coords, src)
    if policy is not None:
        require_int(op, "the cache policy", policy)
        operands += (policy,)
    rank = desc.rank

    def codegen(context, builder, sig, args):
        if _debug.enabled():
            _debug_checks(context, builder, op, desc, sig.args[1], args[1], 1 + arg_shift, tile_index=2 + arg_shift,
                          tile=shared_address(context, builder, sig.args[2], args[2]))
        ptx[rank].emit(
            builder,
            tmap=descriptor_address(builder, args[0]),
            src=shared_address(context, builder, sig.args[2], args[2]),
            **_policy_operand(context, builder, sig, args, 3),
            **_coord_operands(context, builder, sig.args[1], args[1], rank),
        )
        return context.get_dummy_value()

    return types.void(*operands), codegen


@device_op(simulate=lambda dst, desc, coords, bar: sim_load(dst, desc, coords, bar))
def tma_load(typingctx, dst, desc, coords, bar):
    """Start a TMA load of the box at ``coords`` of ``desc`` into the shared tile ``dst``; completion is
    signalled on ``bar`` as ``desc.box_bytes`` transaction bytes.

    Emits the ``cp.async.bulk.tensor`` tile load of the descriptor's rank, the coordinates innermost first
    (PTX below).

    The caller guarantees: one thread issues it; ``bar`` expects the bytes (``mbarrier_arrive_expect_tx``
    with ``desc.box_bytes`` per load) in the phase being waited on; ``dst`` is aligned to 128 bytes
    (1024 for 128B swizzle: ``cuda.shared.array(shape, dtype, alignment=1024)``); nobody reads ``dst``
    before waiting on ``bar``. Typing checks: ``dst`` is a shared array of the descriptor's dtype and (when
    its shape is static) exactly one box in size; ``coords`` has one integer per dimension.
    """
    return tile_load("tma_load", LOAD_TILE, dst, desc, coords, bar)


@device_op(simulate=lambda desc, coords, src: sim_store(desc, coords, src))
def tma_store(typingctx, desc, coords, src):
    """Start a TMA store of the shared tile ``src`` to the box at ``coords`` of ``desc``, in the current
    bulk group. Emits the ``cp.async.bulk.tensor`` tile store of the descriptor's rank into the bulk group
    (PTX below).

    The caller guarantees: the threads that wrote ``src`` executed ``fence_proxy_async_shared_cta()``
    and then a block barrier before one thread issues the store; ``src`` is not overwritten before
    ``bulk_wait_group_read`` says the store has read it; ``bulk_commit_group()`` follows and
    ``bulk_wait_group(0)`` before the kernel relies on the data being in global memory.

    Never outside the array: the hardware writes whole 16-byte units of each row, so a box reaching the end
    of a row whose byte length is not a multiple of 16 would also write the bytes after it. Such a
    descriptor is a typing error (also for ``tma_store_hinted`` and the reduces) unless its TensorMap was
    built with ``allow_store_overhang=True``; store the aligned part (``numbatma.aligned_columns``) and the
    rest with ordinary stores instead.
    """
    return _tile_store("tma_store", STORE_TILE, desc, coords, src)


@device_op(simulate=lambda dst, desc, coords, bar, policy: sim_load(dst, desc, coords, bar))
def tma_load_hinted(typingctx, dst, desc, coords, bar, policy):
    """``tma_load`` with an L2 cache policy (``policy`` from ``l2_policy_evict_first()`` etc.):
    ``cp.async.bulk.tensor.<r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint
    [dst], [desc, {...}], [bar], policy;``. Same caller guarantees as ``tma_load``."""
    return tile_load("tma_load_hinted", LOAD_TILE_HINT, dst, desc, coords, bar, policy)


@device_op(simulate=lambda desc, coords, src, policy: sim_store(desc, coords, src, "tma_store_hinted"))
def tma_store_hinted(typingctx, desc, coords, src, policy):
    """``tma_store`` with an L2 cache policy: ``cp.async.bulk.tensor.<r>d.global.shared::cta.tile.bulk_group
    .L2::cache_hint [desc, {...}], [src], policy;``. Same caller guarantees as ``tma_store``."""
    return _tile_store("tma_store_hinted", STORE_TILE_HINT, desc, coords, src, policy)


def reduce_type_error(op, tma_dtype):
    """Why PTX does not define the reduction ``op`` on elements of TMA data type ``tma_dtype`` (a driver
    ``CUtensorMapDataType`` suffix such as ``"FLOAT32"``), or None when it does."""
    if op not in REDUCE_OPS:
        return f"unknown reduction {op!r}; the reductions are {', '.join(repr(o) for o in REDUCE_OPS)}"
    allowed = REDUCE_TYPES[op]
    if tma_dtype in allowed:
        return None
    name = _TMA_TYPE_NAMES.get(tma_dtype, tma_dtype)
    message = (f"reduction {op!r} is not defined for {name} elements (the descriptor's TMA data type "
               f"{tma_dtype}); PTX defines {op!r} for {', '.join(_TMA_TYPE_NAMES[t] for t in allowed)} elements only")
    if op == "add" and tma_dtype == "INT64":
        message += ("; two's-complement addition gives the same bits for int64 and uint64, so describe the array "
                    "viewed as uint64 (TensorMap(array.view(np.uint64), ...))")
    elif op in ("and", "or", "xor") and tma_dtype == "INT64":
        message += ("; through an INT64 descriptor it stops the kernel on an H200 (scripts/probe_reduce_ops.py), "
                    "and the bits are the same for uint64: describe the array viewed as uint64 "
                    "(TensorMap(array.view(np.uint64), ...))")
    return message


def _reduce_op(op, kind, desc):
    """The reduction named by the literal string ``kind``, checked against the descriptor's element type."""
    if not (isinstance(kind, types.StringLiteral) and isinstance(kind.literal_value, str)):
        fail(op, f"the reduction must be a compile-time constant string (one of "
                 f"{', '.join(repr(o) for o in REDUCE_OPS)}), got {kind}")
    name = kind.literal_value
    if name not in REDUCE_OPS:
        fail(op, f"unknown reduction {name!r}; the reductions are {', '.join(repr(o) for o in REDUCE_OPS)}")
    require_tensormap(op, desc)
    error = reduce_type_error(name, desc.tma_dtype)
    if error:
        fail(op, error)
    return name


def _tile_reduce(op, ptx, kind, desc, coords, src, policy=None):
    """Typing checks and lowering of a reduce-store (``ptx`` by (reduction, rank))."""
    name = _reduce_op(op, kind, desc)
    sig, store_codegen = _tile_store(op, {r: ptx[(name, r)] for r in RANKS}, desc, coords, src, policy, arg_shift=1)

    def codegen(context, builder, sig, args):
        return store_codegen(context, builder, sig.replace(args=sig.args[1:]), args[1:])

    return types.void(kind, *sig.args), codegen


# -- simulator semantics of the tile copies ---------------------------------------------------------------------
def host_array(desc):
    """The NumPy array (sharing memory) behind a TensorMap's array under the simulator."""
    return sim().numpy_of(desc.array)


def _box_index(desc, coords):
    """Per dimension: the element indices of the box (may be out of bounds) and the in-bounds mask."""
    idx = []
    for c, b, e, n in zip(coords, desc.box, desc.element_strides, desc.shape):
        i = int(c) + e * np.arange(-(-b // e)) if e > 1 else int(c) + np.arange(b)
        idx.append((i, (i >= 0) & (i < n)))
    return idx


def tile_chunks(desc, row_bytes, nbytes):
    """Where each 16-byte chunk of the dense box (rows of ``row_bytes``) sits in the shared tile, in chunks:
    rows narrower than the swizzle span start a whole span apart, then the swizzle permutes the chunks (the
    simulator's byte placement of TMA loads and stores; also im2col.py's)."""
    span = int(desc.swizzle)
    c = np.arange(nbytes // 16)
    if not span:
        return c
    if row_bytes < span:  # each row takes a whole span (hardware, scripts/probe_swizzle_pad.py)
        per_row = row_bytes // 16
        c = (c // per_row) * (span // 16) + c % per_row
    return c ^ ((c >> 3) & (span // 16 - 1))


# (operand checks the GPU build makes while typing, and the hardware's runtime rules: the words of
# intrinsics/_define.py's typer checks, so a kernel the GPU refuses fails here the same way)
def _numba_array_name(value):
    dtype = getattr(value, "dtype", None)
    ndim = getattr(value, "ndim", None)
    if dtype is None or ndim is None:
        return type(value).__name__
    flags = getattr(value, "flags", None)
    layout = "C" if flags is None or flags.c_contiguous else ("F" if flags.f_contiguous else "A")
    return f"array({np.dtype(dtype).name}, {ndim}d, {layout})"


def _positions(op):
    """(tile, descriptor, coordinates): where the kernel's call to ``op`` passes them."""
    if op.startswith("tma_reduce"):
        return 3, 1, 2
    if op.startswith("tma_store"):
        return 2, 0, 1
    return 0, 1, 2


def _operand_names(op, tile, site):
    """The tile and the descriptor of the kernel's call to ``op`` on line ``site``, as messages name them."""
    s = sim()
    t, d, _ = _positions(op)
    desc = s.call_argument(site, op, d)
    return s.describe_array(tile, site, op, t), (f"'{desc}'" if desc else "the descriptor")


def _check_tile_operands(op, tile, desc, coords, load):
    """``tile`` a shared array of the descriptor's dtype, one integer coordinate per dimension (the typer's
    rules, in its words, after the kernel's file:line and followed by the operands' names); for a load the
    innermost start coordinate a whole number of 16 bytes, and the tile aligned as TMA needs (the hardware's
    rules: the GPU stops the kernel with an illegal-instruction error)."""
    s = sim()
    site = s.caller_site()
    at = f"{site[0]}:{site[1]}: {op}"
    if not isinstance(tile, s.SharedArray):
        raise s.SimulatedTypingError(
            f"{at}: the shared-memory tile must be a shared-memory array (from cuda.shared.array); got "
            f"{_numba_array_name(tile)}, which is not known to live in shared memory (a kernel argument, a local "
            f"array, or a value mixed from several arrays); the tile operand is {_operand_names(op, tile, site)[0]}")
    if tile.dtype != desc.dtype and not _same_bits(tile.dtype, np.dtype(desc.dtype)):
        raise s.SimulatedTypingError(f"{at}: the shared tile has dtype {tile.dtype} but the descriptor moves "
                                     f"{np.dtype(desc.dtype).name} elements; the tile is "
                                     f"{_operand_names(op, tile, site)[0]}")
    if len(coords) != desc.rank:
        raise s.SimulatedTypingError(
            f"{at}: the descriptor has rank {desc.rank} (box {tuple(desc.box)}) but {len(coords)} coordinates were "
            f"given; pass one coordinate per dimension, in the array's own index order; the descriptor is "
            f"{_operand_names(op, tile, site)[1]}, the coordinates {_coords_text(op, site, coords)}")
    for c in coords:
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
            got = np.asarray(c).dtype.name if isinstance(c, (float, np.generic)) else type(c).__name__
            raise s.SimulatedTypingError(
                f"{at}: every coordinate must be an integer, got {got}; the coordinates of descriptor "
                f"{_operand_names(op, tile, site)[1]} are {_coords_text(op, site, coords)}")
    itemsize = np.dtype(desc.dtype).itemsize
    if load and not getattr(desc, "interleave", 0) and (int(coords[-1]) * itemsize) % 16:
        step = 16 // int(np.gcd(16, itemsize))
        raise s.SimulatedMisuse(
            f"{op} at {_site_text()}: the innermost start coordinate of {tuple(int(c) for c in coords)} is "
            f"{int(coords[-1])} elements of {itemsize} bytes = {int(coords[-1]) * itemsize} bytes, not a multiple of "
            f"16 bytes; the GPU would stop the kernel with an illegal-instruction error "
            f"(CUDA_ERROR_ILLEGAL_INSTRUCTION) on this load. Start boxes at a column that is a multiple of {step}")
    align = tile_alignment(desc)
    address = int(tile.__array_interface__["data"][0])
    if address % align:
        need = "128 bytes" if align == 128 else f"{align} bytes (the repeat of its {int(desc.swizzle)}-byte swizzle)"
        site = getattr(tile, "__dict__", {}).get("_numbatma_site")
        declared = getattr(tile, "__dict__", {}).get("_numbatma_alignment")
        name = f"the shared tile {s.describe_site(site)}" if site else "the shared tile"
        raise s.SimulatedMisuse(
            f"{op} at {_site_text()}: {name} is at an address that is not a multiple of {need}, which TMA needs for "
            f"this descriptor"
            + (f" (it was declared with alignment={declared})" if declared else
               " (declared without alignment=, it may land anywhere)" if site else "")
            + f"; declare the buffer with alignment={align} and keep view offsets multiples of {align} bytes")


def _coords_text(op, site, coords):
    spelled = sim().call_argument(site, op, _positions(op)[2])
    return f"'{spelled}'" if spelled else str(tuple(coords))


def _same_bits(a, b):
    """Tile and descriptor dtypes the GPU build types alike: a bfloat16 / float8 descriptor moves the bits of a
    uint16 / uint8 tile (NumPy has no such dtype of its own)."""
    return a.itemsize == b.itemsize and ({a.name, b.name} & {"bfloat16", "float8_e4m3fn", "float8_e5m2"}) \
        and {a.kind, b.kind} <= {"u", "i", "V", "f"}


def _site_text():
    site = sim().caller_site()
    return f"{site[0]}:{site[1]}"


def sim_load(dst, desc, coords, bar):
    """A tile load (also ``tma_load_multicast`` to the CTA itself): the box, with out-of-bounds elements
    filled, lands swizzled in ``dst`` at once; its bytes complete on ``bar`` and are readable once that phase
    is known complete."""
    s = sim()
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    _check_tile_operands("tma_load", dst, desc, coords, True)
    src = host_array(desc)
    idx = _box_index(desc, coords)
    shape = tuple(len(i) for i, _ in idx)
    fill = np.nan if (getattr(desc.oob_fill, "value", desc.oob_fill) == "nan" and desc.dtype.kind == "f") else 0
    box = np.full(shape, fill, dtype=desc.dtype)
    inb = [m for _, m in idx]
    sel = np.ix_(*[i[m] for i, m in idx])
    box[np.ix_(*[np.nonzero(m)[0] for m in inb])] = src[sel]
    raw = np.ascontiguousarray(box).view(np.uint8).reshape(-1)
    out = np.asarray(dst).reshape(-1).view(np.uint8) if dst.flags.c_contiguous else None
    footprint = int(np.prod(desc.shared_shape)) * desc.dtype.itemsize
    if out is None or out.size != footprint:
        raise s.SimulatedMisuse(
            f"tma_load: the shared tile holds {dst.nbytes} bytes (C-contiguous: {dst.flags.c_contiguous}) but a box "
            f"of the descriptor occupies {footprint} bytes (shared shape {desc.shared_shape})"
        )
    chunks = tile_chunks(desc, box.shape[-1] * desc.dtype.itemsize, raw.size)
    out.reshape(-1, 16)[chunks] = raw.reshape(-1, 16)
    site = s.caller_site()
    with s.lock:
        b, phase = mbarrier.sim_complete_tx(bar, raw.size)
        lo, hi = s.bounds(out)
        fill_record = s.add_fill(lo, hi, f"the tile the TMA load at {site[0]}:{site[1]} fills (coordinates {coords}; "
                                         f"the tile: {s.describe_array(dst, site, 'tma_load', 0)})", [(b, phase)])
        fill_record.swizzle = int(desc.swizzle)


def tile_load_swizzles(array):
    """The TMA loads whose bytes ``array`` (a shared tile) currently holds: [(swizzle span, description)], for
    readers that interpret the bytes through a swizzle of their own (wgmma descriptors)."""
    s = sim()
    lo, hi = s.bounds(array)
    with s.lock:  # (asked by each of a warpgroup's 128 threads per descriptor: the answer kept until the next fill)
        state = s.block_state()
        cached = state.swizzle_cache.get((lo, hi))
        if cached is not None and cached[0] == state.fills_version:
            return cached[1]
        found = [(f.swizzle, f.what) for f in s.live_fills(lo, hi) if f.swizzle is not None]
        state.swizzle_cache[(lo, hi)] = (state.fills_version, found)
        return found


def sim_store(desc, coords, src_tile, op="tma_store", combine=None):
    """A tile store (or, with ``combine(old, tile)``, a tile reduce): the tile, un-swizzled, lands in the
    in-bounds part of the box, and clipped rows are completed to 16 bytes as on the hardware."""
    s = sim()
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    _check_tile_operands(op, src_tile, desc, coords, False)
    if desc.store_overhang and not getattr(desc, "allow_store_overhang", False):
        # The GPU build refuses this at typing time (require_exact_store_target): same rule, same words.
        from numbatma.tensormap import store_overhang_error

        raise s.SimulatedMisuse(store_overhang_error(op, desc.dtype.name, desc.dtype.itemsize, desc.store_overhang,
                                                     desc.shape[-1]))
    dst = host_array(desc)
    idx = _box_index(desc, coords)
    shape = tuple(len(i) for i, _ in idx)
    site = s.caller_site()
    with s.lock:
        lo, hi = s.bounds(src_tile)
        name = s.describe_array(src_tile, site, op, _positions(op)[0])
        s.check_store_source(lo, hi, op, f"{name}; the store at {site[0]}:{site[1]}")
        s.add_store_read(lo, hi, site, name)
    tile = np.ascontiguousarray(src_tile).reshape(-1).view(np.uint8)
    footprint = int(np.prod(desc.shared_shape)) * desc.dtype.itemsize
    if tile.size != footprint:
        raise s.SimulatedMisuse(f"{op}: the shared tile holds {tile.size} bytes but a box of the descriptor "
                                f"occupies {footprint} bytes (shared shape {desc.shared_shape})")
    nbytes = int(np.prod(shape)) * desc.dtype.itemsize
    raw = tile.reshape(-1, 16)[tile_chunks(desc, shape[-1] * desc.dtype.itemsize, nbytes)].reshape(-1)
    box = raw.view(desc.dtype).reshape(shape)
    sel = np.ix_(*[i[m] for i, m in idx])
    part = box[np.ix_(*[np.nonzero(m)[0] for _, m in idx])]
    if combine is None:
        dst[sel] = part
        _store_overhang(desc, dst, idx, box)
        return
    with s.lock, np.errstate(over="ignore", invalid="ignore"):  # (each element's update is atomic on the GPU)
        dst[sel] = combine(dst[sel], part)
        _store_overhang(desc, dst, idx, box, combine)


def _store_overhang(desc, dst, idx, box, combine=None):
    """The hardware completes each innermost row a store clips to the next 16-byte boundary (see
    ``TensorMap.store_overhang``; only reached when the TensorMap allowed it): write those bytes too, into the
    memory that follows the row. Reduces do the same (observed on an H200): ``combine(old, tile)`` gives what
    lands there."""
    extra = desc.store_overhang // desc.dtype.itemsize
    inner_ok = idx[-1][1]
    if not extra or desc.element_strides[-1] != 1 or inner_ok.all() or not inner_ok[-1:].size or inner_ok[-1]:
        return  # nothing clipped at the row's end
    first = int(np.nonzero(inner_ok)[0][-1]) + 1 if inner_ok.any() else 0
    if first == 0:
        return  # the box lies entirely past the row: nothing is written
    extra = min(extra, inner_ok.size - first)
    outer = [i[m] for i, m in idx[:-1]]
    if any(o.size == 0 for o in outer):
        return
    n = dst.shape[-1]
    end = int(dst.__array_interface__["data"][0]) + sum(int(o.max()) * st for o, st in zip(outer, dst.strides)) \
        + (n + extra) * dst.strides[-1]
    root = dst
    while isinstance(root.base, np.ndarray):
        root = root.base
    limit = sim().bounds(root)[1]
    if end > limit:
        raise sim().SimulatedMisuse(
            f"tma_store at coordinates {tuple(int(i[0]) for i, _ in idx)}: the hardware completes the clipped rows "
            f"to 16 bytes and would write {end - limit} byte(s) past the end of the destination's memory "
            f"(TensorMap.store_overhang = {desc.store_overhang}); leave room after the last row"
        )
    wide = np.lib.stride_tricks.as_strided(dst, shape=dst.shape[:-1] + (n + extra,), strides=dst.strides)
    inner_box = np.arange(first, first + extra)
    sel = np.ix_(*outer, np.arange(n, n + extra))
    values = box[np.ix_(*[np.nonzero(m)[0] for _, m in idx[:-1]], inner_box)]
    wide[sel] = values if combine is None else combine(wide[sel], values)


# -- simulator semantics of the reduce-stores and prefetches -------------------------------------------
def _sim_coords(op, desc, coords):
    coords = (coords,) if np.isscalar(coords) else tuple(coords)
    if len(coords) != desc.rank:
        raise TypeError(
            f"{op}: the descriptor has rank {desc.rank} (box {desc.box}) but {len(coords)} coordinates were given; "
            f"pass one coordinate per dimension, in the array's own index order"
        )
    return coords


def _sim_reduce(op, kind, desc, coords, src_tile):
    """The reduce-store happens when issued: the in-bounds part of the box in global memory becomes
    ``old <kind> tile``; the tile is recorded as read by the store until its bulk group is waited for."""
    s = sim()
    error = reduce_type_error(kind, getattr(desc, "tma_dtype", None))
    if error:
        raise TypeError(f"{op}: {error}")
    coords = _sim_coords(op, desc, coords)
    if any(int(c) < 0 for c in coords):
        raise s.SimulatedMisuse(
            f"{op}: coordinates {tuple(int(c) for c in coords)} are negative; on an H200 a tile reduce with a "
            f"negative coordinate stops the kernel with an illegal-instruction error (scripts/probe_reduce.py). "
            f"Boxes may hang over the end of the tensor, not over its start."
        )
    sim_store(desc, coords, src_tile, op, lambda old, new: s.reduce_elements(kind, old, new))  # (as bulk_reduce)


def _sim_prefetch(op, desc, coords):
    """A prefetch changes no data: the simulator only checks the coordinates."""
    _sim_coords(op, desc, coords)


@device_op(prefer_literal=True, simulate=lambda kind, desc, coords, src: _sim_reduce("tma_reduce", kind, desc,
                                                                                      coords, src))
def tma_reduce(typingctx, kind, desc, coords, src):
    """Start a TMA reduce-store of the shared tile ``src`` into the box at ``coords`` of ``desc``, in the
    current bulk group: every in-bounds element ``g`` of the box in global memory becomes ``g <kind> s`` with
    ``s`` the tile's element (out-of-bounds elements of the box are skipped).

    ``kind`` is a string constant: ``"add"``, ``"min"``, ``"max"``, ``"inc"`` (``g >= s ? 0 : g + 1``),
    ``"dec"`` (``g == 0 or g > s ? s : g - 1``), ``"and"``, ``"or"``, ``"xor"``. Emits the
    ``cp.reduce.async.bulk.tensor`` tile reduce of the descriptor's rank with ``.<kind>``, into the bulk group
    (PTX below).

    The descriptor's element type must be one PTX defines the reduction for (checked at typing time):
    add: uint32, int32, uint64, float32, float16, bfloat16; min/max: uint32, int32, uint64, int64, float16,
    bfloat16; inc/dec: uint32; and/or/xor: uint32, int32, uint64 (int64: view it as uint64; an INT64
    descriptor faulted on an H200).

    Coordinates must be >= 0: on an H200 a reduce whose box starts before the tensor (a negative coordinate
    in any dimension) stopped the kernel with an illegal-instruction error (``scripts/probe_reduce.py``);
    boxes hanging over the end are clipped. The simulator reports negative coordinates.

    Each element's update is atomic (``.relaxed.gpu``), so boxes of several CTAs may overlap; their order
    is not defined (floating-point sums may round differently from run to run). The caller guarantees what
    ``tma_store`` asks: the tile's writers fenced (``fence_proxy_async_shared_cta()``) and synchronised
    before one thread issues it; ``src`` is not overwritten before ``bulk_wait_group_read``;
    ``bulk_commit_group()`` and ``bulk_wait_group(0)`` before relying on the result.
    """
    return _tile_reduce("tma_reduce", REDUCE_TILE, kind, desc, coords, src)


@device_op(prefer_literal=True, simulate=lambda kind, desc, coords, src, policy: _sim_reduce(
    "tma_reduce_hinted", kind, desc, coords, src))
def tma_reduce_hinted(typingctx, kind, desc, coords, src, policy):
    """``tma_reduce`` with an L2 cache policy (``policy`` from ``l2_policy_evict_first()`` etc.):
    ``cp.reduce.async.bulk.tensor.<r>d.global.shared::cta.<kind>.tile.bulk_group.L2::cache_hint
    [desc, {...}], [src], policy;``. Same element types and caller guarantees as ``tma_reduce``."""
    return _tile_reduce("tma_reduce_hinted", REDUCE_TILE_HINT, kind, desc, coords, src, policy)


def _tile_prefetch(op, ptx, desc, coords, policy=None):
    require_tensormap(op, desc)
    coords_types(op, desc, coords)
    operands = (desc, coords)
    if policy is not None:
        require_int(op, "the cache policy", policy)
        operands += (policy,)
    rank = desc.rank

    def codegen(context, builder, sig, args):
        if _debug.enabled():
            _debug_checks(context, builder, op, desc, sig.args[1], args[1], 1)
        ptx[rank].emit(
            builder,
            tmap=descriptor_address(builder, args[0]),
            **_policy_operand(context, builder, sig, args, 2),
            **_coord_operands(context, builder, sig.args[1], args[1], rank),
        )
        return context.get_dummy_value()

    return types.void(*operands), codegen


@device_op(simulate=lambda desc, coords: _sim_prefetch("tma_prefetch", desc, coords))
def tma_prefetch(typingctx, desc, coords):
    """Start bringing the box at ``coords`` of ``desc`` into the L2 cache:
    ``cp.async.bulk.prefetch.tensor.<r>d.L2.global.tile [desc, {...}];``.

    A hint with no completion and no shared memory: a later ``tma_load`` of the box may find it in L2.
    Boxes partly or wholly out of bounds are allowed (nothing is fetched for the missing part). Any thread
    may issue it; it changes no data."""
    return _tile_prefetch("tma_prefetch", PREFETCH_TILE, desc, coords)


@device_op(simulate=lambda desc, coords, policy: _sim_prefetch("tma_prefetch_hinted", desc, coords))
def tma_prefetch_hinted(typingctx, desc, coords, policy):
    """``tma_prefetch`` with an L2 cache policy: ``cp.async.bulk.prefetch.tensor.<r>d.L2.global.tile
    .L2::cache_hint [desc, {...}], policy;`` (e.g. ``l2_policy_evict_last()`` for a box read again soon)."""
    return _tile_prefetch("tma_prefetch_hinted", PREFETCH_TILE_HINT, desc, coords, policy)


@device_op(simulate=lambda: bulk.sim_commit_group())
def bulk_commit_group(typingctx):
    """``cp.async.bulk.commit_group;`` - close the current bulk group (the TMA stores issued by this
    thread since the last commit)."""
    return types.void(), emit_only(COMMIT_GROUP)


@device_op(prefer_literal=True, simulate=lambda n: bulk.sim_wait_group(n))
def bulk_wait_group(typingctx, n):
    """``cp.async.bulk.wait_group N;`` - wait until at most ``N`` of this thread's bulk groups are pending
    (their writes to global memory done). ``N`` is a compile-time constant in 0..63."""
    value = require_literal_int("bulk_wait_group", "N", n, 0, 63)
    return types.void(n), emit_only(WAIT_GROUP, n=value)


@device_op(prefer_literal=True, simulate=lambda n: bulk.sim_wait_group(n))
def bulk_wait_group_read(typingctx, n):
    """``cp.async.bulk.wait_group.read N;`` - wait until at most ``N`` bulk groups still *read* their shared
    source, so that shared memory may be reused. ``N`` is a compile-time constant in 0..63."""
    value = require_literal_int("bulk_wait_group_read", "N", n, 0, 63)
    return types.void(n), emit_only(WAIT_GROUP_READ, n=value)


PTX = {
    **{f"tma_load(rank={r})": p for r, p in LOAD_TILE.items()},
    **{f"tma_store(rank={r})": p for r, p in STORE_TILE.items()},
    **{f"tma_load_hinted(rank={r})": p for r, p in LOAD_TILE_HINT.items()},
    **{f"tma_store_hinted(rank={r})": p for r, p in STORE_TILE_HINT.items()},
    **{f"tma_reduce(kind={op!r}, rank={r})": p for (op, r), p in REDUCE_TILE.items()},
    **{f"tma_reduce_hinted(kind={op!r}, rank={r})": p for (op, r), p in REDUCE_TILE_HINT.items()},
    **{f"tma_prefetch(rank={r})": p for r, p in PREFETCH_TILE.items()},
    **{f"tma_prefetch_hinted(rank={r})": p for r, p in PREFETCH_TILE_HINT.items()},
    "bulk_commit_group": COMMIT_GROUP,
    "bulk_wait_group": WAIT_GROUP,
    "bulk_wait_group_read": WAIT_GROUP_READ,
}
