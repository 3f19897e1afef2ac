"""The float64 NumPy reference of attention forward shared by the simulator and GPU tests of
numbatma.kernels.Attention: ``softmax(q kᵀ · scale (+ top-left causal mask)) v`` and the natural-log
log-sum-exp of every row, with grouped-query heads; any finite scale (0, negative, huge: the mask is applied after
the scale, so a masked key is excluded whatever its sign). For numbatma.kernels.AttentionBackward: the closed-form
float64 gradients, and a finite-difference check of a kernel's gradients against the forward itself
(fd_directional_check)."""
from collections import namedtuple

import numpy as np


def heads_major(x, layout):
    """A (B, S, H, D) array ("bshd") as (B, H, S, D); a "bhsd" array as it is."""
    return x if layout == "bhsd" else x.transpose(0, 2, 1, 3)


def repeat_heads(x, group):
    """k or v (B, Hkv, S, D) as float64 with each head repeated ``group`` times (B, Hkv·group, S, D): grouped-query
    attention's query heads h read K/V head h // group."""
    return np.repeat(np.asarray(x, np.float64), group, axis=1)


def sum_heads(x, group):
    """The inverse direction of repeat_heads for gradients: (B, Hkv·group, S, D) summed over each group."""
    return x.reshape(x.shape[0], x.shape[1] // group, group, *x.shape[2:]).sum(2)


def logits(q, k, causal, scale):
    """``q kᵀ · scale`` in float64 (B, Hq, Sq, Sk), k repeated over the group, -inf where the top-left causal mask
    hides a key (after the scale, so whatever its sign)."""
    s = np.einsum("bhqd,bhkd->bhqk", np.asarray(q, np.float64), repeat_heads(k, q.shape[1] // k.shape[1])) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s[..., np.arange(sk)[None, :] > np.arange(sq)[:, None]] = -np.inf
    return s


def attention_reference(q, k, v, causal, scale):
    """q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D) -> (o (B, Hq, Sq, D), lse (B, Hq, Sq)), float64."""
    s = logits(q, k, causal, scale)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    return (p / total) @ repeat_heads(v, q.shape[1] // k.shape[1]), (m + np.log(total))[..., 0]


def attention_probabilities(q, k, causal, scale):
    """P = softmax(logits) in float64 (B, Hq, Sq, Sk): the forward's weights, which its gradients are made of."""
    s = logits(q, k, causal, scale)
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


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


def attention_backward_reference(q, k, v, do, causal, scale):
    """(dq, dk, dv) in float64 from (B, H, S, D) arrays (k, v with fewer heads: repeated, their gradients summed)."""
    q, do = (np.asarray(x, np.float64) for x in (q, do))
    group = q.shape[1] // k.shape[1]
    kr, vr = repeat_heads(k, group), repeat_heads(v, group)
    p = attention_probabilities(q, k, causal, scale)
    o = p @ vr
    ds = p * (do @ vr.transpose(0, 1, 3, 2) - (do * o).sum(-1, keepdims=True))
    dq = ds @ kr * scale
    dk = sum_heads(ds.transpose(0, 1, 3, 2) @ q * scale, group)
    dv = sum_heads(p.transpose(0, 1, 3, 2) @ do, group)
    return dq, dk, dv


# -- finite differences (issue 26: gradcheck-style, against the forward itself) -----------------------------------
FD_EPS = 1e-4  # the central difference's step along a unit direction
FD_C = 2.0  # the kernel's gradient error, at most FD_C ulp of the gradient's norm (fd_tolerance)
FD_T = 6.0  # random directions: the error's projection within FD_T standard widths (fd_tolerance)
FD_REL = 1e-8  # the finite difference's own error, relative to 1 + the gradient's norm (fd_tolerance)

FdCheck = namedtuple("FdCheck", "name fd analytic grad_norm size random")
FdCheck.__doc__ = """One direction u of fd_directional_check: ``fd`` the central difference of the loss along u,
``analytic`` <(dq, dk, dv), u> from the gradients under test, ``grad_norm`` the norm of those gradients restricted to
the tensors u moves, ``size`` how many elements u moves, ``random`` whether u was drawn at random (else it is the
gradients' own direction)."""


def attention_loss(q, k, v, do, causal, scale):
    """L(q, k, v) = sum(O · do) in float64, O = attention_reference's output: the scalar whose gradient is
    (dq, dk, dv) for the output gradient ``do``."""
    return float((attention_reference(q, k, v, causal, scale)[0] * np.asarray(do, np.float64)).sum())


def fd_directional_check(q, k, v, do, dq, dk, dv, causal, scale, rng, eps=FD_EPS, trials=2):
    """The gradients (dq, dk, dv) under test against central differences of the float64 loss
    ``L = sum(attention(q, k, v) · do)`` (attention_loss) along unit directions u of (q, k, v): what
    torch.autograd.gradcheck does coordinate by coordinate, here along a few directions, each costing two float64
    forwards. Arrays (B, H, S, D), heads-major; k, v (and dk, dv) may have fewer heads (grouped-query attention).
    q, k, v, do are the 16-bit values the kernel got (exact in float64): the check is of the gradient of the
    function the kernel was given, at the point it was given.

    Directions: u moving q, k and v together, and q alone, k alone, v alone - each (a) along the gradients under
    test themselves (u = g / ||g|| on those tensors: a gradient off by a factor s is off by (s - 1) ||g|| there) and
    (b) ``trials`` times at random (Gaussian, normalized: uniform on the unit sphere; drawn from ``rng`` after the
    gradients were computed, so independent of their errors). A gradient direction of a zero gradient is left out
    (the random ones still see it). Returns a list of FdCheck; fd_ratios / fd_table judge them against
    fd_tolerance.

    The difference's own error: truncation eps² L'''(u) / 6 plus rounding about 1e-16 |L| / eps. Along the
    gradient the loss curves most: eps = 1e-3 left up to 2e-8 (1 + ||g||) there, eps = 1e-4 leaves at most
    2.3e-10 (1 + ||g||) on the test shapes (standard-normal inputs, scale 1 / sqrt(D); random directions 1e-11)."""
    x = [np.asarray(a, np.float64) for a in (q, k, v)]
    g = [np.asarray(a, np.float64) for a in (dq, dk, dv)]
    for name, a, b in zip(("dq", "dk", "dv"), g, x):
        assert a.shape == b.shape, f"{name} is {a.shape} but its input is {b.shape}"

    def loss(step, u):
        return attention_loss(*(a + step * w for a, w in zip(x, u)), do, causal, scale)

    checks = []
    for subset in ((0, 1, 2), (0,), (1,), (2,)):
        label = "+".join("qkv"[i] for i in subset)
        size = sum(x[i].size for i in subset)
        grad_norm = float(np.sqrt(sum((g[i] ** 2).sum() for i in subset)))
        candidates = [(f"gradient {label}", [g[i] for i in subset], False)] if grad_norm != 0 else []
        candidates += [(f"random {label} #{n}", [rng.standard_normal(x[i].shape) for i in subset], True)
                       for n in range(trials)]
        for name, parts, random in candidates:
            norm = np.sqrt(sum((w ** 2).sum() for w in parts))
            u = [np.zeros_like(a) for a in x]
            for i, w in zip(subset, parts):
                u[i] = w / norm
            fd = (loss(eps, u) - loss(-eps, u)) / (2 * eps)
            analytic = float(sum((a * w).sum() for a, w in zip(g, u)))
            checks.append(FdCheck(name, fd, analytic, grad_norm, size, random))
    return checks


def fd_tolerance(check, ulp, c=FD_C, t=FD_T, rel=FD_REL):
    """How far ``check.analytic`` may be from ``check.fd`` for gradients computed with 16-bit roundings of
    relative precision ``ulp`` (2^-10 float16, 2^-7 bfloat16; 0 for exact float64 gradients).

    The finite difference's own error: at most 2.3e-10 (1 + ||g||) measured (fd_directional_check), allowed
    ``rel (1 + ||g||)`` with rel = 1e-8, 40 times that. (With ulp = 0 that allowance is all: 1e-4 to 1e-5 of the
    16-bit tolerances below.)

    The gradients g under test carry an error e: the kernel rounds P and dS to the 16-bit type before the tensor
    cores (half an ulp relative each), takes delta = rowsum(dO o) from the forward's 16-bit o, and rounds its
    outputs once more. Each is a few tenths of an ulp of the gradient's norm, random in sign: ||e|| / ||g|| was
    0.27 to 0.44 ulp on each of dq, dk, dv in the simulator (float16) and in a NumPy model of those roundings
    (float16 and bfloat16, tests/test_attention_reference_cpu.py). The tolerance assumes ``||e|| <= c ulp ||g||``
    with c = 2, about 5 times that, on each tensor.

    - Along the gradients' own direction (u = g / ||g||) the excess is <e, g> / ||g|| <= ||e|| (Cauchy-Schwarz):
      ``c ulp ||g||``. A gradient scaled by s is off by |s - 1| ||g|| there: caught for |s - 1| > c ulp (0.2 %
      float16, 1.6 % bfloat16; below that no ulp-sized bound can tell a wrong scale from rounding).
    - Along a random unit direction u of R^N (N the elements u moves) drawn independently of e, |<e, u>| exceeds
      t ||e|| / sqrt(N) with probability at most 2 exp(-t² / 2) (the measure of a spherical cap: K. Ball, An
      Elementary Introduction to Modern Convex Geometry, lemma 2.2), 3e-8 for t = 6: ``c ulp ||g|| t / sqrt(N)``,
      sqrt(N) / t (6 to 53 on the test shapes) times tighter than Cauchy-Schwarz. A small error orthogonal to the
      gradient counts only as ||e||² / ||g|| along the gradient; here it shows as about ||e|| / sqrt(N)."""
    bound = c * ulp * check.grad_norm
    if check.random:
        bound *= t / np.sqrt(check.size)
    return bound + rel * (1 + check.grad_norm)


def fd_ratios(checks, ulp, **tolerance):
    """|fd - analytic| / fd_tolerance for each check (<= 1: within it; NaN counts as inf)."""
    return np.nan_to_num(np.array([abs(c.fd - c.analytic) / fd_tolerance(c, ulp, **tolerance) for c in checks]),
                         nan=np.inf)


def fd_table(checks, ulp, **tolerance):
    """The checks one a line (for an assertion's message): the direction, fd, analytic, their difference, the
    tolerance and the ratio."""
    return "\n".join(f"{c.name:>18}: fd {c.fd: .9g} analytic {c.analytic: .9g} |diff| {abs(c.fd - c.analytic):.3g}"
                     f" tol {fd_tolerance(c, ulp, **tolerance):.3g} ratio {r:.3g}"
                     for c, r in zip(checks, fd_ratios(checks, ulp, **tolerance)))
