"""The float64 NumPy reference of attention forward shared by the simulator and GPU tests of
numbatma.kernels.Attention: ``softmax(q kᵀ · scale (+ top-left causal mask)) v`` and the natural-log
log-sum-exp of every row, with grouped-query heads."""
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
