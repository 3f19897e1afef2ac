"""numbatma.autotune without a GPU: a fake timer (each config's launch returns its made-up milliseconds, the timer
calls it) and a fake device identity drive the search, the skip reasons, the memory and disk caches (a folder of
tmp_path through NUMBATMA_AUTOTUNE_DIR), the environment switch and the argument rules."""
import json
import warnings

import pytest

import numbatma
from numbatma import autotune

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
H200 = ("NVIDIA H200", (9, 0))
KEY = ("attention", "bf16", 128, "causal", autotune.bucket(3000))
CONFIGS = [{"bn": 64, "stages": 2}, {"bn": 128, "stages": 2}, {"bn": 128, "stages": 3}]
MS = {64: 3.0, 128: 2.0}  # (bn -> ms; stages 3 faster still: 2.0 - 0.5)


@pytest.fixture(autouse=True)
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBATMA_AUTOTUNE_DIR", str(tmp_path / "autotune"))
    monkeypatch.delenv("NUMBATMA_AUTOTUNE", raising=False)
    return tmp_path / "autotune"


class Recorder:
    """A fake timer and build: ``build(config)`` returns a launch giving the config's milliseconds; ``timer`` calls
    it; both record what they saw."""

    def __init__(self, times=None, fail=()):
        self.built, self.timed, self.fail = [], [], fail
        self.times = times or (lambda c: MS[c["bn"]] - (0.5 if c["stages"] == 3 else 0.0))

    def build(self, config):
        self.built.append(config)
        if config in self.fail:
            raise ValueError(f"bn={config['bn']} needs 240 KiB of shared memory\nsecond line")
        return lambda: self.times(config)

    def timer(self, launch, **options):
        self.timed.append(options)
        return launch()


def tuner(recorder, device=H100, **kw):
    return autotune.Tuner(timer=recorder.timer, device=device, **kw)


def test_the_fastest_config_wins_and_every_config_is_timed():
    r = Recorder()
    result = tuner(r).tune(KEY, CONFIGS, r.build, warmup=1, reps=5)
    assert result.best is CONFIGS[2] and result.source == "timed" and result.device == H100
    assert result.timings == {"{'bn': 64, 'stages': 2}": 3.0, "{'bn': 128, 'stages': 2}": 2.0,
                              "{'bn': 128, 'stages': 3}": 1.5}
    assert result.time_of(CONFIGS[0]) == 3.0 and result.best_ms == 1.5
    assert r.built == CONFIGS
    assert r.timed == [dict(warmup=1, reps=5, flush_l2=True, stream=None)] * 3
    assert "* {'bn': 128, 'stages': 3}: 1.5000 ms" in str(result)


def test_ties_go_to_the_earlier_config():
    r = Recorder(times=lambda c: 1.0)
    assert tuner(r).tune(KEY, CONFIGS, r.build).best is CONFIGS[0]


def test_a_config_whose_build_or_check_raises_is_skipped_with_its_reason():
    r = Recorder(fail=[CONFIGS[2]])

    def check(config, launch):
        assert callable(launch)
        if config["bn"] == 64:
            raise AssertionError("max error 0.5 > 0.01")

    result = tuner(r).tune(KEY, CONFIGS, r.build, check=check)
    assert result.best is CONFIGS[1]
    assert result.timings["{'bn': 128, 'stages': 3}"] == "build: ValueError: bn=128 needs 240 KiB of shared memory"
    assert result.timings["{'bn': 64, 'stages': 2}"] == "check: AssertionError: max error 0.5 > 0.01"
    assert len(r.timed) == 1  # (only the valid config was timed)
    assert "skipped, check: AssertionError" in str(result)


def test_a_launch_failing_while_timed_or_a_bad_timing_is_a_skip_too():
    r = Recorder()

    def timer(launch, **options):
        ms = launch()
        if ms == 3.0:
            raise RuntimeError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")
        return float("nan") if ms == 1.5 else ms

    result = autotune.Tuner(timer=timer, device=H100).tune(KEY, CONFIGS, r.build)
    assert result.best is CONFIGS[1]
    assert result.timings["{'bn': 64, 'stages': 2}"] == "time: RuntimeError: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
    assert result.timings["{'bn': 128, 'stages': 3}"].startswith("time: ValueError: the timer returned nan")


def test_build_returning_no_callable_is_a_skip_naming_what_it_returned():
    r = Recorder()
    result = tuner(r).tune(KEY, CONFIGS[:2], lambda c: None if c["bn"] == 64 else r.build(c))
    assert result.timings["{'bn': 64, 'stages': 2}"] == \
        "build: TypeError: build returned a NoneType, not a zero-argument launch"


def test_every_config_failing_raises_naming_the_key_and_each_reason():
    r = Recorder(fail=CONFIGS)
    with pytest.raises(autotune.AutotuneError) as info:
        tuner(r).tune(KEY, CONFIGS, r.build)
    text = str(info.value)
    assert "no config of key ('attention', 'bf16', 128, 'causal', 4096)" in text and H100[0] in text
    for config in CONFIGS:
        assert f"{autotune.label(config)}: build: ValueError: bn={config['bn']} needs" in text


def test_the_disk_cache_round_trips_into_a_new_process_without_timing(cache_folder):
    first = Recorder()
    tuner(first).tune(KEY, CONFIGS, first.build)
    files = list(cache_folder.rglob("*.json"))
    assert len(files) == 1 and files[0].parent.name == "NVIDIA-H100-80GB-HBM3-sm90"
    stored = json.loads(files[0].read_text())
    assert stored["best"] == "{'bn': 128, 'stages': 3}" and stored["device"] == H100[0] and stored["cc"] == [9, 0]
    assert stored["key"] == autotune.label(KEY) and stored["numbatma"] == numbatma.__version__
    assert not list(cache_folder.rglob(".tmp-*"))  # (the temporary file was renamed)

    again = Recorder()  # a "new process": a fresh Tuner, no memory
    configs = [dict(c) for c in CONFIGS]  # (the caller's own objects come back)
    result = tuner(again).tune(KEY, configs, again.build)
    assert result.best is configs[2] and result.source == "disk" and result.timings["{'bn': 128, 'stages': 3}"] == 1.5
    assert again.built == [] and again.timed == []
    assert tuner(again).path(KEY) == files[0]


def test_the_memory_cache_answers_a_second_call_and_cache_false_stores_nothing(cache_folder):
    r = Recorder()
    t = tuner(r)
    t.tune(KEY, CONFIGS, r.build)
    for path in cache_folder.rglob("*.json"):
        path.unlink()  # (memory answers, not the disk)
    assert t.tune(KEY, CONFIGS, r.build).source == "memory" and len(r.timed) == 3
    off = Recorder()
    t_off = tuner(off, cache=False)
    t_off.tune(("other",), CONFIGS, off.build)
    t_off.tune(("other",), CONFIGS, off.build)
    assert len(off.timed) == 6 and not list(cache_folder.rglob("*.json"))


def test_other_configs_for_the_same_key_are_tuned_again_and_replace_the_file(cache_folder):
    r = Recorder()
    tuner(r).tune(KEY, CONFIGS[:2], r.build)
    r2 = Recorder()
    result = tuner(r2).tune(KEY, CONFIGS, r2.build)
    assert result.source == "timed" and result.best is CONFIGS[2] and len(r2.timed) == 3
    files = list(cache_folder.rglob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["best"] == "{'bn': 128, 'stages': 3}"


@pytest.mark.parametrize("content, why", [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object but a list"),
    ('{"format": 1}', "written for device None"),
])
def test_a_corrupt_cache_file_is_ignored_with_a_warning(content, why):
    r = Recorder()
    path = tuner(r).path(KEY)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.warns(RuntimeWarning, match=f"autotune: ignoring the cache file .*{why}"):
        result = tuner(r).tune(KEY, CONFIGS, r.build)
    assert result.source == "timed" and result.best is CONFIGS[2]
    assert json.loads(path.read_text())["best"] == "{'bn': 128, 'stages': 3}"  # (rewritten)


def test_a_foreign_or_malformed_file_is_ignored_with_a_warning():
    r = Recorder()
    t = tuner(r)
    t.tune(KEY, CONFIGS, r.build)
    path = t.path(KEY)
    stored = json.loads(path.read_text())
    path.write_text(json.dumps(dict(stored, device="NVIDIA A100")))
    with pytest.warns(RuntimeWarning, match="written for device 'NVIDIA A100', not 'NVIDIA H100 80GB HBM3'"):
        assert tuner(r).tune(KEY, CONFIGS, r.build).source == "timed"
    path.write_text(json.dumps(dict(stored, timings={"x": [1]})))
    with pytest.warns(RuntimeWarning, match="malformed"):
        assert tuner(r).tune(KEY, CONFIGS, r.build).source == "timed"


def test_an_unwritable_cache_folder_warns_and_keeps_the_winner_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NUMBATMA_AUTOTUNE_DIR", str(blocker / "sub"))
    r = Recorder()
    t = tuner(r)
    with pytest.warns(RuntimeWarning, match="could not write the cache file"):
        assert t.tune(KEY, CONFIGS, r.build).best is CONFIGS[2]
    assert t.tune(KEY, CONFIGS, r.build).source == "memory"


def test_devices_and_keys_do_not_collide(cache_folder):
    fast_on_h200 = Recorder(times=lambda c: 1.0 if c["bn"] == 64 else 2.0)
    tuner(fast_on_h200, device=H200).tune(KEY, CONFIGS, fast_on_h200.build)
    r = Recorder()
    on_h100 = tuner(r).tune(KEY, CONFIGS, r.build)
    assert on_h100.source == "timed" and on_h100.best is CONFIGS[2]
    assert tuner(Recorder(), device=H200).tune(KEY, CONFIGS, r.build).best is CONFIGS[0]
    same_name_other_cc = ("NVIDIA H100 80GB HBM3", (10, 0))
    assert tuner(r, device=same_name_other_cc).tune(KEY, CONFIGS, r.build).source == "timed"
    other_key = KEY[:-1] + (autotune.bucket(5000),)
    assert tuner(r).tune(other_key, CONFIGS, r.build).source == "timed"
    assert len(list(cache_folder.rglob("*.json"))) == 4


def test_numbatma_autotune_0_returns_the_first_config_untimed(monkeypatch, cache_folder):
    monkeypatch.setenv("NUMBATMA_AUTOTUNE", "0")
    r = Recorder()
    result = tuner(r).tune(KEY, CONFIGS, r.build)
    assert result.best is CONFIGS[0] and result.source == "disabled" and result.timings == {}
    assert r.built == [] and r.timed == [] and not cache_folder.exists()
    assert autotune.tune(KEY, CONFIGS, r.build).best is CONFIGS[0]  # (the process tuner, no device needed)


def test_the_process_wide_tune_uses_time_launch_and_the_current_device(monkeypatch):
    """tune() without a GPU: asks for the current device (refused here with the way out named) - or, with a fake
    device and timer patched in, times through the module's time_launch."""
    monkeypatch.setattr(autotune, "_current_device", lambda: H100)
    r = Recorder()
    monkeypatch.setattr(autotune, "time_launch", r.timer)
    monkeypatch.setattr(autotune, "_PROCESS", autotune.Tuner())
    assert autotune.tune(KEY, CONFIGS, r.build, reps=7).best is CONFIGS[2] and r.timed[0]["reps"] == 7
    assert autotune.tune(KEY, CONFIGS, r.build).source == "memory"
    assert autotune.tune(KEY, CONFIGS, r.build, cache=False).source == "timed"


def test_configs_of_every_kind_get_stable_labels():
    import dataclasses
    import enum
    from collections import namedtuple

    import numpy as np

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        bn: int
        order: str = "snake"

    class Mode(enum.Enum):
        FAST = 1

    Pair = namedtuple("Pair", "bn stages")
    assert autotune.label(Cfg(np.int64(128))) == "Cfg(bn=128, order='snake')"
    assert autotune.label(Pair(64, 2)) == "Pair(bn=64, stages=2)"
    assert autotune.label((Mode.FAST, np.float32(0.5), np.bool_(True), None, np.dtype("float16"))) == \
        "(Mode.FAST, 0.5, True, None, dtype('float16'))"
    assert autotune.label({"b": 1, "a": (2,)}) == autotune.label({"a": (2,), "b": 1}) == "{'a': (2,), 'b': 1}"
    r = Recorder(times=lambda c: 1.0 if c.bn == 128 else 2.0)
    result = tuner(r).tune("gemm", [Cfg(64), Cfg(128)], lambda c: lambda: r.times(c))
    assert result.best == Cfg(128)


@pytest.mark.parametrize("n, expected", [(1, 1), (2, 2), (3, 4), (1000, 1024), (1024, 1024), (1025, 2048)])
def test_bucket_is_the_next_power_of_two(n, expected):
    assert autotune.bucket(n) == expected


@pytest.mark.parametrize("n", [0, -4, 2.5, "8", True, None])
def test_bucket_refuses_what_is_not_an_int_of_at_least_one(n):
    with pytest.raises(ValueError, match=f"autotune.bucket: n must be an int >= 1, got {n!r}"):
        autotune.bucket(n)


BAD_TUNE = [
    (dict(configs=[]), ValueError, r"autotune: configs must be a non-empty sequence, got \[\]"),
    (dict(configs=()), ValueError, r"autotune: configs must be a non-empty sequence, got \[\]"),
    (dict(configs={"bn": 64}), TypeError, r"configs must be a non-empty sequence \(list or tuple\) of configs, got dict"),
    (dict(configs={1, 2}), TypeError, "configs must be a non-empty sequence .* got set"),
    (dict(configs=iter([1])), TypeError, "configs must be a non-empty sequence .* got list_iterator"),
    (dict(configs=[[64, 2]]), TypeError, r"a config must be a scalar, tuple, dict .* got a builtins.list: \[64, 2\]"),
    (dict(configs=[{"bn": {64}}]), TypeError, r"a config must be .* got \{'bn': \{64\}\}, which holds a builtins.set: \{64\}"),
    (dict(configs=[object()]), TypeError, "a config must be .* got a builtins.object: <object"),
    (dict(configs=[{"bn": 64}, {"bn": 64}]), ValueError, "autotune: configs must be distinct, got {'bn': 64} twice"),
    (dict(key=["attention", 128]), TypeError, r"autotune: a key must be .* got a builtins.list: \['attention', 128\]"),
    (dict(build="not callable"), TypeError, "autotune: build must be a callable .* got str 'not callable'"),
    (dict(check=3), TypeError, r"autotune: check must be None or a callable check\(config, launch\), got int 3"),
    (dict(reps=0), ValueError, "autotune: reps must be an int >= 1, got 0"),
    (dict(warmup=-1), ValueError, "autotune: warmup must be an int >= 0, got -1"),
    (dict(reps=2.0), ValueError, "autotune: reps must be an int >= 1, got 2.0"),
]


@pytest.mark.parametrize("change, error, message", BAD_TUNE, ids=[str(i) for i in range(len(BAD_TUNE))])
def test_bad_arguments_are_refused_naming_the_rule_and_the_value(change, error, message):
    r = Recorder()
    args = dict(key=KEY, configs=CONFIGS, build=r.build, check=None, reps=20, warmup=3)
    args.update(change)
    with pytest.raises(error, match=message):
        tuner(r).tune(args.pop("key"), args.pop("configs"), args.pop("build"), **args)
    assert r.built == []  # (refused before anything was built)


@pytest.mark.parametrize("kwargs, message", [
    (dict(timer=5), "autotune: timer must be callable, got int 5"),
    (dict(device="H100"), r"autotune: device must be \(name, \(major, minor\)\), got 'H100'"),
    (dict(device=("H100", 9)), r"device must be \(name, \(major, minor\)\), got \('H100', 9\)"),
    (dict(cache="yes"), "autotune: cache must be True or False, got 'yes'"),
])
def test_bad_tuner_arguments_are_refused(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        autotune.Tuner(**kwargs)


def test_time_launch_refuses_bad_arguments_before_touching_a_gpu():
    with pytest.raises(TypeError, match="autotune.time_launch: launch must be a zero-argument callable, got int 3"):
        autotune.time_launch(3)
    with pytest.raises(ValueError, match="autotune: reps must be an int >= 1, got 0"):
        autotune.time_launch(lambda: None, reps=0)
    with pytest.raises(TypeError, match="autotune: cache must be True or False, got None"):
        autotune.tune(KEY, CONFIGS, lambda c: None, cache=None)


def test_without_a_gpu_tuning_names_the_way_out(monkeypatch):
    from numba import cuda

    def no_gpu():
        raise cuda.CudaSupportError("no CUDA driver")

    monkeypatch.setattr(cuda, "get_current_device", no_gpu)
    with pytest.raises(autotune.AutotuneError, match="tuning needs a CUDA GPU, none is usable .*NUMBATMA_AUTOTUNE=0"):
        autotune.Tuner(timer=Recorder().timer).tune(KEY, CONFIGS, Recorder().build)


def test_exported_from_the_package():
    assert numbatma.autotune is autotune and "autotune" in numbatma.__all__
    assert set(autotune.__all__) == {"AutotuneError", "Tuner", "Tuning", "bucket", "cache_dir", "flush_l2", "label",
                                     "time_launch", "tune"}


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("NUMBATMA_AUTOTUNE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert autotune.cache_dir() == tmp_path / ".cache" / "numbatma" / "autotune"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert autotune.cache_dir() == tmp_path / "xdg" / "numbatma" / "autotune"
    monkeypatch.setenv("NUMBATMA_AUTOTUNE_DIR", str(tmp_path / "mine"))
    assert autotune.cache_dir() == tmp_path / "mine"


def test_no_warning_on_a_clean_round_trip():
    r = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tuner(r).tune(KEY, CONFIGS, r.build)
        assert tuner(r).tune(KEY, CONFIGS, r.build).source == "disk"
