"""GPU tests (marker ``gpu``): descriptors edited inside kernels (``tensormap.replace``), published to a
TensorMapArray workspace (``tensormap.cp_fenceproxy``) or edited there in place, then used by TMA loads;
``prefetch.tensormap``. Fresh random data, poisoned outputs, NumPy references.

The kernels and runners are in tests/descriptor_kernels.py (plain functions, jitted by the runners), shared with
``tests/test_descriptor_cpu.py``, which compiles the very same functions offline, and
``tests/sim/test_sim_descriptor.py``, which runs them in the simulator."""
import numpy as np
import pytest

import descriptor_kernels as K

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()


# -- tests ------------------------------------------------------------------------------------------------------
def test_grouped_retarget_through_shared_copy_and_publish():
    got, want = K.grouped_case(rng, K.grouped_publish, publish=True)
    np.testing.assert_array_equal(got, want)


def test_grouped_retarget_in_place_in_global_memory():
    got, want = K.grouped_case(rng, K.grouped_in_place, publish=False)
    np.testing.assert_array_equal(got, want)


def test_rebuild_every_field():
    got, want = K.rebuild_case(rng)
    # the host-encoded descriptor of the target layout and the NumPy reference agree ...
    np.testing.assert_array_equal(got[1], want)  # (NaN fill: the H200 writes float16 NaN as 0x7FF7)
    # ... and the descriptor rebuilt field by field in the kernel gives the very same bits
    assert not np.isnan(want).all() and np.isnan(want).any()
    np.testing.assert_array_equal(got[0].view(np.uint16), got[1].view(np.uint16))


def test_prefetch_then_load():
    got, want = K.prefetch_case(rng)
    np.testing.assert_array_equal(got, want)
