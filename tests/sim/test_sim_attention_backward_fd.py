"""Under NUMBA_ENABLE_CUDASIM=1: numbatma.kernels.AttentionBackward's gradients are the gradients of the forward
itself - central differences of the float64 loss sum(attention(q, k, v) · dO) along the gradients' own directions
and random ones (tests/attention_reference.py: fd_directional_check, with the tolerance of fd_tolerance at the
float16 ulp) - independently of the closed-form reference that tests/sim/test_sim_attention_backward.py compares
with. Tiny cases (one query block, one key item: the simulator runs 384 Python threads per block): grouped-query
heads, ragged lengths, the causal mask, the function form. Float16 inputs (NumPy has them)."""
import numpy as np
import pytest
from numba import cuda

from numbatma.kernels import Attention, AttentionBackward, _launch, attention_backward

from attention_reference import fd_directional_check, fd_ratios, fd_table

ULP = 2.0 ** -10  # float16


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)  # a persistent grid of 2: several items per CTA


CASES = [  # (batch, q heads, kv heads, sq, sk, head dim, causal, function form)
    (1, 2, 1, 9, 20, 64, True, True),  # GQA, causal: keys 9 to 19 past every query (dK = dV = 0 there)
    # (one case: .ci/run's time on 2 cores; the plan form and the full mask are in test_sim_attention_backward.py,
    # and the GPU test runs the check on 24 cases)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}/{}-{}x{}-d{}-{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], "causal" if c[6] else "full"))
def test_gradients_match_finite_differences(case):
    b, hq, hk, sq, sk, d, causal, function = case
    rng = np.random.default_rng()
    q, do = (rng.standard_normal((b, hq, sq, d)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((b, hk, sk, d)).astype(np.float16) for _ in range(2))
    grads = [cuda.to_device(np.full(x.shape, np.nan, np.float16)) for x in (q, k, v)]
    o = cuda.to_device(np.full(q.shape, np.nan, np.float16))
    lse = cuda.to_device(np.full((b, hq, sq), np.nan, np.float32))
    args = [cuda.to_device(x) for x in (q, k, v)]
    forward = Attention(*args, o, lse, causal=causal)
    forward.launch()
    if function:
        attention_backward(*args, o, cuda.to_device(do), lse, *grads, causal=causal)
    else:
        AttentionBackward(*args, o, cuda.to_device(do), lse, *grads, causal=causal).launch()
    dq, dk, dv = (g.copy_to_host().astype(np.float64) for g in grads)
    for name, got in zip(("dq", "dk", "dv"), (dq, dk, dv)):
        assert not np.isnan(got).any(), f"{name}: elements never written"
    checks = fd_directional_check(q, k, v, do, dq, dk, dv, causal, forward.scale, rng)
    assert fd_ratios(checks, ULP).max() <= 1, fd_table(checks, ULP)
