"""Under NUMBA_ENABLE_CUDASIM=1: numbatma.kernels.AttentionBackward (the preprocess, the warp-specialized main kernel
- TMA loads of K, V, Q, dO and the row statistics through two Pipelines, Sᵀ / dPᵀ / dV / dK / dQ on wgmma with
Pᵀ and dSᵀ from registers and dSᵀ read back from shared memory MN-major, dq's float32 additions - and the
postprocess) matches a float64 NumPy reference of the gradients, on the reference forward's o and lse, and finite
differences of the float64 forward (tests/attention_reference.py: fd_directional_check). Kept small: the
simulator runs 384 Python threads per block. Float16 inputs (NumPy has them; bfloat16 takes the same path)."""
import numpy as np
import pytest
from numba import cuda

from numbatma.kernels import AttentionBackward, _launch, attention_backward

from attention_reference import attention_backward_reference as reference
from attention_reference import attention_reference
from attention_reference import fd_directional_check, fd_ratios, fd_table


def forward(q, k, v, causal):
    """The forward's o (float16) and lse (float32) from the float64 reference - the simulated Attention kernel has
    tests of its own (tests/sim/test_sim_attention.py), and here it took ~6 s a case; the GPU tests chain the two."""
    o, lse = attention_reference(q, k, v, causal, 1 / np.sqrt(q.shape[-1]))
    return o.astype(np.float16), lse.astype(np.float32)


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)  # a persistent grid of 2: several items per CTA


CASES = [  # (batch, q heads, kv heads, sq, sk, head dim, causal, function form or the plan's options)
    (1, 2, 1, 40, 300, 64, True, dict(kv_registers=True)),  # 64 queries a step, K and V in registers: GQA (two
    # query heads per K/V head), causal diagonal, ragged ends; three items on two CTAs, two of them seen by no query
    # (their K and V read into registers, then released: the warps' reads ordered before lane 0's release by
    # cuda.syncwarp, or the next item's load races them)
    (1, 1, 1, 17, 150, 128, False, True),  # two 64-wide chunks of D, one query block (17 rows), two key items
    (1, 1, 1, 40, 100, 256, True, False),  # D = 256: 64-key items, each consumer half of the head dim and Sᵀ, dPᵀ
    # of half the queries (split_scores); the keys past every query (causal) get dK = dV = 0 from an item without
    # query blocks
    (1, 2, 1, 100, 170, 64, True, False),  # D = 64's default, 128 queries a step (FA3's tile): the causal diagonal
    # of a 128 x 128 block, a ragged query block, GQA, and an item no query sees (keys 128..169)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}/{}-{}x{}-d{}-{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], "causal" if c[6] else "full"))
def test_gradients_match_numpy(case):
    b, hq, hk, sq, sk, d, causal, function = case
    rng = np.random.default_rng()
    q, do = (rng.standard_normal((b, hq, sq, d)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((b, hk, sk, d)).astype(np.float16) for _ in range(2))
    dq, dk, dv = (cuda.to_device(np.full(x.shape, np.nan, np.float16)) for x in (q, k, v))
    o, lse = (cuda.to_device(x) for x in forward(q, k, v, causal))
    args = [cuda.to_device(x) for x in (q, k, v)]
    if function is True:
        attention_backward(*args, o, cuda.to_device(do), lse, dq, dk, dv, causal=causal)
    else:
        AttentionBackward(*args, o, cuda.to_device(do), lse, dq, dk, dv, causal=causal, **(function or {})).launch()
    # (the reference's o is exact; ours is rounded to float16 - delta differs by that rounding only)
    grads = []
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), reference(q, k, v, do, causal, 1 / np.sqrt(d))):
        got = got.copy_to_host().astype(np.float64)
        assert not np.isnan(got).any(), f"{name}: elements never written"
        err = np.abs(got - want).max()
        assert err <= 4e-3 * np.abs(want).max(), f"{name}: max error {err:.3g}, max |ref| {np.abs(want).max():.3g}"
        grads.append(got)
    # and gradcheck-style: the gradients are those of the forward itself - central differences of the float64 loss
    # sum(attention(q, k, v) · dO) along the gradients' own directions and random ones (fd_directional_check, the
    # tolerance of fd_tolerance at the float16 ulp), independently of the closed-form reference above
    checks = fd_directional_check(q, k, v, do, *grads, causal, 1 / np.sqrt(d), rng)
    assert fd_ratios(checks, 2.0 ** -10).max() <= 1, fd_table(checks, 2.0 ** -10)


def test_rows_on_4_byte_boundaries_take_the_narrow_row_kernels():
    """o and dq as views two elements into wider rows (rows on 4-byte, not 8-byte, boundaries): the row kernels
    move 32-bit words of them instead of 64-bit ones - same gradients; the parents' first two columns untouched.
    With pingpong=True (the consumers issue Sᵀ and dPᵀ in turn, beside the dSᵀ barrier of every step)."""
    b, h, sq, sk, d = 1, 1, 40, 90, 128  # (one query block: the row kernels are what this is about)
    rng = np.random.default_rng()
    q, do = (rng.standard_normal((b, h, sq, d)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((b, h, sk, d)).astype(np.float16) for _ in range(2))
    dk, dv = (cuda.to_device(np.full(x.shape, np.nan, np.float16)) for x in (k, v))
    args = [cuda.to_device(x) for x in (q, k, v)]
    o_dense, lse_host = forward(q, k, v, False)
    lse = cuda.to_device(lse_host)
    o_host = np.full((b, h, sq, d + 2), 7, np.float16)
    o_host[..., 2:] = o_dense
    o = cuda.to_device(o_host)[..., 2:]
    dq_parent = cuda.to_device(np.full((b, h, sq, d + 2), 7, np.float16))
    dq = dq_parent[..., 2:]
    plan = AttentionBackward(*args, o, cuda.to_device(do), lse, dq, dk, dv, pingpong=True)
    assert plan.prep.args[0].dtype == np.uint32 and plan.post.args[1].dtype == np.uint32  # (the narrow words)
    plan.launch()
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), reference(q, k, v, do, False, 1 / np.sqrt(d))):
        got = got.copy_to_host().astype(np.float64)
        err = np.abs(got - want).max()
        assert err <= 4e-3 * np.abs(want).max(), f"{name}: max error {err:.3g}, max |ref| {np.abs(want).max():.3g}"
    assert (dq_parent.copy_to_host()[..., :2] == 7).all(), "dq's parent written outside the view"


def deterministic_turns(hq, **options):
    """A causal deterministic plan (1 batch, ``hq`` query heads on one K/V head, 70 x 150 queries and keys, D = 64)
    launched and checked against the reference; returns its turn counters (batch, head, 64-row query block) and the
    key blocks that see each query block."""
    b, hk, sq, sk, d = 1, 1, 70, 150, 64
    rng = np.random.default_rng()
    q, do = (rng.standard_normal((b, hq, sq, d)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((b, hk, sk, d)).astype(np.float16) for _ in range(2))
    o, lse = (cuda.to_device(x) for x in forward(q, k, v, True))
    args = [cuda.to_device(x) for x in (q, k, v)]
    grads = [cuda.to_device(np.full(x.shape, np.nan, np.float16)) for x in (q, k, v)]
    plan = AttentionBackward(*args, o, cuda.to_device(do), lse, *grads, causal=True, deterministic=True, **options)
    assert plan.grid == 1
    plan.launch()
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference(q, k, v, do, True, 1 / np.sqrt(d))):
        err = np.abs(got.copy_to_host().astype(np.float64) - want).max()
        assert err <= 4e-3 * np.abs(want).max(), f"{name}: max error {err:.3g}"
    turns = plan.turns.copy_to_host()
    return turns, [sum(1 for n0 in range(0, sk, 128) if n0 <= 64 * i + 63) for i in range(turns.shape[2])]


def test_deterministic_mode_counts_dq_turns_by_key_block():
    """deterministic=True: each consumer waits for its query block's turn before reduce-adding dQ and counts its
    adds (at its next add, or the item's end). One block in the simulator (it runs blocks one after another: the
    items come in descending key-block order, every wait is met at once) - what this checks is the counting: every
    query block ends at 2 adds per key block that sees it (D = 64: both consumers add), and the gradients of the
    reference. (Bitwise equality of two
    runs: tests/test_gpu_attention_backward.py.) With kv_stages=2: the second item's K and V load into the second
    stage while the first item runs."""
    turns, seen = deterministic_turns(1, kv_stages=2, queries=64)  # (one block takes both items: both K/V stages)
    assert (turns == 2 * np.array(seen)[None, None, :]).all(), (turns, seen)


def test_deterministic_mode_with_128_queries_counts_one_add_per_key_block():
    """deterministic=True with queries=128: each 64-row query block takes its adds from the consumer whose queries
    they are - one per key block that sees it (2 per key block with 64 queries a step, where both consumers add)."""
    turns, seen = deterministic_turns(1, queries=128)
    assert turns.shape[2] == 2 and (turns == np.array(seen)[None, None, :]).all(), (turns, seen)


@pytest.mark.parametrize("d", [64, 128])
def test_preprocess_rows_past_the_queries_in_a_shared_warp(d):
    """The preprocess alone: at D = 64 a warp takes two rows at a time (16 lanes each), so with an odd Sq one of a
    pair lies past the queries - its lanes must still take part in the other row's shuffles (a shuffle that half a
    warp skips hangs here and is undefined on the GPU). delta and lse · log2 e for the rows, +inf / 0 past them,
    dq's accumulator and the turn counters zeroed."""
    b, h, sq, sk = 1, 2, 17, 40
    rng = np.random.default_rng()
    q, do, o = (rng.standard_normal((b, h, sq, d)).astype(np.float16) for _ in range(3))
    k, v = (rng.standard_normal((b, h, sk, d)).astype(np.float16) for _ in range(2))
    lse = rng.standard_normal((b, h, sq)).astype(np.float32)
    args = [cuda.to_device(x) for x in (q, k, v, o, do, lse)]
    grads = [cuda.to_device(np.full(x.shape, np.nan, np.float16)) for x in (q, k, v)]
    plan = AttentionBackward(*args, *grads)
    plan.dqacc.copy_to_device(np.full(plan.dqacc.shape, np.nan, np.float32))
    plan.prep.launch()
    stats = plan.stats.copy_to_host()
    delta = (do.astype(np.float64) * o.astype(np.float64)).sum(-1)
    np.testing.assert_allclose(stats[:, :, 1, :sq], delta, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(stats[:, :, 0, :sq], lse * np.float32(1.4426950408889634), rtol=1e-6)
    assert (stats[:, :, 0, sq:] == np.inf).all() and (stats[:, :, 1, sq:] == 0).all()
    assert (plan.dqacc.copy_to_host() == 0).all() and (plan.turns.copy_to_host() == 0).all()
