"""The user-facing pages (README.md, SECURITY.md, docs/*.md) hold up as written: every link and
anchor resolves, every table row has its header's cells, docs/cli.md is what the parser prints,
and every code block is exercised. The checkout-world shell blocks run for real on a tree made
from the installed wheel; every other command is checked against what it names (the CLI's
own parser, the Makefile's targets, the scripts, pip's arguments); Python blocks compile and
call only what exists; toml, yaml and CMake blocks parse and name only what exists."""

from __future__ import annotations

import ast
import fnmatch
import glob
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
import yaml

from tests.conftest import ROOT
from testbed.trees import tree_from_installed

PAGES = sorted(["README.md", "SECURITY.md", "reports/README.md"] + [os.path.relpath(p, ROOT) for p in glob.glob(
    os.path.join(ROOT, "docs", "*.md"))])
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def _read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def blocks(page: str) -> list[tuple[int, str, str]]:
    """(line, language, text) of every fenced block, its indentation removed."""
    out, lines, i = [], _read(page).splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            indent, lang, start = len(m.group(1)), m.group(2), i + 1
            i += 1
            while not re.match(r"^\s*```\s*$", lines[i]):
                i += 1
            out.append((start, lang, "\n".join(line[indent:] for line in lines[start:i])))
        i += 1
    return out


def prose(page: str) -> str:
    """The page without its fenced blocks and inline code (links in code are not links)."""
    kept, inside = [], False
    for line in _read(page).splitlines():
        if FENCE.match(line) or (inside and re.match(r"^\s*```\s*$", line)):
            inside = not inside
            continue
        if not inside:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def slugs(page: str) -> set[str]:
    """GitHub's anchors for the page's headings."""
    seen: dict[str, int] = {}
    out, inside = set(), False
    for line in _read(page).splitlines():
        if FENCE.match(line) or (inside and re.match(r"^\s*```\s*$", line)):
            inside = not inside
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if inside or not m:
            continue
        s = re.sub(r"[^\w\- ]", "", m.group(1).lower().replace("`", "")).replace(" ", "-")
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES)
def test_every_link_and_anchor_resolves(page):
    bad = []
    for target in LINK.findall(prose(page)):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:: not checked here
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else \
            os.path.join(ROOT, page)
        if not full.startswith(ROOT + os.sep) or not os.path.exists(full):
            bad.append(f"{target}: no such file")
        elif anchor and (not full.endswith(".md") or anchor not in slugs(os.path.relpath(full, ROOT))):
            bad.append(f"{target}: no such heading")
    assert bad == [], page


def test_the_reports_index_names_every_report_and_only_those():
    """reports/README.md links each file of reports/ once, and nothing that is not there."""
    index = os.path.join(ROOT, "reports", "README.md")
    linked = LINK.findall(open(index, encoding="utf-8").read())
    there = sorted(f for f in os.listdir(os.path.join(ROOT, "reports")) if f != "README.md")
    assert sorted(linked) == there


def _test_functions() -> dict[str, set[str]]:
    """Each test file's name and the test functions it defines (any depth: methods too)."""
    out = {}
    for path in glob.glob(os.path.join(ROOT, "tests", "test_*.py")):
        tree = ast.parse(open(path, encoding="utf-8").read())
        out[os.path.basename(path)] = {n.name for n in ast.walk(tree)
                                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                       and n.name.startswith("test_")}
    return out


@pytest.mark.parametrize("page", PAGES)
def test_every_test_a_page_cites_exists(page):
    """``file.py::test_name`` names a test of that file; a bare ``test_name`` one of some file."""
    tests = _test_functions()
    everywhere = set().union(*tests.values())
    text = _read(page)
    bad = [f"{f}::{t}" for f, t in re.findall(r"\b(test_\w+\.py)::(test_\w+)", text) if t not in tests.get(f, ())]
    bad += [t for t in re.findall(r"(?<![\w:./])(test_\w+)(?![\w.])", text) if t not in everywhere and t not in tests
            and f"{t}.py" not in tests]
    assert bad == [], page


@pytest.mark.parametrize("page", PAGES)
def test_every_table_row_has_the_headers_cells(page):
    lines = prose(page).splitlines()
    bad = []
    for i, line in enumerate(lines):
        if re.match(r"^\|[-|: ]+\|$", line):
            n = lines[i - 1].count("|")
            for row in lines[i + 1:]:
                if not row.startswith("|"):
                    break
                if row.replace("\\|", "").count("|") != n:
                    bad.append(row[:80])
    assert bad == [], page


def test_readme_is_short_and_keeps_the_two_commands():
    text = _read("README.md")
    assert len(text.splitlines()) <= 150
    assert [n for n, line in enumerate(text.splitlines(), 1) if len(line) > 120] == []  # says less, links more
    sh = "\n".join(b for _, lang, b in blocks("README.md") if lang == "sh")
    assert re.search(r"^make run\b", sh, re.M) and re.search(r"^make test\b", sh, re.M)
    for path in ("## I train with torch", "## I maintain PyTorch or a fork", "## I write an extension"):
        assert path in text


def test_user_facing_pages_speak_of_the_product_only():
    wording = re.compile(r"\b(issue|issues) [0-9]+\b|this session|half-saved|\bI kept\b|the block above", re.I)
    for page in PAGES + [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "reports", "*"))]:
        assert not wording.search(_read(page)), page


def test_cli_reference_is_what_the_parser_prints():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import cli_reference

    made = re.search(r"with Python (\d+\.\d+)", _read("docs/cli.md")).group(1)
    if made != cli_reference.python_version():
        pytest.skip(f"docs/cli.md was made with Python {made}; argparse lays help out differently on "
                    f"{cli_reference.python_version()}")
    assert _read("docs/cli.md") == cli_reference.render(), "stale: run `make docs`"


# --- commands --------------------------------------------------------------------------------


def _commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped, && split."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1:]
    return [c for c in out if c]


def _parse_cli(argv: list[str]) -> None:
    """What `torchgen-patch ARGV` would parse to, or an assertion naming the problem."""
    from torchgen_patch.cli.parser import parser

    if "run" in argv and "--" in argv:  # run's program is not parsed (cli.main does the same)
        argv = argv[:argv.index("--")]
    try:
        parser().parse_args(argv)
    except SystemExit as e:
        if e.code == 0:  # an option that answers and exits (--version, --cmake-dir)
            return
        raise AssertionError(f"torchgen-patch {shlex.join(argv)}: the parser refuses it (exit {e.code})") from None


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", _read("Makefile"), re.M))


def _pip(args: list[str]) -> None:
    """pip install/wheel of this project, its wheels, or its dependencies, nothing else."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    version = project["version"]
    deps = {re.split(r"[<>=\[; ]", d)[0].lower() for d in project["dependencies"]}
    deps |= {re.split(r"[<>=\[; ]", d)[0].lower() for ds in project["optional-dependencies"].values() for d in ds}
    assert args[0] in ("install", "wheel"), args
    rest = iter(args[1:])
    for a in rest:
        if a in ("-w", "--wheel-dir", "-r"):
            next(rest)
        elif a.startswith("-"):
            assert a in ("-q", "--no-deps", "-e", "--upgrade"), a
        elif a.startswith("."):
            extras = re.fullmatch(r"\.(?:\[(\w+)\])?", a)
            assert extras, a
            assert extras.group(1) in (None, *project["optional-dependencies"]), a
        elif a.endswith(".whl"):
            made = [f"torchgen_patch-{version}-py3-none-any.whl",
                    f"torchgen_patch_kernels-{version}+torch2.13.0.cpu.cxx11abi.g0-cp311-cp311-linux_x86_64.whl"]
            assert any(fnmatch.fnmatch(m, os.path.basename(a)) for m in made), a
        else:
            assert a.lower() in deps, f"pip {args[0]} {a}: not this project's dependency"


def check_command(words: list[str]) -> None:
    cmd, args = words[0], words[1:]
    if cmd == "torchgen-patch":
        _parse_cli(args)
    elif cmd == "make":
        targets = [a for a in args if "=" not in a]
        assert targets and set(targets) <= _make_targets(), words
    elif cmd == "pip" or (cmd in ("python", "python3") and args[:2] == ["-m", "pip"]):
        _pip(args[2:] if cmd != "pip" else args)
    elif cmd in ("python", "python3") and args and args[0].endswith(".py"):
        assert os.path.isfile(os.path.join(ROOT, args[0])), words
    elif cmd in ("python", "python3") and "-c" in args[:2] and len(args) == args.index("-c") + 2:
        compile(args[-1], "<docs>", "exec")  # what it does: the test of the page that gives it (enable.md's repair)
    elif cmd == "cd":
        assert len(args) == 1, words
    elif cmd == "git":
        assert args[0] == "apply" and len(args) == 2, words
    else:
        raise AssertionError(f"{shlex.join(words)}: a command the docs test cannot check; teach it")


SHELL = ("sh", "bash", "console")
KNOWN = SHELL + ("python", "toml", "yaml", "cmake", "text")


def _all_blocks():
    return [(page, line, lang, text) for page in PAGES for line, lang, text in blocks(page)]


def test_every_block_has_a_language_this_test_checks():
    bad = [f"{p}:{line}: '{lang}'" for p, line, lang, _ in _all_blocks() if lang not in KNOWN]
    bad += [f"{p}:{line}: text" for p, line, lang, _ in _all_blocks() if lang == "text" and p != "docs/cli.md"]
    assert bad == []


@pytest.mark.parametrize("page, line, text", [(p, n, t) for p, n, lang, t in _all_blocks() if lang in SHELL],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_shell_blocks_name_only_what_exists(page, line, text):
    for words in _commands(text):
        check_command(words)


def _python_names_exist(tree: ast.AST) -> None:
    import torchgen_patch
    from torchgen_patch.runtime import install as install_module

    install_kwargs = set(inspect.signature(install_module.install).parameters) | set(install_module.OPTION_KEYWORDS) \
        | set(install_module.HOW_KEYWORDS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torchgen_patch":
            assert hasattr(torchgen_patch, node.attr), f"torchgen_patch.{node.attr}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchgen_patch"):
            mod = importlib.import_module(node.module)
            for a in node.names:
                assert hasattr(mod, a.name) or importlib.util.find_spec(f"{node.module}.{a.name}"), a.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "install" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torchgen_patch":
            assert {k.arg for k in node.keywords} <= install_kwargs, ast.dump(node)


@pytest.mark.parametrize("page, line, text", [(p, n, t) for p, n, lang, t in _all_blocks() if lang == "python"],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_python_blocks_compile_and_call_what_exists(page, line, text):
    _python_names_exist(ast.parse(compile(text, f"{page}:{line}", "exec", ast.PyCF_ONLY_AST)))


@pytest.mark.parametrize("page, line, text", [(p, n, t) for p, n, lang, t in _all_blocks() if lang == "toml"],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_lintrunner_blocks_parse_and_call_the_entry_point(page, line, text, tmp_path):
    linters = tomllib.loads(text)["linter"]
    for linter in linters:
        assert re.fullmatch(r"[A-Z0-9]+", linter["code"])
        command = linter["command"]
        # the entry point, never `python3 -m` from the checkout root (SECURITY.md says why)
        assert command[0] == "torchgen-patch", command
        (tmp_path / "paths").write_text("native_functions.yaml\n")
        _parse_cli([f"@{tmp_path / 'paths'}" if a == "@{{PATHSFILE}}" else a for a in command[1:]])


@pytest.mark.parametrize("page, line, text", [(p, n, t) for p, n, lang, t in _all_blocks() if lang == "yaml"],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_overlay_blocks_use_only_the_overlays_keys(page, line, text, tmp_path):
    from torchgen_patch.codegen import template_names
    from torchgen_patch.plan.overlay import ACTIONS, KEYS, OPTIMIZERS, REQUIRES_GRAD, load_runtime

    entries = yaml.safe_load(text)
    if OPTIMIZERS in entries:  # optimizer entries: read by the overlay's own parser, every check strict
        (tmp_path / "overlay.yaml").write_text(text)
        assert set(load_runtime(str(tmp_path / "overlay.yaml")).optimizers) == set(entries.pop(OPTIMIZERS))
    for op, entry in entries.items():
        assert "::" in op and set(entry) <= KEYS - {"devices"}, (op, entry)
        assert entry.get("template", "kernel.cpp.j2") in template_names()
        assert entry.get("action", "generate") in ACTIONS
        assert entry.get("requires_grad", "refuse") in REQUIRES_GRAD


@pytest.mark.parametrize("page, line, text", [(p, n, t) for p, n, lang, t in _all_blocks() if lang == "cmake"],
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_cmake_blocks_call_what_the_module_defines(page, line, text):
    module = "\n".join(_read(os.path.relpath(p, ROOT)) for p in glob.glob(os.path.join(ROOT, "cmake", "*.cmake")))
    defined = set(re.findall(r"^\s*(?:function|macro)\((\w+)", module, re.M | re.I))
    builtin = {"list", "include", "find_package", "target_link_libraries", "add_executable", "set", "project"}
    for name, args in re.findall(r"^\s*(\w+)\(([^)]*)\)", text, re.M):
        assert name in defined | builtin, name
        if name == "include":
            assert os.path.isfile(os.path.join(ROOT, "cmake", f"{args.strip()}.cmake")), args


# --- the checkout path, run as written ---------------------------------------------------------

CHECKOUT = re.compile(r"^(cd ~/pytorch|git apply \S+|torchgen-patch (scan|lint|gen|diff) .*--pytorch-root \. ?.*"
                      r"|pip install \.)$")


def _checkout_blocks():
    """The shell blocks made only of checkout-world commands (no torch needed): they run for real."""
    out = []
    for page, line, lang, text in _all_blocks():
        cmds = [" ".join(c) for c in _commands(text)] if lang in SHELL else []
        if cmds and cmds[0] in ("cd ~/pytorch", "pip install .") and all(CHECKOUT.match(c) for c in cmds):
            out.append((page, line, text))
    return out


def test_some_blocks_run_for_real():
    assert len(_checkout_blocks()) >= 2  # the README's maintainer path and the checkout guide's


@pytest.mark.parametrize("page, line, text", _checkout_blocks(), ids=lambda v: v if isinstance(v, str) and
                         len(v) < 40 else None)
def test_checkout_blocks_run_as_written(page, line, text, tmp_path):
    """In a home whose ~/pytorch is a checkout-layout tree of the installed torch, with this
    environment's torchgen-patch on PATH; `pip install .` is left out (tests/test_user_path.py
    installs the project as a user does). Every command succeeds (lint: 1 with findings), and a
    lint after `git apply` of the fix finds nothing."""
    from testbed.notorch_venv import entry_point

    tree_from_installed(str(tmp_path / "pytorch"), git=False)
    bin_dir = os.path.dirname(entry_point(sys.executable, str(tmp_path / "bin")))  # as pip writes it, for this Python
    env = dict(os.environ, HOME=str(tmp_path), PATH=bin_dir + os.pathsep + os.environ["PATH"],
               PYTHONPATH=ROOT)
    cwd, applied = str(tmp_path), False
    for words in _commands(text):
        if words[:2] == ["pip", "install"]:
            continue
        if words[0] == "cd":
            cwd = os.path.join(cwd, str(tmp_path) + words[1][1:] if words[1].startswith("~") else words[1])
            continue
        r = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        ok = {0, 1} if words[:2] == ["torchgen-patch", "lint"] and not applied else {0}
        assert r.returncode in ok, (shlex.join(words), r.returncode, r.stderr[-2000:])
        applied = applied or words[:2] == ["git", "apply"]
    if applied:  # the block really patched the tree's codegen
        r = subprocess.run(["torchgen-patch", "diff", "--pytorch-root", str(tmp_path / "pytorch"), "--check"],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and "patched (mode fix)" in r.stdout, (r.stdout, r.stderr)


def test_foreach_out_count_is_the_plans(default_plan):
    """The problem table's `_foreach_*.out` row counts the ops of the plan for the torch its first
    column is measured on (torch 2.13), counted here from that plan."""
    from testbed.trees import installed_version

    if not installed_version().startswith("2.13."):
        pytest.skip(f"the table's counts are of torch 2.13's plan; this is torch {installed_version()}")
    n = sum(1 for op in default_plan.ops()
            if op.startswith("aten::_foreach_") and "." in op and op.split(".", 1)[1].endswith("out"))
    for page in ("README.md", "docs/evidence.md"):
        said = re.findall(r"\| `_foreach_\*\.out` \((\d+) ops\) \|", _read(page))
        assert said == [str(n)], (page, said, n)


def test_the_pages_show_the_line_a_patched_process_prints():
    """Every example of a patched process's line (`torchgen-patch: N kernels active ...`) has the shape
    the install step prints: the same parts in the same order, its numbers and process aside."""
    from torchgen_patch.runtime.launch.process import kernels_line, process_line

    shown = [(page, m.group(1)) for page in PAGES
             for m in re.finditer(r"`(torchgen-patch: \d+ kernels? active [^`]*)`", _read(page))]
    assert {"docs/enable.md", "docs/run.md"} <= {page for page, _ in shown}, shown
    for page, text in shown:
        origin = re.search(r" refused(?:, ([^;]*?))?(?:;|, in pid )", text)
        who = re.search(r" \(([^()]*)\)$", text)
        assert origin and who, (page, text)
        printed = process_line(kernels_line(177, "cpp", 0, origin.group(1), 41), 4242, who.group(1))
        assert re.sub(r"\d+", "N", text) == re.sub(r"\d+", "N", printed), page
