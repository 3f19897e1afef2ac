"""CPU: numbatma.kernels.torch's operators without a GPU (skipped without torch) - their schemas, their fake
implementations (which torch.compile traces: shapes, dtypes and devices of the outputs, under FakeTensorMode and on
meta tensors) and their autograd plumbing: with stand-in CPU kernels registered for the two attention ops (float32
math, registered for this file only), ``attention`` gives SDPA's output and gradients, and the backward op receives
``deterministic`` as given - eagerly and through ``torch.compile(fullgraph=True)`` (the aot_eager backend: dynamo and
AOTAutograd trace the fake implementations, no code generation). The numbatma kernels themselves are
tests/test_gpu_torch_ops.py's."""
import pytest

torch = pytest.importorskip("torch")

import numbatma.kernels.torch as ntorch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def test_the_schemas_take_the_deterministic_flag():
    """Both attention ops take ``deterministic`` (the forward only to hand it to the backward through autograd's
    context: ``setup_context`` sees the op's inputs, nothing else)."""
    fwd = torch.ops.numbatma.attention_forward.default._schema
    bwd = torch.ops.numbatma.attention_backward.default._schema
    assert [(a.name, str(a.type)) for a in fwd.arguments] == [
        ("q", "Tensor"), ("k", "Tensor"), ("v", "Tensor"), ("causal", "bool"), ("scale", "float"),
        ("deterministic", "bool")]
    assert [a.name for a in bwd.arguments] == ["do", "q", "k", "v", "o", "lse", "causal", "scale", "deterministic"]
    assert len(fwd.returns) == 2 and len(bwd.returns) == 3
    assert [a.name for a in torch.ops.numbatma.matmul.default._schema.arguments] == ["a", "b", "transpose_b"]


@pytest.mark.parametrize("deterministic", [False, True])
def test_fake_implementations_give_the_kernels_shapes(deterministic):
    """Under FakeTensorMode (CUDA tensors without a GPU, as the compiler sees them): o like q (contiguous), the
    log-sum-exp (B, H, S) float32; dq, dk, dv like q, k, v (grouped-query k and v: fewer heads)."""
    with FakeTensorMode():
        q = torch.empty((2, 4, 100, 64), dtype=torch.bfloat16, device="cuda")
        k, v = (torch.empty((2, 2, 100, 64), dtype=torch.bfloat16, device="cuda") for _ in range(2))
        o, lse = torch.ops.numbatma.attention_forward(q, k, v, True, 0.125, deterministic)
        assert (o.shape, o.dtype, o.device.type) == (q.shape, q.dtype, "cuda") and o.is_contiguous()
        assert (lse.shape, lse.dtype) == ((2, 4, 100), torch.float32)
        dq, dk, dv = torch.ops.numbatma.attention_backward(o, q, k, v, o, lse, True, 0.125, deterministic)
        for got, like in ((dq, q), (dk, k), (dv, v)):
            assert (got.shape, got.dtype, got.device.type) == (like.shape, like.dtype, "cuda")
            assert got.is_contiguous()


@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_fake_implementation(transpose_b):
    """``a @ b`` (M, N) from (M, K) and b as (K, N) or, ``transpose_b``, (N, K) - N off the 8-element grid too."""
    with FakeTensorMode():
        a = torch.empty((37, 45), dtype=torch.bfloat16, device="cuda")
        b = torch.empty((29, 45) if transpose_b else (45, 29), dtype=torch.bfloat16, device="cuda")
        c = torch.ops.numbatma.matmul(a, b, transpose_b)
        assert (c.shape, c.dtype) == ((37, 29), torch.bfloat16)


def test_autograd_on_meta_tensors():
    """The autograd formula end to end on meta tensors (the fake implementations run): gradients of q's, k's and
    v's shapes, ``deterministic`` accepted."""
    q = torch.empty((1, 4, 64, 128), dtype=torch.bfloat16, device="meta", requires_grad=True)
    k, v = (torch.empty((1, 1, 64, 128), dtype=torch.bfloat16, device="meta", requires_grad=True) for _ in range(2))
    ntorch.attention(q, k, v, causal=True, deterministic=True).sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, k.shape)


def _scores(q, k, causal, scale):
    """float32 ``q kᵀ · scale`` with k's heads repeated for grouped-query attention, causal: top-left aligned."""
    k = k.float().repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q.float() @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return s


@pytest.fixture
def cpu_kernels():
    """Stand-in CPU kernels for numbatma::attention_forward and numbatma::attention_backward (the real ones are
    CUDA only), for this test only; returns the list of ``deterministic`` values the backward received. The
    backward is the textbook one from the forward's log-sum-exp (P = exp(S - lse), dS = P (dP - rowsum(dO o))), so
    the lse the forward hands over through autograd's context is used, not recomputed."""
    seen = []

    def forward(q, k, v, causal, scale, deterministic):
        s = _scores(q, k, causal, scale)
        v = v.float().repeat_interleave(q.shape[1] // v.shape[1], 1)
        return (torch.softmax(s, -1) @ v).to(q.dtype), s.logsumexp(-1)

    def backward(do, q, k, v, o, lse, causal, scale, deterministic):
        seen.append(deterministic)
        b, hk, group = k.shape[0], k.shape[1], q.shape[1] // k.shape[1]
        p = torch.exp(_scores(q, k, causal, scale) - lse[..., None])
        do = do.float()
        dp = do @ v.float().repeat_interleave(group, 1).transpose(-1, -2)
        ds = p * (dp - (do * o.float()).sum(-1, keepdim=True))
        dq = ds @ k.float().repeat_interleave(group, 1) * scale
        dk = ds.transpose(-1, -2) @ q.float() * scale
        dv = p.transpose(-1, -2) @ do

        def fold(x):  # (the query heads of one key head summed)
            return x.reshape(b, hk, group, *x.shape[2:]).sum(2)
        return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)

    lib = torch.library.Library("numbatma", "IMPL")
    lib.impl("attention_forward", forward, "CPU")
    lib.impl("attention_backward", backward, "CPU")
    yield seen
    lib._destroy()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_attention_hands_deterministic_to_the_backward(cpu_kernels, deterministic, compiled):
    """``attention(..., deterministic=d)``: the backward op runs once with ``d``; output and gradients are SDPA's
    (float32, GQA, causal) - eagerly and under torch.compile(fullgraph=True), which fails on a graph break."""
    torch.manual_seed(deterministic)
    q = torch.randn((2, 4, 37, 64), requires_grad=True)
    k, v = (torch.randn((2, 2, 37, 64), requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)

    def f(q, k, v):
        return ntorch.attention(q, k, v, causal=True, deterministic=deterministic)

    fn = torch.compile(f, fullgraph=True, backend="aot_eager") if compiled else f
    o = fn(q, k, v)
    grads = torch.autograd.grad(o, (q, k, v), do)
    assert cpu_kernels == [deterministic]
    qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True)
    ref_grads = torch.autograd.grad(ref, (qr, kr, vr), do)
    torch.testing.assert_close(o, ref, rtol=1e-4, atol=1e-5)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("switch", [False, True])
def test_deterministic_follows_torchs_switch_by_default(cpu_kernels, switch, compiled):
    """``attention(...)`` without ``deterministic``: the backward gets ``torch.are_deterministic_algorithms_enabled()``
    - what ``torch.use_deterministic_algorithms`` set - eagerly and under torch.compile(fullgraph=True)."""
    q = torch.randn((1, 2, 9, 64), requires_grad=True)
    k, v = (torch.randn((1, 2, 9, 64), requires_grad=True) for _ in range(2))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(switch)
    try:
        def f(q, k, v):
            return ntorch.attention(q, k, v)

        fn = torch.compile(f, fullgraph=True, backend="aot_eager") if compiled else f
        fn(q, k, v).sum().backward()
    finally:
        torch.use_deterministic_algorithms(before)
    assert cpu_kernels == [switch]


def test_deterministic_must_be_a_bool_or_none():
    """A string or a number is refused, not read as true."""
    q = torch.randn((1, 1, 4, 64))
    for bad in ("no", 1):
        with pytest.raises(TypeError, match=f"deterministic must be True, False or None .*got {bad!r}"):
            ntorch.attention(q, q, q, deterministic=bad)
