"""GPU tests (marker ``gpu``): numbatma.kernels.torch - attention as a differentiable PyTorch operator. Its output and
gradients against torch's SDPA in float32 autograd on the same bf16 inputs (head dims 64 and 128, causal and not,
grouped-query heads), ``deterministic=True`` giving the same gradient bits run after run, and the same model step under
``torch.compile(fullgraph=True)`` (which fails on a graph break) giving the eager step's loss and gradients."""
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import numbatma.kernels.torch as ntorch  # noqa: E402


def reference(q, k, v, do, causal):
    group = q.shape[1] // k.shape[1]
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qf, kf.repeat_interleave(group, 1),
                                                         vf.repeat_interleave(group, 1), is_causal=causal)
    o.backward(do.float())
    return o, qf.grad, kf.grad, vf.grad


def close(got, want, what):
    bound = 4 * 2.0 ** -7 * max(want.abs().max().item(), 1e-2)
    err = (got.float() - want).abs().max().item()
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_op_forward_and_gradients(d, causal):
    torch.manual_seed(d + causal)
    q = torch.randn((2, 4, 300, d), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn((2, 2, 300, d), device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn((2, 4, 300, d), device="cuda", dtype=torch.bfloat16)
    o = ntorch.attention(q, k, v, causal=causal)
    o.backward(do)
    ref_o, *ref_grads = reference(q, k, v, do, causal)
    close(o, ref_o, "o")
    for name, x, want in zip("qkv", (q, k, v), ref_grads):
        close(x.grad, want, f"d{name}")


@pytest.mark.parametrize("d", [64, 128])
def test_attention_op_deterministic_gradients_are_the_same_bits_every_time(d):
    """``attention(..., deterministic=True)``: the gradients through autograd are bitwise equal from run to run -
    eagerly and under ``torch.compile(fullgraph=True)`` (the flag reaches the backward op through the compiled graph,
    and the forward is the same kernel on the same inputs) - and as close to float32 autograd, and to the default
    backward's, as the other cases; GQA, causal, 1000 tokens (up to 8 key blocks of 128 add into a query block's dq:
    enough for their order to matter)."""
    torch.manual_seed(10 + d)
    q = torch.randn((2, 4, 1000, d), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn((2, 2, 1000, d), device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    do = torch.randn((2, 4, 1000, d), device="cuda", dtype=torch.bfloat16)

    def grads(fn, deterministic):
        o = fn(q, k, v, causal=True, deterministic=deterministic)
        return torch.autograd.grad(o, (q, k, v), do)

    compiled = torch.compile(ntorch.attention, fullgraph=True)
    first, *again = grads(ntorch.attention, True), grads(ntorch.attention, True), grads(compiled, True)
    for run, how in zip(again, ("eager", "compiled")):
        for name, a, b in zip(("dq", "dk", "dv"), first, run):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)), f"{name}: {how} run differs from the first"
    default = grads(ntorch.attention, False)
    _, *ref = reference(q, k, v, do, True)
    for name, got, other, want in zip(("dq", "dk", "dv"), first, default, ref):
        close(got, want, f"{name} (deterministic)")
        close(got, other.float(), f"{name} (deterministic vs default)")


class Block(torch.nn.Module):
    """A pre-norm attention block: x + proj(attention(qkv(norm(x))))."""

    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x, attend):
        b, s, dim = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        o = attend(q, k, v, causal=True).transpose(1, 2).reshape(b, s, dim)
        return x + self.proj(o)


def test_a_block_under_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16)
    x = torch.randn((2, 256, 256), device="cuda", dtype=torch.bfloat16)

    def step(fn):
        block.zero_grad()
        loss = fn(x, ntorch.attention).float().square().mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in block.parameters()]

    eager_loss, eager_grads = step(block)
    compiled = torch.compile(block, fullgraph=True)
    loss, grads = step(compiled)
    assert torch.allclose(loss, eager_loss, rtol=1e-2), (loss, eager_loss)
    for g, e in zip(grads, eager_grads):
        close(g, e.float(), "a parameter's gradient")


@pytest.mark.parametrize("transpose", [False, True], ids=["matmul", "linear"])
def test_matmul_and_linear_gradients(transpose):
    """``matmul(a, b)`` and ``linear(x, w, bias)`` (x with two leading axes) against float32 autograd."""
    torch.manual_seed(transpose)
    a = torch.randn((3, 100, 256) if transpose else (300, 256), device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    b = torch.randn((512, 256) if transpose else (256, 512), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = ntorch.linear(a, b, bias) if transpose else ntorch.matmul(a, b)
    dout = torch.randn_like(out)
    out.backward(dout)
    af, bf, biasf = (x.detach().float().requires_grad_() for x in (a, b, bias))
    ref = torch.nn.functional.linear(af, bf, biasf) if transpose else af @ bf
    ref.backward(dout.float())
    close(out, ref.detach(), "out")
    close(a.grad, af.grad, "da")
    close(b.grad, bf.grad, "db")
    if transpose:
        close(bias.grad, biasf.grad, "dbias")


def test_matmul_with_k_and_n_off_the_16_byte_grid():
    """K = 45 and N = 29 (rows not on 16-byte boundaries): the op pads copies with zeros and returns a contiguous
    (M, N) result - forward and both gradients against float32 autograd, eager and under torch.compile."""
    torch.manual_seed(7)
    a = torch.randn((37, 45), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn((45, 29), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for fn in (ntorch.matmul, torch.compile(ntorch.matmul, fullgraph=True)):
        a.grad = b.grad = None
        out = fn(a, b)
        assert out.shape == (37, 29) and out.is_contiguous()
        dout = torch.randn_like(out)
        out.backward(dout)
        af, bf = (x.detach().float().requires_grad_() for x in (a, b))
        ref = af @ bf
        ref.backward(dout.float())
        close(out, ref.detach(), "out")
        close(a.grad, af.grad, "da")
        close(b.grad, bf.grad, "db")


def test_linear_under_torch_compile_fullgraph():
    torch.manual_seed(1)
    x = torch.randn((4, 64, 128), device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn((256, 128), device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def f(x, w):
        return torch.relu(ntorch.linear(x, w)).sum()

    eager = f(x, w)
    eager.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    compiled = torch.compile(f, fullgraph=True)(x, w)
    compiled.backward()
    assert torch.allclose(compiled.float(), eager.float(), rtol=1e-2)
    close(x.grad, gx.float(), "dx")
    close(w.grad, gw.float(), "dw")


def test_attention_forward_and_backward_in_a_cuda_graph():
    """One training step of attention (forward, backward) captured in a CUDA graph and replayed on new inputs copied
    into the captured tensors: the replay's output and gradients match eager ones on the same inputs (the plans
    launch on torch's current stream - the capture stream - and allocate their work arrays from torch's allocator)."""
    torch.manual_seed(3)
    shape = (1, 2, 256, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def step():
        o = ntorch.attention(q, k, v, causal=True)
        return (o,) + torch.autograd.grad(o, (q, k, v), do)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up outside the capture (compiles, caches)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    new = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    with torch.no_grad():
        for dst, src in zip((q, k, v, do), new):
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for name, got, want in zip(("o", "dq", "dk", "dv"), captured, eager):
        close(got, want.float(), f"{name} (graph replay vs eager)")
