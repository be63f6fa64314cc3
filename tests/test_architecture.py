"""The package's shape: folders that are the pipeline's stages, imports that only
go down the pipeline (no cycles), one module for torchgen, one for the
dispatcher, argparse only in the CLI, and no torch import to start the CLI."""

from __future__ import annotations

import ast
import graphlib
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

PKG = os.path.join(ROOT, "torchgen_patch")
# Each stage may import only the stages before it.
ORDER = ["errors", "files", "version", "vocabulary", "cache", "sources", "scan", "plan", "codegen", "pipeline", "saved",
         "runtime", "diagnostics", "checks", "upstream", "cli", "(top)", "__main__"]


def _modules() -> dict[str, str]:
    out = {}
    for base, dirs, names in os.walk(PKG):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in names:
            if n.endswith(".py"):
                rel = os.path.relpath(os.path.join(base, n), ROOT)[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = os.path.join(base, n)
    return out


def _imports(mods: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside functions."""
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    base = node.module or ""
                else:
                    parts = m.split(".")
                    if not path.endswith("__init__.py"):
                        parts = parts[:-1]
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    if target in mods and target != m:
                        edges[m].add(target)
            elif isinstance(node, ast.Import):
                edges[m] |= {a.name for a in node.names if a.name in mods and a.name != m}
    return edges


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(top)"


def test_the_folders_are_the_stages():
    stages = {_stage(m) for m in _modules()}
    assert stages == set(ORDER)
    for d in ("sources", "scan", "plan", "codegen", "saved", "runtime", "checks", "diagnostics", "upstream", "cli"):
        assert os.path.isfile(os.path.join(PKG, d, "__init__.py")), d


def test_no_import_cycles_and_imports_only_go_down_the_pipeline():
    mods = _modules()
    edges = _imports(mods)
    order = list(graphlib.TopologicalSorter(edges).static_order())  # raises CycleError on a cycle
    assert set(order) == set(mods)
    upward = sorted(f"{m} -> {d}" for m, ds in edges.items() for d in ds
                    if ORDER.index(_stage(d)) > ORDER.index(_stage(m)))
    assert upward == []


def test_every_module_imports_in_a_fresh_interpreter_in_dependency_order():
    order = list(graphlib.TopologicalSorter(_imports(_modules())).static_order())
    code = "import importlib\nfor m in %r:\n    importlib.import_module(m)\n" % [m for m in order if m != "torchgen_patch.__main__"]
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr


def test_starting_the_cli_imports_neither_torch_nor_torchgen():
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torchgen_patch.cli, torchgen_patch.cli.parser"],
                       cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "torchgen_patch.cli" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "torchgen")}


def _sources_matching(pattern: str) -> set[str]:
    rx = re.compile(pattern, re.M)
    return {os.path.relpath(p, PKG) for p in _modules().values() if rx.search(open(p, encoding="utf-8").read())}


def test_one_module_talks_to_torchgen():
    assert _sources_matching(r"^\s*(from torchgen[\s.]|import torchgen)") == {"sources/torchgen.py"}


def test_one_module_talks_to_the_dispatcher_and_one_to_autograds_engine():
    assert _sources_matching(r"torch\._C\b|\b_C\._") == {"runtime/dispatcher.py", "saved/engine.py"}
    assert _sources_matching(r"_C\._autograd|_execution_engine|_current_autograd_node|saved_tensors_default_hooks") \
        == {"saved/engine.py"}


def test_argparse_only_in_the_cli():
    assert _sources_matching(r"^\s*(import argparse|from argparse)") == {"cli/parser.py"}


def test_design_page_layout_names_every_module():
    text = open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8").read()
    layout = text[text.index("## Layout"):]
    layout = layout[:layout.find("\n## ", 1) % (len(layout) + 1)]  # up to the next section, if any
    missing = []
    for path in _modules().values():
        rel = os.path.relpath(path, PKG)
        folder, name = os.path.split(rel)
        if name == "__main__.py" or (name == "__init__.py" and not folder):
            continue
        row = next((line for line in layout.splitlines() if f"`{folder}/`" in line), "") if folder else layout
        if f"`{name}`" not in row and not (name == "__init__.py" and row):
            missing.append(rel)
    assert missing == []


def test_one_composer_sequences_plan_render_build():
    """plan → render → build appears once in the package: the runtime's ``library()``; every command,
    the Python API and the tests' own library fixture go through it."""
    renders = r"\bfrom \.\.?(codegen|codegen\.render) import [^\n]*\brender\b"
    builds = r"\bfrom \.(build|\.runtime\.build) import [^\n]*\bbuild\b"
    both = _sources_matching(renders) & _sources_matching(builds)
    assert both == {"runtime/__init__.py"}
    conftest = open(os.path.join(ROOT, "tests", "conftest.py"), encoding="utf-8").read()
    assert "runtime.build import build" not in conftest and "import library as compose" in conftest


def test_install_is_a_thin_facade_and_registration_takes_an_artifact():
    import inspect

    from torchgen_patch.runtime import install as inst

    assert len(inspect.signature(inst.install).parameters) <= 6
    assert list(inspect.signature(inst.register).parameters) == ["artifact", "ops", "backend"]
    # live-registry operators are planned in the plan stage, not decided in the runtime
    assert _sources_matching(r"already has an ADInplaceOrView kernel\"") == {"plan/__init__.py"}


def test_vocabulary_is_typed():
    """The shared words are enum members (str-valued, so outputs are unchanged), and no module
    spells one as a module-level string constant of its own."""
    import argparse

    from torchgen_patch import vocabulary as vc
    from torchgen_patch.checks import verify
    from torchgen_patch.cli.parser import parser
    from torchgen_patch.diagnostics.render import RENDERERS
    from torchgen_patch.plan.overlay import ACTIONS
    from torchgen_patch.scan.model import VERDICTS

    assert all(isinstance(v, vc.Verdict) for v in VERDICTS) and list(VERDICTS) == list(vc.Verdict)
    assert all(isinstance(a, vc.Action) for a in ACTIONS)
    assert all(isinstance(o, vc.Outcome) for o in verify.FAILING | {verify.PASS, verify.XFAIL})
    assert all(isinstance(f, vc.Format) for f in RENDERERS) and set(RENDERERS) == set(vc.LINT_FORMATS)
    assert vc.Verdict.MISSING == "missing" and f"{vc.Verdict.MISSING}" == "missing" and \
        repr(vc.Backend.CPP) == "'cpp'"
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    typed = {"format": vc.Format, "backend": vc.Backend, "verdict": vc.Verdict}
    for cmd, p in sub.choices.items():
        for a in p._actions:
            if a.dest in typed and a.choices:
                assert all(isinstance(c, typed[a.dest]) for c in a.choices), (cmd, a.dest, a.choices)
    words = {m.value for e in vars(vc).values() if isinstance(e, type) and issubclass(e, vc.Word) for m in e}
    spelled = []
    for mod, path in _modules().items():
        if mod == "torchgen_patch.vocabulary":
            continue
        for node in ast.parse(open(path, encoding="utf-8").read()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in words:
                spelled.append(f"{mod}: {ast.unparse(node)}")
    assert spelled == []
