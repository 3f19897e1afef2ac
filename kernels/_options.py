"""Checks of the plans' options and scalar arguments: one definition of what a count, a switch, a choice and a
scalar argument may be, and of the message that refuses a bad one.

Every check takes ``op`` (the plan's name, first word of the message), ``name`` (the option as the user spells it)
and ``value``, and returns the value in its canonical type (``int``, ``bool``, ``float``) or raises. The message's
first line names the option, the rule and the user's own value: ``"Gemm: group_m must be an integer >= 1, got -1"``.

Errors: a value of the wrong *type* raises :class:`OptionTypeError` (both a :class:`numbatma.TensorMapError`, i.e. a
ValueError, and a TypeError, so either ``except`` catches it); a value of the right type out of range raises
:class:`numbatma.TensorMapError`. Nothing here touches a GPU.

Rules:

* ``int_option``: a Python or NumPy integer; not a bool (``stages=True`` is a mistake, not a count), not a float
  (``grid=1.5``, even ``2.0``), not a string (``bn="128"``); within ``lo..hi`` (either bound may be None: open)
  and, with ``choices``, one of them.
* ``bool_option``: a Python or NumPy bool only (``causal=1`` is refused: say ``True``).
* ``scalar_option``: a real number (Python or NumPy scalar; not a bool, None, a string, a complex number, nor a
  0-d array or tensor: a plan keeps the scalar it was built with, so an array whose value can change later is
  refused with a hint to pass ``float(a)``). NaN and infinities are IEEE inputs like any other and pass unless
  ``finite=True``.
* ``choice_option``: one of ``choices`` (compared with ``==``, strings are not converted).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from numbatma import TensorMapError

__all__ = ["OptionTypeError", "int_option", "bool_option", "scalar_option", "choice_option", "describe_range"]


class OptionTypeError(TensorMapError, TypeError):
    """An option or scalar argument of the wrong type (also a TypeError)."""


def describe_range(lo=None, hi=None, choices=None):
    """The rule's words for an int in ``lo..hi`` (or one of ``choices``): ``"an integer >= 1"``, ``"an integer in 1..32"``,
    ``"64, 128 or 256"``."""
    if choices is not None:
        return _either(choices)
    if lo is not None and hi is not None:
        return f"an integer in {lo}..{hi}"
    if lo is not None:
        return f"an integer >= {lo}"
    if hi is not None:
        return f"an integer <= {hi}"
    return "an integer"


def _either(choices):
    """``"64, 128, 192 or 256"``, ``"'kn' or 'nk'"``."""
    words = [repr(c) for c in choices]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def int_option(op, name, value, lo=None, hi=None, choices=None, none_ok=False):
    """``value`` as an ``int`` in ``lo..hi`` (bounds included; None: unbounded) and, with ``choices``, one of them.
    ``none_ok``: None passes (returned as None: "choose for me"). Raises :class:`OptionTypeError` for a non-int
    (bool, float, string, array...) and :class:`numbatma.TensorMapError` for an int out of range."""
    if value is None and none_ok:
        return None
    rule = describe_range(lo, hi, choices)
    if not _is_int(value):
        raise OptionTypeError(f"{op}: {name} must be {rule}{' or None' if none_ok else ''}, got {value!r} "
                              f"(a {type(value).__name__})")
    value = int(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi) or (
            choices is not None and value not in choices):
        raise TensorMapError(f"{op}: {name} must be {rule}, got {value!r}")
    return value


def bool_option(op, name, value):
    """``value`` as a ``bool``: only True or False (or a NumPy bool) pass; ``1``, ``"yes"``, None are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise OptionTypeError(f"{op}: {name} must be True or False, got {value!r} (a {type(value).__name__})")
    return bool(value)


def scalar_option(op, name, value, finite=False, none_ok=False):
    """``value`` as a ``float``: a real Python or NumPy number (ints are converted). Refused: bools, None (unless
    ``none_ok``: returned as None), strings, complex numbers, and arrays of any rank, 0-d ones and tensors included
    (a plan keeps the value it was built with; an array's value can change after: pass ``float(a)``). With
    ``finite``, NaN and infinities are refused too."""
    if value is None and none_ok:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        if _looks_like_array(value):
            raise OptionTypeError(
                f"{op}: {name} must be a Python or NumPy scalar, got an array ({type(value).__name__}, shape "
                f"{tuple(getattr(value, 'shape', ()))}): a plan keeps the scalar it was built with and would not see "
                f"the array's value change; pass float({name}) (or build the plan again for a new value)")
        raise OptionTypeError(f"{op}: {name} must be a real number (a Python or NumPy scalar), got {value!r} "
                              f"(a {type(value).__name__})")
    value = float(value)
    if finite and not math.isfinite(value):
        raise TensorMapError(f"{op}: {name} must be a finite number, got {value!r}")
    return value


def choice_option(op, name, value, choices):
    """``value`` if it is one of ``choices`` (by ``==``; a value that cannot be compared is refused too)."""
    try:
        ok = any(type(value) is type(c) and value == c for c in choices) or (
            not isinstance(value, (bool, np.bool_)) and value in choices)
    except Exception:  # (an array compared with a string...)
        ok = False
    if not ok:
        raise TensorMapError(f"{op}: {name} must be {_either(choices)}, got {value!r}")
    return value


def _looks_like_array(value):
    return (isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")
            or hasattr(value, "__dlpack__") or hasattr(value, "__array_interface__") or hasattr(value, "_ary"))
