"""Prepared launches (arguments converted once) and programmatic dependent launches.

A launch through numba-cuda (``kernel[grid, block, stream, smem](*args)``) types every argument, looks up the
compiled overload and marshals each argument again, every time, then has cuda.core build its argument holder and
launch configuration: tens of microseconds of host time, which is longer than a small GEMM runs. A plan that
launches the same kernel with the same arguments again and again (every kernel of :mod:`numbatma.kernels`)
prepares the launch once instead: the arguments marshalled into a kernel parameter block, each run one
``cuLaunchKernel`` (``numbatma/_prepared_launch.py``: ``prepare_launch``, ``KernelParams``).

A *dependent* launch (programmatic dependent launch, compute capability 9.0+: CUDA's launch attribute
programmatic stream serialization) lets a kernel start before the kernel ahead of it on the stream has
finished, so that its prologue overlaps that kernel's tail. The kernel itself must call
``numbatma.intrinsics.griddepcontrol_wait()`` before it touches what the earlier kernel writes; the earlier
kernel may call ``griddepcontrol_launch_dependents()`` to let it start sooner. Two spellings:
``prepare_launch(..., dependent=True)`` and, for any launch, ``with dependent_launch(): ...``
(hook 11 of ``numbatma._numba_internals``, in ``numbatma/_launch_hooks.py``).
"""
from __future__ import annotations

import contextlib

from ._env import SIMULATING
from ._scalars import same_scalar, scalar_key
from .streams import numba_stream
from .views import launch_argument

__all__ = ["dependent_launch", "launch_facts", "prepare_launch", "same_scalar", "scalar_key"]


def prepare_launch(kernel, args, grid, block, shared_mem=0, *, dependent=False, scoped=True):
    """Return ``run(stream=0)``, which launches the ``cuda.jit`` kernel ``kernel`` on ``grid`` x ``block`` with
    ``shared_mem`` bytes of dynamic shared memory and the arguments ``args`` (compiling it now if needed).

    The arguments are converted now: arrays are passed by their current address and shape, descriptors by
    their own encoded bytes (read at every run), scalars by value (a :class:`numbatma.DeviceView` as its numba
    device array). Prepare again when any of them changes (a new array, another scalar) - or, on the GPU path,
    call ``run.update(new_args)``: it patches the arrays replaced by others of the same layout (their address),
    descriptors replaced by others of the same type and scalars of the same type into the parameter block and
    returns True, or returns False (nothing changed) where it cannot; a descriptor re-pointed in place
    (:meth:`numbatma.TensorMap.repoint`) needs neither. Writing new data into the same arrays needs nothing. The
    prepared launch keeps ``args`` alive. It belongs to the device current when it is prepared and always launches
    there (a run made with another device current pushes that device's context for the launch; the stream must be
    one of that device); its TensorMaps must describe that device's memory, or a peer's it was given access to
    (:func:`numbatma.enable_peer_access`). ``run(stream)`` takes a raw ``CUstream`` handle (an int, what
    ``Plan.stream_for`` and :func:`numbatma.streams.stream_handle` return), or any stream ``stream_handle`` takes
    (turned into its handle). Under the CUDA simulator, in debug builds, for host (NumPy) array arguments and
    for an argument the parameter block does not lay out (a complex Python number, a record) it simply launches
    through numba each time (and has no ``update``): the handle becomes what numba's launch takes there, at that one
    edge (:func:`numbatma.streams.numba_stream`).

    ``dependent=True``: every run is a programmatic dependent launch (``cuLaunchKernelEx`` with the programmatic
    stream serialization attribute): the kernel may start before the previous kernel on ``stream``
    has finished, and must call ``griddepcontrol_wait()`` before it reads (or overwrites) what that kernel
    writes. A run made inside :func:`dependent_launch` is dependent too, unless ``scoped=False`` (for a kernel that does
    not call ``griddepcontrol_wait``: it must never launch dependent; every kernel of :mod:`numbatma.kernels` does
    call it, so their plans follow the enclosing :func:`dependent_launch`). When the launch goes through numba (the cases above) on a GPU, the attribute is set by the same
    hook as :func:`dependent_launch`'s. Under the simulator ``dependent`` is accepted and has no effect: the
    simulator runs launches one after another."""
    sources = tuple(args)
    args = tuple(launch_argument(a) for a in sources)
    if not SIMULATING:
        from ._prepared_launch import prepare_launch as prepare

        run = prepare(kernel, args, grid, block, shared_mem, dependent, scoped, sources)
        if run is not None:
            return run

    if SIMULATING or scoped and not dependent:
        def run(stream=0):
            kernel[grid, block, numba_stream(stream), shared_mem](*args)

        return run

    from ._launch_hooks import dependent_launch as scope

    def run(stream=0):  # (dependent: inside hook 11's scope; not scoped: out of any enclosing one)
        with scope(bool(dependent)):
            kernel[grid, block, numba_stream(stream), shared_mem](*args)

    return run


def launch_facts(run):
    """What a prepared launch (what :func:`prepare_launch` returns, or a plan's ``prepared_launch``) does, for tests and
    debugging: a dict with ``"device"`` (the CUDA ordinal it was prepared on and always launches on; None where
    unknown: offline, or a launch that goes through numba each time), ``"switches_context"`` (True where each run
    compares the current context with its own and pushes its own for the launch: a process that sees several
    devices), ``"dynamic_smem"`` (``{device: bytes}``: the dynamic shared memory limit raised for the kernel on each
    device so far; empty where none was raised) and ``"prepared"`` (False for a launch that goes through numba each
    time: the simulator, debug builds, host arrays)."""
    if SIMULATING or not hasattr(run, "slots"):
        return {"device": None, "switches_context": False, "dynamic_smem": {}, "prepared": False}
    from ._prepared_launch import ContextLaunch

    granted = getattr(run.kernel, "_numbatma_dynamic_smem", None) or {}
    return {"device": run.device, "switches_context": isinstance(run, ContextLaunch),
            "dynamic_smem": dict(granted), "prepared": True}


@contextlib.contextmanager
def dependent_launch(enabled=True):
    """``with numbatma.dependent_launch(): kernel[grid, block, stream, smem](*args)``: the kernel launches that
    this thread makes inside the block (plain numba launches, ``with_cluster`` launches, prepared launches) are
    programmatic dependent launches: each may start before the previous kernel on its stream has finished, and
    must call ``numbatma.intrinsics.griddepcontrol_wait()`` before it reads (or overwrites) what that kernel
    writes. Launch dependent only kernels that do so: one that reads its inputs before such a wait may read them
    before the kernel that writes them has finished. ``dependent_launch(False)`` turns it off within an
    enclosing block; blocks nest. The setting belongs to the calling thread (like ``with_cluster``'s).

    Under the simulator it is accepted and has no effect (the simulator runs launches one after another)."""
    from ._launch_hooks import dependent_launch as scope

    with scope(enabled):
        yield
