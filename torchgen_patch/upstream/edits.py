"""What the upstream diff is made of: insertions into a file's lines, located by the caller (with
``ast``), applied bottom-up; the unified diff of a file edited or created; the code to inject, kept as
files under upstream/inject/."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass


def inject(name: str) -> str:
    """Code to inject into the upstream codegen or its tests, kept as files under upstream/inject/."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "inject", name), encoding="utf-8") as fh:
        return fh.read()


@dataclass(frozen=True)
class Insertion:
    line: int  # 1-based line before which the text goes
    text: str
    replaces: int = 0  # how many lines, from `line` on, the text replaces


def apply_edits(source: str, edits: list[Insertion]) -> str:
    lines = source.splitlines(keepends=True)
    for e in sorted(edits, key=lambda e: e.line, reverse=True):
        lines[e.line - 1:e.line - 1 + e.replaces] = [e.text]
    return "".join(lines)


def unified_diff(old: str, new: str, rel: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{rel}", tofile=f"b/{rel}"))


def new_file_diff(text: str, rel: str) -> str:
    """A diff that creates ``rel`` with ``text`` (what `git apply` and `patch -p1` take)."""
    lines = text.splitlines(keepends=True)
    return f"--- /dev/null\n+++ b/{rel}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + line for line in lines)
