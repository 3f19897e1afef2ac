"""GPU tests (marker ``gpu``) of numbatma.autotune: time_launch measures kernel work (a copy's time grows with its
size), the L2 flush buffer is at least twice the device's L2 and the flush is not timed, and tune() picks the faster of two launches of one copy kernel (1 block vs 64
blocks, the output checked) and caches it on disk for the next Tuner."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from numba import cuda  # noqa: E402

from numbatma import autotune  # noqa: E402


@cuda.jit
def copy(dst, src):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, src.size, stride):
        dst[i] = src[i]


def copy_launch(n, blocks=264, threads=256):
    src = cuda.to_device(np.arange(n, dtype=np.float32))
    dst = cuda.device_array(n, dtype=np.float32)
    return (lambda: copy[blocks, threads](dst, src)), src, dst


def test_time_launch_grows_with_the_work():
    small, *_ = copy_launch(1 << 16)
    large, *_ = copy_launch(1 << 26)  # (256 MiB each way: far beyond L2)
    t_small = autotune.time_launch(small, reps=10)
    t_large = autotune.time_launch(large, reps=10)
    assert 0 < t_small < t_large
    assert t_large > 20 * t_small, (t_small, t_large)  # (1024x the bytes; launch overhead bounds the small one)
    # 512 MiB moved at no more than ~4 TB/s (H100/H200 HBM3): at least about 0.13 ms
    assert t_large > 0.1, t_large


def test_the_flush_buffer_is_at_least_twice_the_l2():
    l2 = cuda.get_current_device().L2_CACHE_SIZE
    assert l2 > 0
    assert autotune.flush_l2() >= 2 * l2
    cuda.synchronize()


def test_the_flush_stays_outside_the_timed_interval():
    """A copy of 64 MiB each way (beyond L2, so flushing changes nothing for it; about 0.1 ms on an H100, where the
    flush's 100 MiB memset takes tens of microseconds): flushed and unflushed times agree within 15%; they would not,
    were the memset between the events."""
    launch, *_ = copy_launch(1 << 24)
    hot = autotune.time_launch(launch, reps=20, flush_l2=False)
    cold = autotune.time_launch(launch, reps=20, flush_l2=True)
    assert abs(cold - hot) < 0.15 * hot, (hot, cold)


def test_time_launch_on_a_stream():
    stream = cuda.stream()
    src = cuda.to_device(np.ones(1 << 22, dtype=np.float32))
    dst = cuda.device_array_like(src)
    ms = autotune.time_launch(lambda: copy[264, 256, stream](dst, src), reps=5, stream=stream)
    stream.synchronize()
    assert ms > 0 and dst.copy_to_host().sum() == src.size


def test_tune_picks_the_faster_launch_and_caches_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBATMA_AUTOTUNE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBATMA_AUTOTUNE", raising=False)
    n = 1 << 24
    src = cuda.to_device(np.arange(n, dtype=np.float32))
    dst = cuda.device_array(n, dtype=np.float32)
    configs = [{"blocks": 1}, {"blocks": 64}, {"blocks": 1 << 40}]  # (the last: more blocks than a grid may have)
    built = []

    def build(config):
        if config["blocks"] > 2 ** 31 - 1:
            raise ValueError(f"grid of {config['blocks']} blocks")
        built.append(config)
        return lambda: copy[config["blocks"], 256](dst, src)

    def check(config, launch):
        dst.copy_to_device(np.full(n, np.nan, dtype=np.float32))
        launch()
        np.testing.assert_array_equal(dst.copy_to_host(), src.copy_to_host())

    tuner = autotune.Tuner()
    result = tuner.tune(("copy", "f32", autotune.bucket(n)), configs, build, check=check, reps=5)
    assert result.best is configs[1], str(result)
    assert result.source == "timed" and result.device[1] == cuda.get_current_device().compute_capability
    assert result.timings[autotune.label(configs[0])] > 4 * result.timings[autotune.label(configs[1])], str(result)
    assert result.timings[autotune.label(configs[2])].startswith("build: ValueError: grid of")
    assert tuner.path(("copy", "f32", autotune.bucket(n))).exists()

    again = autotune.Tuner().tune(("copy", "f32", autotune.bucket(n)), configs, build, check=check)
    assert again.source == "disk" and again.best is configs[1] and len(built) == 2  # (nothing built again)
