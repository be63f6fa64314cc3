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

import pytest

from tests import cxx_sizes
from tests.conftest import ROOT

PKG = os.path.join(ROOT, "torchgen_patch")
# Each stage may import only the stages before it.
ORDER = ["errors", "fs", "files", "version", "vocabulary", "cache", "sources", "scan", "plan", "codegen", "pipeline",
         "saved",
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


def _absolute(module: str, package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of what ``node`` (in ``module``, a package's ``__init__`` when ``package``) imports from."""
    if node.level == 0:
        return node.module or ""
    parts = module.split(".")[:None if package else -1]
    parts = parts[:len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(mods: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the package modules it imports, at module level or inside functions."""
    edges = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(m, path.endswith("__init__.py"), node)
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
    code = "import importlib\nfor m in %r:\n    importlib.import_module(m)\n" % [m for m in order
                                                                             if m != "torchgen_patch.__main__"]
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr


def test_starting_the_cli_imports_neither_torch_nor_torchgen():
    r = subprocess.run([sys.executable, "-X", "importtime", "-c",
                        "import torchgen_patch.cli, torchgen_patch.cli.parser"],
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


def test_counts_for_people_have_one_plural_helper():
    """``vocabulary.plural`` ("1 kernel", "2 kernels"); no module spells a plural of its own."""
    assert _sources_matching(r"^def (plural|_count|_plural)\b") == {"vocabulary.py"}
    assert _sources_matching(r"""["']s["'] if [\w.()]+ != 1|== 1 else ["']s["']""") == set()


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
    builds = r"\bfrom \.(compile|\.runtime\.compile) import [^\n]*\bbuild\b"
    both = _sources_matching(renders) & _sources_matching(builds)
    assert both == {"runtime/__init__.py"}
    conftest = open(os.path.join(ROOT, "tests", "conftest.py"), encoding="utf-8").read()
    assert "runtime.compile import build" not in conftest and "import library as compose" in conftest


def signature_problems(fn) -> list[str]:
    """What makes ``fn``'s signature hide what it accepts: a ``*args`` or ``**kwargs``, more than two
    positional parameters, a parameter its docstring does not name (as ``name``)."""
    import inspect

    params = inspect.signature(fn).parameters.values()
    doc = inspect.getdoc(fn) or ""
    out = [f"*{p.name}" if p.kind is p.VAR_POSITIONAL else f"**{p.name}" for p in params
           if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    out += [f"{len(positional)} positional parameters"] if len(positional) > 2 else []
    return out + [f"{p.name} undocumented" for p in params if f"``{p.name}``" not in doc]


def test_install_is_a_facade_of_six_parameters_whose_keyword_forms_are_documented():
    """``install()`` takes at most 6 parameters: ops, backend, the two values (``options``, ``how``), the
    plan, and the keyword forms of those values' fields, read in one place (``keyword_forms``), each named
    in the docstring; any other keyword is a TypeError. ``torchgen_patch.install`` is that very function."""
    import dataclasses
    import inspect

    import torchgen_patch
    from torchgen_patch.runtime import install as inst
    from torchgen_patch.sources import Options

    assert torchgen_patch.install is inst.install
    params = inspect.signature(inst.install).parameters
    assert list(params) == ["ops", "backend", "options", "plan", "how", "keywords"]
    assert set(inst.OPTION_KEYWORDS) | set(inst.HOW_KEYWORDS) == \
        {f.name for f in dataclasses.fields(inst.InstallOptions)} | {f.name for f in dataclasses.fields(Options)} - \
        {"pytorch_root"}
    doc = inspect.getdoc(inst.install) or ""
    assert [k for k in (*params, *inst.OPTION_KEYWORDS, *inst.HOW_KEYWORDS) if f"``{k}``" not in doc] == []
    with pytest.raises(TypeError, match="unexpected keyword argument 'pytorch_root'"):
        inst.install(pytorch_root="/")
    with pytest.raises(TypeError, match="give them in how= or as keywords, not both"):
        inst.install(how=inst.InstallOptions(), check_every=4)
    assert list(inspect.signature(inst.register).parameters) == ["artifact", "ops", "backend"]
    # live-registry operators are planned in the plan stage, not decided in the runtime
    assert _sources_matching(r"already has an ADInplaceOrView kernel\"") == {"plan/__init__.py"}


def test_the_check_of_signatures_finds_what_they_hide():
    def hides(ops=None, backend="cpp", *, options=None, **keywords):
        """``ops``, ``backend``, ``options``, ``keywords``."""

    def three(a, b, c):
        """``a`` ``b``"""

    assert signature_problems(hides) == ["**keywords"]
    assert signature_problems(three) == ["3 positional parameters", "c undocumented"]


def test_install_takes_a_value_or_its_keywords_not_both():
    """A keyword that would be ignored beside the value that holds it is refused before anything happens."""
    from torchgen_patch.runtime.install import InstallOptions, install
    from torchgen_patch.sources import Options

    with pytest.raises(TypeError, match="give them in options= or as keywords"):
        install(options=Options(), overlay="elsewhere.yaml")
    with pytest.raises(TypeError, match="how= and build, library"):
        install(how=InstallOptions(), library="x.so", build=False)


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


# the names under which the package carries a word of the vocabulary (a field, a variable, a key of a
# spec, a flag's destination)
_CARRIERS = {"kind", "form", "verdict", "action", "outcome", "backend", "format", "mode", "autograd_gap", "gap",
             "check_saved", "writer"}


def _carrier(node) -> str | None:
    """The name ``node`` reads a value by (``x.kind``, ``kind``, ``spec["backend"]``, ``getattr(a, "format")``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2 \
            and isinstance(node.args[1], ast.Constant):
        return node.args[1].value
    return None


def _strings(node) -> list:
    """The string constants ``node`` is, or a literal tuple, list or set of."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for e in node.elts for v in _strings(e)]
    return []


def words_spelled(source: str, words: set[str]) -> list[str]:
    """Where ``source`` spells words of the vocabulary as strings: a value that carries one compared
    with a string of them (``kind == "out"``, ``backend in ("cpp", "python")``), and a literal that
    lists two or more of them (a tuple, list or set of them, a table keyed by them), the enum again."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(v in words for s in sides for v in _strings(s)) and any(_carrier(s) in _CARRIERS for s in sides):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
        keys = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List,
                                                                                         ast.Set)) else []
        if len(keys) >= 2 and all(isinstance(k, ast.Constant) and k.value in words for k in keys):
            out.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
    return out


def _words() -> set[str]:
    from torchgen_patch import vocabulary as vc

    return {m.value for e in vars(vc).values() if isinstance(e, type) and issubclass(e, vc.Word) for m in e} - {""}


def test_the_vocabulary_is_used_as_enums_not_strings():
    """No module compares a kind, form, verdict, action, outcome, backend, format, mode or gap with a
    string, nor lists the words again (``classify.KINDS`` once did): each is its enum's member."""
    words = _words()
    found = [f"{os.path.relpath(path, PKG)}:{where}" for mod, path in _modules().items()
             if mod != "torchgen_patch.vocabulary"
             for where in words_spelled(open(path, encoding="utf-8").read(), words)]
    assert found == []


def test_the_check_of_spelled_words_finds_them():
    words = _words()
    spelled = 'if f.kind == "functional" or spec["backend"] != "cpp": pass\nKINDS = ("out", "inplace")\n' \
              'T = {"json": 1, "markdown": 2}\nok = getattr(args, "format", None) in ("text", "lintrunner")\n'
    assert len(words_spelled(spelled, words)) == 6
    fine = 'if name == "out": pass\nif f.kind == Kind.OUT: pass\nd = {"text": message}\n'
    assert words_spelled(fine, words) == []


# ---- the cache and the builds: touched by name in one module only ------------------------------------

# Calls that open, create, rename, remove, list or look at a path by its name (the package's own
# readers and writers of user files included): outside cache.py, each may name only what the
# user or the package names, never a cache or build path. Every such call outside cache.py is
# listed here, by module and function, with what it names.
BY_NAME = {"open", "io.open", "os.open", "os.mkdir", "os.makedirs", "os.rename", "os.renames", "os.replace",
           "os.unlink", "os.remove", "os.rmdir", "os.removedirs", "os.listdir", "os.scandir", "os.walk", "os.link",
           "os.symlink", "os.readlink", "os.chmod", "os.chown", "os.lchown", "os.truncate", "os.utime", "os.mkfifo",
           "os.stat", "os.lstat", "os.access", "os.path.realpath", "os.path.exists", "os.path.lexists",
           "os.path.isfile", "os.path.isdir", "os.path.islink", "os.path.getsize", "os.path.getmtime",
           "shutil.rmtree", "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree", "shutil.move",
           "tempfile.mkdtemp", "tempfile.mkstemp", "tempfile.NamedTemporaryFile", "tempfile.TemporaryDirectory",
           "tempfile.TemporaryFile", "files.read_bytes", "files.read_text", "files.atomic_write",
           "files.write_if_changed", "files.private_dirs", "files.write_output", "fs.atomic.atomic_write",
           "fs.atomic.replace_at"}
# whole modules whose every path is one the user names (inputs, outputs, checkouts, programs) or the
# package's own data; none of them is handed a cache or build path. The runtime's modules and the
# CLI, which are handed such paths, are listed function by function in ALLOWED instead.
USER_PATHS = {
    "files.py": "inputs and outputs the user names",
    "sources/__init__.py": "the inputs the user names, and where the installed torch keeps its yaml",
    "sources/torchgen.py": "the toolchains' own files (torchgen, the autograd codegen, derivatives.yaml)",
    "sources/toolchain.py": "the toolchains' own files, found and hashed",
    "sources/rejected.py": "the toolchains' own files, named where they failed",
    "codegen/output.py": "gen's output directory",
    "codegen/render.py": "the package's templates",
    "diagnostics/lint.py": "the yaml and generated files the user lints",
    "diagnostics/generated.py": "gen's output directory the user names",
    "diagnostics/baseline.py": "the baseline the user names",
    "upstream/patch.py": "the checkout the user names, and the package's injected code",
    "upstream/codegen_test.py": "the checkout the user names (its tools/test/test_codegen.py)",
    "upstream/edits.py": "the package's injected code",
    "upstream/pr_body.py": "the instruction counts the user names (--instructions)",
    "runtime/site/sitecustomize.py": "the program's sys.path",
    "runtime/site/_torchgen_patch_spawn.py": "the programs a patched process starts (their #! lines)",
    "runtime/site/_torchgen_patch_spec.py": "an enabled environment's data file, named by its .pth line",
    "diagnostics/render.py": "the files findings name",
    "runtime/registry.py": "the modules the user imports",
    "plan/overlay.py": "the overlay the user names",
    "scan/__init__.py": "the yaml the user names (the scan's key is its bytes)",
}
ALLOWED = {
    ("runtime/__init__.py", "_inputs_key"): "the package's templates and the overlay, hashed into the index key",
    ("runtime/compile/toolchain.py", "python_flags"): "this Python's header, looked for (the compiler reads it)",
    ("runtime/compile/toolchain.py", "recorded"): "the compiler an enabled environment recorded, looked for (it runs "
                                                "by its name, as a compiler found on PATH does)",
    ("runtime/prebuilt.py", "make_wheel"): "its own private project directory for pip wheel, filled from the "
                                           "library's checked descriptor",
    ("runtime/prebuilt.py", "_publish"): "the wheel pip made in make_wheel's private directory (-o is reached by "
                                         "fs.walk.find)",
    ("runtime/prebuilt.py", "overlay_sha256"): "the overlay the user names",
    ("runtime/launch/process.py", "_usable_streams"): "the null device, in place of a closed stderr",
    ("runtime/prebuilt.py", "_installed"): "where pip installed the kernels distribution (compared, not opened)",
    ("runtime/launch/launcher.py", "_read"): "the installed torch's version file and the overlay, hashed into the "
                                             "check's key",
    ("runtime/launch/launcher.py", "_stamp"): "the files of the --import modules, stamped into the check's key",
    ("runtime/launch/launcher.py", "_silenced"): "the null device, for what the --import modules print",
    ("cli/__init__.py", "_silence_stdout"): "the null device, in place of a standard output that failed",
    ("runtime/launch/enable.py", "_is_dir"): "the data file's name in site-packages, looked at before disable "
                                             "removes anything",
    ("runtime/launch/enable.py", "site_dir"): "the environment's site-packages, against those the interpreter reads",
    ("runtime/launch/enable.py", "check_writable"): "the environment's site-packages",
    ("runtime/launch/enable.py", "state"): "enable's output files, and the hook of this install they name",
    ("runtime/launch/enable.py", "_part_gone"): "the hook's parts, beside the hook enable's data file names",
    ("runtime/launch/enable.py", "_read"): "enable's output files (the .pth line and its data file)",
    ("runtime/launch/enable.py", "_write"): "enable's output file and pip's RECORD of this tool",
    ("runtime/launch/enable.py", "_remove"): "enable's output file",
    ("runtime/launch/enable.py", "_record_path"): "pip's RECORD of this tool in the site-packages",
    ("runtime/launch/enable.py", "_lines"): "pip's RECORD of this tool",
    ("runtime/site/_torchgen_patch_hook.py", "_part"): "the hook's own parts, files beside it",
    ("cli/commands.py", "_emit"): "-o/--output",
    ("cli/commands.py", "lint"): "--write-baseline",
    ("cli/commands.py", "gen"): "--output-dependencies",
    ("cli/commands.py", "diff"): "--pytorch-root's checkout and --pr-body",
    ("cli/commands.py", "_checkout_own"): "the yaml paths and --pytorch-root's checkout, compared",
}


def _aliases(tree) -> dict[str, str]:
    """Names a module binds to the modules and functions of BY_NAME (``from ..files import read_bytes``)."""
    out = {"open": "open"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").removeprefix("torchgen_patch.")
            base = "files" if module.split(".")[-1] == "files" else module
            for a in node.names:
                out[a.asname or a.name] = f"{base}.{a.name}"
    return out


def _calls_by_name(path: str) -> list[tuple[str, str, int]]:
    """(enclosing function, the BY_NAME call, line) of every such call in ``path``."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = _aliases(tree)
    found = []

    def dotted(f) -> str | None:
        if isinstance(f, ast.Name):
            return names.get(f.id, f.id)
        if isinstance(f, ast.Attribute):
            base = dotted(f.value)
            return f"{base}.{f.attr}" if base else None
        return None

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}.{child.name}" if where and isinstance(node, ast.ClassDef) else child.name
            if isinstance(child, ast.Call):
                name = dotted(child.func)
                if name in BY_NAME:
                    found.append((where or "<module>", name, child.lineno))
            visit(child, inner)

    visit(tree, "")
    return found


def test_no_cache_or_build_path_is_touched_by_name_outside_the_cache_module():
    """Every directory of the cache and of a build is walked and used by descriptor in the file system
    layer (fs/: ``fs.dirs.Dir``) and cache.py; anywhere else, a path touched by name is one the user or
    the package names."""
    stray, used = [], set()
    for path in _modules().values():
        rel = os.path.relpath(path, PKG)
        if rel == "cache.py" or rel.startswith("fs" + os.sep) or rel in USER_PATHS:
            continue
        for fn, call, line in _calls_by_name(path):
            if (rel, fn) in ALLOWED:
                used.add((rel, fn))
            else:
                stray.append(f"{rel}:{line}: {call} in {fn}")
    assert stray == []
    assert used == set(ALLOWED)  # each exception still exists (none kept after its reason went away)
    assert set(USER_PATHS) <= {os.path.relpath(p, PKG) for p in _modules().values()}


def test_the_cache_directory_is_named_only_where_it_is_handed_on():
    """Code outside cache.py and the file system layer (fs/) asks them for what it needs (an open ``Dir``),
    never for the root's name to build paths from; the launcher only hands the absolute name to the
    processes it starts."""
    named = _sources_matching(r"\bcache\.directory\(|\bimport directory\b|\bdirectory\(\)")
    assert {m for m in named if not m.startswith("fs" + os.sep)} - {"cache.py"} == {"runtime/launch/launcher.py"}


def test_nothing_loads_a_library_by_path():
    """No cpp_extension.load()/load_inline(), no torch.ops.load_library(); the one dlopen is of the checked
    descriptor's name (runtime/load/loader.py's _dlopen; CDLL(None) is the process itself)."""
    loads, dlopens = [], []
    for path in _modules().values():
        rel = os.path.relpath(path, PKG)
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            attr = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if attr in ("load_library", "load_inline") or (attr == "load" and "cpp_extension" in ast.unparse(f)):
                loads.append(f"{rel}:{node.lineno}")
            if attr in ("CDLL", "dlopen", "LoadLibrary"):
                arg = ast.unparse(node.args[0]) if node.args else ""
                dlopens.append((rel, arg))
    assert loads == []
    assert {d for d in dlopens if d[1] != "None"} == {("runtime/load/loader.py", "name")}  # None: the process itself


# ---- the tools stand on their own -----------------------------------------------------------------

_TOOLS = ("scripts", "bench", "testbed", "torchgen_patch")
_IMPORTS_TESTS = re.compile(r"\b(from|import) tests\b|--import tests\.|^tests\.\w+$")


def _tests_imported(path: str) -> list[str]:
    """Where the file at ``path`` imports ``tests``: an import statement, or in code it hands on (a program
    it writes, a ``python -c``, a ``--import`` of run or lint)."""
    text = open(path, encoding="utf-8").read()
    if not path.endswith(".py"):
        return [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if _IMPORTS_TESTS.search(line)]
    out = []
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        out += [f"{node.lineno}: import {n}" for n in names if n == "tests" or n.startswith("tests.")]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _IMPORTS_TESTS.search(node.value):
            out.append(f"{node.lineno}: {node.value.strip()[:60]!r}")
    return out


def test_nothing_outside_the_tests_imports_them():
    """Scripts, benchmarks, the package and what they share with the tests (``testbed``) import nothing
    from ``tests/``; the tests import ``testbed``."""
    paths = [os.path.join(base, n) for top in _TOOLS for base, _, names in os.walk(os.path.join(ROOT, top))
             for n in names if n.endswith((".py", ".sh"))] + [os.path.join(ROOT, "Makefile")]
    found = [f"{os.path.relpath(p, ROOT)}:{w}" for p in paths for w in _tests_imported(p)]
    assert found == []


def test_the_check_of_imports_of_the_tests_finds_them(tmp_path):
    for text, n in (("from tests.trees import x\nimport tests.custom_ops\n", 2),
                    ("run(['--import', 'tests.custom_ops'])\nopen(f).write('import tests.custom_ops\\n')\n", 2),
                    ("from testbed.trees import x\nprint('the tests pass')\n", 0)):
        (tmp_path / "t.py").write_text(text)
        assert len(_tests_imported(str(tmp_path / "t.py"))) == n, text
    (tmp_path / "t.sh").write_text('"$PY" -c "from tests.trees import tree_from_wheel"\npython -m pytest tests\n')
    assert len(_tests_imported(str(tmp_path / "t.sh"))) == 1


def _private_names_reached(source: str) -> list[str]:
    """The private names of the package that ``source`` reaches: ``from torchgen_patch… import _x``, or
    ``m._x`` where ``m`` was imported from the package."""
    tree = ast.parse(source)
    ours, out = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torchgen_patch":
            ours |= {a.asname or a.name for a in node.names}
            out += [f"{node.lineno}: {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            ours |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("torchgen_patch")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ours \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            out.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return out


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(os.path.join(ROOT, "bench")) if n.endswith(".py")))
def test_benchmarks_use_public_names_only(name):
    source = open(os.path.join(ROOT, "bench", name), encoding="utf-8").read()
    assert _private_names_reached(source) == []


def test_the_check_of_private_names_finds_them():
    assert len(_private_names_reached("from torchgen_patch.runtime import optim\noptim._before(1)\n"
                                      "from torchgen_patch.saved.fingerprint import _block\n"
                                      "import torchgen_patch\ntorchgen_patch._x\n")) == 3
    assert _private_names_reached("from torchgen_patch.runtime import optim\noptim.before_step(1)\n"
                                  "import torch\ntorch._foreach_add_(x, 1)\n") == []


# ---- sizes: a module is read in one sitting, a function on one screen ---------------------------------

MODULE_LINES, FUNCTION_LINES = 500, 60
# modules and functions over the limits, each at its size now: it may shrink, never grow
OVER_THE_LIMITS: dict[str, int] = {}


def sizes(source: str) -> tuple[int, dict[str, int]]:
    """(lines of ``source``, lines of each function in it: every ``def``, nested ones and methods
    included, by its dotted name)."""
    out: dict[str, int] = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                if not isinstance(child, ast.ClassDef):
                    out[name] = max(out.get(name, 0), child.end_lineno - child.lineno + 1)
            visit(child, name)

    visit(ast.parse(source), "")
    return len(source.splitlines()), out


def test_no_module_over_500_lines_and_no_function_over_60():
    over = {}
    for path in _modules().values():
        rel = os.path.relpath(path, PKG)
        lines, functions = sizes(open(path, encoding="utf-8").read())
        if lines > OVER_THE_LIMITS.get(rel, MODULE_LINES):
            over[rel] = lines
        for fn, n in functions.items():
            if n > OVER_THE_LIMITS.get(f"{rel}:{fn}", FUNCTION_LINES):
                over[f"{rel}:{fn}"] = n
    assert over == {}
    assert {k.split(":")[0] for k in OVER_THE_LIMITS} <= {os.path.relpath(p, PKG) for p in _modules().values()}


# ---- private names stay in their module ----------------------------------------------------------------

# A module's ``_name`` (a function, class or constant) is for that module alone: another module of the package
# that takes one, by ``from .x import _y`` or as ``x._y`` of a module it imported, is listed here with why it
# stays. A submodule whose file name starts with ``_`` (the hook's parts in runtime/site/, named for the
# site-packages they are copied into) is a module, not a private name: importing it is not counted.
PRIVATE_CROSSINGS: dict[str, str] = {}


def private_names_taken(source: str, module: str, package: bool, mods) -> list[str]:
    """The private names ``source`` (the module ``module``, a package's ``__init__`` when ``package``) takes
    from another module of ``mods`` (the package's module names): ``from .x import _y`` and ``x._y`` where
    ``x`` names a module of the package, each as ``line: module.name``."""
    tree = ast.parse(source)
    bound, out = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(module, package, node)
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    bound[a.asname or a.name] = f"{base}.{a.name}"
                elif base in mods and base != module and a.name.startswith("_") and not a.name.startswith("__"):
                    out.append(f"{node.lineno}: {base}.{a.name}")
        elif isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name in mods})
            bound.update({a.name: a.name for a in node.names if not a.asname and a.name in mods})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            held = bound.get(ast.unparse(node.value), ast.unparse(node.value))
            if held in mods and held != module:
                out.append(f"{node.lineno}: {held}.{node.attr}")
    return sorted(out, key=lambda hit: int(hit.split(":")[0]))


def test_no_module_takes_a_private_name_of_another():
    """No module of the package imports another's ``_name`` or reads it as ``module._name``, but where
    PRIVATE_CROSSINGS says why (and every entry there is still one)."""
    mods = _modules()
    found = {f"{os.path.relpath(path, PKG)} -> {hit.split(': ', 1)[1]}" for m, path in mods.items()
             for hit in private_names_taken(open(path, encoding="utf-8").read(), m, path.endswith("__init__.py"), mods)}
    assert found - set(PRIVATE_CROSSINGS) == set()
    assert set(PRIVATE_CROSSINGS) - found == set()


def test_the_check_of_private_names_taken_finds_them():
    mods = {"p", "p.a", "p.b", "p.c", "p.c.d", "p._hook"}
    source = ("from .a import _x, y\nfrom . import b\nimport p.c.d as d\nimport p.c\nfrom ._hook import _z\n"
              "b._f()\nd._g\np.c._h\nb.__name__\nfrom . import _hook\n_hook.go()\n")
    assert private_names_taken(source, "p.b", False, mods) == ["1: p.a._x", "5: p._hook._z", "7: p.c.d._g",
                                                               "8: p.c._h"]
    assert private_names_taken(source, "p.e", False, mods) == ["1: p.a._x", "5: p._hook._z", "6: p.b._f",
                                                               "7: p.c.d._g", "8: p.c._h"]
    assert private_names_taken("from . import _own\nfrom .x import _y\n", "p", True, mods | {"p.x"}) == ["2: p.x._y"]


# ---- the file system layer: the trust boundary is one package ----------------------------------------

# what outside torchgen_patch/fs/ still opens with O_NOFOLLOW, by module:function, and why it stays
NOFOLLOW_OUTSIDE_FS = {
    **dict.fromkeys(["codegen/output.py:" + f for f in ("_keep_file", "_salvage", "_open_dir", "_mkdtemp", "read_named",
                                                        "_read_through", "_carry", "_ours")],
                    "gen's output transaction: its staging and old directories, entered by the descriptors "
                    "fs.walk.find gave it, and which of their files are gen's own"),
    **dict.fromkeys(["files.py:_write_through", "files.py:_holds"],
                    "write_output's last step, through the directory fs.walk.find found"),
    "runtime/launch/enable.py:_read": "the data file the interpreter's hook reads, read the way the hook reads it",
    "runtime/site/_torchgen_patch_spec.py:read_data": "the hook's part runs in the program's process and imports "
                                                      "nothing of the package",
}


def file_system_calls(source: str) -> list[str]:
    """What ``source`` does that belongs to the file system layer, by function (``module`` level: ``-``):
    ``flock``/``lockf`` (of fcntl), ``renameat2`` (an attribute, with ctypes imported) and ``O_NOFOLLOW``
    (os's flag, in an ``os.open`` or in flags made for one)."""
    tree = ast.parse(source)
    uses_ctypes = any(isinstance(n, (ast.Import, ast.ImportFrom)) and "ctypes" in
                      ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""])
                      for n in ast.walk(tree))
    found = []

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            here = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and where == "-" else where
            if isinstance(child, ast.Attribute) or isinstance(child, ast.Name):
                name = child.attr if isinstance(child, ast.Attribute) else child.id
                if name in ("flock", "lockf") or name == "O_NOFOLLOW" or (name == "renameat2" and uses_ctypes):
                    found.append(f"{where}:{name}")
            visit(child, here)

    visit(tree, "-")
    return found


def test_only_the_file_system_layer_locks_renames_by_ctypes_or_opens_with_o_nofollow():
    """``flock``/``lockf`` and ``renameat2`` through ctypes only in torchgen_patch/fs/; an ``O_NOFOLLOW``
    open outside it only where NOFOLLOW_OUTSIDE_FS says why (and every entry there still one)."""
    locks, nofollow = [], set()
    for path in _modules().values():
        rel = os.path.relpath(path, PKG)
        if rel.startswith("fs" + os.sep):
            continue
        for hit in file_system_calls(open(path, encoding="utf-8").read()):
            where, name = hit.rsplit(":", 1)
            if name == "O_NOFOLLOW":
                nofollow.add(f"{rel}:{where}")
            else:
                locks.append(f"{rel}:{hit}")
    assert locks == []
    assert nofollow == set(NOFOLLOW_OUTSIDE_FS)


def test_the_check_of_file_system_calls_finds_them():
    source = ("import fcntl, ctypes, os\n"
              "def f(fd):\n    fcntl.flock(fd, fcntl.LOCK_EX)\n"
              "def g():\n    return ctypes.CDLL(None).renameat2\n"
              "FLAGS = os.O_RDONLY | os.O_NOFOLLOW\n"
              "def h(p):\n    def inner():\n        return os.open(p, os.O_NOFOLLOW)\n    return inner\n")
    assert file_system_calls(source) == ["f:flock", "g:renameat2", "-:O_NOFOLLOW", "h:O_NOFOLLOW"]
    assert file_system_calls("import os\nos.rename('a', 'b')\nos.open('a', os.O_RDONLY)\n") == []
    assert file_system_calls("from .fs.atomic import renameat2\nrenameat2(1, 'a', 'b', 2)\n") == []


def test_the_measure_of_sizes_counts_every_def():
    source = ("def f():\n    def inner():\n        return 1\n    return inner\n\n\n"
              "class C:\n    def method(self):\n        x = 1\n        return x\n")
    assert sizes(source) == (10, {"f": 4, "f.inner": 2, "C.method": 3})


# ---- the same sizes for C++: the package's C++ and CUDA sources and its C++ templates -------------------

CXX_SUFFIXES = (".cpp", ".cu", ".h", ".cpp.j2", ".cu.j2", ".h.j2")


def _cxx_files() -> list[str]:
    """Every C, C++ and CUDA file of the package and of templates/ (plain sources and Jinja templates)."""
    out = []
    for top in (PKG, os.path.join(ROOT, "templates")):
        for d, _, names in os.walk(top):
            out += [os.path.join(d, n) for n in names if n.endswith(CXX_SUFFIXES)]
    return sorted(out)


def cxx_over_the_limits(files: dict[str, str]) -> dict[str, int]:
    """The files of ``files`` (name -> text) over MODULE_LINES lines, and their functions over
    FUNCTION_LINES (as ``name:function:line``), each with its size."""
    over = {}
    for name, text in files.items():
        if len(text.splitlines()) > MODULE_LINES:
            over[name] = len(text.splitlines())
        for fn, line, n in cxx_sizes.functions(text):
            if n > FUNCTION_LINES:
                over[f"{name}:{fn}:{line}"] = n
    return over


def test_no_cxx_file_over_500_lines_and_no_cxx_function_over_60():
    files = {os.path.relpath(p, ROOT): open(p, encoding="utf-8").read() for p in _cxx_files()}
    assert any(n.startswith("templates/saved/") for n in files)  # the walk finds the native sources
    assert cxx_over_the_limits(files) == {}


def _cxx_function(name: str, body_lines: int) -> str:
    """A C++ function of ``body_lines`` + 2 lines, with what a reader must not take for braces inside."""
    body = ['  const char* s = "} { \\" }";  // a brace in a comment: }',
            "  char c = '}';  /* { */",
            '  auto f = [&](int x) { return x + 1; };  // a lambda: part of the function',
            '  const char* raw = R"x( } )x";']
    body += [f"  int v{i} = {i};" for i in range(body_lines - len(body))]
    return f"static int {name}(int a,\n    int b) {{\n" + "\n".join(body[:-1]) + "\n  return 0; }\n"


def test_the_measure_of_cxx_functions_reads_what_matters():
    source = ("#include <vector>  // {\n#define OPEN {\n"
              "namespace outer {\n"
              "struct S {\n  int get() const { return 1; }\n  S() : x_{0}, y_(1) {\n    x_ = 2;\n  }\n"
              "  int x_, y_;\n};\n"
              "int table[] = {1, 2, 3};\n"
              "template <typename T = int>\nT twice(T t) {\n  if (t) {\n    return t + t;\n  }\n  return t;\n}\n"
              "}  // namespace outer\n"
              'extern "C" {\nint entry(void) {\n  return outer::twice(2);\n}\n}\n'
              "enum Kind { kA, kB };\n"
              "inline namespace v1 {\nint g() {\n  return [] { return 0; }();\n}\n}\n")
    assert cxx_sizes.functions(source) == [("get", 5, 1), ("S", 6, 3), ("twice", 12, 7), ("entry", 21, 3),
                                           ("g", 27, 3)]
    assert cxx_sizes.functions(_cxx_function("f", 58)) == [("f", 1, 60)]


def test_the_cxx_size_rule_fails_a_function_of_61_lines():
    assert cxx_over_the_limits({"a.cpp": _cxx_function("fits", 58)}) == {}
    assert cxx_over_the_limits({"a.cpp": _cxx_function("long", 59)}) == {"a.cpp:long:1": 61}
    assert cxx_over_the_limits({"a.h": "int x;\n" * 501}) == {"a.h": 501}
    template = "{{ generated_comment }}\n{% for k in ks %}\nvoid {{ k }}() {}\n{% endfor %}\n"
    assert cxx_over_the_limits({"t.cpp.j2": template}) == {}


# ---- the release check: small modules of small functions ---------------------------------------------

RELEASE_CHECK = os.path.join(ROOT, "scripts", "release_check")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60


def _long_functions(source: str, limit: int) -> list[str]:
    """The functions and methods of ``source`` (nested ones too) longer than ``limit`` lines, each from its
    ``def`` to its last line."""
    return [f"{node.name}:{node.lineno}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def _release_check_sources() -> list[str]:
    return sorted([os.path.join(RELEASE_CHECK, n) for n in os.listdir(RELEASE_CHECK) if n.endswith(".py")]
                  + [os.path.join(ROOT, "scripts", "pytorch_check.py")])


def test_the_release_check_is_small_modules_of_small_functions():
    """scripts/release_check/ (and its entry point, scripts/pytorch_check.py): no module over 400 lines, no
    function over 60."""
    sources = _release_check_sources()
    assert len(sources) > 5  # the package is there, split by job
    long_modules, long_functions = [], []
    for path in sources:
        text = open(path, encoding="utf-8").read()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append(f"{os.path.relpath(path, ROOT)}: {len(text.splitlines())} lines")
        long_functions += [f"{os.path.relpath(path, ROOT)}:{f}" for f in _long_functions(text, MAX_FUNCTION_LINES)]
    assert long_modules == [] and long_functions == []


def test_the_check_of_long_functions_finds_them():
    lines = [f"x{i} = {i}\n" for i in range(60)]
    method = "".join("        " + ln for ln in lines)
    found = _long_functions(f"def short():\n    pass\n\n\nclass C:\n    def long(self):\n{method}", MAX_FUNCTION_LINES)
    assert found == ["long:6: 61 lines"]
    assert _long_functions("def fits():\n" + "".join("    " + ln for ln in lines[:59]), MAX_FUNCTION_LINES) == []


def test_the_release_check_imports_no_tests_and_one_module_composes_it():
    """The release check's modules import the product and testbed/, never tests/ (test_nothing_outside_the_tests_
    imports_them walks scripts/); argparse and the steps' order are main.py's alone."""
    assert _sources_in(RELEASE_CHECK, r"^\s*(import argparse|from argparse)") == {"main.py"}
    assert _sources_in(RELEASE_CHECK, r"\bstep_checkout\(") == {"main.py", "checkout.py"}
    assert _sources_in(RELEASE_CHECK, r"\bstep_tests\(") == {"main.py", "groups.py"}


def _sources_in(folder: str, pattern: str) -> set[str]:
    rx = re.compile(pattern, re.M)
    return {n for n in os.listdir(folder) if n.endswith(".py")
            and rx.search(open(os.path.join(folder, n), encoding="utf-8").read())}


def test_every_package_of_the_tree_ships():
    """pyproject.toml lists its packages by name: a sub-package missing there is missing from every
    installed copy (a wheel, a non-editable install), though the tests from the tree pass."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {os.path.relpath(base, ROOT).replace(os.sep, ".") for base, _, names in os.walk(PKG)
             if "__init__.py" in names and "__pycache__" not in base}
    assert found - listed == set()


def test_one_module_takes_file_locks():
    """The one lock protocol (fs/flock.py: try, then wait inside what the caller says while it waits):
    no other module of the package imports fcntl."""
    users = sorted(rel for rel in _sources_matching(r"^\s*(import fcntl|from fcntl import)"))
    assert users == ["fs/flock.py"], users
