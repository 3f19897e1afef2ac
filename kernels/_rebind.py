"""Re-pointing a plan at other arrays of the same layout (:meth:`numbatma.kernels.Plan.rebind`): every descriptor,
view and array reference of the plan that lies inside an input array moves by that array's address change.
Used by the function forms' plan cache (:mod:`numbatma.kernels._plan_cache`).

Two steps. :func:`rebind_map` walks the plan once (its attributes, lists, tuples, dicts and objects of
numbatma.kernels' own classes; not arrays) and records where each descriptor, view, layout and argument
reference sits and which arguments' memory holds it: a small tree holding no objects, only attribute names,
indices and argument numbers, and - where the tree allows it (no tuple to remake, no remade object reached twice) -
the same as a flat program: per container (reached from the plan by a path of attribute names, indices and keys)
its leaves, each with the argument holding it and that argument's byte extent relative to its address.
:meth:`RebindMap.replay` moves the plan for one set of new arguments: through the program, compiled on first use
into one Python function (:func:`_compile`: per argument whether and by how much it moved, per container the leaves
of the arguments that moved; what the function forms run on every call with other arrays), else through the tree
(:func:`apply_moves`: visiting only the branches of arguments that moved). A plan keeps its map until one of its
attributes is assigned (:class:`numbatma.kernels.Plan` forgets it then); each leaf is checked against the plan
before it is moved (kind, and address inside the argument's old memory), so a map that no longer fits raises
:class:`NotRebindable` instead of moving the wrong thing. Only the address moves: a descriptor is re-pointed in
place (``cuTensorMapReplaceAddress`` on its own encoded ``CUtensorMap``), a view or layout is made again at the new
address, from the old one (the argument's layout is the one the plan was built for: the caller checked).
"""
from __future__ import annotations

import enum
import numbers

import numpy as np

from numbatma import SIMULATING, ArrayLayout, DeviceView, TensorMap, kernel_view, layout_facts, layout_view

from ._launch import byte_extent

__all__ = ["NotRebindable", "Move", "RebindMap", "moves_of", "rebind_map", "apply_moves", "is_scalar",
           "overlapping"]

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
    cls = type(value)
    if (isinstance(value, np.ndarray) or hasattr(cls, "__cuda_array_interface__") or hasattr(cls, "__dlpack__")
            or hasattr(value, "_ary")):  # (_ary: the CUDA simulator's arrays)
        return True
    try:  # (an interface set on the instance; the class checks above do not run a property, which may raise -
        # torch's does for a tensor that requires grad)
        return hasattr(value, "__cuda_array_interface__")
    except Exception:  # noqa: BLE001 - an interface that refuses to be read is still an array's
        return True


class Move:
    """Argument ``i`` of a plan moved: it was ``old`` (laid out as ``old_facts``: :func:`numbatma.layout_facts`)
    and is now ``new``, ``delta`` bytes further (another object, or the same one at another address)."""

    __slots__ = ("old", "new", "old_facts", "ptr", "delta", "_extent")

    def __init__(self, old, new, old_facts, new_facts):
        self.old, self.new, self.old_facts = old, new, old_facts
        self.ptr = old_facts[0]
        self.delta = new_facts[0] - self.ptr
        self._extent = None

    def holds(self, ptr):
        """Whether ``ptr`` lies in the argument's old memory (or is its start: an empty array)."""
        if self._extent is None:
            self._extent = byte_extent(self.old_facts)
        lo, hi = self._extent
        return ptr == lo or lo <= ptr < hi


def moves_of(old, new, old_facts, new_facts):
    """A :class:`Move` per argument that moved, None for the others (and for scalars)."""
    moves = []
    for o, n, fo, fn in zip(old, new, old_facts, new_facts):
        moves.append(None if fo is None or o is n and fo[0] == fn[0] else Move(o, n, fo, fn))
    return moves


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


class RebindMap:
    """The map of a plan (:func:`rebind_map`): ``tree`` and, where the tree allows it, ``program`` (see the module
    docstring; None otherwise). :meth:`replay` moves the plan; the program is compiled into one Python function for
    that on first use (see :func:`_compile`)."""

    __slots__ = ("tree", "program", "_replay")

    def __init__(self, tree, program):
        self.tree, self.program, self._replay = tree, program, None

    def replay(self, plan, old, new, old_facts, new_facts):
        """Move ``plan`` from the arguments ``old`` (laid out as ``old_facts``: :func:`numbatma.layout_facts`, None
        for a scalar) to ``new`` (``new_facts``; each array of the layout it replaces): whatever lies in an argument
        that moved (another object, or another address) is re-pointed, made again or replaced. Returns whether any
        argument moved. Raises :class:`NotRebindable` (the plan is then in an undefined state) for an address inside
        two arguments that moved by different amounts, a view it cannot re-make, or a leaf that is not what the map
        says."""
        replay = self._replay
        if replay is None:
            if self.program is None:
                return apply_moves(self, plan, moves_of(old, new, old_facts, new_facts))
            replay = self._replay = _compile(self.program, old_facts)
        try:
            return replay(plan, old, new, old_facts, new_facts)
        except (KeyError, IndexError) as exc:  # (an attribute or item the map knows is gone)
            raise NotRebindable(f"the plan changed since its arrays were mapped ({exc!r})") from None


def rebind_map(plan, arguments, facts, skip=()):
    """The :class:`RebindMap` of ``plan`` for its current ``arguments`` (``facts``: their
    :func:`numbatma.layout_facts`, None for a scalar), its attributes in ``skip`` left out."""
    extents = [None if f is None else byte_extent(f) for f in facts]
    by_id = {}
    for i, a in enumerate(arguments):
        if facts[i] is not None:
            by_id.setdefault(id(a), []).append(i)
    walk = _Walk(extents, by_id, skip)
    walk.seen[id(plan)] = None  # (a helper referring back to the plan: not walked twice)
    tree = walk.node_of_object(plan, skip)
    offsets = [None if e is None else (e[0] - f[0], e[1] - f[0]) for e, f in zip(extents, facts)]
    return RebindMap(tree, _program(tree, offsets))


class _Walk:
    def __init__(self, extents, by_id, skip=()):
        self.extents = extents
        self.by_id = by_id
        self.skip = skip  # (left out of every object: a sub-plan's bookkeeping - its prepared launch's record of
        # the arguments it was prepared with must stay as it was, so that its next launch sees what moved)
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
            return _leaf("tensormap", self.holders(value._ptr))
        if isinstance(value, DeviceView):
            return _leaf("view", self.holders(value._ptr))
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
            return self.node_of_object(value, self.skip)
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


def _program(tree, offsets):
    """The flat program of ``tree`` (see the module docstring), or None where the tree holds a tuple to remake or a
    remade object reached twice. ``offsets``: per argument, its byte extent relative to its address (None: a
    scalar). The program: ``((path, mask, is_object, leaves), ...)``, one entry per container holding leaves, where
    ``path`` is ``((in_object, key), ...)`` from the plan (an attribute where ``in_object``, else an item), ``mask``
    the arguments below, ``is_object`` whether the leaves are attributes, and each leaf ``(key, kind, bit, i, lo,
    hi)``: its place in the container, its kind, and the argument ``i`` holding it (``bit = 1 << i``), ``[lo, hi)``
    that argument's extent relative to its address; a leaf inside several arguments has ``i`` None, ``lo`` its
    holders and ``hi`` ``((i, lo, hi), ...)`` for each (they must have moved alike)."""
    if tree is None:
        return ()
    program, remade = [], set()

    def visit(node, path, is_object):
        kind, mask, children = node
        leaves = []
        for key, child in children:
            ckind = child[0]
            if ckind == "tuple":
                return False
            if ckind in ("obj", "list", "dict"):
                if not visit(child, path + ((is_object, key),), ckind == "obj"):
                    return False
                continue
            if ckind != "tensormap":
                if id(child) in remade:  # (the same remade object reached twice: the tree's memo)
                    return False
                remade.add(id(child))
            holders = child[2]
            if len(holders) == 1:
                i = holders[0]
                leaves.append((key, ckind, child[1], i) + offsets[i])
            else:
                leaves.append((key, ckind, child[1], None, holders, tuple((i,) + offsets[i] for i in holders)))
        if leaves:
            cmask = 0
            for leaf in leaves:
                cmask |= leaf[2]
            program.append((path, cmask, is_object, tuple(leaves)))
        return True

    return tuple(program) if visit(tree, (), True) else None


def apply_moves(rmap, plan, moves):
    """Replay ``rmap``'s tree (:func:`rebind_map`) on ``plan`` for ``moves`` (:func:`moves_of`: a :class:`Move` per
    argument that moved, else None): whatever lies in an argument that moved is re-pointed, made again or replaced;
    returns whether any argument moved. Raises as :meth:`RebindMap.replay`. (What ``replay`` does where the map has
    no program; the program's compiled function does the same.)"""
    mask, bit = 0, 1
    for m in moves:
        if m is not None:
            mask |= bit
        bit <<= 1
    tree = rmap.tree
    if tree is None or not tree[1] & mask:
        return bool(mask)
    try:
        _Replay(moves, mask).fix_children(tree, plan)
    except (KeyError, IndexError) as exc:  # (an attribute or item the map knows is gone)
        raise NotRebindable(f"the plan changed since its arrays were mapped ({exc!r})") from None
    return True


def _compile(program, facts):
    """``replay(plan, old, new, old_facts, new_facts) -> moved``: the program as one Python function (written out
    and compiled once per map; what the function forms run on every call with other arrays). Per argument ``i`` that
    is an array (``facts``: the map's, None for a scalar) it computes once whether it moved (``m{i}``: another object
    or another address) and by how much (``d{i}``); per container of the program, reached by its path only when one
    of its arguments moved, each leaf is checked and moved by the helpers below (no object per move, no dispatch).
    A leaf inside several arguments goes through :func:`_several`. The keys of the paths and leaves are constants of
    the function's namespace, never written into its text."""
    consts, lines = [], ["def replay(plan, old, new, old_facts, new_facts):"]

    def const(value):
        consts.append(value)
        return f"K[{len(consts) - 1}]"

    arrays = [i for i, f in enumerate(facts) if f is not None]
    for i in arrays:
        lines += [f"    o{i} = old[{i}]; n{i} = new[{i}]; p{i} = old_facts[{i}][0]; d{i} = new_facts[{i}][0] - p{i}",
                  f"    m{i} = d{i} or o{i} is not n{i}"]
    for path, cmask, is_object, leaves in program:
        holders = [i for i in arrays if cmask >> i & 1]
        lines.append(f"    if {' or '.join(f'm{i}' for i in holders) or 'False'}:")
        lines.append("        c = plan")
        for in_object, key in path:
            lines.append(f"        c = vars(c)[{const(key)}]" if in_object else f"        c = c[{const(key)}]")
        lines.append("        st = vars(c)" if is_object else "        st = c")
        for key, kind, bit, i, lo, hi in leaves:
            k = const(key)
            if i is None:  # (inside several arguments)
                lines += [f"        v = st[{k}]",
                          f"        w = several(v, {const(kind)}, {const(lo)}, {const(hi)}, old, new, old_facts, "
                          f"new_facts)",
                          f"        if w is not v: st[{k}] = w"]
            elif kind == "ref":
                lines += [f"        if m{i}:",
                          f"            if st[{k}] is not o{i}: stale_ref()",
                          f"            st[{k}] = n{i}"]
            elif kind == "tensormap":  # (in place)
                lines.append(f"        if m{i}: tensormap(st[{k}], o{i}, n{i}, p{i}, d{i}, {lo}, {hi})")
            else:
                lines.append(f"        if m{i}: st[{k}] = {kind}(st[{k}], o{i}, n{i}, p{i}, d{i}, {lo}, {hi})")
    lines.append(f"    return {' or '.join(f'm{i}' for i in arrays) or 'False'}")
    scope = dict(K=tuple(consts), several=_several, stale_ref=_stale_ref, **_LEAVES)  # (a leaf's kind: its helper)
    text = "\n".join(lines)
    exec(compile(text, "<numbatma rebind replay>", "exec"), scope)  # noqa: S102 - see the docstring
    replay = scope["replay"]
    replay.source = text  # (for reading: tests, debugging)
    return replay


def _several(value, kind, holders, spec, old, new, old_facts, new_facts):
    """A leaf of ``kind`` inside several arguments (``holders``; ``spec``: ``((i, lo, hi), ...)``): moved with them when
    they moved alike (the rules of ``_Replay.move_of``), else :class:`NotRebindable`."""
    if kind == "ref":  # (the same argument passed several times)
        return _Replay(moves_of(old, new, old_facts, new_facts), -1).leaf((kind, 0, holders), value)
    first = None
    still = False
    for i, lo, hi in spec:
        o, n, ptr = old[i], new[i], old_facts[i][0]
        delta = new_facts[i][0] - ptr
        if not delta and o is n:
            still = True
        elif first is None:
            first = (o, n, ptr, delta, lo, hi)
        elif delta != first[3]:
            break
    else:
        if first is None:
            return value
        if not still or not first[3]:
            return _LEAVES[kind](value, *first)
    raise NotRebindable("an address lies inside two arguments that moved by different amounts")


def _stale_ref():
    raise NotRebindable("the plan changed since its arrays were mapped (an argument reference)")


def _held(ptr, base, lo, hi):
    """Check that ``ptr`` lies in the old memory of an argument that was at ``base`` (``[lo, hi)``: its extent
    relative to ``base``; or its start: an empty array)."""
    offset = ptr - base
    if not (lo <= offset < hi or offset == lo):
        raise NotRebindable(f"the plan changed since its arrays were mapped (address 0x{ptr:x})")


# The leaves' moves: ``(value, old, new, ptr, delta, lo, hi)`` for a leaf inside the argument ``old`` (at ``ptr``,
# extent ``[lo, hi)`` relative to it) that is now ``new``, ``delta`` bytes further; each returns the leaf's new value.
def _moved_ref(value, old, new, ptr, delta, lo, hi):
    if value is not old:
        _stale_ref()
    return new


def _moved_tensormap(value, old, new, ptr, delta, lo, hi):
    """Re-point the TensorMap ``value`` in place: its array is the new argument, or its view (a
    :class:`numbatma.DeviceView`, the simulator's NumPy view) made again there. (The argument's layout is the one the
    plan was built for: only the address moves.)"""
    if not isinstance(value, TensorMap):
        raise NotRebindable("the plan changed since its arrays were mapped (a TensorMap)")
    at = value._ptr
    _held(at, ptr, lo, hi)
    array = value._array
    if array is old:
        array = new
    elif type(array) is DeviceView:
        array = array._at(delta, new)
    else:
        array = layout_view(value._layout._shifted(delta), new)
    value._moved(array, at + delta)
    return value


def _moved_view(value, old, new, ptr, delta, lo, hi):
    if not isinstance(value, DeviceView):
        raise NotRebindable("the plan changed since its arrays were mapped (a DeviceView)")
    _held(value._ptr, ptr, lo, hi)
    return value._at(delta, new)


def _moved_layout(value, old, new, ptr, delta, lo, hi):
    if not isinstance(value, ArrayLayout):
        raise NotRebindable("the plan changed since its arrays were mapped (an ArrayLayout)")
    _held(value.ptr, ptr, lo, hi)
    return value._shifted(delta)


def _moved_array(value, old, new, ptr, delta, lo, hi):
    try:
        lay = ArrayLayout(*layout_facts(value))
    except Exception:  # noqa: BLE001
        raise NotRebindable("the plan changed since its arrays were mapped (an array)") from None
    _held(lay.ptr, ptr, lo, hi)
    return _remade_array(value, lay, delta, new)


_LEAVES = {"ref": _moved_ref, "tensormap": _moved_tensormap, "view": _moved_view, "layout": _moved_layout,
           "array": _moved_array}


def _remade_array(value, lay, delta, new):
    """An array object ``value`` (laid out as ``lay``) viewing an argument, made again ``delta`` bytes further in the
    argument ``new``."""
    if not SIMULATING:
        raise NotRebindable(f"the plan holds a {type(value).__name__} viewing an argument; only "
                            f"numbatma's own views (DeviceView, TensorMap) can be re-made")
    moved = lay._shifted(delta)
    return layout_view(moved, new) if isinstance(value, np.ndarray) else kernel_view(moved, new)


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
                _stale_ref()
            return moved[-1].new if moved else value
        if kind == "tensormap":
            if not isinstance(value, TensorMap):
                raise NotRebindable("the plan changed since its arrays were mapped (a TensorMap)")
            at = value._ptr
        elif kind == "view":
            if not isinstance(value, DeviceView):
                raise NotRebindable("the plan changed since its arrays were mapped (a DeviceView)")
            at = value._ptr
        elif kind == "layout":
            if not isinstance(value, ArrayLayout):
                raise NotRebindable("the plan changed since its arrays were mapped (an ArrayLayout)")
            at = value.ptr
        else:  # "array": an array object viewing an argument (the simulator's views; on a GPU: not re-makeable)
            try:
                at = layout_facts(value)[0]
            except Exception:  # noqa: BLE001
                raise NotRebindable("the plan changed since its arrays were mapped (an array)") from None
        m = self.move_of(holders, at)
        if m is None:
            return value
        return _LEAVES[kind](value, m.old, m.new, at, m.delta, 0, 1)  # (move_of checked the address: "at at")
