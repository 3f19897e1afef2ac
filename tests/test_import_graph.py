"""No import circles in the host package: the module-level imports of ``numbatma/*.py`` form a graph without a
cycle (read statically, with ``ast``), and every module imports on its own, as the first import of a fresh
interpreter (GPU path and simulator: a child forked from one that imported only numpy and Numba), so no module
depends on another having been imported before it."""
import ast
import functools
import graphlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Subprocesses run outside the checkout, so that they import the installed numbatma (the GPU suite installs a
# normal, non-editable copy; from the checkout's root, its bare numbatma/ folder would shadow it).
NEUTRAL_DIR = tempfile.gettempdir()
PACKAGE = ROOT / "numbatma"
MODULES = sorted("numbatma" if p.stem == "__init__" else f"numbatma.{p.stem}" for p in PACKAGE.glob("*.py"))
SUBPACKAGES = ("numbatma.intrinsics", "numbatma.kernels")  # (installed from the top-level intrinsics/, kernels/)

# Edges into the package's ``__init__`` that close a circle (``__init__`` imports the module back) and are known:
# each is to take the name from the leaf module that defines it (``SIMULATING``: ``numbatma/_env.py``). A listed
# edge that no longer exists fails the test, so the entry goes when the edge goes.
PENDING = set()  # (edges of a cycle still to remove; empty)


def _path(module):
    return PACKAGE / ("__init__.py" if module == "numbatma" else module.split(".", 1)[1] + ".py")


def _module_level_imports(tree):
    """The import statements executed when the module is imported: not those inside functions."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            else:
                stack.append(child)


def _unit(name):
    """The node an imported dotted name belongs to: a module of the graph, a subpackage, or None (outside)."""
    if name == "numbatma":
        return name
    if not name.startswith("numbatma."):
        return None
    head = ".".join(name.split(".")[:2])
    return head if head in MODULES or head in SUBPACKAGES else None


def _every_import(tree):
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def imports_of(module, deferred=False):
    """The numbatma modules (``"numbatma"``: the package's ``__init__``) and subpackages that ``module`` imports
    at module level (``deferred``: inside functions too)."""
    tree = ast.parse(_path(module).read_text(), filename=str(_path(module)))
    found = set()
    for node in (_every_import if deferred else _module_level_imports)(tree):
        if isinstance(node, ast.Import):
            found |= {_unit(alias.name) for alias in node.names}
            continue
        if node.level:  # (numbatma/*.py are modules of the package numbatma: one dot is the package)
            target = "numbatma" if node.level == 1 else None
            if target and node.module:
                target += "." + node.module
        else:
            target = node.module
        if target == "numbatma":  # from numbatma import x / from . import x: a submodule, or a name of __init__
            found |= {_unit(f"numbatma.{alias.name}") or "numbatma" for alias in node.names}
        elif target:
            found.add(_unit(target))
    found.discard(None)
    found.discard(module)
    return found


def import_graph(deferred=False):
    return {module: imports_of(module, deferred) for module in MODULES}


def test_the_graph_reads_every_module():
    graph = import_graph()
    assert {"numbatma", "numbatma.tensormap", "numbatma._numba_internals", "numbatma.cluster"} <= set(graph)
    assert "numbatma._descriptor_base" in graph["numbatma.tensormap"]
    assert graph["numbatma._shapes"] == graph["numbatma._env"] == graph["numbatma._scalars"] == set()  # the leaves


def test_no_import_cycle_among_the_host_modules():
    graph = import_graph()
    edges = {(a, b) for a, targets in graph.items() for b in targets if b in graph}
    assert PENDING <= edges, f"no longer an edge, remove it from PENDING: {sorted(PENDING - edges)}"
    pruned = {a: {b for b in graph[a] if b in graph and (a, b) not in PENDING} for a in graph}
    try:
        tuple(graphlib.TopologicalSorter(pruned).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("import cycle among numbatma/*.py (module-level imports): " + " -> ".join(exc.args[1]))


def test_no_cycle_even_through_deferred_imports():
    """Imports inside functions too: the submodules still form no circle (the seam, _numba_internals.py, sits
    below the modules that use it). Edges into the package's __init__ are left out here: a function runs after
    the package finished importing."""
    graph = import_graph(deferred=True)
    pruned = {a: {b for b in graph[a] if b in graph and b != "numbatma"} for a in graph if a != "numbatma"}
    try:
        tuple(graphlib.TopologicalSorter(pruned).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("import cycle among numbatma/*.py (imports inside functions included): "
                    + " -> ".join(exc.args[1]))


def test_cluster_and_numba_internals_depend_one_way():
    """cluster.py uses the seam (_numba_internals.py); the seam takes grid arithmetic from the leaf _shapes.py and
    never imports cluster.py, not even inside a function."""
    graph = import_graph()
    assert "numbatma._numba_internals" in graph["numbatma.cluster"]
    source = _path("numbatma._numba_internals").read_text()
    every = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert "cluster" not in every and "numbatma.cluster" not in every


def test_host_modules_do_not_import_the_device_packages_at_module_level():
    """docs/architecture.md: host modules never import intrinsics/ (or kernels/) at module level."""
    graph = import_graph()
    offenders = {m: sorted(t & set(SUBPACKAGES)) for m, t in graph.items() if t & set(SUBPACKAGES)}
    assert not offenders


# One interpreter per mode imports numpy and Numba (not numbatma), then forks a child per module, which imports that
# module first: a fresh interpreter as far as numbatma goes, without paying Numba's import (~0.8 s) 74 times.
FORK_EACH = r"""
import json, os, sys, traceback
import numpy, numba, numba.cuda  # (no numbatma module: each child imports its own first)
results = {}
for module in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            __import__(module)
            os._exit(0)
        except BaseException:
            os.write(w, traceback.format_exc().encode()[-8000:])
            os._exit(1)
    os.close(w)
    with os.fdopen(r) as f:
        error = f.read()
    status = os.waitpid(pid, 0)[1]
    results[module] = error or ("" if status == 0 else f"exit status {status}")
print(json.dumps(results))
"""


@functools.lru_cache(maxsize=None)
def _first_imports(simulating):
    """{module: "" or the traceback of importing it first} for every module, NUMBA_ENABLE_CUDASIM=``simulating``."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=simulating)
    modules = MODULES + list(SUBPACKAGES)
    run = subprocess.run([sys.executable, "-c", FORK_EACH, *modules], cwd=NEUTRAL_DIR, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("simulating", ["0", "1"], ids=["gpu", "simulator"])
@pytest.mark.parametrize("module", MODULES + list(SUBPACKAGES))
def test_each_module_imports_first_in_a_fresh_interpreter(module, simulating):
    error = _first_imports(simulating)[module]
    assert not error, f"import {module} (NUMBA_ENABLE_CUDASIM={simulating}) failed:\n{error}"


def test_a_module_that_fails_to_import_first_is_reported():
    """The forking check itself: a module whose import raises gives its traceback (no test that cannot fail)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-c", FORK_EACH, "json", "numbatma_no_such_module"], cwd=NEUTRAL_DIR,
                         env=env, capture_output=True, text=True, timeout=300)
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert results["json"] == "" and "ModuleNotFoundError" in results["numbatma_no_such_module"]


# -- the three packages: host (numbatma/), device (intrinsics/ = numbatma.intrinsics), kernels (kernels/) -------------
PACKAGE_DIRS = {"numbatma": PACKAGE, "numbatma.intrinsics": ROOT / "intrinsics", "numbatma.kernels": ROOT / "kernels"}
HOST, DEVICE, KERNELS = "numbatma", "numbatma.intrinsics", "numbatma.kernels"
MAX_LINES = 850  # (issue 23: one idea a module; the seam modules stay under ~800)
# Modules over MAX_LINES still to split (issue 23), each failing the test once it fits, so the entry goes with it.
PENDING_SIZE = set()  # (wgmma.py, _descriptor_base.py and _sim.py: split already)


def _all_modules():
    """{dotted name: path} of every module of the three packages (``numbatma.intrinsics``: its ``__init__``)."""
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


ALL = _all_modules()


def _package_of(module):
    return module if ALL[module].stem == "__init__" else module.rsplit(".", 1)[0]


def _owner(name):
    """The module of ``ALL`` that the dotted ``name`` imports (a module, else its package), or None (outside)."""
    while name and name not in ALL:
        name = name.rpartition(".")[0]
    return name or None


def imports_of_any(module, deferred=False):
    """The modules of the three packages ``module`` imports: at module level, or anywhere (``deferred``)."""
    tree = ast.parse(ALL[module].read_text(), filename=str(ALL[module]))
    found = set()
    for node in (_every_import if deferred else _module_level_imports)(tree):
        if isinstance(node, ast.Import):
            found |= {_owner(alias.name) for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            parts = _package_of(module).split(".")
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        for alias in node.names:  # (from p import x: the submodule p.x where there is one, else p itself)
            found.add(_owner(f"{base}.{alias.name}") if f"{base}.{alias.name}" in ALL else _owner(base))
    found.discard(None)
    found.discard(module)
    return found


def test_the_three_packages_are_read():
    assert {"numbatma._numba_internals", "numbatma.intrinsics", "numbatma.intrinsics._define",
            "numbatma.kernels", "numbatma.kernels._plan"} <= set(ALL)
    assert "numbatma.intrinsics._define" in imports_of_any("numbatma.intrinsics")
    assert "numbatma._registry" in imports_of_any("numbatma.intrinsics")  # (the device registers with the host)


def test_no_import_cycle_among_the_three_packages():
    """Module-level imports of numbatma/, intrinsics/ and kernels/ together form no circle. Edges from a submodule
    into its own package's ``__init__`` are left out: the package's ``__init__`` has finished the names a
    submodule takes from it (``from numbatma import SIMULATING``) before it imports that submodule, or takes
    them from a leaf; every other edge counts."""
    graph = {m: {t for t in imports_of_any(m) if not (t == _package_of(m) and t != m and m != _package_of(m))}
             for m in ALL}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail("import cycle among numbatma/, intrinsics/, kernels/ (module-level): " + " -> ".join(exc.args[1]))


def test_host_never_imports_the_device_or_kernels_packages_anywhere():
    """docs/architecture.md: host -> device is one way. No module of numbatma/ imports numbatma.intrinsics or
    numbatma.kernels, at module level or inside a function (every import statement, read with ``ast``); the device
    package registers what the host needs (numbatma/_registry.py)."""
    offenders = {}
    for module in ALL:
        if module != HOST and not module.startswith(HOST + ".") or module.startswith((DEVICE, KERNELS)):
            continue
        bad = sorted(t for t in imports_of_any(module, deferred=True) if t.startswith((DEVICE, KERNELS)))
        text = ALL[module].read_text()  # (nor by name: importlib.import_module("numbatma.intrinsics..."))
        if "import_module(\"numbatma.intrinsics" in text or "import_module(\"numbatma.kernels" in text:
            bad.append("importlib")
        if bad:
            offenders[module] = bad
    assert offenders == {}


def test_the_device_package_imports_no_kernel():
    offenders = {m: sorted(t for t in imports_of_any(m, deferred=True) if t.startswith(KERNELS))
                 for m in ALL if m.startswith(DEVICE)}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_kernels_reach_host_and_device_through_public_names_only():
    """kernels/ imports no underscore name of numbatma/ or intrinsics/ (the absolute imports and attributes:
    tests/test_kernel_plans_cpu.py's ``_private_numbatma_imports``, reused); and its relative imports stay in
    kernels/ (``from .. import`` would reach the host's privates by another spelling)."""
    from test_kernel_plans_cpu import _private_numbatma_imports

    for module, path in ALL.items():
        if not module.startswith(KERNELS):
            continue
        assert _private_numbatma_imports(path) == [], module
        tree = ast.parse(path.read_text())
        assert [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 1] == [], module


def test_the_detector_sees_a_host_import_of_the_device(tmp_path, monkeypatch):
    """The scan reads imports inside functions, relative spellings included (a planted offender is found)."""
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from .intrinsics import _sim\n    return _sim\n")
    monkeypatch.setitem(ALL, "numbatma.planted", planted)
    assert imports_of_any("numbatma.planted") == set()  # (not at module level)
    assert imports_of_any("numbatma.planted", deferred=True) == {"numbatma.intrinsics._sim"}


def test_no_module_over_the_size_limit():
    """Every module of the three packages has at most MAX_LINES lines, but those PENDING_SIZE lists (issue 23: being
    split); a listed module that fits fails the test, so the entry goes."""
    sizes = {m: len(p.read_text().splitlines()) for m, p in ALL.items()}
    over = {m for m, n in sizes.items() if n > MAX_LINES}
    assert over - PENDING_SIZE == set(), {m: sizes[m] for m in over - PENDING_SIZE}
    fits = {m for m in PENDING_SIZE if m in sizes and sizes[m] <= MAX_LINES} | (PENDING_SIZE - set(sizes))
    assert fits == set(), f"fits now (or is gone), remove it from PENDING_SIZE: {sorted(fits)}"
