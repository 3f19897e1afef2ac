"""CPU: the finite-difference check of attention gradients in tests/attention_reference.py (fd_directional_check,
fd_tolerance), which the simulator and GPU tests apply to numbatma.kernels.AttentionBackward. It must accept the
exact float64 gradients at a tolerance thousands of times tighter than the kernel's (which also checks the
closed-form attention_backward_reference against the forward), accept a NumPy model of the kernel's 16-bit
roundings at the kernel's tolerance for float16 and bfloat16, and reject gradients with planted errors - 1 %
off in scale, no causal mask, the wrong head, the wrong grouping of query heads, no delta term, keys off
by one - at the float16 tolerance the simulator test uses (the structural ones at bfloat16's too)."""
import numpy as np
import pytest

from attention_reference import (FD_C, attention_backward_reference, attention_probabilities, fd_directional_check,
                                 fd_ratios, fd_table, repeat_heads, sum_heads)

ULP = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


def rounded(x, dtype):
    """float64 values rounded to nearest even in ``dtype`` (bfloat16 through float32's bits: no ml_dtypes needed),
    back in float64."""
    if dtype == "float16":
        return np.asarray(x, np.float64).astype(np.float16).astype(np.float64)
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def inputs(b, hq, hk, sq, sk, d, dtype="float16", seed=0):
    """q, k, v, do: standard normal values rounded to ``dtype`` (what the kernel would get), float64."""
    rng = np.random.default_rng(seed)
    return [rounded(rng.standard_normal((b, h, s, d)), dtype) for h, s in ((hq, sq), (hk, sk), (hk, sk), (hq, sq))]


def kernel_model(q, k, v, do, causal, scale, dtype):
    """(dq, dk, dv) with the roundings of the kernel: o from the forward rounded to ``dtype`` (delta = rowsum(dO o)
    from it), P rounded before dV = Pᵀ dO, dS rounded before dQ = dS K and dK = dSᵀ Q, the outputs rounded; float64
    otherwise (the kernel's float32 accumulation is 2^-24 relative: far below)."""
    group = q.shape[1] // k.shape[1]
    kr, vr = repeat_heads(k, group), repeat_heads(v, group)
    p = attention_probabilities(q, k, causal, scale)
    delta = (do * rounded(p @ vr, dtype)).sum(-1, keepdims=True)
    ds = rounded(p * (do @ vr.transpose(0, 1, 3, 2) - delta), dtype)
    p = rounded(p, dtype)
    dq = ds @ kr * scale
    dk = sum_heads(ds.transpose(0, 1, 3, 2) @ q * scale, group)
    dv = sum_heads(p.transpose(0, 1, 3, 2) @ do, group)
    return [rounded(x, dtype) for x in (dq, dk, dv)]


SHAPES = [(1, 2, 1, 9, 20, 64)] + [  # (batch, q heads, kv heads, sq, sk, head dim): the simulator's, the GPU test's
    (b, hq, hk, sq, sk, d) for d in (64, 128, 256) for b, hq, hk, sq, sk in ((1, 2, 1, 17, 33), (2, 4, 2, 33, 17))]
SHAPE_IDS = ["b{}h{}/{}-{}x{}-d{}".format(*s) for s in SHAPES]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_exact_gradients_pass_a_tight_tolerance(shape, causal):
    """The closed-form float64 gradients agree with the central differences to the difference's own error: ulp = 0
    leaves only its 1e-8 (1 + ||g||) allowance, 1e-4 to 1e-5 of the kernel's tolerance; and the two kinds of
    direction are there (the gradient's own and random ones, for q + k + v and each alone)."""
    q, k, v, do = inputs(*shape)
    scale = 1 / np.sqrt(shape[-1])
    checks = fd_directional_check(q, k, v, do, *attention_backward_reference(q, k, v, do, causal, scale), causal,
                                  scale, np.random.default_rng(1))
    assert len(checks) == 12 and sum(c.random for c in checks) == 8, [c.name for c in checks]
    assert all(c.grad_norm > 1 for c in checks)  # (standard-normal inputs: gradients of norm about 10 to 50)
    assert fd_ratios(checks, 0).max() <= 1, fd_table(checks, 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_the_kernels_roundings_pass_its_tolerance(shape, causal, dtype):
    """kernel_model's gradients - the kernel's 16-bit roundings of P, dS, o and the outputs - pass at the ulp of
    ``dtype``, with room (the largest ratio under 0.2); their error is under half the FD_C ulp of the gradients'
    norm that fd_tolerance assumes (0.25 to 0.45 ulp here; the simulator's kernel: 0.27 to 0.40)."""
    q, k, v, do = inputs(*shape, dtype=dtype)
    scale = 1 / np.sqrt(shape[-1])
    model = kernel_model(q, k, v, do, causal, scale, dtype)
    for name, got, want in zip(("dq", "dk", "dv"), model, attention_backward_reference(q, k, v, do, causal, scale)):
        rel = np.linalg.norm(got - want) / np.linalg.norm(want) / ULP[dtype]
        assert 0.05 < rel < FD_C / 2, f"{name}: error {rel:.3f} ulp of the norm"  # (and the roundings were made)
    checks = fd_directional_check(q, k, v, do, *model, causal, scale, np.random.default_rng(1))
    assert fd_ratios(checks, ULP[dtype]).max() < 0.2, fd_table(checks, ULP[dtype])


def grouped_the_other_way(q, k, v, do, causal, scale):
    """The gradients of attention whose query head h reads K/V head h % Hk (interleaved) instead of h // group."""
    hq, hk = q.shape[1], k.shape[1]
    order = np.arange(hq).reshape(hq // hk, hk).T.ravel()  # query heads reading K/V head 0 first, then 1, ...
    dq, dk, dv = attention_backward_reference(q[:, order], k, v, do[:, order], causal, scale)
    back = np.empty_like(dq)
    back[:, order] = dq
    return back, dk, dv


def without_delta(q, k, v, do, causal, scale):
    """dq, dk from dS = P dP (the row term rowsum(dO O) left out); dv right."""
    group = q.shape[1] // k.shape[1]
    kr, vr = repeat_heads(k, group), repeat_heads(v, group)
    ds = attention_probabilities(q, k, causal, scale) * (do @ vr.transpose(0, 1, 3, 2))
    dk = sum_heads(ds.transpose(0, 1, 3, 2) @ q * scale, group)
    return ds @ kr * scale, dk, attention_backward_reference(q, k, v, do, causal, scale)[2]


def planted(error, q, k, v, do, causal, scale):
    """The exact gradients with one planted error."""
    dq, dk, dv = attention_backward_reference(q, k, v, do, causal, scale)
    if error == "dk x 1.01":
        return dq, dk * 1.01, dv
    if error == "dq x 0.99":
        return dq * 0.99, dk, dv
    if error == "dv x 1.01":
        return dq, dk, dv * 1.01
    if error == "no causal mask":
        return attention_backward_reference(q, k, v, do, False, scale)
    if error == "dv of the wrong head":
        return dq, dk, dv[:, ::-1]
    if error == "query heads grouped the wrong way":
        return grouped_the_other_way(q, k, v, do, causal, scale)
    if error == "no delta term":
        return without_delta(q, k, v, do, causal, scale)
    if error == "dk keys off by one":
        return dq, np.roll(dk, 1, axis=2), dv
    raise AssertionError(error)


PLANTED = ["dk x 1.01", "dq x 0.99", "dv x 1.01", "no causal mask", "dv of the wrong head",
           "query heads grouped the wrong way", "no delta term", "dk keys off by one"]
STRUCTURAL = PLANTED[3:]  # (errors of order the gradient itself, not of a few ulp)


@pytest.mark.parametrize("shape", [(1, 4, 2, 9, 20, 64), (1, 4, 2, 17, 33, 128)], ids=["d64", "d128"])
@pytest.mark.parametrize("error", PLANTED, ids=lambda e: e.replace(" ", "-"))
def test_planted_errors_are_rejected(error, shape):
    """Each planted error (in the exact gradients, so nothing else is off) fails the check at the float16 ulp of
    the simulator test: the largest ratio |fd - analytic| / tolerance over the directions is above 1 (a 1 % scale:
    about 5, along the gradient's own direction; the structural errors: 270 to 700). A structural one fails it
    also at bfloat16's ulp (34 to 86), and along the random directions alone (they see errors orthogonal to the
    gradient). The same gradients without the error pass (tests above). Causal, grouped-query heads (4 query
    heads on 2 K/V heads), ragged lengths."""
    q, k, v, do = inputs(*shape, seed=2)
    scale = 1 / np.sqrt(shape[-1])
    checks = fd_directional_check(q, k, v, do, *planted(error, q, k, v, do, True, scale), True, scale,
                                  np.random.default_rng(3))
    for dtype in ("float16", "bfloat16") if error in STRUCTURAL else ("float16",):
        ratios = fd_ratios(checks, ULP[dtype])
        print(f"{error} {shape} {dtype}: largest ratio {ratios.max():.3g}")
        assert ratios.max() > 1, f"{error} passed at {dtype}:\n" + fd_table(checks, ULP[dtype])
        if error in STRUCTURAL:
            random = max(r for r, c in zip(ratios, checks) if c.random)
            assert random > 1, f"{error} passed the random directions at {dtype}:\n" + fd_table(checks, ULP[dtype])
