"""Findings of a fleet: each process of a job appends every finding it makes, as one JSON line, to a file
of its own in one folder (``--findings DIR``, ``$TORCHGEN_PATCH_FINDINGS``), for ``torchgen-patch
findings DIR`` to group by site across hosts, ranks and steps.

A line is a ``Record``: the host, the pid, the step (the backward pass it was found in, counted from 0
in the process: autograd's own count, where each ``backward()`` or ``autograd.grad`` call is one) and
the finding (``render.as_dict``'s fields); ``Record.to_line`` is its one writer and ``Record.parse``
its one reader, which checks every field. ``Folder`` writes them: the folder made or checked at the
process's first finding (its own account's or root's, writable by no one else unless sticky: the
file system layer's rules), a new file named by host and pid (``findings-HOST-PID.jsonl``), each line
one ``write`` (whole or not at all). A process that cannot write says so once on stderr and goes on."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import weakref
from dataclasses import dataclass

from ..errors import ToolError, printable, say
from ..vocabulary import Writer
from .finding import Finding, Frame
from .render import as_dict

ENV = "TORCHGEN_PATCH_FINDINGS"
VERSION = 1  # the lines' format; a reader refuses any other
SUFFIX = ".jsonl"
MAX_LINES = 10_000  # what one process writes at most: a write in a loop of a long job fills no disk
_TEXT = 1 << 16  # the longest string a line may hold (a path, a module name)


@dataclass(frozen=True)
class Record:
    """One finding of one process, as its line holds it."""

    host: str
    pid: int
    step: int | None  # the backward pass, from 0 (None: found outside one)
    finding: Finding

    def to_line(self) -> bytes:
        """The record as one line of ASCII JSON (keys sorted), newline included."""
        obj = {"v": VERSION, "host": self.host, "pid": self.pid, "step": self.step, **as_dict(self.finding)}
        return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n").encode("ascii")

    @classmethod
    def parse(cls, line: bytes) -> Record:
        """The record of ``line`` (without its newline), every field checked; a ValueError says what is wrong."""
        from ..fs.decode import loads

        try:
            obj = loads(line)
        except ValueError as e:
            raise ValueError(f"not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        if obj.get("v") != VERSION:
            raise ValueError(f"not a findings line of this torchgen-patch ('v' is {printable(repr(obj.get('v')))[:40]},"
                             f" not {VERSION})")
        t = _table(obj, "tensor")
        kernel, launch = _kernel(obj)
        writers = _list(obj, "writers")
        unknown = [w for w in writers if w not in tuple(Writer)]
        if unknown:
            raise ValueError(f"'writers' names {printable(repr(unknown[0]))[:60]}, which is no writer")
        f = Finding(shape=tuple(_int(x, "tensor.shape") for x in _list(t, "shape")), dtype=_str(t, "dtype"),
                    device=_str(t, "device"), version=_int(t.get("version"), "tensor.version"),
                    name=_str_or_none(t, "name"), owner=_str_or_none(t, "owner"), view=_bool(t, "view"),
                    node=_str_or_none(obj, "node"), forward=_frame(obj, "forward"), site=_frame(obj, "site"),
                    call=_frame(obj, "call"), backward=_frame(obj, "backward"),
                    writers=tuple(Writer(w) for w in writers), optimizer=_str_or_none(obj, "optimizer"),
                    step=_frame(obj, "optimizer_step"), kernel=kernel, launch=launch,
                    rank=_int_or_none(obj.get("rank"), "rank"))
        return cls(_str(obj, "host"), _int(obj.get("pid"), "pid"), _int_or_none(obj.get("step"), "step"), f)


def _str(obj: dict, key: str) -> str:
    value = obj.get(key)
    if isinstance(value, str) and 0 < len(value) <= _TEXT:
        return value
    raise ValueError(f"{key!r} is {_kind(value)}, not a string")


def _str_or_none(obj: dict, key: str) -> str | None:
    return None if obj.get(key) is None else _str(obj, key)


def _int(value, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63:
        return value
    raise ValueError(f"{key!r} is {_kind(value)}, not a count")


def _int_or_none(value, key: str) -> int | None:
    return None if value is None else _int(value, key)


def _bool(obj: dict, key: str) -> bool:
    value = obj.get(key)
    if isinstance(value, bool):
        return value
    raise ValueError(f"{key!r} is {_kind(value)}, not true or false")


def _table(obj: dict, key: str) -> dict:
    value = obj.get(key)
    if isinstance(value, dict):
        return value
    raise ValueError(f"{key!r} is {_kind(value)}, not an object")


def _list(obj: dict, key: str) -> list:
    value = obj.get(key)
    if isinstance(value, list) and len(value) <= 64:
        return value
    raise ValueError(f"{key!r} is {_kind(value)}, not a list (of at most 64)")


def _frame(obj: dict, key: str) -> Frame | None:
    if obj.get(key) is None:
        return None
    fr = _table(obj, key)
    return Frame(_str(fr, "file"), _int(fr.get("line"), f"{key}.line"), _str(fr, "function"))


def _kernel(obj: dict) -> tuple[str | None, Frame | None]:
    """The Triton kernel a line names (``triton_kernel``: its name, and its launch's frame where known)."""
    if obj.get("triton_kernel") is None:
        return None, None
    k = _table(obj, "triton_kernel")
    if k.get("file") is None and k.get("line") is None and k.get("function") is None:
        return _str(k, "name"), None
    return _str(k, "name"), Frame(_str(k, "file"), _int(k.get("line"), "triton_kernel.line"), _str(k, "function"))


def _kind(value) -> str:
    return "missing" if value is None else "a list" if isinstance(value, list) else \
        "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


# --- the writer -----------------------------------------------------------------------------------------


def refusal(path: str) -> tuple[str, str]:
    """What a folder another account could write is refused for (the file system layer's wording)."""
    return (f"writes no findings under {path}",
            f"they could replace what is there, so torchgen-patch writes no findings under {path}")


def open_folder(path: str):
    """The folder ``path`` (absolute), made private where missing, checked as the file system layer checks
    a directory it writes in (fs.dirs.Dir); a ToolError says why it cannot be."""
    from ..errors import EnvironmentProblem
    from ..fs.dirs import open_dir

    hint = f"name a directory of your own (--findings, ${ENV})"
    try:
        return open_dir(path, refusal(path), create=True, strict=False)
    except ToolError as e:
        raise EnvironmentProblem(e.message, hint) from None
    except OSError as e:
        raise EnvironmentProblem(f"cannot use {path}: {e.strerror}", hint) from None


class Folder:
    """The file this process appends its findings to, in the folder ``path``; made at the first finding."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self._fd, self._pid, self._size, self._lines = -1, -1, 0, 0
        self._stopped = False
        self._lock = threading.Lock()

    def write(self, f: Finding) -> None:
        """Append ``f``'s line; never raises (a failure is said once on stderr and ends the writing)."""
        with self._lock:
            if self._stopped:
                return
            try:
                if self._pid != os.getpid():  # the first finding, or the first of a forked child
                    self._open()
                if self._lines >= MAX_LINES:
                    self._stop(f"{MAX_LINES} findings written, the rest of this process's are not")
                    return
                from ..fs.appends import append

                self._size = append(self._fd, Record(HOST, os.getpid(), step(), f).to_line(), self._size)
                self._lines += 1
            except ToolError as e:
                self._stop(e.message)
            except OSError as e:
                self._stop(e.strerror or str(e))
            except Exception as e:  # noqa: BLE001 — whatever the writer meets, the program's training goes on
                self._stop(f"{type(e).__name__}: {e}")

    def _open(self) -> None:
        from ..fs.appends import new_file

        if self._fd >= 0:  # a forked child: its parent's file is the parent's
            os.close(self._fd)
        self._fd, self._size, self._lines = -1, 0, 0
        with open_folder(self.path) as d:
            self._fd, _ = new_file(d, f"findings-{HOST}-{os.getpid()}", SUFFIX)
        self._pid = os.getpid()

    def _stop(self, why: str) -> None:
        self._stopped = True
        say(f"torchgen-patch: findings of pid {os.getpid()} not written to {printable(self.path)}: "
            f"{printable(why)}; the check goes on")


HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"
_FOLDERS: dict[str, Folder] = {}  # one writer a folder, in a process


_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a check -> the Folder its findings go to


def attach(check, path: str | None = None) -> None:
    """Send what ``check`` finds to the folder ``path``, else to ``$TORCHGEN_PATCH_FINDINGS``'s (where set)."""
    f = folder(path)
    if f is not None:
        _ATTACHED[check] = f


def write(check, finding: Finding) -> None:
    """``finding``, made by ``check``: a line in its folder, where it has one (``attach``)."""
    f = _ATTACHED.get(check)
    if f is not None:
        f.write(finding)


def folder(path: str | None = None) -> Folder | None:
    """The writer of the folder ``path``, else of ``$TORCHGEN_PATCH_FINDINGS``; None when neither is set."""
    path = path or os.environ.get(ENV) or None
    if path is None:
        return None
    path = os.path.abspath(path)
    return _FOLDERS.setdefault(path, Folder(path))


def step() -> int | None:
    """The backward pass running now, from 0 in the process (autograd's graph task); None outside one."""
    from .engine import graph_task

    task = graph_task()
    return task if task >= 0 else None
