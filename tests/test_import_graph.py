"""No import circles in the host package: the module-level imports of ``numbatma/*.py`` form a graph without a
cycle (read statically, with ``ast``), and every module imports on its own, as the first import of a fresh
interpreter (GPU path and simulator), so no module depends on another having been imported before it."""
import ast
import graphlib
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


@pytest.mark.parametrize("simulating", ["0", "1"], ids=["gpu", "simulator"])
@pytest.mark.parametrize("module", MODULES + list(SUBPACKAGES))
def test_each_module_imports_first_in_a_fresh_interpreter(module, simulating):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=simulating)
    run = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=NEUTRAL_DIR, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, f"import {module} (NUMBA_ENABLE_CUDASIM={simulating}) failed:\n{run.stderr}"
