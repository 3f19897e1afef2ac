"""The plan contract every kernel of :mod:`numbatma.kernels` follows, and the helper behind the function forms.

A *plan* is built once from the arrays and options (validation, TensorMaps, kernel choice; no GPU needed) and
launched any number of times. Every plan class derives from :class:`Plan` and provides:

* ``kernel``: the ``@cuda.jit`` kernel, or None when there is nothing to launch (an empty array);
* ``grid``: blocks (an int; persistent kernels count the GPU's SMs on first use);
* ``block``: threads per block (an int);
* ``shared_mem``: bytes of dynamic shared memory per block;
* ``args``: the kernel's arguments, valid offline (``numbatma.compile.compile_ptx(plan.kernel.py_func,
  plan.args)``); ``launch_args()`` gives them as a launch passes them (views converted once);
* ``output``: the array the plan writes;
* ``launch(stream=None)``: launch on ``stream`` (asynchronously) and return ``output``.

An output the plan allocates itself (attention's ``lse`` when none is given) is made with
:meth:`Plan.owned_output`; the function form then still caches the plan and gives each call a fresh one
(:meth:`Plan.fresh_outputs`).

Streams: ``launch`` takes a numba, torch, CuPy or cuda.core stream, anything with ``__cuda_stream__``, or a raw
handle. :meth:`Plan.stream_for` turns it, once, into the raw ``CUstream`` handle (an int:
:func:`numbatma.streams.stream_handle`) that the prepared launch hands ``cuLaunchKernel``; nothing converts it again.
With none given, a plan built from torch tensors launches on torch's *current* stream (so it orders with the torch ops
around it), any other on the legacy default stream (0).

Launches are *prepared* (:func:`numbatma.prepare_launch`: the arguments converted once into a kernel parameter block;
a launch is then the stream look-up and the driver's ``cuLaunchKernel``) on first use. A plan notices its changes
through attribute assignment (``Plan.__setattr__``): after one (``plan.a = 3.0``, ``Gemm.alpha``/``beta``,
``Attention.scale``, a new ``kernel``) the next launch compares ``kernel``, ``grid``/``block``/``shared_mem`` and
``args`` with the prepared ones: changed arrays, views, descriptors and scalars of the same types are patched into
the prepared launch (``update``: their addresses and values), anything else prepares again. After a
:meth:`Plan.rebind` (a re-point: only addresses move, the kernel and its geometry stay) the next launch compares
``args`` only. A launch with nothing assigned or re-pointed since does no comparison at all. The arrays and
descriptors are fixed when the plan is built until :meth:`Plan.rebind` re-points them (descriptors in place: a
prepared launch passes each descriptor's own encoded bytes, so it sees that without a patch).

Programmatic dependent launch: every kernel of :mod:`numbatma.kernels` calls ``griddepcontrol_wait`` before it
touches global memory and then ``griddepcontrol_launch_dependents`` (``_device.grid_dependency_sync``), so plans
(and function forms) launched inside ``with numbatma.dependent_launch():`` are dependent launches: each may start
its launch and set-up while the kernel before it on the stream finishes, and waits for it before reading its
results (``benchmarks/pdl_chain.py`` measures a chain of two plans with and without).

Devices: a plan belongs to the device that holds its arrays (:attr:`Plan.device`, from
:func:`numbatma.array_device`; arrays of several devices are refused, unless the current device was given access to
the others' memory with :func:`numbatma.enable_peer_access`: then the plan is the current device's). It is built and
prepared with that device current and its launches run there whatever device is current when they are made (as torch
ops run on their tensors' device): the prepared launch pushes its device's context for a launch made while another
is current (one ``cuCtxGetCurrent`` per launch in a process that sees several devices, none in one that sees one).
With no stream given, a plan of torch tensors launches on torch's current stream *of its device*; a torch or CuPy
stream of another device is refused (:meth:`Plan.stream_for`), a raw handle or numba stream is not checked (the
driver refuses the launch).

The function form of a plan (``stream_copy(src, dst, stream=..., **options)`` etc.) is :func:`run` : look the
plan up in a small LRU cache (:func:`plan_cache_size`, :func:`clear_plan_cache`; see :func:`run` for the key),
use it as it is (the same arrays again), re-point it at the new arrays (:meth:`Plan.reuse`) or build one, launch
it on ``stream``, return its output.

The contract for a cache of plans (what :func:`run` uses, and all a user's own cache needs; a CPU test fails if
``kernels/_plan_cache.py`` touches an underscore attribute of a plan):

* ``PlanClass.rebindable`` (class attribute): whether its plans can be kept and re-pointed at all;
* ``PlanClass(*arrays, **options)``: a new plan (it records the arrays' layout facts as it checks them);
* ``plan.cacheable``: whether this plan may be kept for later calls;
* ``plan.owned_outputs``: the outputs it made itself (:meth:`Plan.owned_output`), fixed once it is built;
* ``plan.reuse(arrays, facts=None, overlap=True)``: make the plan launch on ``arrays`` - nothing for the very
  arrays it points at (but fresh owned outputs), else the argument rules for them (read-only outputs, overlaps) and
  the re-point. Guarantees: a :class:`numbatma.TensorMapError` (the rules refused the arrays) leaves the plan as it
  was, fit for other arrays; a :class:`NotRebindable` (any failure of the re-point) means the plan must be dropped.
  ``facts`` (the arrays' :func:`numbatma.layout_facts` as the caller just read them) and ``overlap`` (the pairs of
  arguments that overlap) are what a cache keyed by layouts, scalars and device knows already: passing them skips the
  reads and :meth:`rebind`'s checks, and the caller then guarantees those checks hold;
* ``plan.fresh_outputs(overlap=True)``: new owned outputs only, for a call with the very arrays the plan points at
  (what a cache that has checked that calls instead of ``reuse``);
* ``plan.launch(stream)``: the launch, returning the output.
"""
from __future__ import annotations

from numbatma import ArrayLayout, TensorMapError, is_readonly, launch_argument, layout_facts, prepare_launch
from numbatma.launch import same_scalar
from numbatma.devices import array_device, common_device, enter_device, leave_device, on_device, several_devices
from numbatma.streams import stream_device, stream_handle, torch_device, torch_stream

from ._launch import byte_extent, elements_overlap
from ._rebind import NotRebindable, _looks_like_array, apply_moves, is_scalar, moves_of, overlapping, rebind_map

__all__ = ["Plan", "NotRebindable", "run", "plan_cache_size", "clear_plan_cache", "plan_cache_info"]

_UNSET = object()
_MOVED = "moved"  # (_stale after a re-point only: the next launch compares args, not kernel and geometry)
# The plan's own bookkeeping (assigning these is not a change of the plan; rebind does not walk them).
_BOOKKEEPING = frozenset({"_user_arrays", "_user_facts", "_owned", "_prepared_launch", "_stale", "_rebind_map",
                          "_torch_device", "_device", "_building", "_arg_names", "_written"})


class _PlanType(type):
    """The class of plan classes: ``SomePlan(*arrays, **options)`` runs ``__init__`` with the plan's device current
    (:attr:`Plan.device`, found by ``__new__``), so that what it asks of the GPU (SM counts, limits, allocations) is
    that device's."""

    def __call__(cls, *arrays, **options):
        plan = cls.__new__(cls, *arrays, **options)
        if isinstance(plan, cls):
            context = enter_device(plan.__dict__.get("_device"))
            try:
                plan.__init__(*arrays, **options)
            finally:
                leave_device(context)
            plan.__dict__["_building"] = False  # (from now on only `settable` attributes may be assigned)
            plan._check_arguments(arrays, options)
        return plan


class Plan(metaclass=_PlanType):
    """Base of the plans of :mod:`numbatma.kernels` (see the module docstring for the contract).

    A subclass sets ``kernel``, ``block``, ``shared_mem`` (attributes or properties) and provides ``grid``,
    ``args`` and ``output``; it overrides :meth:`launch` only when a launch is more than one kernel call
    (and then keeps its return convention). An output the plan allocates itself (returned by ``launch``) is made
    with :meth:`owned_output`, so that the function form can cache the plan and hand each call its own array.

    Changes are seen through assignment: assigning any attribute of a plan (``plan.a = 3.0``, ``self.kernel = ...``)
    makes the next launch look at ``kernel``, ``grid``/``block``/``shared_mem`` and ``args`` again, and makes the
    next :meth:`rebind` walk the plan again. Mutating an object a plan holds (a helper's attribute, a list) is not
    seen: assign the plan attribute instead."""

    kernel = None
    block = 32
    shared_mem = 0
    #: Whether :meth:`rebind` can re-point a plan of this class at other arrays of the same layout (then the
    #: function form caches its plans). A class whose plans depend on the arrays in a way :meth:`rebind` does
    #: not handle sets it False.
    rebindable = True
    #: The names of the arguments the kernel writes (parameter names of ``__init__``). None: the arguments that
    #: are the plan's ``output`` (or one of its items, when ``output`` is a tuple) once it is built.
    writes = None
    #: The pairs ``(written, read)`` of argument names that may be *exactly* the same memory (same address, shape,
    #: byte strides and dtype): an element-wise kernel whose every element is read before the same thread (or the
    #: same CTA's tile store) writes it. Every other overlap of a written argument with another one is refused
    #: (see :meth:`_check_arguments`).
    may_alias = ()
    #: Why a plan of this class cannot run in place (said in the overlap refusal), e.g. "the stencil reads the
    #: neighbours of every element".
    overlap_note = ""
    #: The attributes that may be assigned after the plan is built, ``{name: rule}``: ``rule(plan, value)`` returns
    #: the value to store (checked, converted) or raises; None takes any value. Every other public attribute is
    #: fixed once the plan is built (the kernel was made for it): assigning it raises AttributeError.
    settable = {}
    #: Attributes holding plans this plan launches itself (built from views of its arrays, e.g. the backward's row
    #: kernels; absent where the plan has nothing to compute): a re-point re-makes their views with the plan's (the
    #: walk reaches them) and tells them so, so that their next launch patches the new addresses into their prepared
    #: launches.
    subplans = ()

    @property
    def cacheable(self):
        """Whether :func:`run` may keep this plan for later calls (``rebindable``; a subclass whose plans must not
        be kept in some cases overrides it). Outputs made with :meth:`owned_output` do not prevent caching: a
        cache hit gives the plan fresh ones (:meth:`fresh_outputs`)."""
        return type(self).rebindable

    def __new__(cls, *arrays, **options):
        plan = super().__new__(cls)
        plan.__dict__.update(
            _user_arrays=arrays,  # (what a launch without a stream looks at: torch tensors -> torch's stream)
            _user_facts=None,  # (their layout_facts, None for a scalar: recorded by run() or the first rebind)
            _owned=(),  # ((array, make, facts), ...): the outputs made with owned_output
            _prepared_launch=None,  # (kernel, run, (grid, block, shared_mem), args)
            _stale=True,  # (an attribute was assigned since the launch was prepared)
            _rebind_map=None,  # (rebind's map of the plan: _rebind.rebind_map)
            _torch_device=_UNSET,  # (the device of the first torch tensor argument, or None)
            _building=True,  # (__init__ runs: every attribute may be assigned)
            _arg_names=None,  # (the arguments' parameter names, for the messages of the argument rules)
            _written=frozenset(),  # (the names of the arguments the kernel writes: writes, or found from output)
            _device=common_device(cls.__name__, arrays, TensorMapError))  # (see the property device)
        return plan

    @property
    def device(self):
        """The device (CUDA ordinal) this plan runs on: the one that holds its arrays (with arrays of several devices
        and peer access, the device that was current when it was built); None where no array tells (built offline,
        the simulator). Fixed for the plan's life: :meth:`rebind` refuses arrays of another device."""
        return self._device

    @property
    def prepared_launch(self):
        """The prepared launch of the last :meth:`launch` (:func:`numbatma.prepare_launch`'s run; None before the
        first launch or when there was nothing to launch): what :func:`numbatma.launch.launch_facts` describes."""
        prepared = self._prepared_launch
        return None if prepared is None else prepared[1]

    def __setattr__(self, name, value):
        if name[0] != "_" and not self.__dict__.get("_building", True):
            value = self._settable_value(name, value)
        object.__setattr__(self, name, value)
        if name not in _BOOKKEEPING:
            self.__dict__.update(_stale=True, _rebind_map=None)

    def __delattr__(self, name):
        if name[0] != "_" and not self.__dict__.get("_building", True):
            raise AttributeError(f"{type(self).__name__}: {name} cannot be deleted from a built plan")
        object.__delattr__(self, name)
        self.__dict__.update(_stale=True, _rebind_map=None)

    def _settable_value(self, name, value):
        """``value`` as the rule of :attr:`settable` stores it, or AttributeError for an attribute the built kernel
        cannot follow (naming it, and what to do instead)."""
        cls = type(self)
        rule = cls.settable.get(name, _UNSET)
        if rule is _UNSET:
            allowed = ", ".join(sorted(cls.settable)) or "none"
            old = self.__dict__.get(name, _UNSET)
            was = f" (it was built with {name}={old!r})" if old is not _UNSET and is_scalar(old) else ""
            raise AttributeError(
                f"{cls.__name__}: {name} cannot be assigned after the plan is built{was}: the kernel was made for "
                f"what the plan was built with; build a new plan instead ({cls.__name__}(..., {name}=...) or the "
                f"function form). Attributes a built {cls.__name__} lets you assign: {allowed}.")
        return value if rule is None else rule(self, value)

    def _update(self, **attributes):
        """Assign ``attributes`` as the plan's own code does after it is built (a kernel it switches to, a note),
        past the :attr:`settable` rule, and mark the plan changed (the next launch compares, the next rebind
        walks it again)."""
        for name, value in attributes.items():
            object.__setattr__(self, name, value)
        self.__dict__.update(_stale=True, _rebind_map=None)

    # -- the argument rules: overlap and read-only outputs ------------------------------------------------------
    def _check_arguments(self, arrays, options):
        """The rules every plan's arguments follow, checked once the plan is built (and by :meth:`rebind` and the
        function forms' re-point for new arrays): no argument the kernel writes is read-only, and none shares memory
        with another argument, except an exact alias (same address, shape, byte strides, dtype) the class lists in
        :attr:`may_alias`. Two arguments that are only read may overlap."""
        cls = type(self)
        names = _argument_names(cls)
        facts = _positional_facts(arrays)  # (recorded below: what a later re-point moves the plan from)
        read = {} if facts is None else {k: f for k, f in zip(names, facts) if f is not None}
        named = list(zip(names, arrays)) + [(k, v) for k, v in options.items() if k in names[len(arrays):]]
        named = [(k, v) for k, v in named if not is_scalar(v) and _looks_like_array(v)]
        if cls.writes is not None:
            written = frozenset(cls.writes)
        else:
            out = self.output
            outs = out if isinstance(out, tuple) else (out,)
            written = frozenset(k for k, v in named if any(v is o for o in outs))
        state = self.__dict__
        state["_arg_names"], state["_written"], state["_user_facts"] = names, written, facts
        _check_written(cls.__name__, [(k, v) for k, v in named if k in written])
        _check_overlap(cls.__name__, [(k, read.get(k) or layout_facts(v)) for k, v in named], written, cls.may_alias,
                       cls.overlap_note)

    def _check_new_arrays(self, arrays, facts, overlap=True):
        """:meth:`_check_arguments` for the positional ``arrays`` (``facts``: their layout_facts, None for a scalar)
        a built plan is re-pointed at. ``overlap``: True, or the pairs of arguments that overlap as the caller found
        them (none: no overlap to look at)."""
        names, written = self._arg_names, self._written
        if names is None:
            return
        if written:
            _check_written(type(self).__name__, [(k, a) for k, a in zip(names, arrays) if k in written])
        if overlap:
            named = [(k, f) for k, f in zip(names, facts) if f is not None]
            _check_overlap(type(self).__name__, named, written, type(self).may_alias, type(self).overlap_note)

    @property
    def args(self):
        """The kernel's arguments (descriptors, views and scalars), valid offline."""
        raise NotImplementedError

    @property
    def output(self):
        """The array the plan writes (what :meth:`launch` returns)."""
        raise NotImplementedError

    def owned_output(self, make):
        """An output array this plan allocates itself, ``make()`` (e.g. ``lambda: cuda.device_array(shape,
        dtype)``), and returns from :meth:`launch` - or a work array its launch uses (AttentionBackward's float32
        statistics and accumulator); returns it. The plan remembers ``make``: on a cache hit :func:`run` calls
        :meth:`fresh_outputs`, which makes each such array again, so no two calls of a function form share one (nor,
        for a work array, race on it from two streams)."""
        array = make()
        self.__dict__["_owned"] = self._owned + ((array, make, layout_facts(array)),)
        self.__dict__["_rebind_map"] = None
        return array

    @property
    def owned_outputs(self):
        """The outputs this plan made with :meth:`owned_output` (a tuple; empty for most plans). They are made while
        the plan is built, so whether a plan has any is fixed for its life."""
        return tuple(o[0] for o in self._owned)

    def fresh_outputs(self, overlap=True):
        """Make every output of :meth:`owned_output` again (``make()``) and re-point whatever refers to the old
        one (attributes, descriptors, views: as :meth:`rebind` does); the plan's launch then writes and returns
        the new arrays. Nothing for a plan without such outputs. Raises :class:`NotRebindable` as rebind does.
        ``overlap``: as :meth:`reuse` takes it (the pairs of arguments that overlap, where the caller knows them)."""
        if self._owned:
            self._repoint(self._user_arrays, self._facts(), fresh=True, overlap=overlap)
        return self

    def rebind(self, *arrays):
        """Point this plan at ``arrays``: the arguments it was built from (scalars included, in the same order),
        each array of the same layout (shape, byte strides, dtype) as before; returns the plan.

        Generic: for each input array ``i``, ``delta_i`` = new address - old address. Every
        :class:`numbatma.TensorMap` (and ``Im2colTensorMap``) reachable from the plan (its attributes, lists,
        tuples, dicts and objects of numbatma.kernels' own classes such as ``ExactStore``; not arrays) whose
        address lies inside input ``i``'s memory is re-pointed (``repoint``, no re-encoding) ``delta_i`` bytes
        further; every :class:`numbatma.DeviceView`, :class:`numbatma.ArrayLayout` and (simulator) array view
        inside input ``i`` is re-made ``delta_i`` further; every reference to an old input array becomes the new
        one. The plan is walked once to find these (:mod:`numbatma.kernels._rebind`: a map replayed by later
        rebinds, walked again after an attribute of the plan is assigned). The prepared launch is kept: the next
        launch patches the replaced views and arrays into it (or prepares again where it cannot). Raises
        :class:`NotRebindable` where it cannot (a view it cannot re-make, an address inside two inputs that moved
        differently); the plan is then in an undefined state and must be dropped."""
        facts = self._checked_facts(arrays)
        self._check_new_arrays(arrays, facts)
        return self._repoint(arrays, facts)

    def reuse(self, arrays, *, facts=None, overlap=True):
        """Make this plan launch on ``arrays`` (the arguments it was built from, scalars included, in the same order;
        a tuple), with fresh :meth:`owned_output` outputs: the one call a cache of plans makes on a plan it keeps
        (:func:`run`'s does). Returns the plan.

        * The same arrays as now (the same objects at the same addresses): nothing to do, except that a plan with
          outputs of its own makes them again (:meth:`fresh_outputs`), so each call gets its own.
        * Other arrays (or the same objects moved): the argument rules first (no written array read-only, no overlap
          but the exact aliases the class allows: :meth:`_check_arguments`' rules), then the plan is re-pointed at
          them as :meth:`rebind` does.

        ``facts``: None (``reuse`` reads each array and checks what :meth:`rebind` checks: the same count of
        arguments, each array of the layout the plan was built for, the same scalars, the plan's device), or the
        arguments' :func:`numbatma.layout_facts` (None for a scalar) as the caller read them just now - then the
        caller guarantees what :meth:`rebind` would check (a cache key of the layouts, scalars and device does).
        ``overlap``: True (found here), or the pairs ``(j, i)`` of arguments whose bytes overlap, as the caller
        found them (``()``: none; the key of :func:`run` holds them).

        Raises :class:`numbatma.TensorMapError` for arrays the argument rules refuse; nothing was changed then and the
        plan may be kept for other arrays. Raises :class:`NotRebindable` where the re-point fails (whatever the
        cause: the original exception is its ``__cause__``); the plan is then in an undefined state and must be
        dropped (build a new one)."""
        if type(arrays) is not tuple:
            arrays = tuple(arrays)
        if facts is None:
            facts = self._checked_facts(arrays)
        if self._points_at(arrays, facts):
            if not self._owned:
                return self
        else:  # (the argument rules first: a refusal leaves the plan as it was)
            self._check_new_arrays(arrays, facts, overlap)
        try:
            return self._repoint(arrays, facts, fresh=True, overlap=overlap)
        except NotRebindable:
            raise
        except Exception as exc:  # noqa: BLE001 - a re-point the driver refused, a make() that failed: drop the plan
            raise NotRebindable(f"{type(self).__name__}: re-pointing the plan failed: {exc}") from exc

    def _points_at(self, arrays, facts):
        """Whether the plan points at ``arrays`` now: the same objects, at the same addresses (``facts``; a torch
        tensor can move in place: ``set_``, ``resize_``)."""
        old = self._user_arrays
        if len(arrays) != len(old):
            return False
        old_facts = self._facts()
        for a, b, f, g in zip(arrays, old, facts, old_facts):
            if a is not b or f is not None and f[0] != g[0]:
                return False
        return True

    def _checked_facts(self, arrays):
        """The layout_facts of ``arrays`` (None for a scalar), after :meth:`rebind`'s checks: the count, the device,
        the same scalars, the layouts the plan was built for (NotRebindable otherwise)."""
        old = self._user_arrays
        if len(old) != len(arrays):
            raise NotRebindable(f"{type(self).__name__} was built from {len(old)} arguments, got {len(arrays)}")
        if not type(self).rebindable:
            raise NotRebindable(f"{type(self).__name__} plans cannot be re-pointed")
        device = self._device
        if device is not None:
            new = common_device(type(self).__name__, arrays, NotRebindable)
            if new is not None and new != device:
                raise NotRebindable(f"{type(self).__name__} runs on device {device} (its arrays are there); the new "
                                    f"arrays are on device {new}: build a plan for them")
        facts = []
        for o, fo, n in zip(old, self._facts(), arrays):
            if is_scalar(o) or is_scalar(n):
                if not (is_scalar(o) and is_scalar(n)):
                    raise NotRebindable("an array argument became a scalar (or the reverse)")
                if not same_scalar(o, n):
                    raise NotRebindable(f"the scalar argument {o!r} became {n!r}: a plan keeps the scalars it was "
                                        f"built with (build a plan for the new value)")
                facts.append(None)
                continue
            fn = layout_facts(n)
            if fo[1:] != fn[1:]:
                lo_, ln = ArrayLayout(*fo), ArrayLayout(*fn)
                raise NotRebindable(f"{ln.name} with byte strides {ln.strides} is not the layout the plan was "
                                    f"built for ({lo_.name} with byte strides {lo_.strides})")
            facts.append(fn)
        return tuple(facts)

    def _facts(self):
        """The layout_facts of the arguments (None for a scalar) as the plan last saw them."""
        facts = self._user_facts
        if facts is None:
            facts = self.__dict__["_user_facts"] = tuple(
                None if is_scalar(a) else layout_facts(a) for a in self._user_arrays)
        return facts

    def _repoint(self, arrays, facts, fresh=False, overlap=True):
        """Move the plan to ``arrays`` (``facts``: their layout_facts, each of the layout it was built for) and, with
        ``fresh``, to new owned outputs: the work of :meth:`rebind` and :meth:`fresh_outputs`. ``overlap``: True
        (find which arguments overlap), or the pairs ``(j, i)`` of arguments that overlap, as the caller knows them
        (the cache key says which)."""
        old_args, old_facts, owned = self._user_arrays, self._facts(), self._owned
        new_args, new_facts = arrays, facts
        if owned:  # (the owned outputs: arguments after the caller's)
            if fresh:
                owned = tuple(_remade(output, self._device) for output in owned)
            old_args += tuple([o[0] for o in self._owned])
            old_facts += tuple([o[2] for o in self._owned])
            new_args += tuple([o[0] for o in owned])
            new_facts += tuple([o[2] for o in owned])
        rmap = self._rebind_map
        keep = True  # (overlapping arguments moving apart: a map for this move only)
        if overlap and len(old_facts) > 1:
            pairs = overlapping([None if f is None else byte_extent(f) for f in old_facts]) if overlap is True else \
                overlap
            keep = all(new_facts[i][0] - old_facts[i][0] == new_facts[j][0] - old_facts[j][0] for i, j in pairs)
        if rmap is None or not keep:
            rmap = rebind_map(self, old_args, old_facts, skip=_BOOKKEEPING)
        if keep:
            moved = rmap.replay(self, old_args, new_args, old_facts, new_facts)
        else:  # (a map for this move only: its tree, not compiled)
            moved = apply_moves(rmap, self, moves_of(old_args, new_args, old_facts, new_facts))
        state = self.__dict__
        state.update(_user_arrays=arrays, _user_facts=facts, _owned=owned, _rebind_map=rmap if keep else None)
        if moved:
            if not state["_stale"]:
                state["_stale"] = _MOVED
            state["_torch_device"] = _UNSET
            for name in type(self).subplans:  # (their views were re-made by the walk: their launches patch them in)
                sub = state.get(name)  # (absent from a plan with nothing to compute: it builds none)
                if sub is not None and not sub.__dict__["_stale"]:
                    sub.__dict__["_stale"] = _MOVED
        return self

    def on_device(self):
        """``with plan.on_device():`` - the plan's device current inside (for a launch a plan makes itself, not through
        its prepared launch, e.g. through numba's own launch)."""
        return on_device(self._device)

    def launch_args(self):
        """``args`` as a launch passes them (:func:`numbatma.launch_argument`: views become device arrays once)."""
        return tuple(launch_argument(a) for a in self.args)

    def stream_for(self, stream):
        """The ``CUstream`` handle (an int) a launch on ``stream`` uses (see the module docstring): ``stream``'s
        (:func:`numbatma.streams.stream_handle`, the one conversion: TypeError naming a value that is no stream,
        ValueError for a torch or CuPy stream of another device), or with None the default for this plan's arrays
        (torch's current stream, looked up per launch, for a plan of torch tensors; which tensor is decided once per
        set of arrays). Prepared launches take the handle as it is; a plan that launches through numba's own
        ``kernel[grid, block, stream, smem]`` passes :func:`numbatma.streams.numba_stream` of it."""
        if stream is not None:
            device = self._device
            if device is not None:
                owner = stream_device(stream)
                if owner is not None and owner != device:
                    raise ValueError(
                        f"{type(self).__name__}.launch: the stream belongs to device {owner} but the plan runs on "
                        f"device {device} (its arrays are there); pass a stream of device {device} (e.g. "
                        f"torch.cuda.current_stream({device}), or one made under torch.cuda.device({device})).")
            return stream_handle(stream)
        device = self._torch_device
        if device is _UNSET:
            device = torch_device(self._user_arrays)
            if device is not None and self._device is not None and device.index != self._device:
                device = self._device  # (arrays of several devices, peer access: torch's stream of the plan's device)
            self.__dict__["_torch_device"] = device
        return 0 if device is None else torch_stream(device)

    def launch(self, stream=None):
        """Launch the kernel on ``stream`` (asynchronously, like any kernel launch) and return ``output``.
        Nothing is launched when there is nothing to compute (``kernel`` is None). The launch is prepared on first
        use; after an attribute of the plan was assigned (or a rebind) the next launch compares ``kernel``,
        ``grid``/``block``/``shared_mem`` and ``args`` with what it was prepared with and patches the changed
        arguments in, or prepares again (after a re-point only: compares ``args``)."""
        prepared = self._prepared_launch
        stale = self._stale
        if stale or prepared is None:  # (kernel, geometry and args change only by assignment: see Plan)
            if stale is _MOVED and prepared is not None and self._patched(prepared):
                prepared = self._prepared_launch
            else:
                context = enter_device(self._device)  # (compiled, loaded and prepared on the plan's device)
                try:
                    if stale is _MOVED and prepared is not None:
                        prepared = self._prepare(prepared[0], prepared[2])
                    else:
                        kernel = self.kernel
                        prepared = None if kernel is None else self._prepare(kernel)
                finally:
                    leave_device(context)
        if prepared is not None:
            prepared[1](self.stream_for(stream))
        return self.output

    def _patched(self, prepared):
        """After a re-point (kernel and geometry as prepared): the prepared launch with the moved arguments patched in
        (``update``: no device needed); False where it cannot (then :meth:`_prepare`, on the plan's device)."""
        update = getattr(prepared[1], "update", None)
        if update is None:
            return False
        args = self.args
        if not update(args):
            return False
        state = self.__dict__
        state["_prepared_launch"] = (prepared[0], prepared[1], prepared[2], args)
        state["_stale"] = False
        return True

    def _prepare(self, kernel, geometry=None):
        """The prepared launch of ``kernel`` with the plan's ``args`` and geometry now (``geometry``: known to be the
        prepared one): the one there is (its changed arguments patched in: ``update``, where it has that) or a new
        one."""
        args = self.args
        if geometry is None:
            geometry = (self.grid, self.block, self.shared_mem)
        prepared = self._prepared_launch
        if prepared is not None and prepared[0] is kernel and prepared[2] == geometry:
            update = getattr(prepared[1], "update", None)
            if update(args) if update is not None else _same_arguments(args, prepared[3]):
                prepared = (kernel, prepared[1], geometry, args)
            else:
                prepared = None
        else:
            prepared = None
        if prepared is None:
            prepared = (kernel, prepare_launch(kernel, args, *geometry), geometry, args)
        state = self.__dict__
        state["_prepared_launch"] = prepared
        state["_stale"] = False
        return prepared


_names = {}


def _argument_names(cls):
    """The parameter names of ``cls.__init__`` that may be passed by position (``("src", "dst")``), once per
    class."""
    names = _names.get(cls)
    if names is None:
        import inspect

        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        names = _names[cls] = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    return names


def _positional_facts(arrays):
    """The layout_facts of ``arrays`` (None for a scalar), or None where one cannot be read (then :meth:`Plan._facts`
    reads them when a re-point needs them, and says why it cannot)."""
    try:
        return tuple(None if is_scalar(a) else layout_facts(a) for a in arrays)
    except Exception:  # noqa: BLE001 - (an argument the intake does not read: not re-pointable, said at a rebind)
        return None


def _check_written(op, named):
    """Refuse a read-only array among ``named`` (``(name, array)`` pairs the kernel writes):
    :func:`numbatma.is_readonly` (decided per array class where the class alone answers: torch, numba)."""
    for name, array in named:
        if is_readonly(array):
            raise TensorMapError(
                f"{op}: {name} is read-only (its exporter marks its memory read-only) but the kernel writes it; pass "
                f"a writable array as {name}.")


def _check_overlap(op, named, written, may_alias, note=""):
    """Refuse two arguments of ``named`` (``(name, layout_facts)``) that share a byte of an element
    (:func:`elements_overlap`: strided views whose spans interleave but whose elements are apart are fine) where at
    least one is in ``written``, unless they are the exact alias ``(written, read)`` that ``may_alias`` lists. Empty
    arrays share nothing."""
    spans = []
    for name, facts in named:
        lo, hi = byte_extent(facts)
        if lo < hi:
            spans.append((name, facts, lo, hi))
    for j, (nj, fj, lj, hj) in enumerate(spans):
        for ni, fi, li, hi_ in spans[:j]:
            if not (li < hj and lj < hi_) or (ni not in written and nj not in written):
                continue
            w, r, fw, fr = (nj, ni, fj, fi) if nj in written else (ni, nj, fi, fj)
            exact = fw[0] == fr[0] and fw[1:] == fr[1:]
            if not exact and not elements_overlap(fw, fr):  # (spans interleave, elements apart: column blocks)
                continue
            if exact and ((w, r) in may_alias or (r, w) in may_alias):
                continue
            allowed = ", ".join(f"{a} is {b}" for a, b in may_alias) or "none"
            (lw, hw), (lr, hr) = byte_extent(fw), byte_extent(fr)
            what = "overlaps exactly (same address and layout)" if exact else "overlaps"
            why = f" ({note})" if note else ""
            raise TensorMapError(
                f"{op}: {w} {what} {r} ({w}: bytes [0x{lw:x}, 0x{hw:x}), {r}: [0x{lr:x}, 0x{hr:x})); an array a "
                f"plan writes must not share memory with another argument, except the exact aliases (same address "
                f"and layout) an element-wise kernel allows - for {op}: {allowed}{why}. Use a separate output "
                f"array.")


def _same_arguments(new, old):
    """Whether a prepared launch of ``old`` launches ``new`` as it is: the same objects, scalars of the same value
    (:func:`same_scalar`)."""
    return len(new) == len(old) and all(a is b or is_scalar(a) and same_scalar(b, a) for a, b in zip(new, old))


def _remade(output, device=None):
    """An owned output ``(array, make, facts)`` made again (``make()``: the same layout, another array), on the plan's
    ``device`` (a ``make`` that allocates on the current device runs again with ``device`` current)."""
    array, make, facts = output
    new = make()
    if device is not None and several_devices():
        made = array_device(new)
        if made is not None and made != device:
            context = enter_device(device)
            try:
                new = make()
            finally:
                leave_device(context)
    new_facts = layout_facts(new)
    if new_facts[1:] != facts[1:]:
        raise NotRebindable(f"an owned output was made again with another layout: {ArrayLayout(*new_facts).name}")
    return new, make, new_facts


# (imported last: the cache module uses nothing of this one at import time)
from ._plan_cache import (  # noqa: E402
    DEFAULT_PLAN_CACHE_SIZE, clear_plan_cache, plan_cache_info, plan_cache_size, run)  # noqa: F401
