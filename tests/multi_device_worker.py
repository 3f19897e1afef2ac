"""One process per GPU, as torch.distributed launches them (tests/test_gpu_multi_device.py starts two): run the
ready-made kernels' function forms on this process's GPU in a loop, each result checked against a torch reference
(outputs NaN-poisoned before every call, two sets of tensors taken in turn so that the cached plans are re-pointed),
while the other process does the same on its GPU.

    python tests/multi_device_worker.py --rank R --world 2 --rendezvous DIR [--iterations 10] [--set-device]

Without ``--set-device`` the process sees one GPU, ``cuda:0`` (the caller sets ``CUDA_VISIBLE_DEVICES``); with it
the process sees every GPU and makes ``cuda:R`` current (``torch.cuda.set_device(R)``: torchrun's LOCAL_RANK
convention), so its plans run on device R of several. Each kernel runs once first (compiling it, or loading it from
the on-disk cache), then the process writes ``DIR/ready_R`` and waits for every rank's file, so that the timed loops
overlap. Prints one line per kernel and ``ok``, exit status 0; or the first failure and exit status 1.

The cases (also used by tests/test_gpu_multi_device.py for device 1 of one process): ``CASES[name](dev)`` makes
fresh tensors on ``dev`` and returns ``(call, check)``: ``call()`` runs the function form once, ``check()`` gives
``(max error, bound)``."""
import argparse
import os
import sys
import time

import torch

from numbatma import kernels as K


def randn(dev, *shape, dtype=torch.float32):
    return torch.randn(shape, device=dev, dtype=torch.float32).to(dtype)


def nan_like(x, shape=None, dtype=None):
    return torch.full(shape or x.shape, float("nan"), device=x.device, dtype=dtype or x.dtype)


def max_err(got, want):
    got, want = got.double(), want.double()
    if torch.isnan(got).any():
        return float("inf")
    return float((got - want).abs().max())


def case_stream_copy(dev, **options):
    x = randn(dev, 300, 1000)
    y = nan_like(x)
    return lambda: K.stream_copy(x, y, **options), lambda: (max_err(y, x), 0.0)


def case_stream_copy_two_roles(dev):
    return case_stream_copy(dev, two_roles=True)


def case_tma_copy(dev):
    x = randn(dev, 300, 1000)
    y = nan_like(x)
    return lambda: K.tma_copy(x, y), lambda: (max_err(y, x), 0.0)


def case_axpy(dev):
    x, y = randn(dev, 300, 1000), randn(dev, 300, 1000)
    out = nan_like(x)
    return lambda: K.axpy(2.5, x, y, out), lambda: (max_err(out, 2.5 * x.double() + y.double()), 1e-5)


def case_transpose(dev):
    x = randn(dev, 300, 520)
    y = nan_like(x, (520, 300))
    return lambda: K.transpose(x, y), lambda: (max_err(y, x.t()), 0.0)


def case_row_sum(dev):
    x = randn(dev, 300, 1000)
    out = nan_like(x, (300,))
    return lambda: K.row_sum(x, out), lambda: (max_err(out, x.double().sum(-1)), 1e-3)


def case_softmax(dev):
    x = randn(dev, 300, 1000)
    out = nan_like(x)
    return lambda: K.softmax(x, out), lambda: (max_err(out, torch.softmax(x.double(), -1)), 1e-6)


def case_laplacian5(dev):
    x = randn(dev, 300, 1000)
    out = nan_like(x)

    def reference():
        p = torch.nn.functional.pad(x.double(), (1, 1, 1, 1))
        return p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] - 4 * p[1:-1, 1:-1]

    return lambda: K.laplacian5(x, out), lambda: (max_err(out, reference()), 1e-4)


def case_gemm(dev, m=256, n=320, k=192, **options):
    a, b = randn(dev, m, k, dtype=torch.bfloat16), randn(dev, k, n, dtype=torch.bfloat16)  # (b: (K, N))
    c = nan_like(a, (m, n))

    def check():
        ref = a.double() @ b.double()
        bound = 2.0 ** -8 * ref.abs() + k * 2.0 ** -23 * (a.double().abs() @ b.double().abs())
        excess = (c.double() - ref).abs() - 2 * bound  # (twice the bf16 rounding of the output: margin)
        return (float("inf") if torch.isnan(c).any() else max(float(excess.max()), 0.0)), 0.0

    return lambda: K.gemm(a, b, c, **options), check


def case_gemm_cluster(dev):
    """A thread-block-cluster configuration (pairs of CTAs sharing B tiles by multicast; > 48 KiB of shared memory
    like every Gemm)."""
    return case_gemm(dev, m=512, n=512, k=256, cluster_m=2)


def case_attention(dev):
    b, h, s, d = 1, 2, 200, 64
    q, k, v = (randn(dev, b, h, s, d, dtype=torch.bfloat16) for _ in range(3))
    o = nan_like(q)
    lse = nan_like(q, (b, h, s), torch.float32)

    def check():
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
        bound = 2 * 2.0 ** -7 * float(v.float().abs().max())  # (two bfloat16 ulps of max|V|)
        return max_err(o, ref), bound

    return lambda: K.attention(q, k, v, o, lse), check


CASES = {
    "stream_copy": case_stream_copy, "stream_copy_two_roles": case_stream_copy_two_roles, "tma_copy": case_tma_copy,
    "axpy": case_axpy, "transpose": case_transpose, "row_sum": case_row_sum, "softmax": case_softmax,
    "laplacian5": case_laplacian5, "gemm": case_gemm, "gemm_cluster": case_gemm_cluster, "attention": case_attention,
}


def checked(name, call, check, dev):
    call()
    torch.cuda.synchronize(dev)
    err, bound = check()
    if not err <= bound:
        raise AssertionError(f"{name} on {dev}: max error {err:.3g} > {bound:.3g}")


def wait_for_everyone(rendezvous, rank, world, timeout=600.0):
    open(os.path.join(rendezvous, f"ready_{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(rendezvous, f"ready_{r}")) for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: the other processes were not ready after {timeout:.0f} s")
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--set-device", action="store_true")
    args = parser.parse_args()
    import numbatma

    if args.set_device:
        torch.cuda.set_device(args.rank)
        dev = f"cuda:{args.rank}"
    else:
        dev = "cuda:0"
    torch.manual_seed(args.rank)
    sets = {name: [make(dev), make(dev)] for name, make in CASES.items()}  # (two sets each: re-pointed in turn)
    probe = torch.zeros(1, device=dev)
    assert numbatma.array_device(probe) == torch.device(dev).index, (numbatma.array_device(probe), dev)
    t0 = time.perf_counter()
    for name, cases in sets.items():
        for call, check in cases:
            checked(name, call, check, dev)
    warm = time.perf_counter() - t0
    wait_for_everyone(args.rendezvous, args.rank, args.world)
    t0 = time.perf_counter()
    for i in range(args.iterations):
        for name, cases in sets.items():
            call, check = cases[i % 2]
            checked(name, call, check, dev)
    info = K.plan_cache_info()
    if info["rebind_failed"]:
        raise AssertionError(f"rank {args.rank}: {info['rebind_failed']} cached plans could not be re-pointed: {info}")
    print(f"rank {args.rank} on {dev} ({torch.cuda.get_device_name(dev)}, {torch.cuda.device_count()} visible): "
          f"first calls {warm:.1f} s, {args.iterations} x {len(sets)} checked calls {time.perf_counter() - t0:.1f} s, "
          f"plan cache {info}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
