"""CPU: the on-disk cache of the ready-made kernels (kernels/_compile_cache.py, numbatma/_numba_internals.py hook 12).

The cache index key of a factory kernel is the same in two processes (numba's own key hashes a pickle of the
closure cells, which is not); different factory arguments give different keys; an entry saved by one process is
found by another, several closures of one factory sharing one index file; a data file holding another entry is a
miss; ``NUMBATMA_DISK_CACHE=0`` and the debug mode leave the kernels without numbatma's cache; the decorator
memoizes. Kernels are built offline (fake CUDA arrays), never compiled; the key is computed with a stand-in
codegen whose ``magic_tuple()`` is a constant."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda, types

from numbatma import Swizzle
from numbatma import _numba_internals as internals
from numbatma import compile as nbc
from numbatma.kernels import _compile_cache, _launch, stream

HERE = pathlib.Path(__file__).resolve().parent

needs_cache = pytest.mark.skipif(not _compile_cache.ACTIVE, reason="on-disk cache off in this process "
                                 "(NUMBATMA_DISK_CACHE=0, the simulator or the debug mode)")

# Run in a fresh interpreter (cwd: tests/, for fakes.py; numbatma as installed). argv[1]: "keys", "save" or "load".
PROBE = r'''
import json, sys
import numpy as np
from numba import types
from numbatma.kernels import _launch
_launch.sm_count = lambda *a: 132
from numba.cuda.typing.typeof import typeof
from numbatma import compile as nbc
from numbatma.kernels import Attention, Softmax, StreamCopy
from fakes import FakeCudaArray

G = 1 << 34
def fa(shape, dtype=np.float32, ptr=1 << 20):
    return FakeCudaArray(shape, dtype, ptr=ptr)

class Codegen:  # (stand-in: numba's asks the current device for its compute capability)
    def magic_tuple(self):
        return ((13, 0), (9, 0))

class TargetContext:
    def refresh(self):
        pass
    def codegen(self):
        return Codegen()

class Compiled:  # what CUDACacheImpl.reduce / _Kernel._rebuild take and give, without a GPU
    codegen = Codegen()
    def __init__(self, name):
        self.name = name
    def _reduce_states(self):
        return dict(cooperative=False, name=self.name, signature=None, codelibrary=None, debug=False,
                    lineinfo=False, call_helper=None, extensions=[])

plans = {
    "StreamCopy": StreamCopy(fa((512, 512)), fa((512, 512), ptr=G)),
    "StreamCopy-8KiB": StreamCopy(fa((512, 512)), fa((512, 512), ptr=G), tile_bytes=8192, stages=2),
    "Softmax": Softmax(fa((1000, 1000)), fa((1000, 1000), ptr=G)),
    "Attention": Attention(fa((2, 4, 1000, 128), np.float16), fa((2, 4, 1000, 128), np.float16, ptr=1 << 30),
                           fa((2, 4, 1000, 128), np.float16, ptr=1 << 34), fa((2, 4, 1000, 128), np.float16, ptr=1 << 36),
                           fa((2, 4, 1000), np.float32, ptr=1 << 40)),
}
FIXED = (types.float32[:, ::1], types.int64)
out = {}
for name, plan in plans.items():
    kernel = plan.kernel
    cache = kernel._cache
    entry = {"key": nbc.disk_cache_key(kernel), "cache": type(cache).__name__}
    if entry["key"] is not None:
        entry["index_key"] = repr(cache._index_key(FIXED, Codegen()))
        sig = tuple(typeof(a) for a in plan.args)  # (the kernel's own argument types: TensorMaps among them)
        if sys.argv[1] == "save":
            cache.save_overload(sig, Compiled("saved:" + name))
        elif sys.argv[1] == "load":
            loaded = cache.load_overload(sig, TargetContext())
            entry["loaded"] = None if loaded is None else loaded.entry_name
            entry["launch_bounds"] = repr(getattr(loaded, "launch_bounds", "missing"))
        entry["path"] = cache.cache_path
    out[name] = entry
print("RESULT" + json.dumps(out))
'''


def probe(mode, cache_dir, **env):
    environment = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), **env)
    for name in ("NUMBATMA_DISK_CACHE", "NUMBATMA_DEBUG", "NUMBA_ENABLE_CUDASIM"):
        if name not in env:
            environment.pop(name, None)
    run = subprocess.run([sys.executable, "-c", PROBE, mode], cwd=HERE, env=environment, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    line = [text for text in run.stdout.splitlines() if text.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def test_keys_agree_between_processes_and_entries_are_found(tmp_path):
    """(a) The index key of Softmax's, Attention's and StreamCopy's kernels (fixed signature, stand-in codegen)
    is the same in two fresh processes; what the first saved (under the kernels' real argument types), the
    second loads, two closures of one factory sharing one index file."""
    first = probe("save", tmp_path)
    second = probe("load", tmp_path)
    assert set(first) == {"StreamCopy", "StreamCopy-8KiB", "Softmax", "Attention"}
    for name in first:
        assert first[name]["cache"] == "KeyedCUDACache", (name, first[name])
        assert first[name]["key"] == second[name]["key"], name
        assert first[name]["index_key"] == second[name]["index_key"], name
        assert second[name]["loaded"] == "saved:" + name, (name, second[name])
        assert second[name]["launch_bounds"] == "None"  # (restored from the kernel's options: none here)
        assert pathlib.Path(first[name]["path"]).is_relative_to(tmp_path)  # (NUMBA_CACHE_DIR honoured)
    assert first["StreamCopy"]["key"] != first["StreamCopy-8KiB"]["key"]
    assert first["StreamCopy"]["index_key"] != first["StreamCopy-8KiB"]["index_key"]
    copy_indexes = [p for p in tmp_path.rglob("*.nbi") if p.name.startswith("stream._copy_kernel.")]
    assert len(copy_indexes) == 1, sorted(p.name for p in tmp_path.rglob("*"))  # one index file, two entries
    assert len(list(copy_indexes[0].parent.glob("stream._copy_kernel.*.nbc"))) == 2


@pytest.mark.parametrize("env", [{"NUMBATMA_DISK_CACHE": "0"}, {"NUMBATMA_DEBUG": "1"}], ids=["off", "debug"])
def test_off_and_debug_mode_leave_numbas_null_cache(tmp_path, env):
    """(c) NUMBATMA_DISK_CACHE=0 (and the GPU debug mode) give the kernels no cache of ours: numba's default."""
    result = probe("keys", tmp_path, **env)
    for name, entry in result.items():
        assert entry == {"key": None, "cache": "NullCache"}, (name, entry)
    assert not list(tmp_path.iterdir())


@needs_cache
def test_different_arguments_give_different_keys(monkeypatch):
    """(b) Each argument of a factory is in its key: changing any one changes the key and the index key."""
    monkeypatch.setattr(_launch, "sm_count", lambda *a: 132)

    class Codegen:
        def magic_tuple(self):
            return ((13, 0), (9, 0))

    base = dict(stages=4, tile=(16, 256), nb_dtype=types.float32, evict_first=False, tma_part=True, has_tail=False)
    variants = [base, dict(base, stages=3), dict(base, tile=(16, 128)), dict(base, nb_dtype=types.float16),
                dict(base, evict_first=True), dict(base, tma_part=False), dict(base, has_tail=True)]
    kernels = [stream._copy_kernel(**v) for v in variants]
    keys = [nbc.disk_cache_key(k) for k in kernels]
    assert None not in keys and len(set(keys)) == len(keys)
    assert "numbatma.kernels.stream._copy_kernel(stages=4, tile=(16, 256), nb_dtype=float32, evict_first=False" \
           in keys[0]
    sig = (types.float32[:, ::1],)
    index_keys = {k._cache._index_key(sig, Codegen()) for k in kernels}
    assert len(index_keys) == len(kernels)
    # the same call spelled differently (positional, keyword, defaults left out) is the same key
    assert nbc.disk_cache_key(stream._copy_kernel(4, (16, 256), types.float32)) == keys[0]
    # another factory, same arguments: another key
    assert nbc.disk_cache_key(stream._copy_kernel_two_roles(4, (16, 256), types.float32)) not in keys


@needs_cache
def test_the_decorator_memoizes():
    """(d) The same object back for the same arguments, as with lru_cache (whose cache_info it keeps)."""
    a = stream._axpy_kernel(3, (32, 256), types.float32)
    before = stream._axpy_kernel.cache_info().hits
    assert stream._axpy_kernel(3, (32, 256), types.float32) is a
    assert stream._axpy_kernel.cache_info().hits == before + 1
    assert stream._axpy_kernel.__name__ == "_axpy_kernel" and stream._axpy_kernel.__wrapped__


def test_every_kernel_factory_is_decorated():
    """Every factory of kernels/*.py that returns cuda.jit kernels uses kernel_factory (not lru_cache)."""
    import ast

    def is_kernel_decorator(text):
        return text.split("(")[0] in ("cuda.jit", "jit") and "device=True" not in text

    found = {}
    for path in sorted((HERE.parent / "kernels").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                names = [ast.unparse(d) for d in node.decorator_list]
                if "kernel_factory" in names:
                    found.setdefault(path.stem, []).append(node.name)
                returns_kernel = any(
                    isinstance(inner, ast.FunctionDef) and any(is_kernel_decorator(ast.unparse(d))
                                                               for d in inner.decorator_list)
                    for inner in ast.walk(node) if inner is not node)
                if returns_kernel:
                    assert "kernel_factory" in names, f"{path.name}: {node.name} builds a kernel: @kernel_factory"
    assert found == {
        "attention": ["_attention_kernel"],
        "_attention_backward_kernel": ["_backward_kernel"],
        "_attention_backward_rows": ["_prep_kernel", "_post_kernel"],
        "copy": ["_copy_kernel"], "gemm": ["_gemm_kernel"],
        "rowsum": ["_row_sum_kernel", "_fill_zero_kernel"],
        "softmax": ["_softmax_rows_kernel", "_softmax_chunked_kernel"], "stencil": ["_laplacian_kernel"],
        "stream": ["_copy_kernel", "_copy_kernel_two_roles", "_axpy_kernel"], "transpose": ["_transpose_kernel"],
    }


def test_stable_repr():
    r = _compile_cache.stable_repr
    assert r(types.float32) == "float32" and r(types.float16) == "float16"
    assert r((1, (2,), [3, "a"], None, True, 1.5)) == "(1, (2,), [3, 'a'], None, True, 1.5)"
    assert r(np.int64(5)) == "5" and r(np.bool_(True)) == "True" and r(np.float32(0.5)) == "0.5"
    assert r(Swizzle.B128) == "Swizzle.B128"
    assert r({"b": 1, "a": types.int32}) == "{'a': int32, 'b': 1}"
    assert r(np.dtype(np.float32)) == "dtype('float32')"
    from numbatma import cluster_launch_bounds

    assert r(cluster_launch_bounds((2, 1, 1), 384)) == "cluster_launch_bounds((2, 1, 1), (384,))"
    for unstable in (object(), lambda: 0, "at 0x7f12ab", {1, 2}):
        with pytest.raises(_compile_cache.Unstable):
            r(unstable)


@needs_cache
def test_unstable_arguments_device_functions_and_tuples():
    """A call with an argument without a stable repr is only memoized; device functions get no cache; every
    kernel of a tuple result gets its own key (its position)."""

    @_compile_cache.kernel_factory
    def factory(n, extra=None):
        @cuda.jit(device=True)
        def helper(x):
            return x + n

        @cuda.jit
        def first(out):
            out[0] = helper(out[0])

        @cuda.jit
        def second(out):
            out[0] = n

        return first, (second, helper)

    token = object()
    plain = factory(1, token)
    assert factory(1, token) is plain
    assert [nbc.disk_cache_key(k) for k in (plain[0], plain[1][0])] == [None, None]
    first, (second, helper) = factory(2)
    assert nbc.disk_cache_key(helper) is None and type(helper._cache).__name__ == "NullCache"
    k1, k2 = nbc.disk_cache_key(first), nbc.disk_cache_key(second)
    assert k1.startswith(f"{__name__}.test_unstable_arguments_device_functions_and_tuples.<locals>.factory("
                         f"n=2, extra=None)[0] options=")
    assert k2.startswith(f"{__name__}.test_unstable_arguments_device_functions_and_tuples.<locals>.factory("
                         f"n=2, extra=None)[1][0] options=")
    assert f"source={_compile_cache.source_digest()}" in k1


def test_enable_disk_cache_takes_kernels_only():
    @cuda.jit(device=True)
    def dev(x):
        return x

    @cuda.jit
    def kern(out):
        out[0] = 1

    with pytest.raises(TypeError, match="not a device function"):
        nbc.enable_disk_cache(dev, "k")
    with pytest.raises(TypeError, match="non-empty string"):
        nbc.enable_disk_cache(kern, b"k")
    assert nbc.disk_cache_key(kern) is None
    assert nbc.enable_disk_cache(kern, "my key") is kern and nbc.disk_cache_key(kern) == "my key"


class _Codegen:
    def magic_tuple(self):
        return ("magic",)


class _Context:
    def refresh(self):
        pass

    def codegen(self):
        return _Codegen()


class _Compiled:
    codegen = _Codegen()

    def __init__(self, name):
        self.name = name

    def _reduce_states(self):
        return dict(cooperative=False, name=self.name, signature=None, codelibrary=None, debug=False,
                    lineinfo=False, call_helper=None, extensions=[])


def test_a_data_file_of_another_entry_is_a_miss(tmp_path, monkeypatch):
    """Numba numbers data files per process: two processes saving different entries at once may write the same
    file. The entry's index key is stored with its data and compared on load, so such a file is a miss."""
    from numba.cuda.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))

    def make():
        @cuda.jit
        def k(out):
            out[0] = 1

        return k

    a, b = make(), make()
    nbc.enable_disk_cache(a, "entry A")
    nbc.enable_disk_cache(b, "entry B")
    sig = (types.float32[::1],)
    a._cache.save_overload(sig, _Compiled("A"))
    b._cache.save_overload(sig, _Compiled("B"))
    assert a._cache.load_overload(sig, _Context()).entry_name == "A"
    assert b._cache.load_overload(sig, _Context()).entry_name == "B"
    data = sorted(pathlib.Path(a._cache.cache_path).glob("*.nbc"))
    assert len(data) == 2 and len(list(pathlib.Path(a._cache.cache_path).glob("*.nbi"))) == 1
    # B's save reads the index A's wrote; had it not (a concurrent save), it would have taken A's file name
    cache_file = b._cache._cache_file
    b_key = b._cache._index_key(sig, _Codegen())
    a_file = cache_file._load_index()[a._cache._index_key(sig, _Codegen())]
    cache_file._save_data(a_file, (b_key, {"name": "B"}))  # (B's entry written where A's index points)
    assert a._cache.load_overload(sig, _Context()) is None
    assert b._cache.load_overload(sig, _Context()).entry_name == "B"


def test_a_failing_save_or_load_is_a_warning_not_an_error(tmp_path, monkeypatch):
    from numba.cuda.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("numbatma._disk_cache._cache_warned", set())

    @cuda.jit
    def k(out):
        out[0] = 1

    nbc.enable_disk_cache(k, "key")
    sig = (types.float32[::1],)

    class Unpicklable(_Compiled):
        def _reduce_states(self):
            raise RuntimeError("Cannot pickle CUDACodeLibrary with linking files")

    with pytest.warns(RuntimeWarning, match="could not save"):
        k._cache.save_overload(sig, Unpicklable("x"))
    assert k._cache.load_overload(sig, _Context()) is None
    k._cache.save_overload(sig, _Compiled("x"))
    for data in pathlib.Path(k._cache.cache_path).glob("*.nbc"):
        data.write_bytes(b"not a pickle")
    with pytest.warns(RuntimeWarning, match="could not load"):
        assert k._cache.load_overload(sig, _Context()) is None


def test_a_loaded_kernel_gets_its_launch_bounds_back(tmp_path, monkeypatch):
    """_Kernel._rebuild drops launch_bounds; the cluster-grid checks (hook 3, prepared launches) read them."""
    from numba.cuda.core import config

    from numbatma import cluster_launch_bounds

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    bounds = cluster_launch_bounds((2, 1, 1))

    @cuda.jit(launch_bounds=bounds)
    def k(out):
        out[0] = 1

    nbc.enable_disk_cache(k, "key")
    sig = (types.float32[::1],)
    k._cache.save_overload(sig, _Compiled("x"))
    loaded = k._cache.load_overload(sig, _Context())
    assert loaded.launch_bounds is k.targetoptions["launch_bounds"]
    assert loaded.launch_bounds.cluster_dims == (2, 1, 1)


def test_the_debug_key_is_in_the_index_key(monkeypatch):
    from numbatma import debug

    @cuda.jit
    def k(out):
        out[0] = 1

    nbc.enable_disk_cache(k, "key")
    sig = (types.float32[::1],)
    normal = k._cache._index_key(sig, _Codegen())
    monkeypatch.setattr(debug, "ENABLED", True)
    assert k._cache._index_key(sig, _Codegen()) == normal + (debug.cache_key(),)
