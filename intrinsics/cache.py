"""L2 cache policies (``createpolicy``) for the ``*_hinted`` copies: a 64-bit policy handle made once per
thread and passed to ``tma_load_hinted`` / ``tma_store_hinted``.

* ``l2_policy_evict_first()``: streaming data read or written once (give its lines up first).
* ``l2_policy_evict_last()``: data re-read soon (e.g. a tile several CTAs load).
* ``l2_policy_evict_normal()``: the default priority, made explicit.
"""
from __future__ import annotations

from ._asm import Ptx
from ._define import SIMULATING, device_op

__all__ = ["l2_policy_evict_first", "l2_policy_evict_last", "l2_policy_evict_normal"]

EVICT_FIRST = Ptx("createpolicy.fractional.L2::evict_first.b64 $policy, 1.0;", out=("policy", "b64"), min_sm=80)
EVICT_LAST = Ptx("createpolicy.fractional.L2::evict_last.b64 $policy, 1.0;", out=("policy", "b64"), min_sm=80)
EVICT_NORMAL = Ptx("createpolicy.fractional.L2::evict_normal.b64 $policy, 1.0;", out=("policy", "b64"), min_sm=80)

if not SIMULATING:
    from numba.cuda import types


def _policy(ptx):
    def codegen(context, builder, sig, args):
        return ptx.emit(builder)

    return types.uint64(), codegen


@device_op(simulate=lambda: 0)
def l2_policy_evict_first(typingctx):
    """``createpolicy.fractional.L2::evict_first.b64 policy, 1.0;`` - a policy for data used once."""
    return _policy(EVICT_FIRST)


@device_op(simulate=lambda: 0)
def l2_policy_evict_last(typingctx):
    """``createpolicy.fractional.L2::evict_last.b64 policy, 1.0;`` - a policy for data used again soon."""
    return _policy(EVICT_LAST)


@device_op(simulate=lambda: 0)
def l2_policy_evict_normal(typingctx):
    """``createpolicy.fractional.L2::evict_normal.b64 policy, 1.0;`` - the default priority."""
    return _policy(EVICT_NORMAL)


PTX = {
    "l2_policy_evict_first": EVICT_FIRST,
    "l2_policy_evict_last": EVICT_LAST,
    "l2_policy_evict_normal": EVICT_NORMAL,
}
