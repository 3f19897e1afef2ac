"""Autotuning: time a kernel's candidate configurations once per shape class and device, keep the fastest.

For user kernels and numbatma's own. The caller names a *key* (its shape class, e.g. ``("attention", "bf16", 128,
"causal", bucket(seq_len))``), a non-empty sequence of *configs* and a ``build(config)`` that returns a zero-argument
``launch`` callable (or raises: the config does not fit this shape, it is skipped with the reason recorded).
:func:`tune` builds and times every config with :func:`time_launch` and returns a :class:`Tuning` (``.best``, the
fastest config as the caller gave it; ``.timings``, each config's median milliseconds or the reason it was skipped).

* :func:`time_launch`: the median time of ``launch()`` from CUDA events around each call, after untimed warm-up
  calls, with the L2 cache flushed before each timed call (:func:`flush_l2`: a memset of a buffer twice the
  device's L2 size, allocated once per device), so every call starts from cold L2 as a kernel in a real workload
  usually does;
* :func:`tune` / :class:`Tuner`: the search and its caches. The winner is kept in memory (per :class:`Tuner`;
  :func:`tune` uses one per process) and on disk, one JSON file per (device name, compute capability, numbatma
  version, key) under :func:`cache_dir` (``NUMBATMA_AUTOTUNE_DIR``, default ``~/.cache/numbatma/autotune``,
  ``$XDG_CACHE_HOME`` honoured), written atomically (a temporary file, then ``os.replace``). A file also records the
  configs it chose among: asked again with other configs, the key is tuned again (and the file replaced). A file that
  is unreadable, not JSON or written for another device / key is ignored with a warning, never an error;
* :func:`bucket`: the next power of two, to fold sizes into shape classes;
* :func:`label`: the canonical text of a config or key (what the cache files and ``Tuning.timings`` use).

Environment (read at each call): ``NUMBATMA_AUTOTUNE=0`` turns tuning off - :func:`tune` returns the first config
(the caller's default) without building or timing anything (``Tuning.source == "disabled"``). Under the CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``, ``numbatma.SIMULATING``) timings mean nothing: :func:`tune` returns the first
config the same way (``source == "simulator"``) and :func:`time_launch` raises. Several GPUs: timing runs on the
calling thread's current device and the cache is kept per device (its name and compute capability).

A host module: it imports numba-cuda and cuda.bindings only inside the functions that time, so importing it costs
the standard library only.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import numbers
import os
import pathlib
import re
import tempfile
import warnings

import numpy as np

from ._env import SIMULATING

__all__ = ["AutotuneError", "Tuner", "Tuning", "bucket", "cache_dir", "flush_l2", "label", "time_launch", "tune"]

FORMAT = 1  # (the cache files' layout; a file of another format is ignored with a warning)
_OFF = ("0", "false", "no", "off")


class AutotuneError(RuntimeError):
    """No config could be built, checked and timed (each config's reason is in the message), or tuning needs a GPU
    that is not there."""


# -- arguments ------------------------------------------------------------------------------------------------------
def label(value, what="config"):
    """The canonical text of a config or key: the same in every process, different for values that differ. Takes
    None, bools, ints, floats, strings (NumPy scalars as the Python ones), enum members, NumPy dtypes, and tuples
    (named tuples with their field names), dicts (keys sorted by their label) and dataclass instances of these.
    Anything else is a TypeError naming ``what``, the value and the part of it that has no label."""
    try:
        return _text(value)
    except _NoLabel as exc:
        part = exc.args[0]
        whole = "" if part is value else f"{_short(value)}, which holds "
        raise TypeError(f"autotune: a {what} must be a scalar, tuple, dict or dataclass of such values (hashable and "
                        f"the same text in every process), got {whole}a {type(part).__module__}."
                        f"{type(part).__qualname__}: {_short(part)}") from None


class _NoLabel(TypeError):
    """(the part of a config or key that has no label)"""


def _short(value):
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _text(value):
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return repr(value)
    if isinstance(value, enum.Enum):
        return f"{kind.__name__}.{value.name}"
    if isinstance(value, np.bool_):
        return repr(bool(value))
    if isinstance(value, np.integer):
        return repr(int(value))
    if isinstance(value, np.floating):
        return repr(float(value))
    if isinstance(value, np.dtype):
        return f"dtype({str(value)!r})"
    if isinstance(value, tuple):
        if hasattr(value, "_fields"):
            fields = ", ".join(f"{f}={_text(getattr(value, f))}" for f in value._fields)
            return f"{kind.__name__}({fields})"
        items = ", ".join(_text(v) for v in value)
        return f"({items}{',' if len(value) == 1 else ''})"
    if kind is dict:
        return "{" + ", ".join(sorted(f"{_text(k)}: {_text(v)}" for k, v in value.items())) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={_text(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{kind.__name__}({fields})"
    raise _NoLabel(value)


def bucket(n):
    """The smallest power of two >= ``n`` (an int >= 1): ``bucket(1000) == 1024``, ``bucket(1024) == 1024``. For
    shape classes: sizes of one bucket share a tuned config."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"autotune.bucket: n must be an int >= 1, got {n!r}")
    return 1 << (int(n) - 1).bit_length()


def _count(name, value, least):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"autotune: {name} must be an int >= {least}, got {value!r}")
    return int(value)


def _configs(configs):
    """(configs as a list, their labels); refuses an empty or unordered collection, a config without a label and
    two configs with the same label."""
    if isinstance(configs, (str, bytes, dict, set, frozenset)) or not hasattr(configs, "__len__") \
            or not hasattr(configs, "__getitem__"):
        raise TypeError(f"autotune: configs must be a non-empty sequence (list or tuple) of configs, got "
                        f"{type(configs).__name__} {configs!r:.60}")
    configs = list(configs)
    if not configs:
        raise ValueError(f"autotune: configs must be a non-empty sequence, got {configs!r}")
    labels = [label(c) for c in configs]
    seen = set()
    for text in labels:
        if text in seen:
            raise ValueError(f"autotune: configs must be distinct, got {text} twice")
        seen.add(text)
    return configs, labels


def _disabled():
    return os.environ.get("NUMBATMA_AUTOTUNE", "1").strip().lower() in _OFF


# -- timing ---------------------------------------------------------------------------------------------------------
_FLUSH = {}  # device ordinal -> the device array flush_l2 writes (allocated once per device, kept for the process)


def _flush_buffer():
    from numba import cuda

    from .devices import current_device

    cuda.current_context()  # (makes the current device's primary context current where none is)
    ordinal = current_device()
    buffer = _FLUSH.get(ordinal)
    if buffer is None:
        l2 = int(cuda.get_current_device().L2_CACHE_SIZE)
        words = max(2 * l2, 1 << 20) // 4 + 1  # (twice L2, in 32-bit words; at least 4 MiB)
        buffer = _FLUSH[ordinal] = cuda.device_array(words, dtype="uint32")
    return buffer


def flush_l2(stream=None):
    """Evict the current device's L2 cache: a memset (``cuMemsetD32Async``, on ``stream``: any stream
    :func:`numbatma.streams.stream_handle` takes) of a buffer more than twice the L2 size, allocated on the first call
    for each device. Returns the bytes written."""
    from .streams import stream_handle

    if SIMULATING:
        raise AutotuneError("autotune.flush_l2: there is no L2 cache under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)")
    return _flush(stream_handle(stream))


_FLUSHES = [0]  # (flushes so far: the memset's value changes from one flush to the next)


def _flush(handle):
    """flush_l2 on the stream of the raw handle ``handle``."""
    from cuda.bindings import driver

    buffer = _flush_buffer()
    _FLUSHES[0] += 1
    ptr = buffer.__cuda_array_interface__["data"][0]
    (err,) = driver.cuMemsetD32Async(driver.CUdeviceptr(ptr), _FLUSHES[0] & 0xFFFF, buffer.size,
                                     driver.CUstream(handle))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise AutotuneError(f"autotune.flush_l2: cuMemsetD32Async of {buffer.nbytes} bytes failed: {err!r}")
    return buffer.nbytes


def time_launch(launch, *, warmup=3, reps=20, flush_l2=True, stream=None):
    """The median time, in milliseconds, of one ``launch()`` on the current device: ``warmup`` untimed calls (they
    compile and load the kernel), then ``reps`` calls, each between two CUDA events recorded on ``stream`` (any stream
    :func:`numbatma.streams.stream_handle` takes; None: the legacy default stream - give the stream ``launch`` uses
    when it is another one) and, with ``flush_l2``, after an L2 flush (:func:`flush_l2`) outside the events. The host
    synchronizes once, after the last call. The events time the stream from the start event to the stop event, so a
    launch whose host side (tens of microseconds through numba's dispatcher) takes longer than the GPU needs to reach
    the start event is measured with that wait; the flush (a memset of twice L2: about 40 us on an H100) gives the
    host that time, so with ``flush_l2`` a short kernel is measured without its host cost and without it mostly
    with it (seen on an H100: a 256 KiB copy, 0.030 ms flushed, 0.054 ms unflushed; a 256 MiB copy, 0.47 ms both). The caller guarantees that ``launch()`` enqueues its work on ``stream`` (or a
    stream ordered with it) and may be called ``warmup + reps`` times. Raises under the CUDA simulator."""
    if SIMULATING:
        raise AutotuneError("autotune.time_launch: timings under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) mean "
                            "nothing; tune() returns the first config there without timing")
    if not callable(launch):
        raise TypeError(f"autotune.time_launch: launch must be a zero-argument callable, got "
                        f"{type(launch).__name__} {launch!r:.60}")
    warmup, reps = _count("warmup", warmup, 0), _count("reps", reps, 1)
    from numba import cuda

    from .streams import numba_stream, stream_handle

    handle = stream_handle(stream)
    on = numba_stream(handle)
    for _ in range(warmup):
        launch()
    cuda.synchronize()
    events = [(cuda.event(timing=True), cuda.event(timing=True)) for _ in range(reps)]
    for start, stop in events:
        if flush_l2:
            _flush(handle)
        start.record(on)
        launch()
        stop.record(on)
    events[-1][1].synchronize()
    times = sorted(cuda.event_elapsed_time(start, stop) for start, stop in events)
    middle = len(times) // 2
    return float(times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2)


# -- tuning ---------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Tuning:
    """The outcome of :func:`tune`: ``best`` (the winning config, the caller's own object), ``timings`` ({label of
    each config: its median milliseconds, or the reason it was skipped}; empty when nothing was timed), ``key`` (the
    caller's key), ``source`` (``"timed"``: measured now; ``"memory"`` / ``"disk"``: a cached winner, ``timings`` as
    measured then; ``"disabled"``: ``NUMBATMA_AUTOTUNE=0``; ``"simulator"``: the CUDA simulator) and ``device`` (the
    device name and compute capability the timings are for; None when nothing was timed)."""

    key: object
    best: object
    timings: dict
    source: str
    device: tuple = None

    def time_of(self, config):
        """The median milliseconds of ``config`` (or the reason it was skipped; None when it was not timed)."""
        return self.timings.get(label(config))

    @property
    def best_ms(self):
        return self.timings.get(label(self.best)) if self.timings else None

    def __str__(self):
        rows = [f"autotune {label(self.key, 'key')} ({self.source}):"]
        for text, result in self.timings.items():
            mark = "*" if text == label(self.best) else " "
            rows.append(f" {mark} {text}: " + (f"{result:.4f} ms" if isinstance(result, float) else f"skipped, {result}"))
        return "\n".join(rows)


def cache_dir():
    """Where the winners are kept on disk: ``$NUMBATMA_AUTOTUNE_DIR``, else ``$XDG_CACHE_HOME/numbatma/autotune``,
    else ``~/.cache/numbatma/autotune`` (read at each call)."""
    chosen = os.environ.get("NUMBATMA_AUTOTUNE_DIR")
    if chosen:
        return pathlib.Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "numbatma" / "autotune"


def _current_device():
    """(name, (major, minor)) of the calling thread's current device."""
    try:
        from numba import cuda

        device = cuda.get_current_device()
    except Exception as exc:  # noqa: BLE001 - no driver, no GPU
        raise AutotuneError(f"autotune: tuning needs a CUDA GPU, none is usable ({type(exc).__name__}: {exc}); "
                            f"set NUMBATMA_AUTOTUNE=0 to take the first config untimed") from exc
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    return name, tuple(int(c) for c in device.compute_capability)


def _reason(stage, exc):
    text = str(exc).strip().splitlines()
    return f"{stage}: {type(exc).__name__}" + (f": {text[0]}" if text else "")


def _slug(text, limit):
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:limit] or "x"


class Tuner:
    """A search with its caches. ``timer`` (default :func:`time_launch`) is called as ``timer(launch, warmup=,
    reps=, flush_l2=, stream=)`` and returns milliseconds (tests and offline use pass their own). ``device``: the
    device identity the cache is keyed by, ``(name, (major, minor))``; None: the current CUDA device at each call.
    ``cache``: keep winners in memory and on disk (False: time at every call, store nothing). ``directory``: the
    cache folder (None: :func:`cache_dir` at each call). Each Tuner has its own memory; :func:`tune` uses one per
    process."""

    def __init__(self, *, timer=None, device=None, cache=True, directory=None):
        if timer is not None and not callable(timer):
            raise TypeError(f"autotune: timer must be callable, got {type(timer).__name__} {timer!r:.60}")
        if device is not None:
            ok = (isinstance(device, tuple) and len(device) == 2 and isinstance(device[0], str)
                  and isinstance(device[1], tuple) and len(device[1]) == 2
                  and all(isinstance(c, int) and not isinstance(c, bool) for c in device[1]))
            if not ok:
                raise ValueError(f"autotune: device must be (name, (major, minor)), got {device!r}")
        if not isinstance(cache, bool):
            raise TypeError(f"autotune: cache must be True or False, got {cache!r}")
        self.timer = timer  # (None: the module's time_launch, looked up at each call)
        self.device = device
        self.cache = cache
        self.directory = None if directory is None else pathlib.Path(directory)
        self._memory = {}  # (device, key label) -> (config labels, best label, timings)

    def tune(self, key, configs, build, *, check=None, warmup=3, reps=20, flush_l2=True, stream=None):
        """The fastest config for ``key`` (see :func:`tune`, which this is with this Tuner's timer and caches)."""
        key_text = label(key, "key")
        configs, labels = _configs(configs)
        if not callable(build):
            raise TypeError(f"autotune: build must be a callable taking a config and returning a zero-argument "
                            f"launch, got {type(build).__name__} {build!r:.60}")
        if check is not None and not callable(check):
            raise TypeError(f"autotune: check must be None or a callable check(config, launch), got "
                            f"{type(check).__name__} {check!r:.60}")
        timing = dict(warmup=_count("warmup", warmup, 0), reps=_count("reps", reps, 1), flush_l2=bool(flush_l2),
                      stream=stream)
        if _disabled() or (SIMULATING and self.device is None):
            return Tuning(key, configs[0], {}, "disabled" if _disabled() else "simulator")
        device = self.device or _current_device()
        found = self._cached(device, key_text, labels)
        if found is not None:
            best, timings, source = found
            return Tuning(key, configs[labels.index(best)], dict(timings), source, device)
        timings = self._measure(configs, labels, build, check, timing)
        times = {text: ms for text, ms in timings.items() if isinstance(ms, float)}
        if not times:
            reasons = "; ".join(f"{text}: {why}" for text, why in timings.items())
            raise AutotuneError(f"autotune: no config of key {key_text} could run on {device[0]}: {reasons}")
        best = min(labels, key=lambda text: times.get(text, math.inf))  # (ties: the earlier config)
        if self.cache:
            self._memory[device, key_text] = (labels, best, timings)
            self._save(device, key_text, labels, best, timings)
        return Tuning(key, configs[labels.index(best)], timings, "timed", device)

    def _measure(self, configs, labels, build, check, timing):
        timings = {}
        for config, text in zip(configs, labels):
            stage = "build"
            try:
                launch = build(config)
                if not callable(launch):
                    raise TypeError(f"build returned a {type(launch).__name__}, not a zero-argument launch")
                if check is not None:
                    stage = "check"
                    check(config, launch)
                stage = "time"
                ms = (self.timer or time_launch)(launch, **timing)
                if not isinstance(ms, numbers.Real) or not math.isfinite(ms) or ms < 0:
                    raise ValueError(f"the timer returned {ms!r}, not a number of milliseconds >= 0")
                timings[text] = float(ms)
            except Exception as exc:  # noqa: BLE001 - a config that does not fit is skipped, with its reason
                timings[text] = _reason(stage, exc)
        return timings

    # -- the caches --
    def _cached(self, device, key_text, labels):
        """(best label, timings, source) of a cached winner among ``labels``, or None."""
        if not self.cache:
            return None
        hit = self._memory.get((device, key_text))
        if hit is not None and hit[0] == labels:
            return hit[1], hit[2], "memory"
        stored = self._load(device, key_text)
        if stored is None or stored["configs"] != labels or stored["best"] not in labels:
            return None  # (another set of configs: tuned again, the file replaced)
        self._memory[device, key_text] = (labels, stored["best"], stored["timings"])
        return stored["best"], stored["timings"], "disk"

    def path(self, key, device=None):
        """The cache file of ``key`` on ``device`` ((name, (major, minor)); None: this Tuner's device or the
        current one)."""
        return self._path(device or self.device or _current_device(), label(key, "key"))

    def _path(self, device, key_text):
        from . import __version__

        name, cc = device
        identity = json.dumps([name, list(cc), __version__, key_text])
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        folder = (self.directory or cache_dir()) / f"{_slug(name, 48)}-sm{cc[0]}{cc[1]}"
        return folder / f"{_slug(key_text, 60)}-{digest}.json"

    def _identity(self, device, key_text):
        from . import __version__

        return {"format": FORMAT, "device": device[0], "cc": list(device[1]), "numbatma": __version__,
                "key": key_text}

    def _load(self, device, key_text):
        path = self._path(device, key_text)
        try:
            text = path.read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None  # (never written)
        except OSError as exc:
            return _ignored(path, f"unreadable ({type(exc).__name__}: {exc})")
        try:
            stored = json.loads(text)
        except ValueError as exc:
            return _ignored(path, f"not JSON ({exc})")
        if not isinstance(stored, dict):
            return _ignored(path, f"not a JSON object but a {type(stored).__name__}")
        expected = self._identity(device, key_text)
        for field, value in expected.items():
            if stored.get(field) != value:
                return _ignored(path, f"written for {field} {stored.get(field)!r}, not {value!r}")
        configs, best, timings = stored.get("configs"), stored.get("best"), stored.get("timings")
        if not (isinstance(configs, list) and all(isinstance(c, str) for c in configs) and isinstance(best, str)
                and isinstance(timings, dict)
                and all(isinstance(v, (float, int, str)) and not isinstance(v, bool) for v in timings.values())):
            return _ignored(path, "its configs, best or timings are malformed")
        return stored

    def _save(self, device, key_text, labels, best, timings):
        path = self._path(device, key_text)
        record = dict(self._identity(device, key_text), configs=labels, best=best, timings=timings)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as out:
                    json.dump(record, out, indent=1)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise
        except OSError as exc:
            warnings.warn(f"autotune: could not write the cache file {path} ({type(exc).__name__}: {exc}); the "
                          f"winner is kept in memory only", RuntimeWarning, stacklevel=4)


def _ignored(path, why):
    warnings.warn(f"autotune: ignoring the cache file {path}: {why}; tuning again", RuntimeWarning, stacklevel=5)
    return None


_PROCESS = Tuner()  # (the process's memory cache, what tune() uses)


def tune(key, configs, build, *, check=None, warmup=3, reps=20, flush_l2=True, stream=None, cache=True):
    """The fastest of ``configs`` for the shape class ``key`` on the current device, as a :class:`Tuning`.

    ``key``: anything :func:`label` takes (a tuple of strings and ints, typically with :func:`bucket` sizes).
    ``configs``: a non-empty sequence of distinct configs (dicts, tuples, dataclasses, scalars: :func:`label`); the
    first is the default, taken untimed when tuning is off (``NUMBATMA_AUTOTUNE=0``) or under the simulator.
    ``build(config)``: a zero-argument ``launch`` callable for that config (compiled and ready, its arguments bound);
    an exception means the config does not fit this shape: it is skipped, its reason recorded. ``check(config,
    launch)`` (optional): run before timing, raises to reject a config (e.g. it runs ``launch()`` once and compares the
    output with a reference; it receives the launch so that nothing is built twice). Each remaining config is timed
    with :func:`time_launch` (``warmup``, ``reps``, ``flush_l2``, ``stream``); the fastest wins (ties: the earlier).
    With ``cache`` the winner is reused from memory or disk (module docstring) and nothing is built or timed; a cache
    hit returns the caller's own config object of that label. Raises :class:`AutotuneError` naming the key and each
    config's reason when no config ran; TypeError / ValueError naming the argument for bad arguments."""
    tuner = _PROCESS if cache is True else Tuner(cache=False) if cache is False else None
    if tuner is None:
        raise TypeError(f"autotune: cache must be True or False, got {cache!r}")
    return tuner.tune(key, configs, build, check=check, warmup=warmup, reps=reps, flush_l2=flush_l2, stream=stream)
