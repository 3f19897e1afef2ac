"""Probe (GPU, run under ``compute-sanitizer --tool racecheck``): which hand-offs of shared memory from one warp to
another through an mbarrier does racecheck accept? Warp 0 writes 32 words of shared memory, warp 1 waits on an
mbarrier and reads them. All variants but ``none`` are correct by the PTX memory model (mbarrier.arrive is a
release, the wait an acquire at CTA scope; bar.warp.sync orders the lanes of a warp):

  lane0  every lane writes, __syncwarp, lane 0 arrives (barrier count 1)  - Softmax's consumers did this
  all    every lane writes and arrives (barrier count 32)
  none   no wait at all: a real race (the control: racecheck must flag it)

    compute-sanitizer --tool racecheck --error-exitcode 9 python3 scripts/probe_racecheck_mbarrier.py lane0
Prints the checked result; the sanitizer's exit code and report say whether it saw a hazard."""
import sys

import numpy as np
from numba import cuda

from numbatma.intrinsics import fence_mbarrier_init, mbarrier_arrive, mbarrier_init, mbarrier_wait_parity


def make(variant):
    count = 32 if variant == "all" else 1

    @cuda.jit
    def handoff(out):
        buf = cuda.shared.array(32, np.int32)
        bar = cuda.shared.array(1, np.uint64)
        tid = cuda.threadIdx.x
        lane = tid % 32
        if tid == 0:
            mbarrier_init(bar, count)
            fence_mbarrier_init()
        cuda.syncthreads()
        if tid < 32:
            buf[lane] = lane * 7 + 1
            if variant == "all":
                mbarrier_arrive(bar)
            elif variant == "lane0":
                cuda.syncwarp()
                if lane == 0:
                    mbarrier_arrive(bar)
        else:
            if variant != "none":
                mbarrier_wait_parity(bar, 0)
            out[lane] = buf[lane]
        if variant == "none":
            cuda.syncthreads()  # the barrier's phase is never completed; nothing waits on it

    return handoff


def main(variant):
    out = cuda.to_device(np.full(32, -1, np.int32))
    make(variant)[1, 64](out)
    got = out.copy_to_host()
    ok = variant == "none" or (got == np.arange(32) * 7 + 1).all()
    print(f"racecheck probe {variant}: result {'ok' if ok else 'WRONG'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "lane0"))
