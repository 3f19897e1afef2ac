"""Under NUMBA_ENABLE_CUDASIM=1: numbatma.kernels.Attention runs in the simulator (TMA loads of Q, K and V into
swizzled stages through three Pipelines, QKᵀ and PV on wgmma with P from registers, the online softmax through
wgmma_map / wgmma_row_reduce, the O store through shared memory) and matches a float64 NumPy reference,
log-sum-exp included. Kept small: the simulator runs 384 Python threads per block.

Float16 inputs (NumPy has them; bfloat16 takes the same path with another element type)."""
import numpy as np
import pytest
from numba import cuda

from numbatma.kernels import Attention, _launch

from attention_reference import attention_reference, heads_major, lse_error


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)  # a persistent grid of 2: several items per CTA


CASES = [  # (batch, q heads, kv heads, sq, sk, head dim, causal, layout, bn, schedule)
    (1, 1, 1, 100, 70, 64, False, "bhsd", 64, None),  # ragged ends, one query block, two key blocks; pingpong
    (1, 2, 1, 130, 40, 64, True, "bshd", 64, None),  # causal diagonal, two query blocks, GQA, (B, S, H, D)
    (1, 1, 1, 70, 100, 64, True, "bhsd", 32, "serial"),  # each product waited for in turn; four key blocks
    (1, 1, 1, 64, 100, 64, False, "bhsd", 48, "overlap"),  # intra-warpgroup overlap only; bn = 48 (3 blocks)
]
ORDER_CASES = [  # (batch, q heads, kv heads, sq, sk, head dim, causal, order, sweep): a grid of 2 CTAs
    (1, 3, 1, 100, 60, 64, True, "snake", "heads"),  # 3 items: in round 1 (reversed) CTA 0 has none
    # (cyclic order, query blocks fastest, 3 rounds: tests/test_gpu_attention.py::test_item_orders, every order x
    # sweep x mask on the GPU; the simulator case took a minute of the CPU suite)
]
# (the default two Q stages wrap around in the second case: 3 items per CTA; one Q stage below)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}/{}-{}x{}-d{}-{}-{}-bn{}-{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], "causal" if c[6] else "full", c[7], c[8], c[9] or "default"))
def test_attention_matches_numpy(case):
    check(*case)


@pytest.mark.parametrize("case", ORDER_CASES, ids=lambda c: f"{c[7]}-{c[8]}")
def test_every_item_is_computed_once_in_any_order(case):
    check(*case[:7], "bhsd", 64, None, order=case[7], sweep=case[8])


def test_a_wide_key_block():
    """FA3's D = 128 tile width: ``bn = 176`` (not a power of two: 11 k-steps of P V), a ragged second key block
    (200 = 176 + 24) under the causal mask, the 240-register consumer budget's sibling (``producer_registers=32``)."""
    check(1, 1, 1, 40, 200, 64, True, "bhsd", 176, "overlap", producer_registers=32)


def test_lazy_rescale_keeps_and_moves_maxima():
    """D = 128 (two chunks; its default ``lazy_rescale``), a tiny query block, bn = 32, logits rising and falling
    along the keys: in the second key block the slow rows stay within the threshold (their maxima kept, weights
    above 1) while the fast rows of the same warp move theirs (~80 log2 units: O rescaled for the warp)."""
    plan = check(1, 1, 1, 17, 40, 128, False, "bhsd", 32, None, trend=True)
    assert plan.config.lazy_rescale


def test_one_q_stage_own_o_buffer():
    """``q_stages=1`` with ``o_buffer=True`` (the other cases stage O in the Q stage): each item's Q loads only once
    the previous item's last Q Kᵀ has released the stage (eight warps arrive); O goes out through its own tile,
    whose previous store each epilogue waits for. Causal, serial, logits rising and falling along the keys (the
    running maxima move every block: O rescaled; float16 weights would overflow, 2^140, without it)."""
    check(1, 3, 1, 40, 64, 64, True, "bhsd", 32, "serial", q_stages=1, o_buffer=True, trend=True)


SCALE_CASES = [  # (sq, sk, causal, schedule, scale, integer inputs): one key block (bn = 64) or two, every mode
    (70, 100, False, None, 0.0, False),  # "zero": o the mean of V over the keys (a ragged second block masked)
    (100, 70, True, "serial", -0.3, False),  # "fused", negative: the raw row minimum, masked keys at +inf
    (40, 90, True, None, 1e37, True),  # "exact": ties of integer logits share the weight, every other key 0;
    # lse finite (row max below 23) or +inf (beyond float32); the old fused rule gave inf - inf here
    (40, 70, False, "serial", -3e38, True),  # "exact", negative; lse beyond float32 (inf of its sign) or finite
]


@pytest.mark.filterwarnings("ignore:overflow encountered")  # (float32 overflow to ±inf is the point: IEEE)
@pytest.mark.parametrize("case", SCALE_CASES, ids=lambda c: f"scale{c[4]:g}-{'causal' if c[2] else 'full'}")
def test_every_scale(case):
    """Every softmax mode (kernels.attention.softmax_mode) against the float64 reference, o and lse."""
    sq, sk, causal, schedule, scale, integers = case
    check(1, 1, 1, sq, sk, 64, causal, "bhsd", 64, schedule, scale=scale, integers=integers)


def check(b, hq, hk, sq, sk, d, causal, layout, bn, schedule, integers=False, trend=False, **options):
    rng = np.random.default_rng()
    if trend:  # logit ≈ slope_i · t_j / 8: t rises along the keys, the slope cycles over the rows
        q = (rng.standard_normal((b, hq, sq, d)) * 0.3).astype(np.float16)
        k = (rng.standard_normal((b, hk, sk, d)) * 0.3).astype(np.float16)
        v = rng.standard_normal((b, hk, sk, d)).astype(np.float16)
        q[..., 0] = np.array([8.0, 0.0, -8.0, 0.5, 3.0])[np.arange(sq) % 5]
        k[..., 0] = np.linspace(0, 100, sk)
    elif integers:  # small integers: every logit exact in float32 (the float64 reference sees the same ties)
        q, k, v = (rng.integers(-2, 3, (b, h, s, d)).astype(np.float16) for h, s in ((hq, sq), (hk, sk), (hk, sk)))
    else:
        q = rng.standard_normal((b, hq, sq, d)).astype(np.float16)
        k = rng.standard_normal((b, hk, sk, d)).astype(np.float16)
        v = rng.standard_normal((b, hk, sk, d)).astype(np.float16)
    as_layout = (lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))) if layout == "bshd" else (lambda x: x)
    d_o = cuda.to_device(np.full(as_layout(q).shape, np.nan, np.float16))
    d_lse = cuda.to_device(np.full((b, hq, sq), np.nan, np.float32))
    plan = Attention(*(cuda.to_device(as_layout(x)) for x in (q, k, v)), d_o, d_lse, causal=causal, layout=layout,
                     bn=bn, stages=2, schedule=schedule, **options)
    o, lse = plan.launch()
    got = heads_major(o.copy_to_host(), layout).astype(np.float64)
    got_lse = lse.copy_to_host()
    ref, ref_lse = attention_reference(q, k, v, causal, plan.scale)
    assert not np.isnan(got).any() and not np.isnan(got_lse).any(), "outputs never written (or NaN)"
    assert np.abs(got - ref).max() <= 2.0 ** -10 * np.abs(ref).max() + 2e-3
    if integers:  # (huge scales: relative, and ±inf where the float64 lse is beyond float32)
        assert lse_error(got_lse, ref_lse, rel=1e-5, atol=1e-4) <= 0
    else:
        assert np.abs(got_lse - ref_lse).max() <= 1e-4 * np.abs(ref_lse).max() + 1e-4
    return plan
