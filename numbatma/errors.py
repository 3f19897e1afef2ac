"""Typing errors that point at the user's kernel line; the simulator's exceptions.

Every rule an intrinsic's typer enforces is raised as :class:`TypingError` (a subclass of Numba's
``numba.core.errors.TypingError``, so ``except TypingError`` / ``pytest.raises(TypingError)`` written
against Numba keep working). What the user sees when a kernel is compiled (``kernel[grid, block](...)``,
``cuda.compile_ptx``, ``numbatma.compile.compile_ptx``) is::

    /path/to/kernel.py:17: tma_load: the shared tile has dtype float16 but the descriptor moves float32 elements
        17 |     tma_load(tile, desc, (0, 0), bar)

How it gets there (``numbatma/_numba_internals.py``, hook 9): Numba types a call by trying each candidate
implementation and, when all fail, raises one "No implementation of function ... found for signature" error
that lists every attempt (for a ``prefer_literal`` intrinsic: once with the constants as literal types, once
without - two different messages). Numba-cuda's type inference runs one *constraint* per statement, each
carrying the statement's source location. numbatma wraps those constraints: while one runs, every
:class:`TypingError` a numbatma typer creates is recorded (:func:`recording`); when the constraint fails and a
numbatma error was recorded, the first one recorded (for a ``prefer_literal`` intrinsic the one that saw the
constants) is raised instead, with the constraint's location. A typing error inside one of numbatma's own
device functions (an ``overload`` implementation) is moved to the user's call that led there.
"""
from __future__ import annotations

import os
import threading

from numba.core import errors as _numba_errors

from ._registry import source_dirs

# Compile-time-constant rules that numba's typing enforces and the simulator enforces too (numbatma/_numba_internals.py,
# hooks 4 and 7), in one wording for both.
SHAPE_RULE = ("the shape must be a compile-time constant: an integer literal, a global or closure constant, or a "
              "tuple of those (not a value computed in the kernel, read from an argument or chosen by a branch)")
INDEX_RULE = ("the register index must be a compile-time constant: an integer literal, a global or closure "
              "constant (not a loop variable or a value computed in the kernel); write the registers out with "
              "constant indices, or use wgmma_map / wgmma_row_reduce to visit every register")

_state = threading.local()


class TypingError(_numba_errors.TypingError):
    """A kernel breaks a rule of a numbatma intrinsic. ``str()`` starts with ``file:line: op: message``
    once the error has a location (``loc``); ``reason`` is ``op: message`` alone."""

    def __init__(self, reason, loc=None, fatal=False):
        self.reason = str(reason)
        self.fatal = fatal  # a rule broken by a compile-time constant: reported even if a plain retry types
        super().__init__(_format(self.reason, loc), loc=None, highlighting=False)
        self.loc = loc
        records = getattr(_state, "records", None)
        if records is not None and loc is None:
            records.append(self)

    def __reduce__(self):
        return (type(self), (self.reason, self.loc, self.fatal))

    def at(self, loc):
        """This error located at ``loc`` (a Numba ``ir.Loc``): a located error keeps its place unless it is
        inside numbatma's own sources (then the caller's line is the user's)."""
        if self.loc is not None and not is_internal(getattr(self.loc, "filename", None)):
            return self
        if loc is None:
            return self
        return TypingError(self.reason, loc=loc, fatal=self.fatal)


def _format(reason, loc):
    if loc is None or not getattr(loc, "filename", None):
        return reason
    head = f"{loc.filename}:{loc.line}: {reason}"
    try:
        lines = loc.get_lines()
        source = lines[loc.line - 1].rstrip() if 0 < loc.line <= len(lines) else ""
    except Exception:  # (source not available: an interactive session)
        source = ""
    return f"{head}\n    {loc.line} | {source}" if source.strip() else head


def is_internal(filename):
    """Whether ``filename`` is one of numbatma's own device-side sources (package ``numbatma`` or
    ``numbatma.intrinsics``), whose lines are not what the user wrote."""
    if not filename:
        return True
    own = source_dirs()  # (the host's folder, and the device package's once it registered: _registry.py)
    return os.path.abspath(filename).startswith(own)


class recording:
    """Context manager: collect the unlocated :class:`TypingError` s created in this thread meanwhile
    (``.errors``, in order); nests (an inner block does not hand its errors to the outer one)."""

    def __enter__(self):
        self.outer = getattr(_state, "records", None)
        self.errors = _state.records = []
        return self

    def __exit__(self, *exc):
        _state.records = self.outer
        return False


def relocate(errors, loc, failed):
    """The error to raise for a constraint at ``loc`` that ``failed`` (or succeeded), given the numbatma
    errors recorded while it ran; None: let Numba's outcome stand."""
    if failed:
        chosen = errors[0] if errors else None
    else:
        chosen = next((e for e in errors if e.fatal), None)
    return None if chosen is None else chosen.at(loc)


# -- the simulator's exceptions (raised by its engine, intrinsics/_sim.py; public as numbatma.SimulatedHang & co.) ----
class SimulatedHang(RuntimeError):
    """Every live thread of a block waits on something that can no longer happen."""


class SimulatedMisuse(RuntimeError):
    """An operation whose result on the GPU would be undefined (wrong byte counts, uninitialised barrier)."""


class SimulatedTypingError(SimulatedMisuse, TypeError):
    """An operand the GPU build refuses at typing time (a numba TypingError there), with the typer's words."""
