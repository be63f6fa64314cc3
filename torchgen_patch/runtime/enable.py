"""`torchgen-patch enable` / `disable` / `status`: an environment whose every Python process that
imports torch gets the kernels, whatever started it.

The mechanism is one ``.pth`` file in the environment's site-packages (``FILE``), as coverage and
pytest-cov use: ``site`` reads it at every interpreter start that imports ``site``, ``-I``, ``-E``
and a cleared environment included (only ``-S`` skips it). Its one line loads the hook of this
install (``site/_torchgen_patch_hook.py``) by its absolute path and starts it with the launch spec
written into the file; a hook that is gone (the tool uninstalled, moved) or fails to load does
nothing at all. The file is an output like any other: written atomically, by the account that owns
the site-packages directory, and listed in pip's RECORD of this tool when the tool is installed in
that same directory, so ``pip uninstall torchgen-patch`` removes it too.

The library is built (or found) when enabling, and its path is part of the spec: each process
pays the install step only (it falls back to the cache's key lookup where that build is gone or
belongs to another torch).
"""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import io
import json
import os
from dataclasses import dataclass

from ..errors import EnvironmentProblem
from ..version import __version__
from ..vocabulary import Backend, plural
from . import launch
from .process import checked_spec

FILE = "torchgen_patch_enable.pth"
HOOK = os.path.join(launch.SITE, launch.hook.NAME + ".py")
_HEAD = "# torchgen-patch {version}: every Python process of this environment that imports torch gets its " \
        "kernels; `torchgen-patch disable` (or `pip uninstall torchgen-patch`) removes this file\n"


@dataclass(frozen=True)
class State:
    """What the environment's file says, and whether it is what this torchgen-patch writes."""

    site: str  # the site-packages directory
    path: str  # the file, there or not
    present: bool
    spec: dict | None = None  # its launch spec, when it is readable
    version: str | None = None  # the torchgen-patch that wrote it
    problem: str | None = None  # why it does not patch as this torchgen-patch would (None: it does)
    recorded: bool | None = None  # pip's RECORD of this tool lists it (None: no RECORD of the tool there)


def site_dir() -> str:
    """This environment's site-packages: where pip installs, and a directory whose .pth files the
    interpreter reads at start."""
    import site
    import sysconfig

    d = sysconfig.get_paths()["purelib"]
    read = {os.path.realpath(p) for p in getattr(site, "getsitepackages", lambda: [])()}
    if os.path.realpath(d) not in read:
        raise EnvironmentProblem(f"{d}, where this Python installs packages, is not among the directories whose "
                                 ".pth files it reads at start", "enable a virtual environment or conda "
                                                                 "environment instead")
    return d


def check_writable(site: str, removing: bool = False) -> None:
    """Refuse, before any work, a site-packages directory this account may not write into: another
    account's (the file would be this account's in an environment it does not own), a read-only one,
    and for a file to be written (not ``removing`` one: ``disable``), one others can write."""
    from ..cache import owner_name

    try:
        st = os.stat(site)
    except OSError as e:
        raise EnvironmentProblem(f"cannot use {site}: {e.strerror}") from None
    if st.st_uid != os.geteuid():
        raise EnvironmentProblem(f"{site} belongs to {owner_name(st.st_uid)}: this account does not enable an "
                                 "environment it does not own", "run torchgen-patch enable as that account, or in "
                                                                "an environment of your own")
    if st.st_mode & 0o002 and not removing:
        raise EnvironmentProblem(f"{site} is writable by others (mode {st.st_mode & 0o7777:04o}): any account could "
                                 "replace the file enable writes there, which every Python of this environment runs",
                                 f"chmod o-w {site}")
    if not os.access(site, os.W_OK):
        raise EnvironmentProblem(f"cannot write into {site}: " + (
            "it is on a read-only file system" if _read_only(site) else "permission denied"),
            "enable a writable environment (a read-only image is enabled when it is built)")


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def render(spec: dict, path: str, version: str = __version__, hook: str = HOOK) -> str:
    """The file's text: a comment, then one line that ``site`` executes. The line loads ``hook`` only
    when it is there, and swallows every error: an interpreter's start never breaks on it."""
    spec_text = json.dumps(spec, sort_keys=True)
    code = (f"if os.path.isfile({hook!r}):\n"
            f" sys.path.insert(0, {os.path.dirname(hook)!r})\n"
            f" try:\n"
            f"  import {launch.hook.NAME} as h\n"
            f"  h.start({spec_text!r}, 'enable', {path!r})\n"
            f" except Exception:\n"
            f"  pass\n"
            f" finally:\n"
            f"  sys.path.remove({os.path.dirname(hook)!r})\n")
    return _HEAD.format(version=version) + "import os, sys; exec(" + repr(code) + ")\n"


def _parse(text: str) -> tuple[str, dict, str, str]:
    """(version, spec, hook, path) of a file ``render`` wrote; ValueError for anything else."""
    lines = text.splitlines()
    if len(lines) != 2 or not lines[0].startswith("# torchgen-patch ") or ":" not in lines[0]:
        raise ValueError("not two lines in torchgen-patch's form")
    version = lines[0][len("# torchgen-patch "):].split(":", 1)[0]
    call = ast.parse(lines[1]).body[-1].value  # type: ignore[attr-defined]  # not an Expr: AttributeError
    code = ast.literal_eval(call.args[0])
    tree = ast.parse(code)
    hook = ast.literal_eval(tree.body[0].test.args[0])
    start = tree.body[0].body[1].body[1].value
    spec_text, _mode, path = (ast.literal_eval(a) for a in start.args)
    return version, json.loads(spec_text), hook, path


def state(site: str | None = None) -> State:
    site = site or site_dir()
    path = os.path.join(site, FILE)
    recorded = _recorded(site)
    try:
        with open(path, "rb") as fh:
            data = fh.read(1 << 20)
            uid = os.fstat(fh.fileno()).st_uid
    except FileNotFoundError:
        return State(site, path, False, recorded=recorded)
    except OSError as e:
        return State(site, path, True, problem=f"cannot read it: {e.strerror}", recorded=recorded)
    try:
        text = data.decode()
        version, spec, hook, named = _parse(text)
    except (ValueError, SyntaxError, AttributeError, IndexError, TypeError, UnicodeDecodeError, RecursionError,
            MemoryError):  # the last two: nested deeper than the parsers go
        return State(site, path, True, problem=f"it is not as torchgen-patch writes it ({_by(uid)}): what it "
                                               "does is its own", recorded=recorded)
    problem = None
    if version != __version__:
        problem = f"written by torchgen-patch {version}; this is {__version__}"
    elif not os.path.isfile(hook):
        problem = f"its hook {hook} is gone (that torchgen-patch was uninstalled or moved): it does nothing"
    elif hook != HOOK:
        problem = f"it loads the hook of another torchgen-patch install ({hook})"
    elif render(spec, named, version, hook) != text or named != path:
        problem = "it was edited since torchgen-patch wrote it" + ("" if uid == os.geteuid() else f" ({_by(uid)})")
    else:
        try:
            checked_spec(json.dumps(spec))
        except ValueError as e:  # said once, after the file's name
            problem = str(e)
    return State(site, path, True, spec, version, problem, recorded)


def _by(uid: int) -> str:
    from ..cache import owner_name

    return "edited?" if uid == os.geteuid() else f"{owner_name(uid)} owns it: replaced by that account?"


def enable(spec: dict, site: str) -> State:
    """Write the file (atomically) and list it in pip's RECORD of this tool where there is one; on a
    failure nothing is left half-written."""
    path = os.path.join(site, FILE)
    data = render(spec, path).encode()
    _write(path, data, site)
    record = _record_path(site)
    if record is not None:
        try:
            _write(record, _record_with(record, data), site)
        except EnvironmentProblem:
            _remove(path, site)
            raise
    return state(site)


def disable(site: str) -> State:
    """Remove the file and its RECORD line; the state before."""
    before = state(site)
    record = _record_path(site)
    if before.present:
        _remove(before.path, site)
    if record is not None and before.recorded:
        _write(record, _record_with(record, None), site)
    return before


def _write(path: str, data: bytes, site: str) -> None:
    from ..files import atomic_write

    try:
        atomic_write(path, data)
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {path}: {_why(e, site)}",
                                 "enable a writable environment of your own") from None


def _remove(path: str, site: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise EnvironmentProblem(f"cannot remove {path}: {_why(e, site)}") from None


def _why(e: OSError, site: str) -> str:
    import errno

    if e.errno == errno.EROFS or _read_only(site):
        return "the file system is read-only"
    return e.strerror or str(e)


def _record_path(site: str) -> str | None:
    """pip's RECORD of this tool's distribution in ``site`` (None: the tool is installed elsewhere)."""
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return None
    for n in names:
        if n.endswith(".dist-info") and n.split("-", 1)[0].lower().replace(".", "_") == "torchgen_patch":
            record = os.path.join(site, n, "RECORD")
            if os.path.isfile(record) and not os.path.islink(record):
                return record
    return None


def _recorded(site: str) -> bool | None:
    record = _record_path(site)
    if record is None:
        return None
    return any(_names(line) == FILE for line in _lines(record))


def _lines(record: str) -> list[str]:
    try:
        with open(record, newline="", encoding="utf-8") as fh:
            return fh.read().splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return []


def _names(line: str) -> str | None:
    """The path a RECORD line names (its first CSV field)."""
    try:
        row = next(csv.reader([line]), None)
    except csv.Error:
        return None
    return row[0] if row else None


def _record_with(record: str, data: bytes | None) -> bytes:
    """RECORD as it is, byte for byte, without this file's line, and with its line for ``data``
    (None: without), ended as RECORD's own lines are."""
    lines = _lines(record)
    kept = [line for line in lines if _names(line) != FILE]
    if data is not None:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        end = next((line[len(line.rstrip("\r\n")):] for line in lines if line.rstrip("\r\n") != line), "\n")
        if kept and kept[-1].rstrip("\r\n") == kept[-1]:
            kept[-1] += end
        out = io.StringIO()
        csv.writer(out, lineterminator=end).writerow([FILE, f"sha256={digest}", str(len(data))])
        kept.append(out.getvalue())
    return "".join(kept).encode()

def prepared(opts, backend: str, ops: list[str] | None, *, quiet: bool = False, verbose: bool = False,
             log=None) -> tuple[dict, str]:
    """The spec of an enabled environment, with its library built (or found) now, so its processes pay
    the install step only: (spec, what the processes will install, for people)."""
    import sys

    library = None
    if backend == Backend.CPP:
        from . import library as compose

        art = compose(opts, verbose=verbose, log=log or sys.stderr)
        n = len(art.kernels) if ops is None else len(ops)
        if art.origin == "prebuilt":
            what = f"{plural(n, 'kernel')} from the prebuilt kernels {art.prebuilt}"
        else:
            library = art.path
            what = f"{plural(n, 'kernel')}, {'built now' if art.origin == 'build' else 'from the cached build'}"
    else:
        from ..pipeline import plan

        _, p = plan(opts)  # the scan cached for the processes
        what = f"{plural(len(p.kernels) if ops is None else len(ops), 'Python kernel')}, no compiler needed"
    return launch.launch_spec(opts, backend, ops, [], [], quiet=quiet, library=library), what
