"""A toolchain's refusals said as input errors: the file and line torchgen (or the autograd codegen)
rejected, in its own words, or the check that failed where it gave none. Reads exceptions and their
frames only; nothing here imports torchgen."""

from __future__ import annotations

import os
import re

from ..errors import InputError, one_line
from .toolchain import CHECKOUT, Toolchain
from .yaml_bounds import line_of_named_entry


def frames_inside(tc: Toolchain, exc: BaseException) -> list:
    """The traceback's frames in the toolchain's own files, outermost first."""
    import traceback

    return [f for f in traceback.extract_tb(exc.__traceback__)
            if os.path.abspath(f.filename).startswith(tc.path_entry + os.sep)]


def where_failed(tc: Toolchain, name: str, exc: BaseException) -> tuple[str, int | None]:
    """The toolchain's own file and line where the import failed (the innermost frame in it)."""
    inside = frames_inside(tc, exc)
    if inside:
        return inside[-1].filename, inside[-1].lineno
    p = os.path.join(tc.path_entry, *name.split("."))
    return (p + ".py" if os.path.isfile(p + ".py") else os.path.join(p, "__init__.py")), None


_LOC = re.compile(r"in (?P<path>.+?):(?P<line>\d+):")


def rejected(tc: Toolchain, path: str, exc: BaseException, es: list | None = None,
              who: str = "torchgen") -> InputError:
    msg = str(exc.args[0]) if exc.args else ""
    m = _LOC.search(msg)
    line = int(m.group("line")) if m else line_of_named_entry(msg, es or [])
    first = one_line(msg) if msg.strip() else ""
    if not first or (first.startswith("in ") and _LOC.match(first)):  # no message of its own
        first = failed_check(tc, exc)
    return InputError(path, line, f"the {whose(tc)} {who} rejected this file: {first}",
                      "is the yaml from a torch release this torchgen can read?")


def failed_check(tc: Toolchain, exc: BaseException) -> str:
    """An exception without a message of its own (torchgen adds only where it was parsing):
    older torchgens (torch 2.4's) check schemas with bare asserts; the failed check's own
    source line says what failed. Its type where there is no such line."""
    import linecache

    inside = frames_inside(tc, exc)
    if not inside or not inside[-1].line:
        return type(exc).__name__
    f = inside[-1]
    lines = [f.line.strip()]  # a check spread over lines: back to its `assert` (a few lines at most)
    for n in range(f.lineno - 1, max(f.lineno - 6, 0), -1):
        if lines[0].startswith("assert"):
            break
        lines.insert(0, linecache.getline(f.filename, n).strip())
    check = " ".join(lines) if lines[0].startswith("assert") else lines[-1]
    return f"failed check `{check}` ({os.path.relpath(f.filename, tc.path_entry)}:{f.lineno})"


def whose(tc: Toolchain) -> str:
    return "checkout's" if tc.world == CHECKOUT else "installed"
