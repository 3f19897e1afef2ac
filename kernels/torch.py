"""numbatma's kernels as PyTorch operators: ``torch.library`` custom ops with fake (meta) implementations and
autograd, so that a model uses them like torch's own - eagerly, under ``torch.compile(fullgraph=True)`` (no graph
break: the compiler traces the fake implementations) and inside CUDA graphs (the plans launch on torch's current
stream). Imported only on request (``import numbatma.kernels.torch``); it needs torch. (It lives in the kernels
package, not at ``numbatma.torch``: the host package never imports the kernels - tests/test_import_graph.py.)

* :func:`attention` ``(q, k, v, causal=False, scale=None, deterministic=None)``: ``softmax(q kᵀ · scale) v`` for
  (B, H, S, D) tensors as :func:`torch.nn.functional.scaled_dot_product_attention` takes them (k and v may have
  fewer heads: grouped-query attention), bfloat16 or float16, differentiable: the forward is
  :class:`numbatma.kernels.Attention` (op ``numbatma::attention_forward``, which also returns the log-sum-exp the
  backward needs), the backward :class:`numbatma.kernels.AttentionBackward` (op ``numbatma::attention_backward``).
  ``deterministic=True`` makes the backward's gradients bitwise reproducible (AttentionBackward's
  ``deterministic``: dq's additions in a fixed order, slower; ``None``, the default:
  ``torch.are_deterministic_algorithms_enabled()``); both ops take the flag - the forward only carries it to the
  backward through autograd's context, since ``setup_context`` sees nothing but the op's inputs.

Status (2026-11-28): tests/test_gpu_torch_ops.py passes on an H200 (eager, torch.compile(fullgraph=True), a CUDA
graph, K and N off the 16-byte grid, ``deterministic=True`` bitwise twice, commit fb1062a).
tests/test_torch_ops_cpu.py checks the ops' schemas, fake implementations and autograd plumbing (the flag and its
default from torch's switch included, eager and under torch.compile) on the CPU, with stand-in CPU kernels.

* :func:`matmul` ``(a, b)`` (2-D, ``a @ b``) and :func:`linear` ``(x, weight, bias=None)`` (``x @ weightᵀ + bias``,
  x of any leading shape): :class:`numbatma.kernels.Gemm` forward and backward (op ``numbatma::matmul``, with
  ``b`` given as (K, N) or, ``transpose_b``, as (N, K): the backward's products are the same op - ``da = dc bᵀ``
  takes b as it is, ``db = aᵀ dc`` takes a transposed copy of ``a`` (Gemm reads A row-major)).

The ops take what the kernels take (head dims 64/128/256 forward and backward; |scale| <= 1 for
the backward; matmul / linear pad K or N that is not a multiple of 8 with zeros); anything else is refused with
the kernels' messages when the op runs.
"""
import math  # (no "from __future__ import annotations": custom_op reads the signature's annotations as types)

import torch

__all__ = ["attention", "matmul", "linear"]


@torch.library.custom_op("numbatma::attention_forward", mutates_args=(), device_types="cuda")
def _attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                       deterministic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``o`` and the log-sum-exp of each query row. ``deterministic`` does not change the forward (it is
    deterministic already): it is an input only so that autograd's ``setup_context``, which sees the op's inputs,
    can hand it to the backward op."""
    from numbatma.kernels import attention as run_attention

    q, k, v = q.detach(), k.detach(), v.detach()  # (the op runs below autograd: the kernels read plain tensors)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    run_attention(q, k, v, o, lse, causal=causal, scale=scale)
    return o, lse


@_attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal, scale, deterministic):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty(q.shape[:3], dtype=torch.float32))


@torch.library.custom_op("numbatma::attention_backward", mutates_args=(), device_types="cuda")
def _attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                        lse: torch.Tensor, causal: bool, scale: float,
                        deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``dq, dk, dv``; ``deterministic``: dq's additions in a fixed order (bitwise reproducible, slower - see
    :class:`numbatma.kernels.AttentionBackward`)."""
    from numbatma.kernels import attention_backward as run_backward

    do, q, k, v, o, lse = (x.detach() for x in (do, q, k, v, o, lse))
    if do.stride(-1) != 1:
        do = do.contiguous()
    dq, dk, dv = (torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))
    run_backward(q, k, v, o, do, lse, dq, dk, dv, causal=causal, scale=scale, deterministic=deterministic)
    return dq, dk, dv


@_attention_backward.register_fake
def _attention_backward_fake(do, q, k, v, o, lse, causal, scale, deterministic):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, deterministic = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.deterministic = causal, scale, deterministic


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale, ctx.deterministic)
    return dq, dk, dv, None, None, None


_attention_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, causal=False, scale=None, deterministic=None):
    """``softmax(q kᵀ · scale (+ causal mask)) v`` for (B, H, S, D) tensors (``scale`` default ``1 / sqrt(D)``;
    ``causal``: top-left aligned, as ``scaled_dot_product_attention(is_causal=True)``), differentiable with
    respect to q, k and v. ``deterministic``: the backward adds into dq in a fixed order, so that the gradients
    are bitwise reproducible from run to run (for reproducible training; slower - docs/attention.md gives the
    cost); the forward is the same either way. ``None`` (the default): what
    ``torch.are_deterministic_algorithms_enabled()`` says - on after ``torch.use_deterministic_algorithms(True)``,
    as torch's own ops follow that switch."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    elif not isinstance(deterministic, bool):
        raise TypeError(f"numbatma.kernels.torch.attention: deterministic must be True, False or None (follow "
                        f"torch.use_deterministic_algorithms), got {deterministic!r}")
    o, _ = _attention_forward(q, k, v, bool(causal), float(scale), bool(deterministic))
    return o


@torch.library.custom_op("numbatma::matmul", mutates_args=(), device_types="cuda")
def _matmul(a: torch.Tensor, b: torch.Tensor, transpose_b: bool) -> torch.Tensor:
    """``a @ b`` (``b`` (K, N)) or, ``transpose_b``, ``a @ bᵀ`` (``b`` (N, K)), by :class:`numbatma.kernels.Gemm`."""
    from numbatma.kernels import gemm

    a, b = a.detach(), b.detach()
    m, k = a.shape
    n = b.shape[0] if transpose_b else b.shape[1]
    # TMA needs rows on 16-byte boundaries: K or N that is not a multiple of 8 (16-bit elements) is zero-padded
    # here (copies of a / b, the product written to a wider c and sliced) - exact, at the cost of the copies
    kp, np_ = -k % 8, -n % 8
    if kp:
        a = torch.nn.functional.pad(a, (0, kp))
        b = torch.nn.functional.pad(b, (0, kp) if transpose_b else (0, 0, 0, kp))
    if np_:
        b = torch.nn.functional.pad(b, (0, 0, 0, np_) if transpose_b else (0, np_))
    if a.stride(-1) != 1 or a.stride(0) % 8:
        a = a.contiguous()
    if b.stride(-1) != 1 or b.stride(0) % 8:
        b = b.contiguous()
    c = torch.empty((m, n + np_), dtype=a.dtype, device=a.device)
    gemm(a, b, c, b_layout="nk" if transpose_b else "kn")
    return c[:, :n].contiguous() if np_ else c  # (contiguous, as the fake implementation says)


@_matmul.register_fake
def _matmul_fake(a, b, transpose_b):
    return a.new_empty((a.shape[0], b.shape[0] if transpose_b else b.shape[1]))


def _matmul_setup(ctx, inputs, output):
    a, b, transpose_b = inputs
    ctx.save_for_backward(a, b)
    ctx.transpose_b = transpose_b


def _matmul_backward(ctx, dc):
    a, b = ctx.saved_tensors
    dc = dc.contiguous()
    # c = a @ B with B = b (K, N) or bᵀ: da = dc Bᵀ; dB = aᵀ dc (a transposed copy: Gemm's A is row-major)
    da = _matmul(dc, b, not ctx.transpose_b)
    if ctx.transpose_b:  # b (N, K): db = dcᵀ a
        db = _matmul(dc.t().contiguous(), a, False)
    else:  # b (K, N): db = aᵀ dc
        db = _matmul(a.t().contiguous(), dc, False)
    return da, db, None


_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def matmul(a, b):
    """``a @ b`` for 2-D bfloat16 / float16 tensors, differentiable (K or N not a multiple of 8: the op pads copies
    of the operands with zeros, since TMA needs 16-byte rows)."""
    return _matmul(a, b, False)


def linear(x, weight, bias=None):
    """``x @ weightᵀ + bias`` (``weight`` (N, K), ``x`` (..., K)) as :func:`torch.nn.functional.linear`, the product
    on :class:`numbatma.kernels.Gemm`, differentiable."""
    y = _matmul(x.reshape(-1, x.shape[-1]), weight, True).reshape(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias
