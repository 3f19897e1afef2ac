"""The float64 NumPy reference of attention forward shared by the simulator and GPU tests of
numbatma.kernels.Attention: ``softmax(q kᵀ · scale (+ top-left causal mask)) v`` and the natural-log
log-sum-exp of every row, with grouped-query heads; any finite scale (0, negative, huge: the mask is applied after
the scale, so a masked key is excluded whatever its sign)."""
import numpy as np


def heads_major(x, layout):
    """A (B, S, H, D) array ("bshd") as (B, H, S, D); a "bhsd" array as it is."""
    return x if layout == "bhsd" else x.transpose(0, 2, 1, 3)


def attention_reference(q, k, v, causal, scale):
    """q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D) -> (o (B, Hq, Sq, D), lse (B, Hq, Sq)), float64."""
    group = q.shape[1] // k.shape[1]
    kk = np.repeat(np.asarray(k, np.float64), group, axis=1)
    vv = np.repeat(np.asarray(v, np.float64), group, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", np.asarray(q, np.float64), kk) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s[..., np.arange(sk)[None, :] > np.arange(sq)[:, None]] = -np.inf
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    return (p / total) @ vv, (m + np.log(total))[..., 0]


def lse_error(got, ref, rel=1e-5, atol=1e-4):
    """The largest excess of the float32 log-sum-exp ``got`` over its tolerance against the float64 ``ref``
    (<= 0: within it). Where ``ref`` is beyond float32's range (a huge scale) ``got`` must be the infinity of its
    sign (exactly: else the excess is inf); elsewhere ``|got - ref| <= rel |ref| + atol`` (float32 rounds the
    product ``M · scale`` alone to ``|ref| 2^-24``)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32).astype(np.float64)
    out = ~np.isfinite(ref32)
    if (got[out] != ref32[out]).any():
        return np.inf
    inside = ~out
    if not inside.any():
        return 0.0
    err = np.abs(got[inside] - ref[inside]) - (rel * np.abs(ref[inside]) + atol)
    return float(np.nan_to_num(err, nan=np.inf).max())
