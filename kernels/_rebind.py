"""Re-pointing a plan at other arrays of the same layout (:meth:`numbatma.kernels.Plan.rebind`): every descriptor,
view and array reference of the plan that lies inside an input array moves by that array's address change.
Used by the function forms' plan cache (:mod:`numbatma.kernels._plan_cache`).

Two steps. :func:`rebind_map` walks the plan once (its attributes, lists, tuples, dicts and objects of
numbatma.kernels' own classes; not arrays) and records where each descriptor, view, layout and argument
reference sits and which arguments' memory holds it: a small tree holding no objects, only attribute names,
indices and argument numbers. :func:`apply_moves` replays that tree for one set of moves, visiting only the
branches that hold something of an argument that moved. A plan keeps its tree until one of its attributes is
assigned (:class:`numbatma.kernels.Plan` forgets it then); each leaf is checked against the plan before it is
moved (kind, and address inside the argument's old memory), so a tree that no longer fits raises
:class:`NotRebindable` instead of moving the wrong thing.
"""
from __future__ import annotations

import enum
import numbers

import numpy as np

from numbatma import SIMULATING, ArrayLayout, DeviceView, TensorMap, kernel_view, layout_facts, layout_view

from ._launch import byte_extent

__all__ = ["NotRebindable", "Move", "moves_of", "rebind_map", "apply_moves", "is_scalar", "overlapping"]

_SCALARS = (numbers.Number, np.generic, str, bytes, enum.Enum, type(None))


class NotRebindable(Exception):
    """:meth:`Plan.rebind` cannot re-point this plan at the new arrays (:func:`run` then builds a new plan)."""


def is_scalar(value):
    """Whether ``value`` is a scalar argument (a number, NumPy scalar, string, enum member or None), decided once
    per type."""
    known = _scalar_types.get(type(value))
    if known is None:
        known = _scalar_types[type(value)] = isinstance(value, _SCALARS)
    return known


_scalar_types = {}


def _looks_like_array(value):
    return (isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")
            or hasattr(value, "__dlpack__") or hasattr(value, "_ary"))  # (_ary: the CUDA simulator's arrays)


class Move:
    """Argument ``i`` of a plan moved: it was ``old`` (laid out as ``old_facts``: :func:`numbatma.layout_facts`)
    and is now ``new``, ``delta`` bytes further (another object, or the same one at another address)."""

    __slots__ = ("old", "new", "old_facts", "delta", "_extent")

    def __init__(self, old, new, old_facts, new_facts):
        self.old, self.new, self.old_facts = old, new, old_facts
        self.delta = new_facts[0] - old_facts[0]
        self._extent = None

    def holds(self, ptr):
        """Whether ``ptr`` lies in the argument's old memory (or is its start: an empty array)."""
        if self._extent is None:
            self._extent = byte_extent(self.old_facts)
        lo, hi = self._extent
        return ptr == lo or lo <= ptr < hi


def moves_of(old, new, old_facts, new_facts):
    """A :class:`Move` per argument that moved, None for the others (and for scalars)."""
    return [None if fo is None or o is n and fo[0] == fn[0] else Move(o, n, fo, fn)
            for o, n, fo, fn in zip(old, new, old_facts, new_facts)]


def overlapping(extents):
    """The pairs ``(i, j)``, ``i < j``, of ``extents`` (``(lo, hi)`` per argument, None for a scalar) that share a
    byte (or start at the same address)."""
    pairs = []
    for j, b in enumerate(extents):
        if b is None:
            continue
        for i in range(j):
            a = extents[i]
            if a is not None and (a[0] < b[1] and b[0] < a[1] or a[0] == b[0]):
                pairs.append((i, j))
    return pairs


# -- the tree: (kind, mask, payload); mask: bit i set when argument i's memory holds something below -----------------
# kinds: "obj" / "list" / "dict" (fixed in place; payload: ((attribute or index or key, node), ...)), "tuple" (made
# again; same payload), and the leaves "tensormap" (re-pointed in place), "view", "layout", "array" (made again) and
# "ref" (an argument itself) whose payload is the arguments whose memory holds them (several: overlapping arguments).
_REMADE = ("view", "layout", "array", "ref", "tuple")


def rebind_map(plan, arguments, facts, skip=()):
    """The tree of ``plan`` for its current ``arguments`` (``facts``: their :func:`numbatma.layout_facts`, None for a
    scalar), its attributes in ``skip`` left out."""
    extents = [None if f is None else byte_extent(f) for f in facts]
    by_id = {}
    for i, a in enumerate(arguments):
        if facts[i] is not None:
            by_id.setdefault(id(a), []).append(i)
    walk = _Walk(extents, by_id)
    walk.seen[id(plan)] = None  # (a helper referring back to the plan: not walked twice)
    return walk.node_of_object(plan, skip)


class _Walk:
    def __init__(self, extents, by_id):
        self.extents = extents
        self.by_id = by_id
        self.seen = {}  # id(object) -> its node (an object reached twice is recorded at both places if remade)
        self.keep = []  # (the objects whose ids are in seen stay alive during the walk)

    def holders(self, ptr):
        return tuple(i for i, e in enumerate(self.extents) if e is not None and (ptr == e[0] or e[0] <= ptr < e[1]))

    def node(self, value):
        if is_scalar(value):
            return None
        if id(value) in self.by_id:
            return _leaf("ref", tuple(self.by_id[id(value)]))
        key = id(value)
        if key in self.seen:
            node = self.seen[key]
            return node if node is not None and node[0] in _REMADE else None  # (in place: fixed once)
        self.keep.append(value)
        self.seen[key] = None  # (a cycle back to this object: nothing more to record)
        node = self.seen[key] = self._node(value)
        return node

    def _node(self, value):
        if isinstance(value, TensorMap):  # (Im2colTensorMap included)
            return _leaf("tensormap", self.holders(value._layout.ptr))
        if isinstance(value, DeviceView):
            return _leaf("view", self.holders(value.layout.ptr))
        if isinstance(value, ArrayLayout):
            return _leaf("layout", self.holders(value.ptr))
        if isinstance(value, list):
            return _branch("list", [(i, self.node(item)) for i, item in enumerate(value)])
        if isinstance(value, tuple):
            return _branch("tuple", [(i, self.node(item)) for i, item in enumerate(value)])
        if isinstance(value, dict):
            return _branch("dict", [(k, self.node(item)) for k, item in value.items()])
        if _looks_like_array(value):
            try:
                ptr = layout_facts(value)[0]
            except Exception:  # noqa: BLE001 - not an array numbatma reads: left as it is
                return None
            return _leaf("array", self.holders(ptr))
        if type(value).__module__.startswith("numbatma.kernels") and hasattr(value, "__dict__"):
            return self.node_of_object(value)
        return None

    def node_of_object(self, obj, skip=()):
        return _branch("obj", [(name, self.node(item)) for name, item in vars(obj).items() if name not in skip])


def _leaf(kind, holders):
    if not holders:
        return None  # (in no argument's memory: never moves)
    mask = 0
    for i in holders:
        mask |= 1 << i
    return (kind, mask, holders)


def _branch(kind, children):
    children = tuple((k, n) for k, n in children if n is not None)
    if not children:
        return None
    mask = 0
    for _, n in children:
        mask |= n[1]
    return (kind, mask, children)


def apply_moves(tree, plan, moves):
    """Replay ``tree`` (:func:`rebind_map`) on ``plan`` for ``moves`` (:func:`moves_of`: a :class:`Move` per
    argument that moved, else None): whatever lies in an argument that moved is re-pointed, made again or replaced.
    Raises :class:`NotRebindable` (the plan is then in an undefined state) for an address inside two arguments that
    moved by different amounts, a view it cannot re-make, or a leaf that is not what the tree says."""
    mask = 0
    for i, m in enumerate(moves):
        if m is not None:
            mask |= 1 << i
    if tree is not None and tree[1] & mask:
        try:
            _Replay(moves, mask).fix_children(tree, plan)
        except (KeyError, IndexError) as exc:  # (an attribute or item the map knows is gone)
            raise NotRebindable(f"the plan changed since its arrays were mapped ({exc!r})") from None


class _Replay:
    def __init__(self, moves, mask):
        self.moves = moves
        self.mask = mask
        self.memo = {}  # id(old value) -> its replacement (an object reached twice is replaced once)
        self.keep = []

    def fix_children(self, node, container):
        kind, _, children = node
        mask = self.mask
        if kind == "obj":
            attrs = vars(container)
            for name, child in children:
                if child[1] & mask:
                    value = attrs[name]
                    new = self.fix(child, value)
                    if new is not value:
                        object.__setattr__(container, name, new)  # (frozen dataclasses included)
        elif kind == "tuple":
            items = list(container)
            for i, child in children:
                if child[1] & mask:
                    items[i] = self.fix(child, items[i])
            if any(a is not b for a, b in zip(items, container)):
                return type(container)(*items) if hasattr(container, "_fields") else type(container)(items)
        else:  # list, dict: in place
            for k, child in children:
                if child[1] & mask:
                    value = container[k]
                    new = self.fix(child, value)
                    if new is not value:
                        container[k] = new
        return container

    def fix(self, node, value):
        key = id(value)
        if key in self.memo:
            return self.memo[key]
        self.keep.append(value)
        self.memo[key] = value  # (a cycle back: as it is)
        kind = node[0]
        new = self.fix_children(node, value) if kind in ("obj", "list", "dict", "tuple") else self.leaf(node, value)
        self.memo[key] = new
        return new

    def move_of(self, holders, ptr):
        """The move of the argument(s) holding ``ptr`` (None: none of them moved), checking that the tree still
        fits (``ptr`` inside the old memory of the argument that moved) and that overlapping holders moved alike."""
        moved = [self.moves[i] for i in holders if self.moves[i] is not None]
        if not moved:
            return None
        first = moved[0]
        if not first.holds(ptr):
            raise NotRebindable(f"the plan changed since its arrays were mapped (address 0x{ptr:x})")
        if len(holders) > 1 and (any(m.delta != first.delta for m in moved)
                                 or len(moved) < len(holders) and first.delta != 0):
            raise NotRebindable(f"address 0x{ptr:x} lies inside two arguments that moved by different amounts")
        return first

    def leaf(self, node, value):
        kind, _, holders = node
        if kind == "ref":
            moved = [self.moves[i] for i in holders if self.moves[i] is not None]
            if any(m.old is not value for m in moved):
                raise NotRebindable("the plan changed since its arrays were mapped (an argument reference)")
            return moved[-1].new if moved else value
        if kind == "tensormap":
            if not isinstance(value, TensorMap):
                raise NotRebindable("the plan changed since its arrays were mapped (a TensorMap)")
            m = self.move_of(holders, value._layout.ptr)
            if m is not None:
                if value.array is m.old:
                    value.repoint(m.new)
                else:
                    value.repoint(layout_view(_shifted(value._layout, m), m.new))
            return value
        if kind == "view":
            if not isinstance(value, DeviceView):
                raise NotRebindable("the plan changed since its arrays were mapped (a DeviceView)")
            m = self.move_of(holders, value.layout.ptr)
            return value if m is None else DeviceView(_shifted(value.layout, m), m.new)
        if kind == "layout":
            if not isinstance(value, ArrayLayout):
                raise NotRebindable("the plan changed since its arrays were mapped (an ArrayLayout)")
            m = self.move_of(holders, value.ptr)
            return value if m is None else _shifted(value, m)
        # "array": an array object viewing an argument (the simulator's views; on a GPU: not re-makeable)
        try:
            layout = ArrayLayout(*layout_facts(value))
        except Exception:  # noqa: BLE001
            raise NotRebindable("the plan changed since its arrays were mapped (an array)") from None
        m = self.move_of(holders, layout.ptr)
        if m is None:
            return value
        if not SIMULATING:
            raise NotRebindable(f"the plan holds a {type(value).__name__} viewing an argument; only "
                                f"numbatma's own views (DeviceView, TensorMap) can be re-made")
        new_layout = _shifted(layout, m)
        return layout_view(new_layout, m.new) if isinstance(value, np.ndarray) else kernel_view(new_layout, m.new)


def _shifted(layout, m):
    return ArrayLayout(layout.ptr + m.delta, layout.shape, layout.strides, layout.dtype)
