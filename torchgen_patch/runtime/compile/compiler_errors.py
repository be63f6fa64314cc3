"""Compiler errors mapped back to the kernel (op and yaml line) they are in."""

from __future__ import annotations

import os
import re

_DIAG = re.compile(r"(?P<file>[^\s:]+\.(?:cpp|h)):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)")
_NINJA = re.compile(r"^(?:\[\d+/\d+\] |FAILED: |ninja: )")
_ERROR = re.compile(r"\berror\b", re.I)  # "error:", "fatal error:", never -Werror in a command line
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


def last_error(output: str) -> str:
    """The compiler's last error line in ``output`` (ninja's own lines left out: its progress, ``FAILED:``,
    ``ninja: ...``), else its last line of any kind: one printable line, at most 300 characters."""
    from ...errors import printable

    said = [line.strip() for line in output.splitlines() if line.strip() and not _NINJA.match(line.strip())]
    errors = [line for line in said if _ERROR.search(line)]
    last = (errors or said or ["ninja failed and said nothing"])[-1]
    return printable(last)[:300]


def _kernel_at(source: bytes, line: int) -> str | None:
    for row in reversed(source.decode("utf-8", errors="replace").splitlines()[:line]):
        m = _KERNEL.match(row)
        if m:
            return f"{m.group('op')} ({m.group('yaml')})"
    return None


