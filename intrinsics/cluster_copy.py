"""Cluster-wide asynchronous copies: TMA multicast loads, asynchronous stores (STAS) and asynchronous
reductions into the shared memory of another CTA of the cluster, each completing transaction bytes on an
mbarrier of the CTA that receives the data.

* ``tma_load_multicast(dst, desc, coords, bar, mask)``: one TMA load whose box lands at the same shared
  offset in every CTA named in the 16-bit ``mask`` (bit ``r`` = cluster rank ``r``), completing
  ``desc.box_bytes`` on the barrier at ``bar``'s offset in each of those CTAs.
* ``st_async(addr, value, remote_bar)``: store a 32/64-bit scalar, a 2-tuple or a 4-tuple to a
  ``shared::cluster`` address; the bytes complete on ``remote_bar`` (in the same CTA as ``addr``).
* ``red_async(op, addr, value, remote_bar)``: the same for an atomic-like reduction
  (add/min/max/inc/dec/and/or/xor).
* Mask helpers: ``cluster_mask(rank)``, ``cluster_mask_all()``, ``cluster_mask_row()``,
  ``cluster_mask_column()``.

Addresses of ``st_async``/``red_async`` are uint32 ``shared::cluster`` addresses from ``mapa_shared``
(data) and ``mapa_barrier`` (barrier) of :mod:`numbatma.intrinsics.cluster`; adding a byte offset to a
``mapa_shared`` address addresses a later element of the same array in the same CTA.

Under the CUDA simulator a cluster has exactly one CTA: a multicast whose mask is 1 is an ordinary TMA
load; a mask naming another CTA raises ``NotImplementedError``. ``st.async`` and ``red.async`` need a
cluster of more than one CTA (PTX: ``%cluster_nctarank > 1``; ``red.async`` must target another CTA), so
under the simulator they raise :class:`~numbatma.intrinsics._sim.SimulatedMisuse` - on the GPU they would
be undefined in a one-CTA cluster.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from . import cluster as _cluster
from ._asm import Ptx
from ._define import SIMULATING, device_op, fail, sim, to_u32
from .tma import RANKS, coord_ins, coord_list, sim_load, tile_load

__all__ = [
    "cluster_mask",
    "cluster_mask_all",
    "cluster_mask_column",
    "cluster_mask_row",
    "red_async",
    "st_async",
    "tma_load_multicast",
]

# -- the PTX ------------------------------------------------------------------------------------------------
LOAD_MULTICAST = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        f"[$dst], [$tmap, {{{coord_list(r)}}}], [$bar], $mask;",
        ins=(("dst", "b32"), ("tmap", "b64")) + coord_ins(r) + (("bar", "b32"), ("mask", "b16")),
    )
    for r in RANKS
}

# st.async: (vector width, PTX type) -> Ptx. The PTX ISA allows .v2 with every type, .v4 with 32-bit types.
ST_ASYNC_FORMS = ((1, "b32"), (1, "b64"), (1, "f32"), (1, "f64"),
                  (2, "b32"), (2, "b64"), (2, "f32"), (2, "f64"),
                  (4, "b32"), (4, "f32"))


def _st_async_ptx(vec, ptype):
    names = [f"v{i}" for i in range(vec)]
    value = "$v0" if vec == 1 else "{" + ", ".join("$" + n for n in names) + "}"
    suffix = "" if vec == 1 else f".v{vec}"
    return Ptx(
        f"st.async.shared::cluster.mbarrier::complete_tx::bytes{suffix}.{ptype} [$addr], {value}, [$bar];",
        ins=(("addr", "b32"),) + tuple((n, ptype) for n in names) + (("bar", "b32"),),
    )


ST_ASYNC = {form: _st_async_ptx(*form) for form in ST_ASYNC_FORMS}

# red.async: the legal (op, PTX type) pairs of the PTX ISA.
RED_ASYNC_TYPES = {
    "inc": ("u32",),
    "dec": ("u32",),
    "min": ("u32", "s32"),
    "max": ("u32", "s32"),
    "and": ("b32",),
    "or": ("b32",),
    "xor": ("b32",),
    "add": ("u32", "s32", "u64"),
}
RED_ASYNC = {
    (op, ptype): Ptx(
        f"red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.{op}.{ptype} "
        f"[$addr], $value, [$bar];",
        ins=(("addr", "b32"), ("value", "b64" if ptype == "u64" else "b32"), ("bar", "b32")),
    )
    for op, ptypes in RED_ASYNC_TYPES.items()
    for ptype in ptypes
}


# -- value types (shared by the typer and the simulator) ----------------------------------------------------
# NumPy dtype name -> (st.async PTX type, bytes)
_ST_TYPES = {
    "int32": ("b32", 4), "uint32": ("b32", 4), "float32": ("f32", 4),
    "int64": ("b64", 8), "uint64": ("b64", 8), "float64": ("f64", 8),
}
# NumPy dtype name -> the red.async PTX type it means for each op family
_RED_INT = {"uint32": "u32", "int32": "s32", "uint64": "u64"}


def red_async_ptx_type(op, dtype_name):
    """The PTX type of ``red.async.<op>`` for a value of NumPy dtype ``dtype_name``, or raise ValueError
    with the rule (the legal pairs are ``RED_ASYNC_TYPES``)."""
    if op not in RED_ASYNC_TYPES:
        raise ValueError(f"the operation must be one of {', '.join(sorted(RED_ASYNC_TYPES))} (a string "
                         f"constant), got {op!r}")
    if op in ("and", "or", "xor"):
        if dtype_name in ("int32", "uint32"):
            return "b32"
    elif _RED_INT.get(dtype_name) in RED_ASYNC_TYPES[op]:
        return _RED_INT[dtype_name]
    legal = {"u32": ["uint32"], "s32": ["int32"], "u64": ["uint64"], "b32": ["int32", "uint32"]}
    names = [n for t in RED_ASYNC_TYPES[op] for n in legal[t]]
    wanted = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    hint = ""
    if dtype_name == "int64":
        hint = (" (an integer constant or int64 variable: cast it, e.g. np.uint32(v) or np.int32(v); "
                "int64 has no red.async form" + (", np.uint64 adds the same bits" if op == "add" else "") + ")")
    raise ValueError(f"red.async.{op} takes a value of type {wanted}, got {dtype_name}{hint}; the PTX ISA has "
                     f"red.async.{op} for {', '.join('.' + t for t in RED_ASYNC_TYPES[op])} only")


def _st_async_form(value_types):
    """(vector width, PTX type, bytes) of ``st.async`` for a tuple of NumPy dtype names; ValueError if none."""
    names = set(value_types)
    vec = len(value_types)
    if vec not in (1, 2, 4):
        raise ValueError(f"the value must be a scalar, a 2-tuple or a 4-tuple (st.async, .v2, .v4), got a "
                         f"{vec}-tuple")
    if len(names) != 1:
        raise ValueError(f"the elements of the value tuple must have one type, got {', '.join(value_types)}")
    name = value_types[0]
    if name not in _ST_TYPES:
        raise ValueError(f"st.async stores int32, uint32, float32, int64, uint64 or float64 values, got {name}"
                         f"; cast the value (e.g. np.int32(v))")
    ptype, size = _ST_TYPES[name]
    if (vec, ptype) not in ST_ASYNC:
        raise ValueError(f"st.async.v4 takes 32-bit elements only (the PTX ISA has no .v4 of 64-bit types), "
                         f"got 4 x {name}; use two 2-tuples")
    return vec, ptype, size * vec


def _mask_ranks(mask):
    return [r for r in range(16) if int(mask) >> r & 1]


if not SIMULATING:
    from numba.cuda import types


def _numpy_name(op, ty):
    """NumPy dtype name of a scalar Numba type (TypingError for other types)."""
    if isinstance(ty, (types.Integer, types.Float)):
        return str(ty.literal_type if isinstance(ty, types.Literal) else ty)
    fail(op, f"the value must be an integer or floating-point scalar (or a tuple of them), got {ty}")


def _require_cluster_address(op, what, ty):
    if not isinstance(ty, types.Integer):
        fail(op, f"{what} must be an integer shared::cluster address (from mapa_shared / mapa_barrier), got {ty}")


# -- TMA multicast -------------------------------------------------------------------------------------------
@device_op(simulate=lambda dst, desc, coords, bar, mask: _simulate_multicast(dst, desc, coords, bar, mask))
def tma_load_multicast(typingctx, dst, desc, coords, bar, mask):
    """Start a TMA load of the box at ``coords`` of ``desc`` into the shared tile ``dst`` of every CTA of
    the cluster whose rank bit is set in ``mask``; in each of them the box lands at ``dst``'s shared offset
    and completes ``desc.box_bytes`` transaction bytes on the mbarrier at ``bar``'s offset.

    Emits the ``cp.async.bulk.tensor`` tile load of the descriptor's rank with ``.multicast::cluster``
    (PTX below; the coordinates innermost first, ``mask`` its 16-bit CTA-mask operand).

    The caller guarantees: ``mask`` names only CTAs of the cluster (``0 < mask < 1 << nctarank``; the
    helpers ``cluster_mask*`` build such masks); ``dst`` and ``bar`` are at the same shared offsets in
    every destination CTA (the same kernel code declares them, so they are); every destination CTA's
    barrier is initialised (``mbarrier_init`` + ``fence_mbarrier_init`` + a cluster barrier, e.g.
    ``cluster_sync()``, before any CTA issues the multicast) and expects these bytes in the phase it waits
    on (``mbarrier_arrive_expect_tx(bar, desc.box_bytes)`` in each CTA, per multicast it receives);
    ``dst`` is aligned as for ``tma_load``; nobody reads ``dst`` before waiting on its own ``bar``; no CTA
    exits while a multicast into it may be in flight (``cluster_sync()`` before the end). Typing checks are
    those of ``tma_load`` plus an integer ``mask`` (a 16-bit operand: higher bits are dropped on the GPU and
    reported by the simulator).
    """
    return tile_load("tma_load_multicast", LOAD_MULTICAST, dst, desc, coords, bar, mask=mask)


def _simulate_multicast(dst, desc, coords, bar, mask):
    m = int(mask) & 0xFFFFFFFF
    if m == 0 or m > 0xFFFF:
        raise sim().SimulatedMisuse(
            f"tma_load_multicast: the CTA mask 0x{m:x} must be a 16-bit set of cluster ranks naming at least "
            f"one CTA (1..0xFFFF); on the GPU this is undefined")
    if m != 1:
        raise NotImplementedError(
            f"tma_load_multicast: the mask 0x{m:04x} names cluster rank(s) {_mask_ranks(m)}, but the CUDA "
            f"simulator runs every cluster as one CTA (rank 0, mask 0x1 = cluster_mask_all()); run this kernel "
            f"on a GPU (compute capability 9.0+) to multicast to other CTAs")
    sim_load(dst, desc, coords, bar)  # (the tile load's semantics, tma.py)


# -- st.async --------------------------------------------------------------------------------------------------
@device_op(simulate=lambda addr, value, remote_bar: _simulate_remote("st_async", addr, value, remote_bar))
def st_async(typingctx, addr, value, remote_bar):
    """Asynchronously store ``value`` to the ``shared::cluster`` address ``addr``; when the bytes land,
    they complete on the mbarrier at the ``shared::cluster`` address ``remote_bar`` (4 or 8 bytes per
    element: a scalar, a 2-tuple (``.v2``) or a 4-tuple (``.v4``, 32-bit elements only)).

    Emits ``st.async`` to shared::cluster with an mbarrier complete-tx, ``.v2`` / ``.v4`` for a 2- / 4-tuple
    (PTX below) - the PTX type follows the value's Numba type: int32/uint32 -> b32,
    int64/uint64 -> b64, float32 -> f32, float64 -> f64 (an integer constant is int64: 8 bytes; write
    ``np.int32(v)`` for 4). ``addr`` and ``remote_bar`` are 32-bit (a wider integer is truncated).

    The caller guarantees: ``addr`` (from ``mapa_shared``, plus a byte offset) and ``remote_bar`` (from
    ``mapa_barrier``) lie in the same CTA of the cluster; the cluster has more than one CTA (PTX:
    ``%cluster_nctarank > 1``, else undefined); ``addr`` is aligned to the store's size (8 bytes for
    ``.v2.b32``, 16 for ``.v4``); the receiving CTA's barrier is initialised before the store (a cluster
    barrier after ``mbarrier_init`` + ``fence_mbarrier_init``) and expects the bytes in the phase it waits
    on (``mbarrier_arrive_expect_tx`` / ``mbarrier_expect_tx`` in the receiving CTA); the receiving CTA reads
    the data only after waiting on that barrier, and does not exit while stores into it may be in flight
    (``cluster_sync()`` before the end). The complete-tx has release semantics at cluster scope.
    """
    op = "st_async"
    _require_cluster_address(op, "the destination address", addr)
    _require_cluster_address(op, "the remote barrier", remote_bar)
    if isinstance(value, types.BaseTuple):
        elems = tuple(value)
        if not elems:
            fail(op, "the value tuple is empty")
        names = tuple(_numpy_name(op, t) for t in elems)
    else:
        elems = (value,)
        names = (_numpy_name(op, value),)
    try:
        vec, ptype, _ = _st_async_form(names)
    except ValueError as e:
        fail(op, str(e))
    ptx = ST_ASYNC[(vec, ptype)]
    is_tuple = isinstance(value, types.BaseTuple)
    target = {"b32": types.uint32, "b64": types.uint64, "f32": types.float32, "f64": types.float64}[ptype]

    def codegen(context, builder, sig, args):
        vals = {}
        for i, t in enumerate(elems):
            v = builder.extract_value(args[1], i) if is_tuple else args[1]
            vals[f"v{i}"] = v if ptype in ("f32", "f64") else context.cast(builder, v, t, target)
        ptx.emit(
            builder,
            addr=to_u32(context, builder, sig.args[0], args[0]),
            bar=to_u32(context, builder, sig.args[2], args[2]),
            **vals,
        )
        return context.get_dummy_value()

    return types.void(addr, value, remote_bar), codegen


# -- red.async -------------------------------------------------------------------------------------------------
@device_op(prefer_literal=True,
           simulate=lambda op, addr, value, remote_bar: _simulate_remote("red_async", addr, value, remote_bar, op))
def red_async(typingctx, op, addr, value, remote_bar):
    """Asynchronously apply the reduction ``op`` with ``value`` to the ``shared::cluster`` address
    ``addr`` of another CTA of the cluster; when done, the operand's bytes (4, or 8 for uint64) complete on
    the mbarrier at ``remote_bar``.

    Emits the relaxed, cluster-scope ``red.async`` to shared::cluster with an mbarrier complete-tx, its
    ``.<op>.<type>`` from ``op`` and the value (PTX below). ``op`` is a string constant; the value's Numba
    type picks the type, and only the pairs the PTX ISA has are accepted: ``"add"``: uint32 (u32), int32
    (s32), uint64 (u64); ``"min"``/``"max"``: uint32, int32 (unsigned/signed comparison); ``"inc"``/``"dec"``:
    uint32 (``inc``: ``old >= value ? 0 : old + 1``; ``dec``: ``old == 0 or old > value ? value : old - 1``);
    ``"and"``/``"or"``/``"xor"``: int32 or uint32 (b32). Others are a typing error.

    The caller guarantees: ``addr`` and ``remote_bar`` lie in the same CTA, and that CTA is *not* the
    executing thread's own (PTX: undefined otherwise); ``addr`` is aligned to the operand size; the
    receiving CTA's barrier is initialised before (cluster barrier) and expects the bytes, one operand's
    worth per ``red_async``; the receiving CTA reads the location only after waiting on its barrier and does
    not exit while reductions into it may be in flight. The reduction is relaxed; the complete-tx has
    release semantics at cluster scope. Reductions from several CTAs into one location are atomic.
    """
    name = "red_async"
    if not isinstance(op, types.StringLiteral):
        fail(name, f"the operation must be a string constant (one of {', '.join(sorted(RED_ASYNC_TYPES))}), "
                   f"got {op}")
    _require_cluster_address(name, "the destination address", addr)
    _require_cluster_address(name, "the remote barrier", remote_bar)
    try:
        ptype = red_async_ptx_type(op.literal_value, _numpy_name(name, value))
    except ValueError as e:
        fail(name, str(e))
    ptx = RED_ASYNC[(op.literal_value, ptype)]
    target = types.uint64 if ptype == "u64" else types.uint32

    def codegen(context, builder, sig, args):
        ptx.emit(
            builder,
            addr=to_u32(context, builder, sig.args[1], args[1]),
            value=context.cast(builder, args[2], sig.args[2], target),
            bar=to_u32(context, builder, sig.args[3], args[3]),
        )
        return context.get_dummy_value()

    return types.void(op, addr, value, remote_bar), codegen


def _simulate_remote(op, addr, value, remote_bar, red_op=None):
    """st.async / red.async under the simulator: check the operands as the typer does, then report that a
    one-CTA cluster (all the simulator runs) makes the operation undefined on the GPU."""
    import numpy as np

    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    names = tuple(np.asarray(v).dtype.name for v in values)
    try:
        if red_op is None:
            _st_async_form(names)
        else:
            if len(values) != 1:
                raise ValueError(f"red.async takes a scalar value, got a {len(values)}-tuple")
            red_async_ptx_type(str(red_op), names[0])
    except ValueError as e:
        raise sim().SimulatedMisuse(f"{op}: {e}") from None
    rule = ("needs a cluster of more than one CTA (PTX: %cluster_nctarank > 1)" if red_op is None else
            "must target the shared memory of another CTA of the cluster")
    raise sim().SimulatedMisuse(
        f"{op} to shared::cluster address 0x{int(addr) & 0xFFFFFFFF:x}: {op.replace('_', '.')} {rule}; the CUDA "
        f"simulator runs every cluster as one CTA, where this is undefined on the GPU. Run this kernel on a "
        f"GPU (compute capability 9.0+) with numbatma.with_cluster(kernel, (n, 1, 1)), n >= 2")


# -- multicast masks -----------------------------------------------------------------------------------------------
@cuda.jit(device=True)
def cluster_mask(rank):
    """The multicast mask naming the one CTA of cluster rank ``rank`` (``1 << rank``; uint32)."""
    return np.uint32(np.uint32(1) << np.uint32(rank))


@cuda.jit(device=True)
def cluster_mask_all():
    """The multicast mask naming every CTA of the calling thread's cluster:
    ``(1 << cluster_nctarank()) - 1`` (uint32)."""
    return np.uint32((np.uint32(1) << np.uint32(_cluster.cluster_nctarank())) - np.uint32(1))


@cuda.jit(device=True)
def cluster_mask_row():
    """The multicast mask naming the CTAs of the calling CTA's cluster row: every CTA of the cluster with
    the caller's ``cluster_ctaid().y`` and ``.z`` (any ``.x``). Cluster ranks run x fastest
    (``rank = x + nx * (y + ny * z)``), so this is ``((1 << nx) - 1) << (nx * (y + ny * z))``."""
    cx, cy, cz = _cluster.cluster_ctaid()
    nx, ny, nz = _cluster.cluster_nctaid()
    row = (np.uint32(1) << np.uint32(nx)) - np.uint32(1)
    return np.uint32(row << np.uint32(nx * (cy + ny * cz)))


@cuda.jit(device=True)
def cluster_mask_column():
    """The multicast mask naming the CTAs of the calling CTA's cluster column: every CTA of the cluster
    with the caller's ``cluster_ctaid().x`` and ``.z`` (any ``.y``): bit ``x + nx * (j + ny * z)`` for each
    ``j < ny``."""
    cx, cy, cz = _cluster.cluster_ctaid()
    nx, ny, nz = _cluster.cluster_nctaid()
    mask = np.uint32(0)
    for j in range(ny):
        mask = np.uint32(mask | (np.uint32(1) << np.uint32(cx + nx * (j + ny * cz))))
    return mask


PTX = {
    **{f"tma_load_multicast(rank={r})": p for r, p in LOAD_MULTICAST.items()},
    **{f"st_async({'' if v == 1 else f'v{v}.'}{t})": p for (v, t), p in ST_ASYNC.items()},
    **{f"red_async({op}.{t})": p for (op, t), p in RED_ASYNC.items()},
}
