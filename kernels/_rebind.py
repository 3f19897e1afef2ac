"""Re-pointing a plan at other arrays of the same layout (:meth:`numbatma.kernels.Plan.rebind`): every descriptor,
view and array reference of the plan that lies inside an input array moves by that array's address change.
Used by the function forms' plan cache (:mod:`numbatma.kernels._plan_cache`)."""
from __future__ import annotations

import enum
import numbers

import numpy as np

from numbatma import SIMULATING, ArrayLayout, DeviceView, TensorMap, array_layout, kernel_view, layout_view

from ._launch import byte_extent

__all__ = ["NotRebindable", "Rebinder", "Range", "is_scalar"]

_SCALARS = (numbers.Number, np.generic, str, bytes, enum.Enum, type(None))


class NotRebindable(Exception):
    """:meth:`Plan.rebind` cannot re-point this plan at the new arrays (:func:`run` then builds a new plan)."""


class Range:
    """Where input array ``i`` of a plan was (``lo``, ``hi``: its byte extent) and where it is now."""

    __slots__ = ("old", "new", "lo", "hi", "delta")

    def __init__(self, old, new, old_layout, new_layout):
        self.old, self.new = old, new
        self.lo, self.hi = byte_extent(old_layout)
        self.delta = new_layout.ptr - old_layout.ptr

    def holds(self, ptr):
        return ptr == self.lo or self.lo <= ptr < self.hi


def is_scalar(value):
    return isinstance(value, _SCALARS)


def _looks_like_array(value):
    return (isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")
            or hasattr(value, "__dlpack__") or hasattr(value, "_ary"))  # (_ary: the CUDA simulator's arrays)


class Rebinder:
    """One :meth:`Plan.rebind` walk: ``ranges`` are the inputs that moved."""

    def __init__(self, ranges):
        self.ranges = ranges  # (every array argument: those that stayed, delta 0, tell ambiguous addresses)
        self.by_id = {id(r.old): r.new for r in ranges if r.old is not r.new}
        self.memo = {}  # id(old object) -> its replacement (an object reached twice is replaced once)
        self.keep = []  # (the objects whose ids are in memo stay alive during the walk)

    def locate(self, ptr):
        """The range holding address ``ptr`` (None: no argument that changed holds it)."""
        found = [r for r in self.ranges if r.holds(ptr)]
        if len({r.delta for r in found}) > 1:
            raise NotRebindable(f"address 0x{ptr:x} lies inside two arguments that moved by different amounts")
        found = [r for r in found if r.old is not r.new]
        return found[0] if found else None

    @staticmethod
    def shifted(layout, r):
        return ArrayLayout(layout.ptr + r.delta, layout.shape, layout.strides, layout.dtype)

    def fix(self, value):
        """``value`` as it must be after the move (the same object when nothing changes)."""
        if is_scalar(value):
            return value
        if id(value) in self.by_id:
            return self.by_id[id(value)]
        key = id(value)
        if key in self.memo:
            return self.memo[key]
        self.keep.append(value)
        self.memo[key] = value  # (a cycle back to this object sees it as it is)
        new = self._fix(value)
        self.memo[key] = new
        return new

    def _fix(self, value):
        if isinstance(value, TensorMap):  # (Im2colTensorMap included)
            r = self.locate(value._layout.ptr)
            if r is not None:
                if value.array is r.old:
                    value.repoint(r.new)
                else:
                    value.repoint(layout_view(self.shifted(value._layout, r), r.new))
            return value
        if isinstance(value, DeviceView):
            r = self.locate(value.layout.ptr)
            return value if r is None else DeviceView(self.shifted(value.layout, r), r.new)
        if isinstance(value, ArrayLayout):
            r = self.locate(value.ptr)
            return value if r is None else self.shifted(value, r)
        if isinstance(value, list):
            for i, item in enumerate(value):
                value[i] = self.fix(item)
            return value
        if isinstance(value, tuple):
            items = [self.fix(item) for item in value]
            if all(a is b for a, b in zip(items, value)):
                return value
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if isinstance(value, dict):
            for k, item in list(value.items()):
                value[k] = self.fix(item)
            return value
        if _looks_like_array(value):
            try:
                layout = array_layout(value)
            except Exception:  # noqa: BLE001 - not an array numbatma reads: left as it is
                return value
            r = self.locate(layout.ptr)
            if r is None:
                return value
            if not SIMULATING:
                raise NotRebindable(f"the plan holds a {type(value).__name__} viewing an argument; only "
                                    f"numbatma's own views (DeviceView, TensorMap) can be re-made")
            new_layout = self.shifted(layout, r)
            return layout_view(new_layout, r.new) if isinstance(value, np.ndarray) else kernel_view(new_layout, r.new)
        if type(value).__module__.startswith("numbatma.kernels") and hasattr(value, "__dict__"):
            self.fix_object(value)
        return value

    def fix_object(self, obj, skip=()):
        """Fix the attributes of ``obj`` in place (frozen dataclasses included)."""
        for name, item in list(vars(obj).items()):
            if name in skip:
                continue
            new = self.fix(item)
            if new is not item:
                object.__setattr__(obj, name, new)


