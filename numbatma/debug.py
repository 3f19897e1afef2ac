"""GPU debug mode: bounded waits and cheap runtime checks that print and trap instead of hanging or faulting.

Turn it on for a whole process with the environment variable ``NUMBATMA_DEBUG=1`` (set before ``numbatma`` is
imported; it is read once, at import). ``NUMBATMA_DEBUG_TIMEOUT_MS`` sets how long a wait may take before
it is reported (default 2000 ms of ``%globaltimer``).

In a debug build (every kernel numbatma lowers in that process):

* every blocking mbarrier wait (``mbarrier_wait_parity``, ``mbarrier_wait``, ``mbarrier_wait_parity_cluster``)
  and every ``Pipeline`` wait (``producer_acquire``, ``consumer_wait``) is a ``try_wait`` loop bounded by
  the timeout; when it expires the thread prints (device ``printf``) what it waited for - the barrier's
  kernel variable and the kernel file:line of the wait (for a Pipeline: the pipeline's variable and the line
  that created it, the stage and full/empty barrier), the phase parity or state token, the barrier's
  shared address and raw 64-bit word, and the block and thread - then executes ``trap;``: the launch fails
  (CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure") instead of the process freezing;
* TMA tile operations check, before issuing the copy: that every coordinate fits in 32 bits (a 64-bit or
  unsigned coordinate is otherwise silently truncated), that the innermost start coordinate of a load is a
  whole number of 16 bytes (otherwise the hardware stops the kernel with CUDA_ERROR_ILLEGAL_INSTRUCTION and
  no hint of which load it was), and that the shared tile's address has the alignment TMA needs (128 bytes,
  or the swizzle repeat: 256/512/1024 bytes for 32/64/128-byte swizzle) - the usual slip with views of
  dynamic shared memory. Each failed check prints which operation, where, and the values, then traps.

Not bounded (PTX has no timed or polling form): ``bulk_wait_group`` / ``bulk_wait_group_read`` and
``cp_async_wait_group`` / ``cp_async_wait_all`` wait only for this thread's own copies, which finish or fault,
never hang; ``cuda.syncthreads()``, named barriers and ``barrier_cluster_wait`` wait for other threads and
are not bounded either. A loop the kernel writes itself around ``mbarrier_try_wait_parity`` /
``mbarrier_test_wait*`` is not bounded: use ``mbarrier_wait_parity``.

Cost: with the variable unset, no kernel changes at all (the default build's PTX is byte-for-byte the same;
a CPU test checks that it holds no ``%globaltimer``, ``vprintf`` or ``trap``). In debug mode each wait reads
``%globaltimer`` once per ``try_wait`` round and each TMA operation does a few integer tests; the printf
paths are never taken by a correct kernel. A process is either a debug or a normal one, so compiled kernels
(numba's in-memory caches of kernels and device functions) never mix the two; the on-disk cache
(``cuda.jit(cache=True)``) keys debug builds apart (the debug settings are part of its index key).
"""
from __future__ import annotations

import os

_TRUE = ("1", "true", "yes", "on")


def _read_enabled():
    return os.environ.get("NUMBATMA_DEBUG", "").strip().lower() in _TRUE


def _read_timeout_ms():
    text = os.environ.get("NUMBATMA_DEBUG_TIMEOUT_MS", "").strip()
    if not text:
        return 2000
    try:
        value = int(float(text))
    except ValueError:
        raise ValueError(f"NUMBATMA_DEBUG_TIMEOUT_MS must be a number of milliseconds, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"NUMBATMA_DEBUG_TIMEOUT_MS must be positive, got {text!r}")
    return value


ENABLED = _read_enabled()
"""Whether this process builds debug kernels (``NUMBATMA_DEBUG`` at import)."""

TIMEOUT_MS = _read_timeout_ms()
"""How long a debug-mode wait may take before it prints and traps (``NUMBATMA_DEBUG_TIMEOUT_MS``, default 2000)."""


def enabled():
    """Whether kernels compiled in this process are debug builds."""
    return ENABLED


def timeout_ns():
    """The wait timeout in nanoseconds (the unit of ``%globaltimer``)."""
    return TIMEOUT_MS * 1_000_000


def cache_key():
    """What the on-disk kernel cache adds to its index key for a debug build (None for a normal build)."""
    return ("numbatma_debug", TIMEOUT_MS) if ENABLED else None
