"""CPU: numbatma.streams turns every kind of stream a user holds into one form, its raw CUstream handle (an int;
0 for the legacy default stream), refuses anything else naming its type, and picks torch's current stream (its handle)
for plans built from torch tensors; only a launch through numba's own launch turns the handle into a numba stream
(numba_stream: numba.cuda.external_stream(handle), once per handle), and as_stream stays a helper for user code."""
import sys
import types

import pytest

import numbatma
from numbatma import streams


class ProtocolStream:  # cuda.core-style: the CUDA stream protocol
    def __init__(self, handle):
        self.handle_value = handle

    def __cuda_stream__(self):
        return (0, self.handle_value)


class TorchLike:
    def __init__(self, handle):
        self.cuda_stream = handle


class CupyLike:
    def __init__(self, handle):
        self.ptr = handle


@pytest.mark.parametrize("stream, handle", [
    (None, 0), (0, 0), (1234, 1234), (ProtocolStream(77), 77), (TorchLike(88), 88), (CupyLike(99), 99)])
def test_handles(stream, handle):
    assert streams.stream_handle(stream) == handle


def test_default_stream_is_zero_and_numba_streams_pass_through():
    assert streams.as_stream(None) == 0 and streams.as_stream(0) == 0 and streams.as_stream(TorchLike(0)) == 0
    from numba.cuda.cudadrv.driver import Stream

    numba_stream = Stream.__new__(Stream)  # (no driver here: an instance is enough to check the type test)
    numba_stream.handle = None  # (the default stream's)
    assert streams.stream_handle(numba_stream) == 0 and streams.as_stream(numba_stream) is numba_stream
    numba_stream.handle = 0x5150  # (numba keeps a CUstream; an int is what int() gives of it)
    assert streams.stream_handle(numba_stream) == 0x5150 and type(streams.stream_handle(numba_stream)) is int


def test_other_handles_become_external_streams_at_numbas_edge_only(monkeypatch):
    made = []
    monkeypatch.setattr("numba.cuda.external_stream", lambda h: made.append(h) or ("external", h))
    streams._external.cache_clear()
    assert streams.as_stream(ProtocolStream(0x1000)) == ("external", 0x1000)
    assert streams.as_stream(TorchLike(0x1000)) == ("external", 0x1000)  # made once per handle
    assert streams.as_stream(CupyLike(0x2000)) == ("external", 0x2000)
    assert streams.numba_stream(0x2000) == ("external", 0x2000) and streams.numba_stream(0) == 0
    assert streams.numba_stream(CupyLike(0x3000)) == ("external", 0x3000)  # (a stream object: its handle first)
    assert made == [0x1000, 0x2000, 0x3000]
    with pytest.raises(TypeError, match="cannot use 's' \\(a str\\)"):
        streams.numba_stream("s")
    streams._external.cache_clear()


@pytest.mark.parametrize("bad, words", [
    (object(), "cannot use a builtins.object as a CUDA stream"),
    (True, "not a bool"),
    (-1, "non-negative"),
    (types.SimpleNamespace(__cuda_stream__=lambda: 5), "returns (version, handle)"),
])
def test_bad_streams_are_refused(bad, words):
    with pytest.raises(TypeError) as info:
        streams.stream_handle(bad)
    assert words in str(info.value)


def test_torch_tensors_launch_on_torchs_current_stream(monkeypatch):
    class Tensor:
        is_cuda = True
        device = "cuda:0"

    fake_torch = types.SimpleNamespace(
        Tensor=Tensor, cuda=types.SimpleNamespace(current_stream=lambda device: TorchLike(0xABC)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert streams.default_stream([object(), Tensor()]) == 0xABC
    assert streams.default_stream([object()]) == 0


def test_plans_resolve_streams():
    from numbatma.kernels import Plan

    class Tiny(Plan):
        output = None  # (writes nothing: no argument rule applies)

        def __init__(self, a, b, flag=1):
            pass

    plan = Tiny("a", "b", flag=2)
    assert plan._user_arrays == ("a", "b")
    assert plan.stream_for(None) == 0 and plan.stream_for(0) == 0
    with pytest.raises(TypeError, match="as a CUDA stream"):
        plan.stream_for("s")
    for stream, handle in ((None, 0), (0x77, 0x77), (TorchLike(0x88), 0x88), (ProtocolStream(0x99), 0x99),
                           (CupyLike(0xAA), 0xAA)):
        assert plan.stream_for(stream) == handle and type(plan.stream_for(stream)) is int
    assert numbatma.streams is streams


def test_plans_prepare_again_when_a_scalar_argument_changes(monkeypatch):
    """Axpy's ``plan.a`` may change between launches: the prepared launch is made again (and only then)."""
    from numbatma.kernels import Plan, _plan

    made = []
    monkeypatch.setattr(_plan, "prepare_launch", lambda kernel, args, *rest, **kw: made.append(args) or (lambda s: None))

    class Scaled(Plan):
        kernel = object()
        grid, block = 1, 32
        output = "out"
        settable = {"a": None}  # (a built plan refuses other assignments)

        def __init__(self):
            self.a = 2.0

        @property
        def args(self):
            return (self.a, 7)

    plan = Scaled()
    plan.launch()
    plan.launch()
    plan.a = -0.5
    plan.launch()
    assert [args for args in made] == [(2.0, 7), (-0.5, 7)]


def test_torchs_current_stream_through_its_raw_handle_lookup(monkeypatch):
    """torch_stream: torch._C._cuda_getCurrentRawStream(index) where torch has it (no Stream object built), else
    torch.cuda.current_stream(device).cuda_stream; a handle of 0 is the legacy default stream."""
    import fakes

    torch = fakes.fake_torch(current_stream=lambda index: 0x100 + index)
    monkeypatch.setitem(sys.modules, "torch", torch)
    t = fakes.FakeTorchTensor((4, 4), device=1)
    assert streams.torch_device([object(), fakes.FakeTorchTensor((4, 4), device=None), t]) is t.device
    assert streams.default_stream([object(), t]) == 0x101
    assert streams.default_stream([t]) == 0x101
    assert torch.calls == {"current_stream": 0, "raw": 2}
    older = fakes.fake_torch(current_stream=0x200, raw_stream=False)
    monkeypatch.setitem(sys.modules, "torch", older)
    assert streams.default_stream([t]) == 0x200 and older.calls["current_stream"] == 1
    monkeypatch.setitem(sys.modules, "torch", fakes.fake_torch(current_stream=0))
    assert streams.default_stream([t]) == 0


def test_plans_find_their_torch_tensor_once_and_its_stream_per_launch(monkeypatch):
    import fakes
    from numbatma.kernels import Plan, _plan

    torch = fakes.fake_torch(current_stream=0x300)
    monkeypatch.setitem(sys.modules, "torch", torch)
    found = []
    monkeypatch.setattr(_plan, "torch_device", lambda arrays: found.append(arrays) or streams.torch_device(arrays))

    class Tiny(Plan):
        output = None

        def __init__(self, a, b):
            pass

    t = fakes.FakeTorchTensor((4, 4))
    plan = Tiny(t, t)
    assert [plan.stream_for(None) for _ in range(3)] == [0x300] * 3
    assert len(found) == 1 and torch.calls["raw"] == 3
    assert plan.stream_for(7) == 7 and torch.calls["raw"] == 3
    plan.rebind(fakes.FakeTorchTensor((4, 4), ptr=1 << 30), fakes.FakeTorchTensor((4, 4), ptr=1 << 31))
    plan.stream_for(None)
    assert len(found) == 2  # (new arrays: which tensor, decided again)


def test_a_plan_hands_its_prepared_launch_the_handle_converted_once(monkeypatch):
    """One stream form end to end: Plan.launch converts the caller's stream once (stream_handle) and its prepared
    launch receives that int; nothing in numbatma's or the kernels' launch paths calls as_stream."""
    import pathlib

    from numbatma.kernels import Plan, _plan

    got, converted = [], []
    monkeypatch.setattr(_plan, "prepare_launch", lambda *a, **k: got.append)
    real = streams.stream_handle
    monkeypatch.setattr(_plan, "stream_handle", lambda s: converted.append(s) or real(s))

    class Tiny(Plan):
        kernel, grid, block, output, args = object(), 1, 32, "out", ()

    plan = Tiny()
    for stream in (TorchLike(0x1234), ProtocolStream(0x99), 0x42):
        plan.launch(stream)
    assert got == [0x1234, 0x99, 0x42] and all(type(h) is int for h in got) and len(converted) == 3
    root = pathlib.Path(__file__).resolve().parents[1]
    users = [str(p.relative_to(root)) for d in ("numbatma", "kernels") for p in (root / d).glob("*.py")
             if p.name != "streams.py" and "as_stream(" in p.read_text()]
    assert users == []


def test_a_launch_through_numba_turns_the_handle_into_numbas_stream_at_that_edge(monkeypatch):
    """numbatma.prepare_launch's launch through numba (here: the prepared path declined) gives numba
    numba_stream(handle): 0 as it is, a handle as numba.cuda.external_stream(handle)."""
    from numbatma import _prepared_launch, launch

    monkeypatch.setattr(_prepared_launch, "prepare_launch", lambda *a, **k: None)
    monkeypatch.setattr(streams, "_external", lambda h: ("external", h))
    seen = []

    class Kernel:
        def __getitem__(self, config):
            seen.append(config[2])
            return lambda *args: None

    run = launch.prepare_launch(Kernel(), (), 1, 32)
    run(0)
    run(0x51)
    run(TorchLike(0x52))
    assert seen == [0, ("external", 0x51), ("external", 0x52)]
