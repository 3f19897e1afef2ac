"""CPU test of the simulator's layering (docs/simulator.md, "Engine and families"): the engine
``intrinsics/_sim.py`` is reached by the other modules of ``intrinsics/`` only through its documented API - no
underscore name of ``_sim`` (through ``_define.sim()``, an alias of it, or an import), and only names its module
docstring lists -, and no family module imports (or reads) an underscore name of another family module.
Checked on the source (AST), so it needs neither a GPU nor the simulator."""
import ast
import os
import re

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
INTRINSICS = os.path.join(os.path.dirname(HERE), "intrinsics")
ENGINE = "_sim"
MODULES = sorted(f[:-3] for f in os.listdir(INTRINSICS) if f.endswith(".py"))
# Family modules: one per PTX family (intrinsics/__init__.py's FAMILIES); the underscore modules are the shared
# machinery (_asm, _define, _debug) and the engine.
FAMILIES = [m for m in MODULES if not m.startswith("_")]


def _source(module):
    with open(os.path.join(INTRINSICS, module + ".py"), encoding="utf-8") as f:
        return f.read()


def _private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imported_module(node, package="numbatma.intrinsics"):
    """The intrinsics module an ImportFrom names (``._sim``, ``numbatma.intrinsics.tma``), or None; for
    ``from . import x`` the empty string (the names are modules)."""
    if node.level == 1:
        return node.module or ""
    if node.level == 0 and node.module and node.module.startswith(package + "."):
        return node.module[len(package) + 1:]
    if node.level == 0 and node.module == package:
        return ""
    return None


def _uses(tree, targets):
    """(line, module, name) for every name of a module in ``targets`` that ``tree`` takes: imported by name,
    or read as an attribute of the module imported under an alias, of ``sim()`` (the engine), or of a variable
    assigned ``sim()``."""
    found = []
    aliases = {}  # local name -> module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = _imported_module(node)
            if module is None:
                continue
            for alias in node.names:
                if module == "":  # from . import x [as y]: x is a module
                    if alias.name in targets:
                        aliases[alias.asname or alias.name] = alias.name
                elif module in targets:
                    found.append((node.lineno, module, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["numbatma", "intrinsics"] and len(parts) == 3 and parts[2] in targets and alias.asname:
                    aliases[alias.asname] = parts[2]
        elif isinstance(node, ast.Assign) and ENGINE in targets and _is_sim_call(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    aliases[target.id] = ENGINE
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in aliases:
            found.append((node.lineno, aliases[value.id], node.attr))
        elif ENGINE in targets and _is_sim_call(value):
            found.append((node.lineno, ENGINE, node.attr))
    return found


def _is_sim_call(node):
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sim" and not node.args


def _engine_api():
    """(API, calls): the names of the engine its module docstring lists as its API (``name`` or ``name(...)``)
    and defines at module level; the names the list writes as calls (``name(...)``)."""
    tree = ast.parse(_source(ENGINE))
    doc = ast.get_docstring(tree)
    api = doc[doc.index("The engine API"):]
    api = api[api.index("\n\n") + 2:]  # (the bulleted list after the sentence that introduces it)
    api = api[:api.index("\n\n")]
    mentioned = set(re.findall(r"``([A-Za-z]\w*)(?:\(|``)", api))  # (also operands and record attributes)
    calls = set(re.findall(r"``([A-Za-z]\w*)\(", api))
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return mentioned & defined, calls


def test_the_engine_api_is_documented_and_defined():
    names, calls = _engine_api()
    assert {"lock", "block_local", "wait_until", "notify", "knowledge", "add_fill", "reduce_elements",
            "SimulatedMisuse", "SimulatedHang", "SimulatedTypingError"} <= names
    assert calls - names == set(), "listed as calls in _sim.py's docstring but not defined there"
    assert not any(_private(n) for n in names)


@pytest.mark.parametrize("module", [m for m in MODULES if m != ENGINE])
def test_modules_use_only_the_engine_api(module):
    names, _ = _engine_api()
    uses = [u for u in _uses(ast.parse(_source(module)), {ENGINE}) if u[1] == ENGINE]
    private = [f"{module}.py:{line}: _sim.{name}" for line, _, name in uses if _private(name)]
    assert private == [], "underscore names of the engine"
    undocumented = [f"{module}.py:{line}: _sim.{name}" for line, _, name in uses if name not in names]
    assert undocumented == [], "names of the engine its docstring does not list as API (or that do not exist)"


def test_the_engine_imports_no_family():
    uses = _uses(ast.parse(_source(ENGINE)), set(FAMILIES))
    imports = [n for n in ast.walk(ast.parse(_source(ENGINE))) if isinstance(n, ast.ImportFrom) and n.level]
    assert uses == [] and imports == []


@pytest.mark.parametrize("module", FAMILIES)
def test_families_take_no_underscore_name_of_another_family(module):
    others = set(FAMILIES) - {module}
    private = [f"{module}.py:{line}: {other}.{name}" for line, other, name in _uses(ast.parse(_source(module)), others)
               if _private(name)]
    assert private == []


def test_the_checks_see_violations():
    tree = ast.parse("from ._define import sim\nfrom .tma import _box_index, tma_load\nfrom . import bulk as b\n"
                     "from numbatma.intrinsics import mbarrier\n"
                     "def f():\n    s = sim()\n    s._lock\n    sim()._add_fill\n    b._raw\n    mbarrier._barriers\n"
                     "    sim().lock\n")
    uses = sorted((m, n) for _, m, n in _uses(tree, {ENGINE, "tma", "bulk", "mbarrier"}))
    assert uses == [("_sim", "_add_fill"), ("_sim", "_lock"), ("_sim", "lock"), ("bulk", "_raw"),
                    ("mbarrier", "_barriers"), ("tma", "_box_index"), ("tma", "tma_load")]
