"""CPU: the PTX registry. Every Ptx description a family module defines is in its PTX table (so all_ptx() and
docs/ptx.md show it), the package exports exactly the families' __all__, and docs/ptx.md is up to date."""
import os
import re
import subprocess
import sys
import tempfile

import pytest

import numbatma.intrinsics as I
from numbatma.intrinsics._asm import Ptx

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# Subprocesses run outside the checkout, so that they import the installed numbatma (the GPU suite installs a
# normal, non-editable copy; from the checkout's root, its bare numbatma/ folder would shadow it).
NEUTRAL_DIR = tempfile.gettempdir()


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


# -- the PTX sections of the intrinsics' docstrings -----------------------------------------------------------
def _table_texts(name, table):
    """The collapsed texts of the table entries of intrinsic ``name`` (keyed ``name`` or ``name(...)``)."""
    return {" ".join(p.text.split()) for k, p in table.items() if k == name or k.startswith(name + "(")}


def test_every_intrinsic_with_table_entries_shows_one_in_its_docstring():
    import inspect

    from numbatma.intrinsics._define import PTX_SECTION

    table = I.all_ptx()
    with_entries = [n for n in I.__all__ if _table_texts(n, table)]
    assert len(with_entries) > 80
    for name in with_entries:
        doc = inspect.getdoc(getattr(I, name))
        assert doc.count(PTX_SECTION) == 1, name
        shown = doc.split(PTX_SECTION)[1].split("``")[1]
        assert shown in _table_texts(name, table), (name, shown)
    for name in ("shared_view", "wgmma_row_col", "swizzle_offset"):  # (no PTX: pure arithmetic)
        assert PTX_SECTION not in (inspect.getdoc(getattr(I, name)) or ""), name
    assert "tma_load(rank=2); 4 more variants" in I.tma_load.__doc__


def test_the_ptx_sections_are_added_once():
    """Adding the sections again (a second import of the package runs it again) changes no docstring."""
    from numbatma.intrinsics._define import add_ptx_sections

    objects = {n: getattr(I, n) for n in I.__all__}
    before = {n: o.__doc__ for n, o in objects.items()}
    documented, refused = add_ptx_sections(objects, I.all_ptx())
    assert documented and not refused
    assert {n: o.__doc__ for n, o in objects.items()} == before
    code = ("import sys, numbatma.intrinsics as I; from numbatma.intrinsics._define import PTX_SECTION; "
            "del sys.modules['numbatma.intrinsics']; import numbatma.intrinsics as J; assert J is not I; "
            "print(J.tma_load.__doc__.count(PTX_SECTION), J.Pipeline.__doc__.count(PTX_SECTION))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=NEUTRAL_DIR)
    assert out.returncode == 0 and out.stdout.split() == ["1", "1"], out.stdout + out.stderr


def test_the_simulator_names_show_the_ptx_section():
    code = ("import inspect, numbatma.intrinsics as I; from numbatma.intrinsics._define import PTX_SECTION; "
            "assert inspect.isfunction(I.tma_load); "
            "print(sum(PTX_SECTION in (inspect.getdoc(getattr(I, n)) or '') for n in I.__all__), "
            "inspect.getdoc(I.tma_load).count(PTX_SECTION))")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=NEUTRAL_DIR, env=env, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    count, once = map(int, out.stdout.split())
    table = I.all_ptx()
    assert count >= len([n for n in I.__all__ if _table_texts(n, table)]) and once == 1


# The rule of the check below: in a family module, the paragraph that starts at the word "Emits" (up to the next
# blank line or docstring end) names no instruction by its complete PTX mnemonic. A ``...`` span whose first word
# (letters, digits, _ . :, with the placeholders <x> = any, {a,b} = optional a or b, [x] = optional x, ... = any,
# joined across a line break before a dot) spells in full the mnemonic of an instruction of the table (the first
# word of each ;-separated statement of its text) is a hand-spelled copy of what the generated PTX section shows;
# the prose names the family (``cp.async.bulk.tensor``, ``mbarrier.init``) or the intrinsic instead.
_EMITS = re.compile(r"\b[Ee]mits\b(.*?)(?:\n[ \t]*\n|\"\"\"|$)", re.S)
_SPAN = re.compile(r"``(.+?)``", re.S)
_WORD = re.compile(r"[A-Za-z](?:[\w.:]|<[^<>`]*>|\{[^{}`]*\}|\[[^\[\]`]*\])*")


def _table_mnemonics():
    mnemonics = set()
    for ptx in I.all_ptx().values():
        for statement in " ".join(ptx.text.split()).split(";"):
            statement = re.sub(r"^[{}\s]*(?:[A-Z_][A-Z0-9_]*:\s*)?(?:@!?\w+\s+)?", "", statement)
            word = statement.split(" ", 1)[0]
            if "." in word and not word.startswith("."):
                mnemonics.add(word)
    return mnemonics


def _spelling_pattern(word):
    def part(m):
        piece = m.group(0)
        if piece == "...":
            return r"[\w.:]*"
        if piece.startswith("<"):
            return r"[\w.:]+"
        if piece.startswith("{"):
            return "(?:" + "|".join(re.escape(a.strip()) for a in piece[1:-1].split(",")) + ")?"
        if piece.startswith("["):
            return "(?:" + re.escape(piece[1:-1]) + ")?"
        return re.escape(piece)

    return re.compile(re.sub(r"\.\.\.|<[^<>]*>|\{[^{}]*\}|\[[^\[\]]*\]|[^<{\[.]+|\.", part, word))


def _hand_spelled(source, mnemonics):
    found = []
    for paragraph in _EMITS.findall(source):
        for span in _SPAN.findall(paragraph):
            word = _WORD.match(re.sub(r"\s+(?=\.)", "", span.strip()))
            if word and "." in word.group(0):
                pattern = _spelling_pattern(word.group(0))
                if any(pattern.fullmatch(m) for m in mnemonics):
                    found.append(word.group(0))
    return found


def test_the_emits_sentences_spell_no_ptx_of_the_table():
    mnemonics = _table_mnemonics()
    assert {"cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes", "bar.sync",
            "mbarrier.init.shared::cta.b64", "cvt.rn.bf16x2.f32"} <= mnemonics
    sample = ('"""Emits ``cp.async.bulk.tensor.<r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes\n'
              '    [dst], ...`` and ``st.async.shared::cluster.mbarrier::complete_tx::bytes{.v2,.v4}.{b32,b64}``."""'
              '\n"""Emits the ``cp.async.bulk.tensor`` tile load (``mbarrier.init``, ``tma_load``)."""')
    assert _hand_spelled(sample, mnemonics) == [
        "cp.async.bulk.tensor.<r>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        "st.async.shared::cluster.mbarrier::complete_tx::bytes{.v2,.v4}.{b32,b64}"]
    offenders = {}
    for module in I.FAMILIES + (I._debug_family,):
        found = _hand_spelled(open(module.__file__).read(), mnemonics)
        if found:
            offenders[os.path.basename(module.__file__)] = found
    assert not offenders, f"hand-spelled PTX in an 'Emits' sentence (the generated PTX section shows it): {offenders}"
