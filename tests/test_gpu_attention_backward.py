"""GPU tests (marker ``gpu``): numbatma.kernels.AttentionBackward against torch autograd through
scaled_dot_product_attention in float32, on the same bfloat16 / float16 inputs (fresh random data): dq, dk, dv for
head dims 64, 128 and 256, causal and not, lengths 1, 17, 1000, 4097, different query and key lengths, grouped-query
heads (dk and dv summed over a group), both layouts, the scale; the outputs NaN-poisoned first, and written through
views inside larger buffers whose margins must keep their sentinel. And (issue 26, at the end) the gradients against
float64 finite differences of the forward itself, on tiny cases (tests/attention_reference.py).

Tolerance: P and dS enter the tensor cores rounded to the input type (half an ulp relative each), the outputs are
rounded once more; |grad - ref| <= 4 ulp(dtype) · max|ref| + 1e-3 · max|ref| covers that with room, and a wrong
mask, scale or missing block is off by far more (a few percent of max|ref| at least)."""
import math

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from numbatma.kernels import Attention, AttentionBackward, attention_backward  # noqa: E402

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ULP = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
SENTINEL = 7.0


def reference(q, k, v, do, causal, scale):
    """(dq, dk, dv) in float32 from (B, H, S, D) tensors by autograd (k, v repeated over the group)."""
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qf, kf.repeat_interleave(group, 1),
                                                         vf.repeat_interleave(group, 1), is_causal=causal,
                                                         scale=scale)
    o.backward(do.float())
    return qf.grad, kf.grad, vf.grad


def padded(shape, dtype, layout):
    """(view, parent): a (B, H, S, D) view - stored as ``layout`` - inside a parent with margins on the sequence
    and batch axes, everything SENTINEL, the view then NaN."""
    b, h, s, d = shape
    if layout == "bshd":
        parent = torch.full((b + 1, s + 3, h, d), SENTINEL, device="cuda", dtype=dtype)
        view = parent[:b, 1:s + 1]  # (B, S, H, D)
    else:
        parent = torch.full((b + 1, h, s + 3, d), SENTINEL, device="cuda", dtype=dtype)
        view = parent[:b, :, 1:s + 1]
    view.fill_(float("nan"))
    return view, parent


def run_case(b, hq, hk, sq, sk, d, causal, layout="bhsd", dtype="bfloat16", scale=None, function=False, **options):
    torch.manual_seed(hash((b, hq, hk, sq, sk, d, causal, layout, dtype)) % (1 << 31))
    t = TORCH[dtype]

    def make(h, s):
        x = torch.randn((b, h, s, d), device="cuda", dtype=torch.float32).to(t)  # (B, H, S, D)
        return x.transpose(1, 2).contiguous() if layout == "bshd" else x

    q, k, v, do = make(hq, sq), make(hk, sk), make(hk, sk), make(hq, sq)
    as_bhsd = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    o = torch.empty_like(q)
    lse = torch.empty((b, hq, sq), device="cuda", dtype=torch.float32)
    fwd = Attention(q, k, v, o, lse, causal=causal, layout=layout, scale=scale)
    fwd.launch()
    grads = [padded((b, h, s, d), t, layout) for h, s in ((hq, sq), (hk, sk), (hk, sk))]
    dq, dk, dv = (g[0] for g in grads)
    if function:
        attention_backward(q, k, v, o, do, lse, dq, dk, dv, causal=causal, layout=layout, scale=scale, **options)
    else:
        AttentionBackward(q, k, v, o, do, lse, dq, dk, dv, causal=causal, layout=layout, scale=scale,
                          **options).launch()
    torch.cuda.synchronize()
    refs = reference(as_bhsd(q), as_bhsd(k), as_bhsd(v), as_bhsd(do), causal, fwd.scale)
    for name, (view, parent), ref in zip(("dq", "dk", "dv"), grads, refs):
        got = as_bhsd(view).float()
        assert not torch.isnan(got).any(), f"{name}: {int(torch.isnan(got).sum())} elements never written"
        scale_ref = max(ref.abs().max().item(), 1e-2)  # (S = 1: dq is 0 up to rounding noise)
        err = (got - ref).abs().max().item()
        bound = (4 * ULP[dtype] + 1e-3) * scale_ref
        assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g} (max |ref| {scale_ref:.3g})"
        outside = parent.clone()
        if layout == "bshd":
            outside[:view.shape[0], 1:view.shape[1] + 1] = SENTINEL
        else:
            outside[:view.shape[0], :, 1:view.shape[2] + 1] = SENTINEL
        assert (outside == SENTINEL).all(), f"{name}: written outside its view"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b, hq, hk, sq, sk", [(1, 2, 2, 1, 1), (2, 3, 3, 17, 17), (1, 4, 2, 1000, 1000),
                                               (1, 2, 2, 300, 1000), (1, 2, 1, 1000, 300), (1, 1, 1, 4097, 4097)])
def test_gradients_match_float32_autograd(d, causal, b, hq, hk, sq, sk):
    run_case(b, hq, hk, sq, sk, d, causal)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bshd_float16_and_a_scale(d, causal):
    run_case(2, 4, 2, 333, 517, d, causal, layout="bshd", dtype="float16", scale=0.3)
    run_case(1, 2, 1, 200, 130, d, causal, scale=-0.7, function=True)


def test_function_form_reuses_its_plan_with_fresh_work_arrays_on_two_streams():
    """attention_backward with new tensors of one layout, on two streams at once: the cached plan is re-pointed
    (plan_cache_info's hits) and each call gets work arrays of its own (Plan.owned_output, on its stream), so the
    two calls - neither waiting for the other - both give the reference's gradients (outputs NaN-poisoned)."""
    from numbatma.kernels import clear_plan_cache, plan_cache_info

    clear_plan_cache()
    torch.manual_seed(5)
    b, h, s, d = 2, 4, 700, 64
    sets = []
    for _ in range(3):
        q, k, v, do = (torch.randn((b, h, s, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o = torch.empty_like(q)
        lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
        Attention(q, k, v, o, lse, causal=True).launch()
        sets.append((q, k, v, o, do, lse) + tuple(torch.full_like(x, float("nan")) for x in (q, k, v)))
    attention_backward(*sets[0], causal=True)  # (the plan built and cached)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for stream, args in zip(streams, sets[1:]):
        with torch.cuda.stream(stream):
            attention_backward(*args, causal=True)
    torch.cuda.synchronize()
    assert plan_cache_info()["hits"] >= 1
    for q, k, v, o, do, lse, dq, dk, dv in sets:
        for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), reference(q, k, v, do, True, 1 / math.sqrt(d))):
            err = (got.float() - ref).abs().max().item()
            assert err <= (4 * ULP["bfloat16"] + 1e-3) * ref.abs().max().item(), f"{name}: max error {err:.3g}"


def test_default_scale_is_one_over_sqrt_d():
    run_case(1, 2, 2, 128, 128, 64, False, scale=1 / math.sqrt(64))


@pytest.mark.parametrize("options", [dict(dq_split="keys"), dict(stages=3), dict(stages=1, dq_split="keys"),
                                     dict(pingpong=True)],
                         ids=["keys", "three-stages", "one-stage-keys", "pingpong"])
def test_other_schedules_at_head_dim_128(options):
    """The benchmark's switches: dQ over each consumer's own keys, three Q/dO stages (one dQ staging buffer)."""
    run_case(1, 4, 2, 1000, 700, 128, True, **options)
    run_case(2, 2, 2, 300, 900, 128, False, **options)


def test_two_kv_stages_at_head_dim_64():
    """kv_stages=2 (the next item's K and V loaded under this one; not yet measured): many items per CTA."""
    run_case(2, 4, 2, 700, 2000, 64, True, kv_stages=2)
    run_case(1, 2, 1, 1500, 900, 64, False, kv_stages=2)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kv_registers_at_head_dim_64(causal, dtype):
    """kv_registers (K and V of a consumer's keys as register A fragments, read once per item through ldmatrix of
    the swizzled tiles): GQA, ragged ends, Sk > Sq and Sq > Sk, several items per CTA, with kv_stages=2 too."""
    run_case(2, 4, 2, 700, 2000, 64, causal, dtype=dtype, kv_registers=True)
    run_case(1, 2, 1, 1500, 900, 64, causal, dtype=dtype, kv_registers=True)
    run_case(1, 1, 1, 17, 300, 64, causal, dtype=dtype, kv_registers=True, kv_stages=2)


@pytest.mark.parametrize("d", [64, 128])
def test_rows_of_o_and_dq_on_4_byte_boundaries(d):
    """o and dq as views two elements into wider rows: the row kernels take 32-bit words; dq's margins untouched."""
    torch.manual_seed(d)
    b, h, s = 2, 2, 333
    q, k, v, do = (torch.randn((b, h, s, d), device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o_dense = torch.empty_like(q)
    lse = torch.empty((b, h, s), device="cuda", dtype=torch.float32)
    Attention(q, k, v, o_dense, lse, causal=True).launch()
    o_parent = torch.full((b, h, s, d + 2), SENTINEL, device="cuda", dtype=torch.bfloat16)
    o = o_parent[..., 2:]
    o.copy_(o_dense)
    dq_parent = torch.full((b, h, s, d + 2), SENTINEL, device="cuda", dtype=torch.bfloat16)
    dq = dq_parent[..., 2:]
    dq.fill_(float("nan"))
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    AttentionBackward(q, k, v, o, do, lse, dq, dk, dv, causal=True).launch()
    torch.cuda.synchronize()
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), reference(q, k, v, do, True, 1 / math.sqrt(d))):
        scale_ref = ref.abs().max().item()
        err = (got.float() - ref).abs().max().item()
        assert err <= (4 * ULP["bfloat16"] + 1e-3) * scale_ref, f"{name}: max error {err:.3g}"
    assert (dq_parent[..., :2] == SENTINEL).all(), "dq written outside its view"


@pytest.mark.parametrize("d", [64, 128, 256])
def test_atomic_dq_and_one_stage(d):
    """The benchmark's comparison variant (one atomic per dQ element) and a single Q/dO stage."""
    run_case(1, 4, 2, 1000, 700, d, True, dq_reduce="atomic")
    run_case(1, 2, 2, 500, 900, d, False, stages=1)


@pytest.mark.parametrize("options", [dict(dq_writer=True), dict(dv_first=False), dict(dq_writer=False, dv_first=False),
                                     dict(persistent=None)],
                         ids=["store-warp", "dv-after", "neither", "the-other-grid"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dq_store_warp_and_dv_first(d, causal, options):
    """The schedules besides each head dim's default: dq_writer (the consumers hand dQ's staged chunks to warp 1 of
    the producer warpgroup, which reduce-adds them: named-barrier hand-offs, one staging buffer per chunk) on and off,
    dv_first (dV's product issued before the dSᵀ barrier) off, persistent=False (a CTA per item; at D = 256 causal
    the default, where the case is the persistent grid's). GQA, ragged ends, Sq != Sk both ways, several items and
    query blocks per CTA; at D = 128 also with
    dq_split="keys" (two chunks a step) and two stages."""
    if "persistent" in options:  # (the grid the head dim does not take by default)
        options = dict(persistent=d == 256 and causal)
    run_case(1, 4, 2, 1000, 700, d, causal, **options)
    run_case(2, 2, 2, 17, 1500, d, causal, **options)
    if d == 128:
        run_case(1, 2, 1, 700, 900, d, causal, dq_split="keys", **options)
        run_case(1, 2, 2, 900, 700, d, causal, stages=2, **options)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_score_in_both_consumers_at_head_dim_256(causal):
    """split_scores=False at D = 256 (both consumers compute Sᵀ and dPᵀ of all the step's queries, each keeping its
    own dSᵀ copy - the fifth version's schedule, a benchmark switch): GQA, ragged ends, Sq != Sk both ways, with the
    persistent grid and a CTA per item."""
    run_case(1, 4, 2, 1000, 700, 256, causal, split_scores=False)
    run_case(2, 2, 2, 17, 1500, 256, causal, split_scores=False, persistent=not causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_128_queries_a_step_at_head_dim_64(causal, dtype):
    """queries=128 (FA3's D = 64 tile: 128 queries a step, each consumer's dQ its own 64 queries over all 128 keys):
    GQA, ragged ends, Sq != Sk both ways, several items and query blocks per CTA, with the store warp too."""
    run_case(1, 4, 2, 1000, 700, 64, causal, dtype=dtype, queries=128)
    run_case(2, 2, 1, 17, 1500, 64, causal, dtype=dtype, queries=128)
    run_case(1, 2, 2, 1500, 300, 64, causal, dtype=dtype, queries=128, dq_writer=True, layout="bshd")


@pytest.mark.parametrize("options", [dict(dq_writer=False), dict(dq_writer=True), dict(queries=128)],
                         ids=["consumers", "store-warp", "128-queries"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_deterministic_mode_gives_the_same_bits_twice(d, options):
    """deterministic=True: dq's additions in key-block order - two runs give bitwise equal dq, dk, dv (and the
    reference's values); GQA and causal, enough key blocks per query block that the order matters. With the
    consumers' own reduce-adds, the store warp's, and 128 queries a step (D = 64 only)."""
    if options.get("queries") == 128 and d != 64:
        pytest.skip("queries=128 is a head dim 64 tile")
    torch.manual_seed(d)
    b, hq, hk, s = 2, 4, 2, 2000
    q, do = (torch.randn((b, hq, s, d), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn((b, hk, s, d), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o = torch.empty_like(q)
    lse = torch.empty((b, hq, s), device="cuda", dtype=torch.float32)
    Attention(q, k, v, o, lse, causal=True).launch()
    runs = []
    for _ in range(2):
        grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
        AttentionBackward(q, k, v, o, do, lse, *grads, causal=True, deterministic=True, **options).launch()
        torch.cuda.synchronize()
        runs.append(grads)
    for name, a, c in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a.view(torch.int16), c.view(torch.int16)), f"{name}: two runs differ"
    for name, got, ref in zip(("dq", "dk", "dv"), runs[0], reference(q, k, v, do, True, 1 / math.sqrt(d))):
        scale_ref = ref.abs().max().item()
        err = (got.float() - ref).abs().max().item()
        assert err <= (4 * ULP["bfloat16"] + 1e-3) * scale_ref, f"{name}: max error {err:.3g}"


# -- issue 26: gradcheck-style finite differences in float64 (tests/attention_reference.py) -----------------------
import numpy as np  # noqa: E402

from attention_reference import FD_C, fd_directional_check, fd_ratios, fd_table  # noqa: E402


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b, hq, hk, sq, sk", [(1, 2, 1, 17, 33), (2, 4, 2, 33, 17)])
def test_gradients_match_finite_differences(b, hq, hk, sq, sk, d, causal, dtype):
    """The gradients are those of the forward itself, independently of torch's autograd: central differences of
    the float64 loss sum(attention(q, k, v) · dO) at the 16-bit inputs, along the gradients' own directions and
    random ones (fd_directional_check), within fd_tolerance at the ulp of ``dtype`` - a few ulp of the gradients'
    norm, tighter by sqrt(N) / 6 along random directions. Grouped-query heads, ragged lengths (fewer keys than
    queries too), every head dim. And the check has teeth at this shape and type: the same dk scaled by
    1 + 3 FD_C ulp fails it."""
    torch.manual_seed(1000 * sq + d + causal)
    t = TORCH[dtype]
    q, do = (torch.randn((b, hq, sq, d), device="cuda", dtype=torch.float32).to(t) for _ in range(2))
    k, v = (torch.randn((b, hk, sk, d), device="cuda", dtype=torch.float32).to(t) for _ in range(2))
    o = torch.empty_like(q)
    lse = torch.empty((b, hq, sq), device="cuda", dtype=torch.float32)
    fwd = Attention(q, k, v, o, lse, causal=causal)
    fwd.launch()
    grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    AttentionBackward(q, k, v, o, do, lse, *grads, causal=causal).launch()
    torch.cuda.synchronize()
    for name, g in zip(("dq", "dk", "dv"), grads):
        assert not torch.isnan(g).any(), f"{name}: {int(torch.isnan(g).sum())} elements never written"
    q64, k64, v64, do64, dq, dk, dv = (x.double().cpu().numpy() for x in (q, k, v, do, *grads))
    ulp = ULP[dtype]
    checks = fd_directional_check(q64, k64, v64, do64, dq, dk, dv, causal, fwd.scale, np.random.default_rng(d))
    assert fd_ratios(checks, ulp).max() <= 1, fd_table(checks, ulp)
    off = fd_directional_check(q64, k64, v64, do64, dq, dk * (1 + 3 * FD_C * ulp), dv, causal, fwd.scale,
                               np.random.default_rng(d))
    assert fd_ratios(off, ulp).max() > 1, "dk scaled by 1 + 3 FD_C ulp passed:\n" + fd_table(off, ulp)
