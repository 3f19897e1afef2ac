"""GPU tests (marker ``gpu``): numbatma.kernels.Gemm against a float64 reference on fresh random data, NaN-poisoned
outputs, awkward shapes (1 x 1 x 16, primes, 4097 x 4095 x 1000, padded views), both B layouts, every input /
output dtype pair, alpha/beta, numba / CuPy / torch arrays, a stream; Gemm's refusal of the retired
``warp_specialized`` option. The multistage (not warp-specialized) comparison kernel that option selected lives in
benchmarks/gemm_multistage.py now: tested here the same way (float32 reference, poisoned output, ragged shapes).

Tolerance (elementwise): the output's rounding (half an ulp of C's type times |ref|) plus the float32
accumulation bound K * 2^-23 * (|A| @ |B|), which scales with K."""
import importlib.util
import math
import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from numbatma import TensorMapError  # noqa: E402
from numbatma.kernels import Gemm, gemm  # noqa: E402

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
OUT_EPS = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}


def matrix(rows, cols, dtype, pad_to=8, fill=None):
    """A (rows, cols) CUDA tensor whose rows start 16-byte aligned: a view of a padded allocation when cols is not
    a multiple of 8 elements."""
    width = -(-cols // pad_to) * pad_to if cols % pad_to else cols
    if fill is None:
        base = torch.randn((rows, width), device="cuda", dtype=torch.float32).to(TORCH[dtype])
    else:
        base = torch.full((rows, width), fill, device="cuda", dtype=TORCH[dtype])
    return base[:, :cols]


def check(c, a, b_kn, alpha=1.0, beta=0.0, c0=None, out="bfloat16"):
    a64, b64 = a.double().cpu(), b_kn.double().cpu()
    ref = alpha * (a64 @ b64)
    if beta:
        ref += beta * c0.double().cpu()
    got = c.double().cpu()
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} outputs never written"
    k = a.shape[1]
    bound = OUT_EPS[out] * ref.abs() + abs(alpha) * k * 2.0 ** -23 * (a64.abs() @ b64.abs()) + 1e-30
    if beta:
        bound += OUT_EPS[out] * abs(beta) * c0.double().cpu().abs()
    bad = (got - ref).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outside tolerance; worst at " \
                          f"{tuple(int(i) for i in torch.nonzero(bad)[0])}"


def run(m, n, k, layout="nk", dtype="bfloat16", out="bfloat16", alpha=1.0, beta=0.0, **options):
    a = matrix(m, k, dtype)
    if layout == "kn":
        b = matrix(k, n, dtype)
        b_kn = b
    else:
        b = matrix(n, k, dtype)
        b_kn = b.t()
    if beta:
        c = matrix(m, n, out)
        c0 = c.clone()
    else:
        c = matrix(m, n, out, fill=float("nan"))
        c0 = None
    plan = Gemm(a, b, c, alpha=alpha, beta=beta, b_layout=layout, **options)
    plan.launch()
    torch.cuda.synchronize()
    check(c, a, b_kn, alpha, beta, c0, out)
    return plan


SHAPES = [(1, 1, 16), (1, 8, 16), (7, 13, 24), (127, 131, 72), (128, 256, 64), (257, 129, 520), (300, 520, 264),
          (1024, 1024, 1024), (4097, 4095, 1000), (2048, 8192, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_shapes(shape, layout):
    run(*shape, layout)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("out", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_dtypes(dtype, out, layout):
    run(300, 520, 264, layout, dtype, out)


@pytest.mark.parametrize("alpha, beta", [(0.5, 0.0), (1.0, 1.0), (-2.0, 0.25)])
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
def test_alpha_beta(alpha, beta, out):
    run(257, 300, 136, "nk", "bfloat16", out, alpha, beta)


@pytest.mark.parametrize("options", [dict(bn=128), dict(bn=64, stages=2), dict(bn=192), dict(stages=1),
                                     dict(group_m=1), dict(grid=3), dict(cluster_m=2), dict(cluster_m=2, stages=1),
                                     dict(cluster_m=2, grid=5)], ids=str)
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_options(options, layout):
    run(700, 1000, 520, layout, **options)


def test_warp_specialized_is_no_longer_an_option():
    a, b, c = matrix(64, 64, "bfloat16"), matrix(64, 64, "bfloat16"), matrix(64, 64, "bfloat16")
    with pytest.raises(TypeError, match="warp_specialized is no longer an option.*benchmarks/gemm_multistage.py"):
        Gemm(a, b, c, warp_specialized=False)


def multistage_module():
    """benchmarks/gemm_multistage.py (benchmarks/ is not a package: loaded by path)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_multistage.py"
    spec = importlib.util.spec_from_file_location("gemm_multistage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Ragged M and K (partial tiles, several k-steps); N a multiple of 8 (the benchmark kernel has no exact-store tail)
MULTISTAGE_SHAPES = [(1, 8, 16), (127, 136, 72), (257, 264, 520), (700, 1000, 520), (4097, 4088, 1000)]


@pytest.mark.parametrize("options", [dict(), dict(stages=1), dict(bn=128, stages=2), dict(bn=192, grid=3),
                                     dict(alpha=-0.5, group_m=1)], ids=str)
@pytest.mark.parametrize("shape", MULTISTAGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["nk", "kn"])
def test_multistage_benchmark_kernel(shape, layout, options):
    """benchmarks/gemm_multistage.py against a float32 reference (torch, on the GPU), the output NaN-poisoned
    first; the tolerance as :func:`check`'s with float32 sums: output rounding + K * 2^-23 * (|A| @ |B|)."""
    bench = multistage_module()
    m, n, k = shape
    a = matrix(m, k, "bfloat16")
    b = matrix(k, n, "bfloat16") if layout == "kn" else matrix(n, k, "bfloat16")
    b_kn = b if layout == "kn" else b.t()
    c = matrix(m, n, "bfloat16", fill=float("nan"))
    alpha = options.get("alpha", 1.0)
    plan = bench.MultistageGemm(a, b, c, b_layout=layout, **options)
    assert plan.launch() is c
    torch.cuda.synchronize()
    a32, b32 = a.float(), b_kn.float()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # (a true float32 reference)
    try:
        ref = alpha * (a32 @ b32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    got = c.float()
    assert not torch.isnan(got).any(), f"{int(torch.isnan(got).sum())} outputs never written"
    bound = OUT_EPS["bfloat16"] * ref.abs() + abs(alpha) * k * 2.0 ** -23 * (a32.abs() @ b32.abs()) + 1e-30
    bad = (got - ref).abs() > 2 * bound  # (the float32 reference rounds too: twice the bound)
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} outside tolerance"


def test_multistage_benchmark_kernel_refuses_a_c_with_a_partial_16_byte_unit():
    bench = multistage_module()
    a, b, c = matrix(64, 64, "bfloat16"), matrix(61, 64, "bfloat16"), matrix(64, 61, "bfloat16")
    with pytest.raises(TensorMapError, match=r"c's rows are 122 bytes \(N = 61 bfloat16\)"):
        bench.MultistageGemm(a, b, c, b_layout="nk")


@pytest.mark.parametrize("bn", [64, 192])
def test_cluster_with_an_odd_number_of_b_boxes(bn):
    """(N, K) B tiles split in row halves between the two CTAs of a cluster; (K, N) tiles of an odd number of
    64-column boxes cannot be split evenly: refused before launch."""
    run(300, 520, 264, "nk", bn=bn, cluster_m=2)
    a, b, c = matrix(300, 264, "bfloat16"), matrix(264, 520, "bfloat16"), matrix(300, 520, "bfloat16")
    with pytest.raises(TensorMapError, match="even number of 64-column boxes"):
        Gemm(a, b, c, b_layout="kn", bn=bn, cluster_m=2)


def test_plan_relaunch_and_stream():
    a, b = matrix(512, 256, "bfloat16"), matrix(384, 256, "bfloat16")
    c = matrix(512, 384, "bfloat16", fill=float("nan"))
    plan = Gemm(a, b, c, b_layout="nk")
    stream = torch.cuda.Stream()
    from numba import cuda

    plan.launch(cuda.external_stream(stream.cuda_stream))
    stream.synchronize()
    check(c, a, b.t())
    a.copy_(torch.randn_like(a))
    c.fill_(float("nan"))
    plan.launch()
    torch.cuda.synchronize()
    check(c, a, b.t())


def test_alpha_beta_change_between_launches_of_a_prepared_plan():
    a, b = matrix(256, 128, "bfloat16"), matrix(192, 128, "bfloat16")
    c = matrix(256, 192, "float32")
    c0 = c.clone()
    plan = Gemm(a, b, c, b_layout="nk", alpha=1.0, beta=1.0)
    plan.launch()
    plan.alpha, plan.beta = -0.5, 2.0
    c1 = c.clone()
    plan.launch()
    torch.cuda.synchronize()
    ref1 = a.double() @ b.t().double() + c0.double()
    check(c1, a, b.t(), 1.0, 1.0, c0, "float32")
    check(c, a, b.t(), -0.5, 2.0, c1, "float32")
    assert torch.allclose(c1.double(), ref1, rtol=1e-4, atol=1e-3)


def test_prepare_launch_of_a_plain_kernel_on_a_stream():
    """numbatma.prepare_launch: arguments converted once; new data in the same arrays is seen; streams."""
    from numba import cuda

    import numbatma

    @cuda.jit
    def axpb(x, y, a, b):
        i = cuda.grid(1)
        if i < x.size:
            y[i] = a * x[i] + b

    x = torch.randn(1000, device="cuda")
    y = torch.full((1000,), float("nan"), device="cuda")
    run = numbatma.prepare_launch(axpb, (x, y, 2.0, 1.0), 4, 256)
    run()
    torch.cuda.synchronize()
    assert torch.allclose(y, 2 * x + 1)
    x.copy_(torch.randn(1000, device="cuda"))
    stream = torch.cuda.Stream()
    run(cuda.external_stream(stream.cuda_stream))
    stream.synchronize()
    assert torch.allclose(y, 2 * x + 1)


def test_numba_and_cupy_arrays():
    from numba import cuda

    rng = np.random.default_rng()
    a = rng.standard_normal((200, 64)).astype(np.float16)
    b = rng.standard_normal((64, 136)).astype(np.float16)
    c = cuda.to_device(np.full((200, 136), np.nan, np.float32))
    gemm(cuda.to_device(a), cuda.to_device(b), c)
    got = c.copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)
    cp = pytest.importorskip("cupy")
    cc = cp.full((200, 136), cp.nan, cp.float16)
    gemm(cp.asarray(a), cp.asarray(b), cc)
    np.testing.assert_allclose(cc.get().astype(np.float64), ref, rtol=2e-3, atol=2e-2)


def test_output_view_inside_a_sentinel_parent():
    """C is a (300, 517) view in the middle of a larger bfloat16 array: nothing outside it changes."""
    parent = torch.full((302, 536), 7.0, device="cuda", dtype=torch.bfloat16)
    c = parent[1:301, 8:525]
    c.fill_(float("nan"))
    a, b = matrix(300, 136, "bfloat16"), matrix(517, 136, "bfloat16")
    before = parent.clone()
    Gemm(a, b, c, b_layout="nk").launch()
    torch.cuda.synchronize()
    check(c, a, b.t())
    mask = torch.ones_like(parent, dtype=torch.bool)
    mask[1:301, 8:525] = False
    assert torch.equal(parent[mask], before[mask])


def test_bad_arguments():
    a, b = matrix(64, 64, "bfloat16"), matrix(64, 64, "float16")
    with pytest.raises(TensorMapError, match="both must be bfloat16 or both float16"):
        Gemm(a, b, matrix(64, 64, "bfloat16"))
    with pytest.raises(TensorMapError, match="shapes do not multiply"):
        Gemm(a, matrix(32, 64, "bfloat16"), matrix(64, 64, "bfloat16"))
    assert math.isfinite(run(64, 64, 64).flops)
