"""TMA tensor copies in tile mode (``cp.async.bulk.tensor``) and their bulk-group completion.

Coordinates are given in the array's own index order, like the descriptor's box (``(row, col)`` for a
2-D array); the PTX wants the innermost coordinate first, and the reversal happens here. Coordinates are
element offsets of the box's first element and may be negative or run past the end: the hardware fills
out-of-bounds elements of a load (zero or NaN, as the descriptor says) and drops them on a store.
"""
from __future__ import annotations

from ._asm import Ptx
from ._define import (
    SIMULATING,
    barrier_address,
    coords_types,
    descriptor_address,
    device_op,
    emit_only,
    require_barrier,
    require_int,
    require_literal_int,
    require_tensormap,
    require_tile_matches,
    shared_address,
    sim,
    to_i32,
)

RANKS = (1, 2, 3, 4, 5)


def _coord_list(rank):
    return ", ".join(f"$c{i}" for i in range(rank))


def _coord_ins(rank):
    return tuple((f"c{i}", "b32") for i in range(rank))


# -- the PTX: one description per rank ---------------------------------------------------------------
LOAD_TILE = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        f"[$dst], [$tmap, {{{_coord_list(r)}}}], [$bar];",
        ins=(("dst", "b32"), ("tmap", "b64")) + _coord_ins(r) + (("bar", "b32"),),
    )
    for r in RANKS
}
STORE_TILE = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.global.shared::cta.tile.bulk_group [$tmap, {{{_coord_list(r)}}}], [$src];",
        ins=(("tmap", "b64"),) + _coord_ins(r) + (("src", "b32"),),
    )
    for r in RANKS
}
# The same copies with an L2 cache policy (a 64-bit handle from createpolicy, see cache.py).
LOAD_TILE_HINT = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint "
        f"[$dst], [$tmap, {{{_coord_list(r)}}}], [$bar], $policy;",
        ins=(("dst", "b32"), ("tmap", "b64")) + _coord_ins(r) + (("bar", "b32"), ("policy", "b64")),
    )
    for r in RANKS
}
STORE_TILE_HINT = {
    r: Ptx(
        f"cp.async.bulk.tensor.{r}d.global.shared::cta.tile.bulk_group.L2::cache_hint "
        f"[$tmap, {{{_coord_list(r)}}}], [$src], $policy;",
        ins=(("tmap", "b64"),) + _coord_ins(r) + (("src", "b32"), ("policy", "b64")),
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


def _policy_operand(context, builder, sig, args, index):
    if len(sig.args) <= index:
        return {}
    return {"policy": context.cast(builder, args[index], sig.args[index], types.uint64)}


def _tile_load(op, ptx, dst, desc, coords, bar, policy=None):
    """Typing checks and lowering of a tile load (``ptx`` by rank), with an L2 policy operand if given."""
    require_tensormap(op, desc)
    require_tile_matches(op, dst, desc)
    coords_types(op, desc, coords)
    require_barrier(op, bar)
    operands = (dst, desc, coords, bar)
    if policy is not None:
        require_int(op, "the cache policy", policy)
        operands += (policy,)
    rank = desc.rank

    def codegen(context, builder, sig, args):
        ptx[rank].emit(
            builder,
            dst=shared_address(context, builder, sig.args[0], args[0]),
            tmap=descriptor_address(builder, args[1]),
            bar=barrier_address(context, builder, sig.args[3], args[3]),
            **_policy_operand(context, builder, sig, args, 4),
            **_coord_operands(context, builder, sig.args[2], args[2], rank),
        )
        return context.get_dummy_value()

    return types.void(*operands), codegen


def _tile_store(op, ptx, desc, coords, src, policy=None):
    """Typing checks and lowering of a tile store (``ptx`` by rank), with an L2 policy operand if given."""
    require_tensormap(op, desc)
    coords_types(op, desc, coords)
    require_tile_matches(op, src, desc)
    operands = (desc, coords, src)
    if policy is not None:
        require_int(op, "the cache policy", policy)
        operands += (policy,)
    rank = desc.rank

    def codegen(context, builder, sig, args):
        ptx[rank].emit(
            builder,
            tmap=descriptor_address(builder, args[0]),
            src=shared_address(context, builder, sig.args[2], args[2]),
            **_policy_operand(context, builder, sig, args, 3),
            **_coord_operands(context, builder, sig.args[1], args[1], rank),
        )
        return context.get_dummy_value()

    return types.void(*operands), codegen


@device_op(simulate=lambda dst, desc, coords, bar: sim().tma_load(dst, desc, coords, bar))
def tma_load(typingctx, dst, desc, coords, bar):
    """Start a TMA load of the box at ``coords`` of ``desc`` into the shared tile ``dst``; completion is
    signalled on ``bar`` as ``desc.box_bytes`` transaction bytes.

    Emits ``cp.async.bulk.tensor.<r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    [dst], [desc, {c_innermost, ...}], [bar];``.

    The caller guarantees: one thread issues it; ``bar`` expects the bytes (``mbarrier_arrive_expect_tx``
    with ``desc.box_bytes`` per load) in the phase being waited on; ``dst`` is aligned to 128 bytes
    (1024 for 128B swizzle: ``cuda.shared.array(shape, dtype, alignment=1024)``); nobody reads ``dst``
    before waiting on ``bar``. Typing checks: ``dst`` is a shared array of the descriptor's dtype and (when
    its shape is static) exactly one box in size; ``coords`` has one integer per dimension.
    """
    return _tile_load("tma_load", LOAD_TILE, dst, desc, coords, bar)


@device_op(simulate=lambda desc, coords, src: sim().tma_store(desc, coords, src))
def tma_store(typingctx, desc, coords, src):
    """Start a TMA store of the shared tile ``src`` to the box at ``coords`` of ``desc``, in the current
    bulk group. Emits ``cp.async.bulk.tensor.<r>d.global.shared::cta.tile.bulk_group [desc, {...}], [src];``.

    The caller guarantees: the threads that wrote ``src`` executed ``fence_proxy_async_shared_cta()``
    and then a block barrier before one thread issues the store; ``src`` is not overwritten before
    ``bulk_wait_group_read`` says the store has read it; ``bulk_commit_group()`` follows and
    ``bulk_wait_group(0)`` before the kernel relies on the data being in global memory.
    """
    return _tile_store("tma_store", STORE_TILE, desc, coords, src)


@device_op(simulate=lambda dst, desc, coords, bar, policy: sim().tma_load(dst, desc, coords, bar))
def tma_load_hinted(typingctx, dst, desc, coords, bar, policy):
    """``tma_load`` with an L2 cache policy (``policy`` from ``l2_policy_evict_first()`` etc.):
    ``cp.async.bulk.tensor.<r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint
    [dst], [desc, {...}], [bar], policy;``. Same caller guarantees as ``tma_load``."""
    return _tile_load("tma_load_hinted", LOAD_TILE_HINT, dst, desc, coords, bar, policy)


@device_op(simulate=lambda desc, coords, src, policy: sim().tma_store(desc, coords, src))
def tma_store_hinted(typingctx, desc, coords, src, policy):
    """``tma_store`` with an L2 cache policy: ``cp.async.bulk.tensor.<r>d.global.shared::cta.tile.bulk_group
    .L2::cache_hint [desc, {...}], [src], policy;``. Same caller guarantees as ``tma_store``."""
    return _tile_store("tma_store_hinted", STORE_TILE_HINT, desc, coords, src, policy)


@device_op(simulate=lambda: sim().bulk_commit_group())
def bulk_commit_group(typingctx):
    """``cp.async.bulk.commit_group;`` - close the current bulk group (the TMA stores issued by this
    thread since the last commit)."""
    return types.void(), emit_only(COMMIT_GROUP)


@device_op(prefer_literal=True, simulate=lambda n: sim().bulk_wait_group(n))
def bulk_wait_group(typingctx, n):
    """``cp.async.bulk.wait_group N;`` - wait until at most ``N`` of this thread's bulk groups are pending
    (their writes to global memory done). ``N`` is a compile-time constant in 0..63."""
    value = require_literal_int("bulk_wait_group", "N", n, 0, 63)
    return types.void(n), emit_only(WAIT_GROUP, n=value)


@device_op(prefer_literal=True, simulate=lambda n: sim().bulk_wait_group(n))
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
    "bulk_commit_group": COMMIT_GROUP,
    "bulk_wait_group": WAIT_GROUP,
    "bulk_wait_group_read": WAIT_GROUP_READ,
}
