"""Replacing an upstream attribute once: the one patch primitive every hook of the seam modules uses.

A leaf: imports nothing of numbatma (the seam modules, ``_numba_internals.py`` and the modules it lists, all use it).
"""
from __future__ import annotations


def patch(owner, attr, make):
    """Replace ``owner.attr`` by ``make(original)``, once: the replacement keeps the original as
    ``_numbatma_original``, and a second call finds it there and leaves it alone."""
    current = getattr(owner, attr)
    if getattr(current, "_numbatma_original", None) is not None:
        return
    replacement = make(current)
    replacement._numbatma_original = current
    setattr(owner, attr, replacement)
