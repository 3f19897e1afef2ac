"""What the device package (``numbatma.intrinsics``) hands the host when it is imported: the host never imports it.

Layers are one way: ``intrinsics/`` imports the host, the host imports nothing of ``intrinsics/``. The few things the
host's hooks need from the device side are registered here by ``intrinsics/__init__.py`` at its import:

* :func:`register_target_checker` - ``check(ir_text, arch)``: raises ``UnsupportedTarget`` where a module holds a
  restricted instruction (a ``numbatma:`` marker) the target lacks; hook 5 (``_numba_internals.py``) calls it. No
  checker is needed before the device package is imported: only its instructions carry the marker.
* :func:`register_simulator` - a loader (no arguments) of the simulator *engine* (``intrinsics/_sim.py``), called on
  first use so the GPU path never loads the engine; hook 7 (``_sim_hooks.py``) reads it through :func:`simulator`.
  Before the device package is imported, simulated shared arrays are plain NumPy arrays (no instruction that could
  race exists yet) and the warp operations numbatma adds to the simulator refuse, naming the fix.
* :func:`register_accumulator_class` - the simulator's wgmma accumulator class; each callback given to
  :func:`on_accumulator_class` (hook 7's index check) is applied to it, whichever of the two comes first.
* :func:`register_source_dir` - a folder of numbatma's own device sources (:func:`source_dirs`: where a typing
  error's frame is not the user's line, ``errors.is_internal``).

A leaf: imports nothing of numbatma.
"""
from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_target_checker = None
_simulator_loader = None
_engine = None
_accumulator_classes = []
_accumulator_callbacks = []
_source_dirs = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)  # (the host package's own folder)


def _callable(what, fn):
    if not callable(fn):
        raise TypeError(f"numbatma._registry.{what}: takes a callable, got {fn!r}")


def register_target_checker(check):
    """Register ``check(ir_text, arch)``, which raises where ``ir_text`` holds an instruction ``arch`` lacks."""
    global _target_checker
    _callable("register_target_checker", check)
    _target_checker = check


def target_checker():
    """The registered target checker, or None (the device package is not imported: no module carries a marker)."""
    return _target_checker


def register_simulator(loader):
    """Register ``loader()``, which returns the simulator engine (imported on first use)."""
    global _simulator_loader, _engine
    _callable("register_simulator", loader)
    with _lock:
        _simulator_loader, _engine = loader, None


def simulator():
    """The simulator engine, loaded on the first call; None while the device package is not imported."""
    engine = _engine
    if engine is not None or _simulator_loader is None:
        return engine
    return _load_engine()


def _load_engine():
    global _engine
    loaded = _simulator_loader()
    with _lock:
        _engine = loaded
    return loaded


def register_accumulator_class(cls):
    """Register the simulator's accumulator class and apply every :func:`on_accumulator_class` callback to it."""
    if not isinstance(cls, type):
        raise TypeError(f"numbatma._registry.register_accumulator_class: takes a class, got {cls!r}")
    with _lock:
        if cls in _accumulator_classes:
            return
        _accumulator_classes.append(cls)
        callbacks = list(_accumulator_callbacks)
    for callback in callbacks:
        callback(cls)


def on_accumulator_class(callback):
    """Call ``callback(cls)`` for each accumulator class registered, now and later."""
    _callable("on_accumulator_class", callback)
    with _lock:
        if callback in _accumulator_callbacks:
            return
        _accumulator_callbacks.append(callback)
        classes = list(_accumulator_classes)
    for cls in classes:
        callback(cls)


def register_source_dir(path):
    """Register a folder of numbatma's own device sources (``path``: a directory)."""
    global _source_dirs
    if not isinstance(path, str) or not os.path.isdir(path):
        raise TypeError(f"numbatma._registry.register_source_dir: takes an existing directory, got {path!r}")
    entry = os.path.abspath(path) + os.sep
    with _lock:
        if entry not in _source_dirs:
            _source_dirs = _source_dirs + (entry,)


def source_dirs():
    """The folders of numbatma's own sources: the host package's, then each registered device folder."""
    return _source_dirs
