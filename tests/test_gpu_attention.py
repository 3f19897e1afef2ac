"""GPU tests (marker ``gpu``): numbatma.kernels.Attention against torch's scaled_dot_product_attention computed in
float32 (and the log-sum-exp from float32 scores) on fresh random data, outputs NaN-poisoned first: every head dim,
causal and not, ragged lengths (1, 17, 1000, 4097), different query and key lengths, grouped-query heads, both
layouts (and a "bhsd" view of "bshd" memory), bfloat16 and float16, a stream.

Tolerance (elementwise, on O): P is rounded to the input type before P V and O to the output type, each half an ulp
relative, so |O - ref| <= 2 ulp(dtype) * max|V| covers it with a factor of two to spare; the log-sum-exp is float32
all the way (1e-3 absolute)."""
import math

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from numba import cuda  # noqa: E402

from numbatma.kernels import Attention, attention  # noqa: E402

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ULP = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}


def reference(q, k, v, causal, scale):
    """(o, lse) in float32 from (B, H, S, D) tensors (k, v with fewer heads: repeated)."""
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    o = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, scale=scale)
    s = (qf @ kf.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return o, torch.logsumexp(s, -1)


def run_case(b, hq, hk, sq, sk, d, causal, layout="bhsd", dtype="bfloat16", view=False, stream=None, **options):
    def make(h, s):
        x = torch.randn((b, s, h, d), device="cuda", dtype=torch.float32).to(TORCH[dtype])
        if layout == "bshd":
            return x, x.transpose(1, 2)  # the reference takes (B, H, S, D)
        heads_major = x.transpose(1, 2)  # (B, H, S, D)
        return (heads_major if view else heads_major.contiguous()), heads_major

    q, q_ref = make(hq, sq)
    k, k_ref = make(hk, sk)
    v, v_ref = make(hk, sk)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, hq, sq), float("nan"), device="cuda", dtype=torch.float32)
    plan = Attention(q, k, v, o, lse, causal=causal, layout=layout, **options)
    plan.launch(0 if stream is None else cuda.external_stream(stream.cuda_stream))
    torch.cuda.synchronize()
    ref, ref_lse = reference(q_ref, k_ref, v_ref, causal, plan.scale)
    assert_matches(o if layout == "bhsd" else o.transpose(1, 2), lse, ref, ref_lse, v, dtype)


def assert_matches(got, lse, ref, ref_lse, v, dtype):
    """O within 2 ulp(dtype) · max|V| of the float32 reference, the log-sum-exp within 1e-3, nothing left NaN."""
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} outputs never written"
    assert not torch.isnan(lse).any(), "log-sum-exp never written"
    err = (got.float() - ref).abs()
    bound = 2 * ULP[dtype] * v.float().abs().max()
    assert err.max() <= bound, f"max error {err.max():.3g} > {bound:.3g} at {tuple(int(i) for i in (err == err.max()).nonzero()[0])}"
    assert (lse - ref_lse).abs().max() <= 1e-3


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq", [1, 17, 1000, 4097])
def test_head_dims_and_lengths(d, causal, seq):
    run_case(1, 2, 2, seq, seq, d, causal)


# The tile configurations beyond the defaults (FA3's tile shapes: wider key blocks, the 240-register consumers):
# every one against the float32 reference, ragged in both lengths.
TILES = [dict(d=128, bn=176), dict(d=128, bn=160), dict(d=128, bn=144, schedule="pingpong"),
         dict(d=128, bn=176, producer_registers=32), dict(d=64, bn=192), dict(d=64, bn=160),
         dict(d=256, bn=64, schedule="overlap", producer_registers=24), dict(d=256, bn=80, schedule="serial"),
         dict(d=256, bn=96, schedule="serial", producer_registers=24),
         dict(d=128, q_stages=2, o_buffer=False), dict(d=128, q_stages=1, o_buffer=True, schedule="serial"),
         dict(d=64, bn=128, o_buffer=False), dict(d=256, bn=80, schedule="overlap", producer_registers=24),
         dict(d=64, carry=True), dict(d=64, bn=192, carry=True), dict(d=64, q_stages=1, o_buffer=True, carry=True),
         dict(d=64, q_stages=2, o_buffer=True, carry=True),
         dict(d=64, lazy_rescale=True), dict(d=128, lazy_rescale=False), dict(d=256, lazy_rescale=False),
         dict(d=128, schedule="pingpong"), dict(d=128, schedule="serial"), dict(d=64, carry=True, lazy_rescale=True),
         dict(d=64, poly_exp2=0.25), dict(d=128, poly_exp2=0.125), dict(d=256, poly_exp2=1.0)]


@pytest.mark.parametrize("tile", TILES, ids=lambda t: "-".join(f"{k}{v}" for k, v in t.items()))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq, sk", [(1000, 1000), (300, 2049), (4097, 177)])
def test_tile_configurations(tile, causal, sq, sk):
    options = dict(tile)
    d = options.pop("d")
    run_case(1, 4, 2, sq, sk, d, causal, **options)


@pytest.mark.parametrize("d, options", [(128, {}), (64, {}), (256, {}), (128, dict(bn=176)),
                                          (64, dict(carry=True)), (256, dict(producer_registers=40))],
                         ids=["d128", "d64", "d256", "d128-bn176", "d64-carry", "d256-p40"])
@pytest.mark.parametrize("sq, sk, layout, grid", [(1000, 1000, "bhsd", None), (300, 2049, "bshd", None),
                                                  (4097, 177, "bhsd", 6), (17, 33, "bshd", None)])
def test_cluster_pairs(d, options, sq, sk, layout, grid):
    """``cluster_m=2``: CTA pairs on neighbouring query blocks of a head, each multicasting half of every K and V
    tile into both. Odd numbers of query blocks (300: 3; 4097: 33; 17: 1 - the partner's block is past the rows,
    computed on zeros and never stored), ragged key lengths, GQA, both layouts, a grid of 3 clusters (rounds)."""
    run_case(2, 4, 2, sq, sk, d, False, layout=layout, cluster_m=2, grid=grid, **options)


@pytest.mark.parametrize("carry", [False, True], ids=["per-item", "carried"])
@pytest.mark.parametrize("order", ["snake", "cyclic"])
@pytest.mark.parametrize("sweep", ["heads", "queries"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_item_orders(order, sweep, causal, carry):
    """Every persistent order and item numbering computes each item once: a grid of 3 CTAs over 3 x 3 heads x 5
    query blocks (45 items, 15 rounds, the last one partial), two Q stages wrapping around; the pipeline started
    per item or carried from one item to the next (causal: items of 1 to 4 key blocks follow each other)."""
    run_case(3, 3, 1, 600, 500, 64, causal, order=order, sweep=sweep, grid=3, q_stages=2, carry=carry)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_autotuned_plan(d, tmp_path, monkeypatch):
    """``autotune=True`` times the default and TUNE_SPACE's configurations on this GPU, caches the winner on disk,
    and the plan it builds is as exact as any."""
    monkeypatch.setenv("NUMBATMA_AUTOTUNE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBATMA_AUTOTUNE", raising=False)
    run_case(1, 4, 2, 1000, 1000, d, True, autotune=True)
    assert list(tmp_path.rglob("*.json")), "no winner cached"


@pytest.mark.parametrize("sq, sk", [(1, 4097), (17, 1000), (1000, 17), (300, 2049), (4097, 128)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_different_query_and_key_lengths(sq, sk, causal):
    run_case(2, 2, 2, sq, sk, 128, causal)


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_rising_and_falling_row_maxima(dtype, d, causal, lazy):
    """A wide dynamic range along the keys: logits that rise by ~13 log2 units per 128 keys in some rows (the
    running maxima move on every block: O rescaled each time), fall in others (the first block's maximum holds),
    stay flat or rise slowly - mixed within every warp. Unrescaled, the rising rows' weights would overflow float16
    (2^100); a wrong rescale factor shows on O and the log-sum-exp. ``lazy_rescale``: the slow rows (0.5: under
    the threshold of 8 log2 units for several blocks, then past it) keep stale maxima between rescales, and a
    warp whose rows rise fast rescales them all."""
    b, h, sq, sk = 1, 2, 1000, 1000
    gen = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    q = torch.randn((b, h, sq, d), device="cuda", generator=gen) * 0.3
    k = torch.randn((b, h, sk, d), device="cuda", generator=gen) * 0.3
    v = torch.randn((b, h, sk, d), device="cuda", generator=gen)
    slopes = torch.tensor([8.0, 0.0, -8.0, 0.5, 3.0], device="cuda")
    q[..., 0] = slopes[torch.arange(sq, device="cuda") % len(slopes)]
    k[..., 0] = torch.linspace(0, 100, sk, device="cuda")  # logit ≈ slope · t_j / sqrt(d) + noise
    q, k, v = (x.to(TORCH[dtype]) for x in (q, k, v))
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, sq), float("nan"), device="cuda", dtype=torch.float32)
    plan = Attention(q, k, v, o, lse, causal=causal, lazy_rescale=lazy)
    plan.launch()
    torch.cuda.synchronize()
    ref, ref_lse = reference(q, k, v, causal, plan.scale)
    assert_matches(o, lse, ref, ref_lse, v, dtype)


@pytest.mark.parametrize("hq, hk", [(8, 1), (8, 2), (6, 3)])
def test_grouped_query_heads(hq, hk):
    run_case(2, hq, hk, 333, 777, 128, True)


@pytest.mark.parametrize("layout, view", [("bshd", False), ("bhsd", True)], ids=["bshd", "bhsd-view-of-bshd"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_layouts(layout, view, d):
    run_case(2, 4, 2, 1000, 1000, d, d == 128, layout=layout, view=view)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_dtypes(dtype, d):
    run_case(1, 3, 3, 513, 1025, d, False, dtype=dtype)


def test_function_form_on_a_stream_and_lse_allocated():
    q = torch.randn((1, 2, 200, 64), device="cuda", dtype=torch.bfloat16)
    k = torch.randn((1, 2, 300, 64), device="cuda", dtype=torch.bfloat16)
    v = torch.randn((1, 2, 300, 64), device="cuda", dtype=torch.bfloat16)
    o = torch.full_like(q, float("nan"))
    stream = torch.cuda.Stream()
    out, lse = attention(q, k, v, o, stream=cuda.external_stream(stream.cuda_stream), scale=0.3)
    stream.synchronize()
    ref, ref_lse = reference(q, k, v, False, 0.3)
    assert out is o and (o.float() - ref).abs().max() <= 2 * ULP["bfloat16"] * v.float().abs().max()
    assert abs(float(ref_lse[0, 1, 5]) - float(lse[0, 1, 5])) <= 1e-3
    assert math.isfinite(float(lse[0, 0, 199]))


# -- issue 22: every finite scale, against the float64 NumPy reference (tests/attention_reference.py) -------------
from attention_reference import attention_reference, lse_error  # noqa: E402

SCALES = [None, 0.0, -0.3, -1.0, 1e-30, 1.5, 1e30, -1e30, 3e38, -3e38]  # None: the default 1 / sqrt(D)
HUGE = 1e6  # scales beyond this: integer-valued inputs (every logit exact in float32, ties shared as in float64)


def check_scale(scale, causal, sq, sk, d, dtype="bfloat16", plan=None, arrays=None, **options):
    """One launch (a new plan, or ``plan`` with its scale reassigned) against the float64 reference, o and lse
    NaN-poisoned first; returns the plan."""
    if arrays is None:
        if scale is not None and abs(scale) > HUGE:
            make = lambda h, s: torch.randint(-2, 3, (1, h, s, d), device="cuda").to(TORCH[dtype])  # noqa: E731
        else:
            make = lambda h, s: torch.randn((1, h, s, d), device="cuda").to(TORCH[dtype])  # noqa: E731
        arrays = make(2, sq), make(2, sk), make(2, sk)
    q, k, v = arrays
    if plan is None:
        o = torch.empty_like(q)
        lse = torch.empty((1, 2, sq), device="cuda", dtype=torch.float32)
        plan = Attention(q, k, v, o, lse, causal=causal, scale=scale, **options)
    else:
        plan.scale = scale
        o, lse = plan.output
    o.fill_(float("nan"))
    lse.fill_(float("nan"))
    plan.launch()
    torch.cuda.synchronize()
    ref, ref_lse = attention_reference(*(x.double().cpu().numpy() for x in (q, k, v)), causal, plan.scale)
    got = o.double().cpu().numpy()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), f"NaN (or never written) at scale {scale}"
    err = abs(got - ref).max()
    bound = 2 * ULP[dtype] * float(v.float().abs().max())
    assert err <= bound, f"scale {plan.scale}: max error of o {err:.3g} > {bound:.3g}"
    excess = lse_error(lse.cpu().numpy(), ref_lse, rel=1e-5, atol=1e-3)
    assert excess <= 0, f"scale {plan.scale}: lse off by {excess:.3g} beyond the tolerance"
    return plan


@pytest.mark.parametrize("scale", SCALES, ids=lambda s: "default" if s is None else f"{s:g}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq, sk, d", [(200, 333, 64), (300, 1000, 128), (130, 77, 256)],
                         ids=["ragged-d64", "ragged-d128", "one-ragged-block-d256"])
def test_every_finite_scale(scale, causal, sq, sk, d):
    check_scale(scale, causal, sq, sk, d)


@pytest.mark.parametrize("scale", [None, 0.0, -0.3, 1e-30, 1.5, -1e30], ids=lambda s: "default" if s is None else f"{s:g}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lazy_rescale_every_scale_mode(scale, causal):
    """``lazy_rescale=True`` in every softmax mode (the "fused" mode's stale maxima, a negative scale's minima,
    "zero", and "exact", which rescales eagerly whatever the option) against the float64 reference."""
    check_scale(scale, causal, 300, 1000, 128, lazy_rescale=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_scale_reassigned_on_a_built_plan(dtype):
    """``plan.scale = x`` between launches: the plan switches kernel where the mode changes (and back)."""
    torch.manual_seed(0)
    arrays = tuple(torch.randint(-2, 3, (1, 2, s, 64), device="cuda").to(TORCH[dtype]) for s in (150, 290, 290))
    plan = check_scale(None, True, 150, 290, 64, dtype, arrays=arrays)
    for scale in (-0.5, 0.0, 1e30, -1e30, 3e38, 0.125):
        check_scale(scale, True, 150, 290, 64, dtype, plan=plan, arrays=arrays)


def test_function_form_keeps_scales_apart():
    """attention(..., scale=...) caches its plans: a scale of another mode gets its own kernel, not the cached one."""
    q = torch.randint(-2, 3, (1, 2, 100, 64), device="cuda").to(torch.bfloat16)
    k = torch.randint(-2, 3, (1, 2, 180, 64), device="cuda").to(torch.bfloat16)
    v = torch.randn((1, 2, 180, 64), device="cuda").to(torch.bfloat16)
    for scale in (0.125, 0.0, -0.125, 1e30, 0.125):
        o = torch.full_like(q, float("nan"))
        out, lse = attention(q, k, v, o, causal=True, scale=scale)
        torch.cuda.synchronize()
        ref, ref_lse = attention_reference(*(x.double().cpu().numpy() for x in (q, k, v)), True, scale)
        assert abs(out.double().cpu().numpy() - ref).max() <= 2 * ULP["bfloat16"] * float(v.float().abs().max())
        assert lse_error(lse.cpu().numpy(), ref_lse, rel=1e-5, atol=1e-3) <= 0
