"""CPU: the PTX registry. Every Ptx description a family module defines is in its PTX table (so all_ptx() and
docs/ptx.md show it), the package exports exactly the families' __all__, and docs/ptx.md is up to date."""
import os
import subprocess
import sys

import pytest

import numbatma.intrinsics as I
from numbatma.intrinsics._asm import Ptx

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _module_ptx(module):
    """(name, Ptx) for every Ptx a module defines at top level, directly or inside a top-level dict/list/tuple."""
    for name, value in vars(module).items():
        if isinstance(value, Ptx):
            yield name, value
        elif isinstance(value, dict):
            yield from ((f"{name}[{k!r}]", v) for k, v in value.items() if isinstance(v, Ptx))
        elif isinstance(value, (list, tuple)):
            yield from ((f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, Ptx))


@pytest.mark.parametrize("module", I.FAMILIES + (I._debug_family,), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_ptx_of_a_family_is_registered(module):
    registered = {id(p) for p in I.all_ptx().values()}
    missing = [name for name, p in _module_ptx(module) if id(p) not in registered and name != "PTX"]
    assert not missing, f"{module.__name__}: Ptx not in any PTX table (add it to the module's PTX): {missing}"


def test_the_package_exports_exactly_the_families_all():
    names = [n for m in I.FAMILIES for n in m.__all__]
    assert len(names) == len(set(names))
    assert sorted(I.__all__) == sorted(names)
    for module in I.FAMILIES:
        for name in module.__all__:
            assert getattr(I, name) is getattr(module, name)


def test_docs_ptx_md_is_up_to_date():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_ptx_doc.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_help_shows_the_kernel_call_not_the_typer():
    """``inspect.signature`` / ``help()`` of every exported intrinsic: the kernel's arguments, no ``typingctx``;
    ``help(Pipeline)`` lists the methods."""
    import inspect

    for name in I.__all__:
        obj = getattr(I, name)
        try:
            params = list(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            continue  # (not a callable with a signature: constants)
        assert "typingctx" not in params, f"{name}{inspect.signature(obj)}"
    from numbatma.intrinsics.pipeline import METHODS

    for method in METHODS:
        assert f"pipe.{method}(" in I.Pipeline.__doc__, method


def test_simulator_errors_and_kernel_helpers_are_public():
    import numbatma
    from numbatma.intrinsics import _sim
    from numbatma.kernels import persistent_grid, sm_count  # noqa: F401

    assert numbatma.SimulatedHang is _sim.SimulatedHang and numbatma.SimulatedMisuse is _sim.SimulatedMisuse
    assert issubclass(numbatma.SimulatedTypingError, TypeError)


def test_one_definition_of_the_targets():
    from numbatma import compile as nbc
    from numbatma.intrinsics import _asm
    from numbatma.targets import TARGETS, capability_text, compute_capability, target_of

    assert _asm.TARGETS is TARGETS and nbc.ARCHS is TARGETS
    assert [compute_capability(t) for t in TARGETS] == [(9, 0, "a"), (10, 0, "a"), (12, 0, "a")]
    assert target_of((9, 0, "a")) == target_of("compute_90a") == "sm_90a" and target_of("xyz") is None
    assert capability_text("sm_120a") == "12.0"


def test_the_type_modules_do_not_import_the_descriptor_modules():
    """No import circle: numbatma/_types.py and _im2col_type.py take shape arithmetic from the leaf _shapes.py."""
    import ast

    for name in ("_types.py", "_im2col_type.py", "_shapes.py", "targets.py"):
        tree = ast.parse(open(os.path.join(ROOT, "numbatma", name)).read())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
        assert not imported & {"tensormap", "im2col"}, (name, imported)
