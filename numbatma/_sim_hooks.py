"""Numba's CUDA simulator made to behave as numbatma's GPU build (hook 7): its patches, and what it reads of it.

A seam module (numba-cuda private names of ``numba.cuda.simulator``: ``FakeCUDAShared``, ``BlockThread``,
``BlockManager``, ``FakeCUDAKernel``, ``_manager`` / ``_block_dim`` / ``_grid_dim``, ``FakeCUDAArray``; and the
bytecode frontend ``numba.cuda.core.interpreter``). Hook 7 is described in ``numbatma/_numba_internals.py``'s docstring;
``numbatma/__init__.py`` runs :func:`install_simulator` under ``NUMBA_ENABLE_CUDASIM=1``; the upstream names are
checked by ``tests/test_numba_internals.py`` (:func:`_simulator_hook_points`, :func:`_simulator_jit_points`).

The simulator *engine* (``intrinsics/_sim.py``: race-checked ``SharedArray`` views, knowledge passed through
barriers, thread lifetime, warp exchange) is the device package's: it registers it when imported
(``numbatma/_registry.py``), and the hooks here look it up at each use, never import it. Before it is registered (a
kernel that uses no numbatma operation), shared arrays are plain arrays placed as the GPU places them, block
barriers pass nothing on, and ``cuda.syncwarp`` / ``cuda.shfl_*_sync`` refuse, naming the fix.
"""
from __future__ import annotations

import threading
import types as _pytypes

import numpy as np

from . import _registry
from ._lowering_sites import _describe_var, _user_name
from ._patching import patch as _patch
from .errors import INDEX_RULE, SHAPE_RULE  # (the rules both the typers and the simulator state)


class _PlainShared(np.ndarray):
    """A simulated shared array while no engine is registered: a NumPy view that takes numbatma's attributes
    (its declaration site and alignment)."""


def _shared_view(array):
    """``array`` as the kernel sees shared memory: the engine's checked ``SharedArray`` view once the device package
    registered the engine, else a plain view."""
    engine = _registry.simulator()
    return array.view(_PlainShared if engine is None else engine.SharedArray)


def _engine(op):
    """The registered simulator engine, for ``op`` (a warp operation numbatma adds to the simulator); raises where
    the device package was never imported."""
    engine = _registry.simulator()
    if engine is None:
        raise RuntimeError(
            f"{op}: numbatma's simulator implements it with its engine, which numbatma.intrinsics registers when "
            f"imported, and it was not imported in this process; import numbatma.intrinsics (or a numbatma.kernels "
            f"module) before the launch")
    return engine


# -- hook 7: the simulator (shared arrays, block barriers, warp operations, device limits) ---------------
_sim_lock = threading.Lock()


def _simulator_hook_points():
    """The upstream simulator objects install_simulator patches or relies on (tests check they exist)."""
    from numba.cuda.simulator import kernel, kernelapi
    from numba.cuda.simulator.cudadrv import devices

    return {
        "FakeCUDAShared.array": (kernelapi.FakeCUDAShared, "array"),
        "FakeCUDAModule.syncthreads": (kernelapi.FakeCUDAModule, "syncthreads"),
        "BlockThread.syncthreads": (kernel.BlockThread, "syncthreads"),
        "BlockThread.run": (kernel.BlockThread, "run"),
        "BlockManager.run": (kernel.BlockManager, "run"),
        "FakeCUDADevice": (devices, "FakeCUDADevice"),
        "FakeCUDAArray": (_sim_devicearray(), "FakeCUDAArray"),
    }


def _sim_devicearray():
    from numba.cuda.simulator.cudadrv import devicearray

    return devicearray


def simulated_device_array(view):
    """A simulated device array over the NumPy array ``view`` itself (no copy; strided views allowed), as
    ``numbatma.kernel_view`` hands kernels under the simulator (a plain NumPy argument would be copied,
    and refused when not contiguous)."""
    return _sim_devicearray().FakeCUDAArray(view)


def install_simulator():
    """Under NUMBA_ENABLE_CUDASIM=1: ``cuda.shared.array(..., alignment=...)`` as on the GPU. The replacement
    keeps upstream's rules (dynamic arrays share one buffer; static ones are keyed by the calling source
    line) and takes a lock around the allocation, which upstream does not."""
    import sys
    import traceback

    import numpy as np
    from numba.cuda import types
    from numba.cuda.np import numpy_support
    from numba.cuda.simulator import kernelapi

    shared_cls = kernelapi.FakeCUDAShared
    if getattr(shared_cls.array, "_numbatma", False):
        return

    def array(self, shape, dtype, alignment=None):
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        dtype = np.dtype(dtype)
        if shape == 0:
            count = self._dynshared_size // dtype.itemsize
            with _sim_lock:
                placed = self.__dict__.get("_numbatma_dynshared")
                if placed is None:  # one buffer for every dynamic array, placed on a multiple of 1024 bytes
                    placed = self._numbatma_dynshared = _placed_buffer(self._dynshared_size, 1024)
            raw, offset = placed
            return _shared_view(np.frombuffer(raw, dtype=dtype, count=count, offset=offset))
        check_constant_operand(sys._getframe(1), "shape")
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[-1][0:2])
        with _sim_lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = _shared_view(_placed_zeros(shape, dtype, alignment))
                res._numbatma_site = caller  # (named in the simulator's messages)
                res._numbatma_alignment = alignment
        return res

    def _placed_zeros(shape, dtype, alignment):
        """Zeros placed as the GPU may place them: on a multiple of ``alignment`` (default: the element size)
        and never on a multiple of twice that, so a tile declared with less alignment than TMA needs is
        misaligned in every run (not only when the allocator happens to misplace it)."""
        nbytes = int(np.prod(shape)) * dtype.itemsize
        raw, offset = _placed_buffer(nbytes, max(int(alignment or dtype.itemsize), 1))
        return np.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset).reshape(shape)

    def _placed_buffer(nbytes, align):
        """(zeroed buffer, offset): the bytes at the offset start on an odd multiple of ``align``. A bytearray,
        so that the array over it is a root (code that measures offsets from the allocation's start walks
        ``.base`` up to the first array)."""
        raw = bytearray(nbytes + 2 * align)
        address = np.frombuffer(raw, np.uint8).__array_interface__["data"][0]
        return raw, (align - address) % (2 * align)

    array._numbatma = True
    shared_cls.array = array

    # Block barriers pass on what each thread knows complete (the simulator engine's hazard checks).
    from numba.cuda.simulator import kernel as sim_kernel

    thread_cls = sim_kernel.BlockThread

    def _notify(thread):
        """Wake the block manager (it sleeps until a thread of its block waits at a barrier, ends or fails)."""
        changed = getattr(thread._manager, "_numbatma_changed", None)
        if changed is not None:
            changed.set()

    def block_sync(self):
        """Upstream's ``BlockThread.syncthreads`` (the abort checks, ``syncthreads_blocked``, the thread's event),
        plus a wake-up of the block manager, which no longer polls."""
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        self.syncthreads_blocked = True
        _notify(self)
        self.syncthreads_event.wait()
        self.syncthreads_event.clear()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def syncthreads(self):
        engine = _registry.simulator()
        if engine is None:
            return block_sync(self)
        engine.publish_knowledge(self)
        block_sync(self)
        engine.absorb_knowledge(self)

    thread_cls.syncthreads = syncthreads

    # Thread lifetime: the hang check waits until every thread of the block has started; a thread that
    # returns with a store still in flight is reported (the engine's thread_exit).
    original_run = thread_cls.run

    def run(self):
        engine = _registry.simulator()
        try:
            if engine is not None:
                engine.thread_started(self)
        except Exception:  # noqa: BLE001 - (no simulated block: leave it to upstream)
            pass
        original_run(self)
        if self.exception is None and not self.abort and engine is not None:
            try:
                engine.thread_exit(self)
            except Exception as e:  # noqa: BLE001 - reported like upstream reports a kernel's exception
                self.exception = (type(e)(f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}: {e}"),
                                  sys.exc_info()[2])
        if self.exception is None:  # (the manager counts the thread as ended from here: is_alive() lags behind)
            self._numbatma_done = True
        _notify(self)
        if self.exception is not None:
            # Stay alive until the block manager has seen this exception: it looks only at live threads, so a
            # failing thread that ended at once would let the others run on and report a consequence instead.
            import time

            deadline = time.monotonic() + 10.0
            while not self.abort and time.monotonic() < deadline:
                time.sleep(0.0005)

    thread_cls.run = run

    # The block manager. Upstream's polls its threads in a loop that never blocks, so it holds the GIL but
    # for the interpreter's switch interval (5 ms): every simulated thread woken from a lock, a barrier or a
    # warp exchange then waits up to 5 ms to run, and a block whose threads wait on one another (shuffles,
    # mbarriers) can crawl - minutes instead of seconds under CPU load (seen in CI). This one has upstream's
    # contract (one BlockThread per thread of the block; release syncthreads once every live thread waits
    # there; on a thread's exception, abort the others and raise it) and sleeps until a thread of the block
    # waits at a barrier, ends or fails (each sets the manager's event; a timeout of 20 ms as a safety net).
    # (Polling every 0.2 ms instead - 384 is_alive() calls each time - took half of the CPU time of a simulated
    # attention block.)
    import time as _time

    manager_cls = sim_kernel.BlockManager

    def _abort_all(threads, manager=None):
        """Abort every thread of the block and let them end before the failing thread's exception leaves the
        launch (upstream raises at once and leaves them running): a thread of the failed launch still inside the
        kernel afterwards calls its device functions with no kernel context, and Numba's simulator then swaps
        those functions' module global ``cuda`` to ``None`` - under the threads of the *next* launch, which fail
        with "'NoneType' object has no attribute 'shared'" (seen once in CI, in a planted-bug test that launches
        a failing kernel five times). A thread ends at its next wait or barrier (both test ``abort``); the join
        gives up after 10 s (a thread in a loop with neither)."""
        for t in threads:
            t.abort = True
            t.syncthreads_blocked = False
            t.syncthreads_event.set()
        engine = _registry.simulator()
        if engine is not None and manager is not None:
            engine.wake_block(manager)  # (threads waiting on a barrier or a warp exchange: at once, not at a timeout)
        deadline = _time.monotonic() + 10.0
        for t in threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - _time.monotonic()))

    def manager_run(self, grid_point, *args):
        def target():
            self._f(*args)

        changed = self._numbatma_changed = threading.Event()
        threads = []
        for block_point in np.ndindex(*self._block_dim):
            t = thread_cls(target, self, grid_point, block_point, self._debug)
            t._numbatma_done = False
            t.start()
            threads.append(t)
        live = threads
        while live:
            changed.wait(0.02)
            changed.clear()  # (before the scan: a thread that changes after it sets the event again)
            blocked = 0
            running = []
            for t in live:
                if t.exception:  # (a failing thread is never marked done: it stays in `live` until seen here)
                    _abort_all(threads, self)
                    raise t.exception[0].with_traceback(t.exception[1])
                if not t._numbatma_done:
                    running.append(t)
                    blocked += t.syncthreads_blocked
            live = running
            if live and blocked == len(live):  # every live thread waits in syncthreads: release them together
                for t in live:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
        for t in threads:
            t.join()
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    manager_run._numbatma = True
    manager_cls.run = manager_run

    # A simulated device that answers what persistent kernels ask: 2 SMs (so a persistent grid gives each
    # block several tiles), Hopper's shared-memory opt-in limit.
    from numba.cuda.simulator.cudadrv import devices as sim_devices

    sim_devices.FakeCUDADevice.MULTIPROCESSOR_COUNT = 2
    sim_devices.FakeCUDADevice.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 232448

    # cuda.libdevice functions kernels use, as NumPy (float32 in, float32 out).
    import types as pytypes

    module_cls = kernelapi.FakeCUDAModule
    if not hasattr(module_cls, "libdevice"):
        module_cls.libdevice = pytypes.SimpleNamespace(
            rintf=lambda x: np.float32(np.rint(x)), rint=np.rint, expf=lambda x: np.float32(np.exp(x)),
            exp=np.exp, fabsf=lambda x: np.float32(abs(x)), fabs=np.fabs, floorf=lambda x: np.float32(np.floor(x)),
        )

    # Warp-synchronous operations the simulator lacks (its threads are independent): syncwarp and the
    # shuffles, implemented by numbatma's simulator runtime as an exchange among the lanes of a warp.
    module_cls = kernelapi.FakeCUDAModule
    module_cls.syncwarp = staticmethod(lambda mask=0xFFFFFFFF: _engine("cuda.syncwarp").syncwarp(mask))
    module_cls.shfl_sync = staticmethod(lambda mask, value, src: _engine("cuda.shfl_sync").shfl(mask, value, src))
    module_cls.shfl_xor_sync = staticmethod(
        lambda mask, value, lane_mask: _engine("cuda.shfl_xor_sync").shfl_xor(mask, value, lane_mask))
    module_cls.shfl_down_sync = staticmethod(
        lambda mask, value, delta: _engine("cuda.shfl_down_sync").shfl_down(mask, value, delta))
    module_cls.shfl_up_sync = staticmethod(
        lambda mask, value, delta: _engine("cuda.shfl_up_sync").shfl_up(mask, value, delta))

    install_simulator_launches()
    _registry.on_accumulator_class(_install_accumulator_index_check)  # (when the device package registers it)


# -- hook 7 (cont.): what the GPU's cuda.jit and typer decide, decided the same way in the simulator -------
# cuda.jit options of the GPU path (numba.cuda.decorators.jit's own parameters and the keywords it hands to
# numba.cuda.dispatcher._Kernel): the simulator accepts every one (compile-only ones are ignored) and, like the
# GPU path, refuses any other name. tests/test_numba_internals.py checks the list against numba-cuda.
GPU_JIT_OPTIONS = frozenset({
    "device", "inline", "forceinline", "link", "debug", "opt", "lineinfo", "cache", "launch_bounds", "lto",
    "shared_memory_carveout", "fastmath", "extensions", "max_registers", "boundscheck",
})
_sim_launch_lock = threading.RLock()


def _simulated_jit(original):
    """The simulator's ``cuda.jit`` taking the GPU's options: ``max_registers``, ``lineinfo``, ``opt``, ``lto``,
    ``link``, ``cache``, ``launch_bounds``, ... are accepted and ignored (they change code generation, not what
    a kernel computes); ``fastmath``, ``debug`` and ``extensions`` go to the simulated kernel; a
    ``launch_bounds`` carrying a cluster shape (``numbatma.cluster_launch_bounds``) gives the kernel that
    shape, as ``numbatma.cluster_kernel`` does (a launch of a multi-CTA cluster shape is refused by
    :func:`_configured_copy`, in cluster.py's words); any other keyword is refused as the GPU's ``cuda.jit``
    refuses it."""

    def jit(func_or_sig=None, **options):
        unknown = sorted(set(options) - GPU_JIT_OPTIONS)
        if unknown:
            raise TypeError(f"cuda.jit: unknown option {unknown[0]!r} (the GPU's cuda.jit takes "
                            f"{', '.join(sorted(GPU_JIT_OPTIONS))})")
        if options.get("boundscheck"):
            raise NotImplementedError("bounds checking is not supported for CUDA")
        kept = {k: options[k] for k in ("device", "debug", "fastmath") if k in options}
        extensions = list(options.get("extensions") or ())
        bounds = options.get("launch_bounds")

        def finish(kernel):
            if extensions:
                kernel.extensions = list(extensions)
            dims = getattr(bounds, "cluster_dims", None)
            if dims is not None and not kept.get("device"):  # (what numbatma.cluster_kernel records there)
                kernel._numbatma_cluster_dims = tuple(dims)
            return kernel

        if func_or_sig is None or isinstance(func_or_sig, (str, list, tuple)) or not callable(func_or_sig):
            wrapper = original(func_or_sig, **kept) if func_or_sig is not None else None

            def decorate(fn):
                return finish(wrapper(fn) if wrapper is not None else original(fn, **kept))

            return decorate
        return finish(original(func_or_sig, **kept))

    jit._numbatma = True
    jit._numbatma_original = original
    return jit


def _serialised_launch(original):
    """``FakeCUDAKernel.__call__``: a launch from a host thread runs whole under one process-wide lock (the
    simulator keeps one kernel context per process and swaps each module's ``cuda`` global for the launch's
    simulated module, so two launches at once would see each other's blocks). A call from a simulated thread
    (a device function, or a kernel called as one) runs as before."""
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator import kernelapi

    sticky = []  # the module globals this launch swapped for good (ids), restored when it ends

    def keep_swapped(fn):
        """Upstream swaps a device function's module ``cuda`` global for the simulated module on every call and back
        after it (a scan of the module's globals each time: 7% of a simulated attention launch); here the first call
        of a launch swaps it (upstream's own bookkeeping: its lock, reference count and saved originals) and leaves it
        swapped until the launch ends."""
        gid = id(fn.__globals__)
        if kernelapi._swap_refcount.get(gid, 0) > 0:
            return
        with kernelapi._locks_register_lock:
            lock = kernelapi._globals_locks[gid]
        with lock:
            if kernelapi._swap_refcount[gid] == 0:
                from numba import cuda

                orig = {k: v for k, v in fn.__globals__.items() if v is cuda}
                kernelapi._swap_orig[gid] = orig
                for k in orig:
                    fn.__globals__[k] = sim_kernel._get_kernel_context()
                kernelapi._swap_refcount[gid] += 1
                sticky.append((gid, fn.__globals__))

    def release_swapped():
        while sticky:
            gid, globs = sticky.pop()
            with kernelapi._globals_locks[gid]:
                kernelapi._swap_refcount[gid] -= 1
                if kernelapi._swap_refcount[gid] == 0:
                    globs.update(kernelapi._swap_orig.pop(gid))
                    del kernelapi._swap_refcount[gid]

    def __call__(self, *args):
        if self._device or isinstance(threading.current_thread(), sim_kernel.BlockThread):
            if self._device and sim_kernel._get_kernel_context() is not None:
                keep_swapped(self.fn)
                return self.fn(*args)
            return original(self, *args)
        with _sim_launch_lock:
            try:
                return original(self, *args)
            finally:
                release_swapped()

    __call__._numbatma = True
    return __call__


def _configured_copy(original):
    """``FakeCUDAKernel.__getitem__``: ``kernel[grid, block, ...]`` configures a copy, as the GPU's
    dispatcher does (upstream's simulator configures the kernel itself, so two threads launching one kernel
    with different grids would launch with each other's)."""
    import copy

    def __getitem__(self, configuration):
        dims = self.__dict__.get("_numbatma_cluster_dims")
        if dims is not None and dims[0] * dims[1] * dims[2] > 1:  # (cuda.jit(launch_bounds=cluster_launch_bounds))
            raise NotImplementedError(
                f"clusters of {dims} CTAs cannot run in Numba's CUDA simulator: it runs the blocks of a grid one "
                f"after another, so the CTAs of a cluster (which run together and share their shared memory) "
                f"cannot be simulated. Run this launch on a GPU (compute capability 9.0+), or use clusters of "
                f"shape (1, 1, 1) in the simulator.")
        return original(copy.copy(self), configuration)

    __getitem__._numbatma = True
    return __getitem__


def install_simulator_launches():
    """Hook 7's launch and decorator parts (see :func:`_simulator_jit_points`)."""
    from numba.cuda.simulator import kernel as sim_kernel

    _patch(sim_kernel.FakeCUDAKernel, "__call__", _serialised_launch)
    _patch(sim_kernel.FakeCUDAKernel, "__getitem__", _configured_copy)
    import numba.cuda as cuda_module
    from numba.cuda import simulator
    from numba.cuda.simulator import api

    original = api.jit
    if getattr(original, "_numbatma", False):
        return
    replacement = _simulated_jit(original)
    for module in (api, simulator, cuda_module):
        if getattr(module, "jit", None) is original:
            module.jit = replacement


def _simulator_jit_points():
    """The upstream objects :func:`install_simulator_launches` replaces (tests check they exist)."""
    from numba.cuda.simulator import api
    from numba.cuda.simulator import kernel as sim_kernel

    return {
        "simulator.api.jit": (api, "jit"),
        "FakeCUDAKernel.__call__": (sim_kernel.FakeCUDAKernel, "__call__"),
        "FakeCUDAKernel.__getitem__": (sim_kernel.FakeCUDAKernel, "__getitem__"),
        "kernel._push_kernel_context": (sim_kernel, "_push_kernel_context"),
    }


# Compile-time constants. Numba types cuda.shared.array's shape and a wgmma accumulator's index from the
# kernel's IR: a value is a compile-time constant when its variable has one definition that is a constant, a
# global or a closure variable (or another such variable; for a shape, a tuple of those) - anything else
# (an argument, arithmetic, a loop variable, two definitions from a branch) is typed as a run-time integer,
# which the GPU build refuses. The simulator runs the kernel's Python code, so it builds the same IR (numba-cuda's
# bytecode frontend, once per function) and applies the same rule to the statement being run.
_ir_cache = {}
_ir_cache_lock = threading.Lock()


def _frame_ir(frame):
    """Numba IR of the function ``frame`` runs (None when the frontend cannot build it: then nothing is
    checked)."""
    code = frame.f_code
    try:
        return _ir_cache[code]
    except KeyError:
        pass
    func_ir = None
    try:
        from numba.cuda.core import bytecode, interpreter, postproc

        cells = tuple(_pytypes.CellType(frame.f_locals.get(name)) for name in code.co_freevars)
        func = _pytypes.FunctionType(code, frame.f_globals, code.co_name, None, cells or None)
        func_id = bytecode.FunctionIdentity.from_function(func)
        func_ir = interpreter.Interpreter(func_id).interpret(bytecode.ByteCode(func_id=func_id))
        postproc.PostProcessor(func_ir).run(False)
    except Exception:  # noqa: BLE001 - code numba cannot read: the GPU build reports it; no check here
        func_ir = None
    with _ir_cache_lock:
        _ir_cache[code] = func_ir
    return func_ir


def _is_constant(func_ir, value, tuples):
    """Whether IR ``value`` (a variable) is a compile-time constant by numba's typing rule (above)."""
    from numba.cuda.core import ir as nir

    for _ in range(64):
        if isinstance(value, nir.Var):
            defs = func_ir._definitions.get(value.name, ())
            if len(defs) != 1:
                return False
            value = defs[0]
            continue
        if isinstance(value, (nir.Const, nir.Global, nir.FreeVar)):
            return True
        if tuples and isinstance(value, nir.Expr) and value.op == "build_tuple":
            return all(_is_constant(func_ir, item, False) for item in value.items)
        return False
    return False


def _statements(func_ir, line):
    from numba.cuda.core import ir as nir

    for block in func_ir.blocks.values():
        for stmt in block.body:
            if isinstance(stmt, nir.Assign) and isinstance(stmt.value, nir.Expr) and stmt.loc.line == line:
                yield stmt.value


def _shared_array_shapes(func_ir, line):
    """The shape operands of the ``cuda.shared.array`` calls on ``line``."""
    from numba.cuda.core import ir as nir

    for expr in _statements(func_ir, line):
        if expr.op != "call":
            continue
        callee = func_ir._definitions.get(expr.func.name, ())
        if len(callee) != 1 or not (isinstance(callee[0], nir.Expr) and callee[0].op == "getattr"
                                    and callee[0].attr == "array"):
            continue
        owner = func_ir._definitions.get(callee[0].value.name, ())
        if len(owner) != 1 or not (getattr(owner[0], "attr", None) == "shared"
                                   or getattr(owner[0], "name", None) == "shared"):
            continue
        if expr.args:
            yield expr.args[0]
        else:
            yield from (v for k, v in expr.kws if k == "shape")


def _runtime_indices(func_ir, line):
    """[(name of x, index variable)] for the ``x[i]`` reads on ``line`` whose index is not a compile-time
    constant."""
    return [(expr.value.name.split(".")[0], expr.index) for expr in _statements(func_ir, line)
            if expr.op == "getitem" and not _is_constant(func_ir, expr.index, False)]


def _sim_refusal(frame, reason):
    """A :class:`numbatma.errors.SimulatedTypingError` (also a TypeError) starting with the kernel's file:line and
    quoting it - the same class whether or not the kernel uses a numbatma operation."""
    from .errors import SimulatedTypingError

    filename, line = frame.f_code.co_filename, frame.f_lineno
    import linecache

    source = linecache.getline(filename, line).strip()
    return SimulatedTypingError(f"{filename}:{line}: {reason}" + (f"\n    {line} | {source}" if source else ""))


def check_constant_operand(frame, what, owner=None):
    """Under the simulator: refuse, as the GPU build does while typing, the statement ``frame`` runs when an
    operand that must be a compile-time constant is not one - ``what="shape"``: the shape of a
    ``cuda.shared.array`` call; ``what="index"``: an index into ``owner`` (a wgmma accumulator). Raises
    ``SimulatedTypingError`` starting with the kernel's file:line. Frames of numbatma's own code are not
    checked. The IR is read once per line (cached); a later call costs a dictionary lookup."""
    if frame is None:
        return
    key = (frame.f_code, frame.f_lineno, what)
    found = _ir_cache.get(key)
    if found is None:
        found = _line_verdict(frame, what)
        with _ir_cache_lock:
            _ir_cache[key] = found
    if not found:
        return
    if what == "shape":
        raise _sim_refusal(frame, found)
    local = frame.f_locals  # (an index: only when the indexed variable is this accumulator)
    for name, index in found:
        if local.get(name) is owner:
            raise _sim_refusal(frame, f"accumulator[i]: {INDEX_RULE}; got the run-time index '{index}'")


def _line_verdict(frame, what):
    """For ``what="shape"``: the refusal of the line's computed shared-array shape, or ''; for ``"index"``:
    [(variable, index as spelled)] of the line's reads with a run-time index."""
    from . import errors

    func_ir = None if errors.is_internal(frame.f_code.co_filename) else _frame_ir(frame)
    if what == "index":
        return [] if func_ir is None else [(name, _describe_var(func_ir, index) or _user_name(index.name))
                                           for name, index in _runtime_indices(func_ir, frame.f_lineno)]
    if func_ir is not None:
        for shape in _shared_array_shapes(func_ir, frame.f_lineno):
            if not _is_constant(func_ir, shape, True):
                return f"cuda.shared.array: {SHAPE_RULE}; got '{_describe_var(func_ir, shape) or _user_name(shape.name)}'"
    return ""


def _install_accumulator_index_check(cls):
    """The simulator's accumulator class ``cls`` (``SimAccumulator``, registered by the device package:
    ``_registry.register_accumulator_class``): its ``__getitem__`` refuses a run-time index as the GPU's typer does
    (:func:`check_constant_operand`)."""
    import sys

    original = cls.__getitem__
    if getattr(original, "_numbatma_index_checked", False):
        return

    def __getitem__(self, i):
        check_constant_operand(sys._getframe(1), "index", self)
        return original(self, i)

    __getitem__._numbatma_index_checked = True
    cls.__getitem__ = __getitem__


# -- the simulator's block of a thread (accessors) --------------------------------------------------------
def simulated_block(thread):
    """The simulator's manager of the block ``thread`` (a simulated thread) belongs to: the same object for
    every thread of one block, None for a thread that is not a simulated one (``BlockThread._manager``)."""
    return getattr(thread, "_manager", None)


def simulated_block_dim(manager):
    """The block shape of a simulated block (:func:`simulated_block`): ``BlockManager._block_dim``."""
    return manager._block_dim


def simulated_grid_dim(manager):
    """The grid shape of the launch a simulated block belongs to: ``BlockManager._grid_dim``."""
    return manager._grid_dim
