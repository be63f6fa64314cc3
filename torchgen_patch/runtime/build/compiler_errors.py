"""Compiler errors mapped back to the kernel (op and yaml line) they are in."""

from __future__ import annotations

import os
import re

_DIAG = re.compile(r"(?P<file>[^\s:]+\.(?:cpp|h)):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)")
_KERNEL = re.compile(r"^// (?P<op>\S+)  \((?P<yaml>[^)]+)\)$")


def explain(output: str, files: dict[str, bytes]) -> str:
    """Map compiler errors back to the kernel (op and yaml line) they are in (``files``: the sources)."""
    lines = []
    for m in _DIAG.finditer(output):
        name = os.path.basename(m.group("file"))
        op = _kernel_at(files.get(name, b""), int(m.group("line")))
        where = f"{name}:{m.group('line')}"
        lines.append(f"  {where}: error: {m.group('msg')}" + (f"  [in the kernel of {op}]" if op else ""))
    if not lines:
        tail = "\n".join(output.strip().splitlines()[-15:])
        return "  " + tail.replace("\n", "\n  ")
    return "\n".join(dict.fromkeys(lines))


def _kernel_at(source: bytes, line: int) -> str | None:
    for row in reversed(source.decode("utf-8", errors="replace").splitlines()[:line]):
        m = _KERNEL.match(row)
        if m:
            return f"{m.group('op')} ({m.group('yaml')})"
    return None


