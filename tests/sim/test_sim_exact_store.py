"""Under NUMBA_ENABLE_CUDASIM=1: every kernel of numbatma.kernels writes its output view inside a
sentinel-filled parent and nothing else (tests/exact_store_cases.py), including rows whose byte length is
not a multiple of 16 and rows narrower than one 16-byte unit."""
import pytest

from numbatma.kernels import _launch

from exact_store_cases import SIM_CASES, run


@pytest.fixture(autouse=True)
def two_sms(monkeypatch):
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 2)  # a persistent grid of 2: several tiles per CTA


@pytest.mark.parametrize("case", SIM_CASES, ids=lambda c: f"{c['kernel']}-{'x'.join(map(str, c['shape']))}"
                         f"-{c.get('dtype', 'float32')}")
def test_output_view_written_exactly(case):
    run(case)
