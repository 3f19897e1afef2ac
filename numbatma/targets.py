"""The compile targets numbatma supports, and target-name parsing: one definition for the host layer
(``numbatma.compile``) and the device layer (``intrinsics/_asm.py``). A leaf module: it imports nothing of numbatma."""
from __future__ import annotations

#: What numbatma compiles for (and CI links for through nvJitLink).
TARGETS = ("sm_90a", "sm_100a", "sm_120a")


def target_of(arch):
    """``compute_90a`` / ``sm_90a`` / ``(9, 0, 'a')`` -> ``'sm_90a'`` (None when not recognisable)."""
    if isinstance(arch, tuple):
        arch = "sm_" + "".join(str(x) for x in arch)
    digits = "".join(ch for ch in str(arch) if ch.isdigit())
    if not digits:
        return None
    return f"sm_{digits}" + ("a" if str(arch).endswith("a") else "")


def compute_capability(target):
    """``'sm_90a'`` -> ``(9, 0, 'a')`` (the ``cc`` numba-cuda's compile functions take); ``'sm_120'`` ->
    ``(12, 0)``."""
    name = target_of(target)
    if name is None:
        raise ValueError(f"not a compute target: {target!r}")
    digits = "".join(ch for ch in name if ch.isdigit())
    cc = (int(digits[:-1]), int(digits[-1]))
    return cc + ("a",) if name.endswith("a") else cc


def capability_text(target):
    """``'sm_90a'`` -> ``'9.0'``."""
    major, minor = compute_capability(target)[:2]
    return f"{major}.{minor}"
