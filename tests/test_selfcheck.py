"""The package checks itself: ruff on the whole tree and mypy on torchgen_patch/ with the settings of
pyproject.toml find nothing, and every finding left unreported on purpose (a `noqa` or `type: ignore`) says why on
its line."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
import tokenize

import pytest

from tests.conftest import ROOT

PKG = os.path.join(ROOT, "torchgen_patch")
# mypy follows torch's imports: a cache of its own keeps a warm run to seconds
MYPY_CACHE = os.path.join(ROOT, ".cache", "mypy-selfcheck")


def _tool(name: str) -> list[str]:
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (requirements-dev.txt pins it)")
    return [sys.executable, "-m", name]


def test_ruff_finds_nothing():
    """The whole tree (the package, tests/, scripts/, bench/, testbed/), with pyproject.toml's rules."""
    r = subprocess.run(_tool("ruff") + ["check", "--no-cache", "--output-format", "concise", "."],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"ruff check .:\n{r.stdout}{r.stderr}"


def test_mypy_finds_nothing():
    # no paths given: mypy checks what pyproject.toml's [tool.mypy] files names, with its settings
    r = subprocess.run(_tool("mypy") + ["--cache-dir", MYPY_CACHE], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and r.stdout.startswith("Success: no issues found"), f"mypy:\n{r.stdout}{r.stderr}"


# a `noqa` comment as `noqa: CODE[,CODE] reason` and `# type: ignore[code]  # reason`: the codes, then words that say why
# (a reason is anything with a letter in it after the codes)
_NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)", re.I)
_NOQA_WHY = re.compile(r":\s*[A-Z]+[0-9]+\b(?:\s*,\s*[A-Z]+[0-9]+\b)*[\s—(-]+.*\w")
_IGNORE = re.compile(r"#\s*type:\s*ignore\b(?P<rest>.*)")
_IGNORE_WHY = re.compile(r"\[[a-z-]+(?:\s*,\s*[a-z-]+)*\]\s*#.*\w")


def unexplained(source: str) -> list[tuple[int, str]]:
    """The (line, comment) of each `noqa` or `type: ignore` comment in `source` that names no code or
    gives no reason after its codes."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        for pattern, why in ((_NOQA, _NOQA_WHY), (_IGNORE, _IGNORE_WHY)):
            for m in pattern.finditer(tok.string):
                if not why.match(m.group("rest")):
                    out.append((tok.start[0], tok.string))
    return out


def test_the_reason_check_tells_a_bare_suppression():
    explained = ("x = 1  # noqa: F401 (re-exported)\n"
                 "y = 2  # noqa: BLE001 — the program's sink\n"
                 "z = f()  # type: ignore[attr-defined]  # torch's dynamic attribute\n")
    assert unexplained(explained) == []
    bare = ("a = 1  # noqa\n"
            "b = 2  # noqa: BLE001\n"
            "c = 3  # noqa: E501 ,\n"
            "d = f()  # type: ignore\n"
            "e = f()  # type: ignore[attr-defined]\n"
            "s = '# noqa'  # a string is not a comment\n")
    assert [line for line, _ in unexplained(bare)] == [1, 2, 3, 4, 5]


def test_every_noqa_and_type_ignore_says_why():
    found = []
    for base, dirs, names in os.walk(PKG):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(base, name)
                with open(path, encoding="utf-8") as fh:
                    found += [f"{os.path.relpath(path, ROOT)}:{line}: {text}" for line, text in unexplained(fh.read())]
    assert found == [], "a noqa or type: ignore without its reason:\n" + "\n".join(found)
