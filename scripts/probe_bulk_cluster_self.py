"""Probe (GPU): cp.async.bulk.shared::cluster.shared::cta to the issuing CTA itself - with a plain launch,
and with explicit cluster launches of 1 and 2 CTAs (each copying to itself through mapa). Each case in its own
process (a fault poisons the context)."""
import subprocess
import sys

import numpy as np


def case(how):
    sys.path.insert(0, "tests")
    from numba import cuda

    import numbatma
    import bulk_kernels as T

    src = np.arange(512, dtype=np.int32)
    out = cuda.to_device(np.full(512, 7, np.int32))
    if how == "plain":
        T.cluster_copy_self_kernel[1, 256](cuda.to_device(src), out, 1008)
        n = 1
    else:
        n = int(how)
        numbatma.with_cluster(T.cluster_copy_self_kernel, (n, 1, 1))[n, 256](cuda.to_device(src), out, 1008)
    got = out.copy_to_host()
    print("ok" if np.array_equal(got[:252], src[:252]) else f"wrong {got[:8]}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        case(sys.argv[1])
    else:
        for how in ("plain", "1", "2"):
            r = subprocess.run([sys.executable, __file__, how], capture_output=True, text=True)
            last = (r.stdout.strip().splitlines() or [""])[-1]
            err = [ln for ln in r.stderr.splitlines() if "Error" in ln][-1:]
            print(how, "->", last if r.returncode == 0 else f"FAIL {err}")
