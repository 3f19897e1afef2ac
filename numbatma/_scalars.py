"""When two scalar kernel arguments are the same: one rule for the prepared launch (``_numba_internals``: whether a
replaced scalar must be written into the parameter block) and the plans of ``numbatma.kernels`` (their cache key,
``Plan.rebind``), re-exported by :mod:`numbatma.launch`. Python's ``==`` is not enough: ``-0.0 == 0.0`` (and both
hash alike), yet a kernel tells them apart. A leaf module: it imports nothing of numbatma."""
from __future__ import annotations

import math

import numpy as np

_FLOATS = (float, np.floating)


def scalar_key(value):
    """A hashable form of a scalar (or option) ``value`` that keeps apart what a kernel tells apart: its type (by
    name), its value, and a zero's sign. Raises TypeError for an unhashable value."""
    hash(value)
    if value == 0 and isinstance(value, _FLOATS):
        return (type(value).__name__, value, math.copysign(1.0, value))
    return (type(value).__name__, value)


def same_scalar(old, new):
    """Whether a kernel launched with scalar ``old`` computes the same with ``new``: the same object, or the same
    type and value (a zero of the same sign; a NaN only as the same object): what :func:`scalar_key` keeps apart."""
    if new is old:
        return True
    if type(new) is not type(old) or not new == old:
        return False
    if new == 0 and isinstance(new, _FLOATS):
        return math.copysign(1.0, new) == math.copysign(1.0, old)
    return True
