"""FlashAttention forward in plain Python: TMA pipelines feed wgmma, the online softmax runs in registers.

    python examples/flash_attention.py [SEQ [HEADS]]       (default 4096 tokens, 16 heads, batch 4, head dim 128)

``O = softmax(Q Kᵀ / sqrt(D)) V`` for float16 (batch, heads, seq, 128) arrays. The kernel below is the whole
algorithm, written with numbatma's public API; ``numbatma.kernels.Attention`` is the same design made persistent
and general (head dims 64/128/256, causal masks, ragged lengths, grouped-query heads, both layouts, the
log-sum-exp). The script checks both against a reference (torch's SDPA in float32 when torch is installed, NumPy
otherwise) and prints TFLOP/s for this kernel, for ``Attention`` and for torch's cuDNN and flash backends.

One CTA computes 128 query rows of one (batch, head) with 384 threads in three warpgroups:

* **warpgroup 0 - the producer** (``setmaxnreg_dec``: it only issues TMA). One elected thread loads the Q tile
  once (two 64 x 128 halves, each as two 64 x 64 boxes with the 128-byte swizzle) through a one-stage
  ``Pipeline``, then, for every block of 128 keys, the K tile and the V tile into two ``STAGES``-deep Pipelines:
  K and V travel separately, so ``Q Kᵀ`` starts as soon as K has landed while V is still on its way.
* **warpgroups 1 and 2 - the consumers** (``setmaxnreg_inc``), 64 query rows each. For every key block:

  1. ``S = Q Kᵀ``: eight wgmma k-steps (head dim 128 = 8 x 16), both operands in shared memory - then K's stage
     goes back to the producer.
  2. the online softmax, in registers: the row maxima (``wgmma_row_reduce``: the thread's registers, then its
     four-thread quad), ``P = exp2(S · scale·log2 e - m)`` (``wgmma_map`` calls a small device function per
     register: it is inlined), the correction ``exp2(m_old - m_new)`` of the running sums and of O.
  3. ``O += P V``: P goes to the tensor cores straight from registers (``wgmma_a_fragments``: the accumulator
     layout of S *is* the A-fragment layout of the next wgmma, converted to float16 in place) - then V's stage
     goes back.

  At the end each consumer divides O by the row sums and stores it through its half of the Q stage (now free)
  with TMA; the stage then goes back to the producer.

Needs an H100/H200 (sm_90a). Without one the script runs a small problem in the CUDA simulator, which executes
the same kernel (wgmma decoded from its descriptors, the softmax in NumPy per thread).
"""
import math
import sys

import numpy as np
from numba import cuda

import numbatma
from numbatma import Swizzle, TensorMap
from numbatma.intrinsics import (
    Pipeline,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    elect_one_sync,
    fence_proxy_async_shared_cta,
    named_barrier_sync,
    row_max,
    row_sum,
    setmaxnreg_dec,
    setmaxnreg_inc,
    shared_view,
    tma_store,
    wgmma,
    wgmma_a_fragments,
    wgmma_commit_group,
    wgmma_desc,
    wgmma_fence,
    wgmma_map,
    wgmma_row_reduce,
    wgmma_store,
    wgmma_wait_group,
    wgmma_zeros,
)
from numbatma.utils import gpu_or_simulator, median_ms, small_problem

D = 128  # head dim: two 64-element (128-byte) swizzle rows
BM, BN = 128, 128  # query rows per CTA (64 per consumer warpgroup), keys per block
STAGES = 2
WARPGROUP = 128
CHUNKS = D // 64
Q_ELEMS = BM * D  # the Q stage: [consumer][chunk] boxes of 64 x 64
KV_ELEMS = BN * D  # one K (or V) stage: [chunk] boxes of BN x 64
K_BASE, V_BASE = Q_ELEMS, Q_ELEMS + STAGES * KV_ELEMS
SMEM_BYTES = (Q_ELEMS + 2 * STAGES * KV_ELEMS) * 2  # 160 KiB
MAX_REGISTERS, PRODUCER_REGISTERS, CONSUMER_REGISTERS = 168, 40, 232
NEG_INF, ZERO, ONE = np.float32(-np.inf), np.float32(0.0), np.float32(1.0)

_jit = cuda.jit if numbatma.SIMULATING else cuda.jit(max_registers=MAX_REGISTERS)


@cuda.jit(device=True, inline="always")
def exp2_shifted(s, half, col, st):
    """One register of S -> P: ``half`` says which of the thread's two rows it belongs to (a constant)."""
    return math.exp2(s * st[0] - (st[1] if half == 0 else st[2]))


@cuda.jit(device=True, inline="always")
def scale_rows(o, half, col, f):
    return o * (f[0] if half == 0 else f[1])


@_jit
def attention_kernel(q_map, k_map, v_map, o_map, heads, seq, scale_log2):
    smem = cuda.shared.array(0, np.float16, alignment=1024)
    qpipe = Pipeline(1, 1, 2)  # Q: one stage; one release per consumer warpgroup
    kpipe = Pipeline(STAGES, 1, 8)  # one release per consumer warp
    vpipe = Pipeline(STAGES, 1, 8)
    m0 = cuda.blockIdx.x * BM
    b, h = cuda.blockIdx.y // heads, cuda.blockIdx.y % heads
    blocks = (seq + BN - 1) // BN
    wg = cuda.threadIdx.x // WARPGROUP
    if wg == 0:  # ---- producer ----
        setmaxnreg_dec(PRODUCER_REGISTERS)
        if cuda.threadIdx.x < 32 and elect_one_sync():
            qpipe.producer_acquire()
            for w in range(2):
                for c in range(CHUNKS):
                    qpipe.load(shared_view(smem, (w * CHUNKS + c) * 4096, (64, 64)), q_map, (b, h, m0 + 64 * w, 64 * c))
            qpipe.producer_commit()
            for j in range(blocks):
                s = kpipe.producer_acquire()
                for c in range(CHUNKS):
                    kpipe.load(shared_view(smem, K_BASE + s * KV_ELEMS + c * BN * 64, (BN, 64)), k_map, (b, h, j * BN, 64 * c))
                kpipe.producer_commit()
                s = vpipe.producer_acquire()
                for c in range(CHUNKS):
                    vpipe.load(shared_view(smem, V_BASE + s * KV_ELEMS + c * BN * 64, (BN, 64)), v_map, (b, h, j * BN, 64 * c))
                vpipe.producer_commit()
    else:  # ---- consumers: warpgroup 1 takes query rows m0..m0+63, warpgroup 2 the next 64 ----
        setmaxnreg_inc(CONSUMER_REGISTERS)
        w = wg - 1
        lane = cuda.threadIdx.x % 32
        q_tile = shared_view(smem, w * CHUNKS * 4096, (CHUNKS, 64, 64))  # K-major: the chunks lie along K (= D)
        m_a, m_b, l_a, l_b = NEG_INF, NEG_INF, ZERO, ZERO  # the thread's two rows: running max and sum
        o = wgmma_zeros(D)  # 64 x 128 float32: 64 registers per thread
        qpipe.consumer_wait()
        for j in range(blocks):
            ks = kpipe.consumer_wait()
            k_tile = shared_view(smem, K_BASE + ks * KV_ELEMS, (CHUNKS, BN, 64))
            s = wgmma_fence(wgmma_zeros(BN))
            s = wgmma(s, wgmma_desc(q_tile, q_map, "K", 0, (0, D)), wgmma_desc(k_tile, k_map, "K", 0, (0, D)), 1)
            wgmma_commit_group()
            s = wgmma_wait_group(0, s)
            if lane == 0:
                kpipe.consumer_release()
            # online softmax (the last block's keys past the end are masked by Attention; here seq % BN == 0)
            r_a, r_b = wgmma_row_reduce(s, row_max, NEG_INF)
            n_a, n_b = max(m_a, r_a * scale_log2), max(m_b, r_b * scale_log2)
            p = wgmma_map(s, exp2_shifted, (scale_log2, n_a, n_b))
            f_a, f_b = math.exp2(m_a - n_a), math.exp2(m_b - n_b)
            o = wgmma_map(o, scale_rows, (f_a, f_b))
            sum_a, sum_b = wgmma_row_reduce(p, row_sum, ZERO)
            l_a, l_b = l_a * f_a + sum_a, l_b * f_b + sum_b
            m_a, m_b = n_a, n_b
            # O += P V, P from registers; V's tile is (K = keys) x (N = head dim): MN-major
            vs = vpipe.consumer_wait()
            v_tile = shared_view(smem, V_BASE + vs * KV_ELEMS, (CHUNKS, BN, 64))
            o, pf = wgmma_fence((o, wgmma_a_fragments(p, "f16")))
            o = wgmma(o, pf, wgmma_desc(v_tile, v_map, "MN", 0, (0, BN)), 1)
            wgmma_commit_group()
            o = wgmma_wait_group(0, o)
            if lane == 0:
                vpipe.consumer_release()
        # ---- epilogue: O / l -> this warpgroup's half of the Q stage (swizzled) -> TMA store ----
        o = wgmma_map(o, scale_rows, (ONE / l_a, ONE / l_b))
        named_barrier_sync(1 + w, WARPGROUP)  # every wgmma of this warpgroup has read its Q rows
        for c in range(CHUNKS):
            wgmma_store(o, shared_view(smem, (w * CHUNKS + c) * 4096, (64, 64)), o_map, 0, 64 * c)
        fence_proxy_async_shared_cta()
        named_barrier_sync(1 + w, WARPGROUP)
        if cuda.threadIdx.x % WARPGROUP == 0:
            for c in range(CHUNKS):
                tma_store(o_map, (b, h, m0 + 64 * w, 64 * c), shared_view(smem, (w * CHUNKS + c) * 4096, (64, 64)))
            bulk_commit_group()
            bulk_wait_group_read(0)
            qpipe.consumer_release()
            bulk_wait_group(0)


def main():
    gpu_or_simulator("flash_attention.py", shared_bytes=SMEM_BYTES)
    batch, heads, seq = (4, 16, 4096) if not small_problem() else (1, 1, 128)
    if len(sys.argv) > 1:
        seq = int(sys.argv[1])
    if len(sys.argv) > 2:
        heads = int(sys.argv[2])
    if seq % BN:
        sys.exit(f"flash_attention.py: SEQ must be a multiple of {BN} here (numbatma.kernels.Attention takes any)")
    shape = (batch, heads, seq, D)
    rng = np.random.default_rng()
    try:
        import torch
    except ImportError:
        torch = None
    use_torch = torch is not None and not numbatma.SIMULATING
    if use_torch:
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
        o, o2 = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    else:
        q, k, v = (cuda.to_device(rng.standard_normal(shape).astype(np.float16)) for _ in range(3))
        o, o2 = (cuda.to_device(np.full(shape, np.nan, np.float16)) for _ in range(2))
    scale = 1.0 / math.sqrt(D)
    maps = [TensorMap(x, (1, 1, rows, 64), swizzle=Swizzle.B128) for x, rows in ((q, 64), (k, BN), (v, BN), (o, 64))]
    grid = (seq // BM, batch * heads)

    def launch():
        attention_kernel[grid, 3 * WARPGROUP, 0, SMEM_BYTES](*maps, heads, seq, np.float32(scale * math.log2(math.e)))

    launch()
    cuda.synchronize()
    from numbatma.kernels import Attention

    plan = Attention(q, k, v, o2)
    plan.launch()
    cuda.synchronize()
    # reference
    if use_torch:
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        errs = [float((x.float() - ref).abs().max()) for x in (o, o2)]
        bound = 2 * 2.0 ** -10 * float(v.float().abs().max())
    else:
        qf, kf, vf = (x.copy_to_host().astype(np.float64) for x in (q, k, v))
        s = np.einsum("bhqd,bhkd->bhqk", qf, kf) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = (p / p.sum(-1, keepdims=True)) @ vf
        errs = [float(np.abs(x.copy_to_host().astype(np.float64) - ref).max()) for x in (o, o2)]
        bound = 2 * 2.0 ** -10 * float(np.abs(vf).max())
    ok = all(e <= bound for e in errs)
    print(f"attention forward, float16, batch {batch} x {heads} heads x {seq} tokens, head dim {D}: "
          f"{'OK' if ok else 'WRONG'} (max error: this kernel {errs[0]:.2e}, Attention {errs[1]:.2e}; bound {bound:.2e})")
    if not ok:
        sys.exit(1)
    if numbatma.SIMULATING or small_problem():
        print("(CUDA simulator or small problem: no timing)")
        return
    flops = 4.0 * batch * heads * seq * seq * D
    results = [("this example", median_ms(launch)), ("numbatma.kernels.Attention", median_ms(plan.launch))]
    if torch is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (("torch SDPA cuDNN", SDPBackend.CUDNN_ATTENTION), ("torch SDPA flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    results.append((name, median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))))
            except RuntimeError as exc:
                print(f"{name}: not available ({str(exc).splitlines()[0]})")
    for name, ms in results:
        print(f"  {name:28s} {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
