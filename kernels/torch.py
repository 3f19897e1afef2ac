"""numbatma's kernels as PyTorch operators: ``torch.library`` custom ops with fake (meta) implementations and
autograd, so that a model uses them like torch's own - eagerly, under ``torch.compile(fullgraph=True)`` (no graph
break: the compiler traces the fake implementations) and inside CUDA graphs (the plans launch on torch's current
stream). Imported only on request (``import numbatma.kernels.torch``); it needs torch. (It lives in the kernels
package, not at ``numbatma.torch``: the host package never imports the kernels - tests/test_import_graph.py.)

* :func:`attention` ``(q, k, v, causal=False, scale=None)``: ``softmax(q kᵀ · scale) v`` for (B, H, S, D) tensors as
  :func:`torch.nn.functional.scaled_dot_product_attention` takes them (k and v may have fewer heads: grouped-query
  attention), bfloat16 or float16, differentiable: the forward is :class:`numbatma.kernels.Attention` (op
  ``numbatma::attention_forward``, which also returns the log-sum-exp the backward needs), the backward
  :class:`numbatma.kernels.AttentionBackward` (op ``numbatma::attention_backward``).

Status (2026-11-28): the first GPU run of tests/test_gpu_torch_ops.py failed before any kernel ran (a tensor that
requires grad refused its CUDA Array Interface to the plans' argument check); fixed since (the ops detach their
inputs, the check no longer reads the interface of such a tensor) and not yet run again on a GPU.

The ops take what the kernels take (head dims 64 and 128 for the backward, 64/128/256 forward; |scale| <= 1 for
the backward); anything else is refused with the kernels' messages when the op runs.
"""
from __future__ import annotations

import math

import torch

__all__ = ["attention"]


@torch.library.custom_op("numbatma::attention_forward", mutates_args=(), device_types="cuda")
def _attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    from numbatma.kernels import attention as run_attention

    q, k, v = q.detach(), k.detach(), v.detach()  # (the op runs below autograd: the kernels read plain tensors)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    run_attention(q, k, v, o, lse, causal=causal, scale=scale)
    return o, lse


@_attention_forward.register_fake
def _attention_forward_fake(q, k, v, causal, scale):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty(q.shape[:3], dtype=torch.float32))


@torch.library.custom_op("numbatma::attention_backward", mutates_args=(), device_types="cuda")
def _attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                        lse: torch.Tensor, causal: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from numbatma.kernels import attention_backward as run_backward

    do, q, k, v, o, lse = (x.detach() for x in (do, q, k, v, o, lse))
    if do.stride(-1) != 1:
        do = do.contiguous()
    dq, dk, dv = (torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))
    run_backward(q, k, v, o, do, lse, dq, dk, dv, causal=causal, scale=scale)
    return dq, dk, dv


@_attention_backward.register_fake
def _attention_backward_fake(do, q, k, v, o, lse, causal, scale):
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


_attention_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, causal=False, scale=None):
    """``softmax(q kᵀ · scale (+ causal mask)) v`` for (B, H, S, D) tensors (``scale`` default ``1 / sqrt(D)``;
    ``causal``: top-left aligned, as ``scaled_dot_product_attention(is_causal=True)``), differentiable with
    respect to q, k and v."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    o, _ = _attention_forward(q, k, v, bool(causal), float(scale))
    return o
