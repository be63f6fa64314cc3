"""Where things are, and the errors the user sees.

``Location`` is the one file:line type of the package (records, findings, plan
entries, errors all carry one). ``ToolError`` is what the CLI says in one line,
``FILE:LINE: error: MESSAGE (hint: ...)``, and exits with its code; it is one of
two siblings: ``InputError``, bad input (exit 2), and ``EnvironmentProblem``, a
machine that lacks something a command needs (torch, a compiler, CUDA; exit 3).
Code that handles both says ``except ToolError``. Any other exception is a bug
and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from typing import NamedTuple


class Location(NamedTuple):
    """A file and a 1-based line (None: the whole file). Immutable, ordered by path then line."""

    path: str | None  # None: unknown (a runtime operator registered where this machine cannot see)
    line: int | None = None

    def render(self) -> str:
        if self.path is None:
            return "<unknown location>"
        where = printable(display_path(self.path))
        return f"{where}:{self.line}" if self.line else where


class ToolError(Exception):
    """An error said in one line, with its exit code. Besides what is said (``path``, ``line``,
    ``message``, ``hint``), the data a caller may act on, so no caller parses a message back:
    ``cause``, the reason alone (an OS error's text) where the message wraps one; ``errno``, the OS
    error behind it; ``facts``, the part of the hint that states what there is (a caller with other
    advice keeps it and gives its own); ``brief``, the message in one line where it spans lines."""

    exit_code: int  # 2 (InputError) or 3 (EnvironmentProblem): the two kinds raised

    def __init__(self, path: str | None, line: int | None, message: str, hint: str | None = None, *,
                 cause: str | None = None, errno: int | None = None, facts: str | None = None,
                 brief: str | None = None):
        self.path, self.line, self.message, self.hint = path, line, message, hint
        self.cause, self.errno, self.facts, self.brief = cause, errno, facts, brief
        super().__init__(self.render())

    @property
    def location(self) -> Location | None:
        return Location(self.path, self.line) if self.path else None

    def render(self, brief: bool = False) -> str:
        """The error as the command line says it; ``brief``: in one line (``summary``), as a process says it."""
        where = Location(self.path, self.line).render() if self.path else "torchgen-patch"
        text = f"{where}: error: {self.summary() if brief else self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        return text

    def __str__(self) -> str:
        return self.render()

    def summary(self) -> str:
        """The message in one line, what a process's line says: ``brief`` where the message spans lines
        (a compiler's output under its first line), else the message."""
        return self.brief if self.brief is not None else self.message


class InputError(ToolError):
    """Bad input (a file, a flag, a cache another account could write): exit 2."""

    exit_code = 2


class EnvironmentProblem(ToolError):
    """The machine lacks what a command needs (torch, a C++ compiler, ninja, CUDA): exit 3."""

    exit_code = 3

    def __init__(self, message: str, hint: str | None = None, *, cause: str | None = None,
                 errno: int | None = None, facts: str | None = None):
        super().__init__(None, None, message, hint, cause=cause, errno=errno, facts=facts)


def no_descriptor(e: BaseException, what: str | None = None) -> EnvironmentProblem | None:
    """Descriptor exhaustion (EMFILE, ENFILE) said as what it is, or None for any other error: never a
    damaged build, a missing file or a traceback of whichever open (or import) met it first."""
    if not isinstance(e, OSError) or e.errno not in (errno.EMFILE, errno.ENFILE):
        return None
    where = "this process" if e.errno == errno.EMFILE else "the system"
    return EnvironmentProblem(f"cannot open {what or e.filename or 'a file'}: {where} has no free file descriptor "
                              f"({errno.errorcode[e.errno]}, {e.strerror})",
                              "close descriptors the program does not need, or raise the limit (ulimit -n)")


@contextlib.contextmanager
def descriptors_said():
    """An entry point's block (install(), the command line): no free descriptor, met anywhere in it (a
    lazy import included), is one EnvironmentProblem."""
    try:
        yield
    except OSError as e:
        problem = no_descriptor(e)
        if problem is None:
            raise
        raise problem from None


def unknown_names(what: str, unknown: list[str], known) -> InputError:
    """The error for names not among ``known``: each listed, with the closest
    known names for the first one ("did you mean ...?")."""
    import difflib

    def bare(name: str) -> str:  # the shared "aten::" prefix would make any two names look close
        return name.split("::", 1)[-1]

    by_bare: dict[str, list[str]] = {}
    for k in sorted(known):
        by_bare.setdefault(bare(k), []).append(k)
    close = [k for b in difflib.get_close_matches(bare(unknown[0]), list(by_bare), n=3) for k in by_bare[b]][:3]
    return InputError(None, None, f"not in {what}: {', '.join(unknown)}",
                      ("did you mean " + ", ".join(close) + "?") if close else None)


def display_path(path: str) -> str:
    """A path as the user would like to read it: relative when under the cwd."""
    return _display(path, os.getcwd())


@functools.lru_cache(maxsize=256)
def _display(path: str, cwd: str) -> str:
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def printable(text: str) -> str:
    """``text`` with every character that could end a line or hide what follows (newlines, other
    control characters, line separators, bidirectional overrides) written as its Python escape,
    so that a file name from input stays on its line in a message, a report or a C++ comment."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def say(text: str) -> None:
    """One line on the program's stderr as it is now, from code running inside the program (the
    saved-tensor check's lines): nothing when it is None (closed at start; never its stdout, where
    ``print(file=None)`` would go), and a sink that cannot flush, or fails, costs the program
    nothing."""
    import sys

    err = sys.stderr
    if err is None:
        return
    try:
        err.write(text + "\n")
        flush = getattr(err, "flush", None)
        if callable(flush):
            flush()
    except Exception:  # noqa: BLE001 — a broken sink is the program's; its training goes on
        pass


def one_line(text: object) -> str:
    """Collapse a multi-line message (torchgen's, say) to its first line."""
    for part in str(text).splitlines():
        if part.strip():
            return part.strip()
    return str(text).strip() or "unknown error"


def require_torch(what: str):
    """Import torch for ``what``, or say clearly that this command needs it."""
    try:
        import torch
    except ImportError:
        raise EnvironmentProblem(f"{what} needs torch, and this Python has none",
                                 "pip install 'torch>=2.4' (or torchgen-patch[torch]); scan, lint, gen and "
                                 "diff on a checkout (--pytorch-root) work without it") from None
    return torch
