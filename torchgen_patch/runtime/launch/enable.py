"""`torchgen-patch enable` / `disable` / `status`: an environment whose every Python process that
imports torch gets the kernels, whatever started it.

The mechanism is one ``.pth`` file in the environment's site-packages (``FILE``), as coverage and
pytest-cov use: ``site`` reads it at every interpreter start that imports ``site``, ``-I``, ``-E``
and a cleared environment included (only ``-S`` skips it). It holds one ASCII line that depends on
nothing but where this install's hook is (``site/_torchgen_patch_hook.py``, which loads its two
parts beside it by their path, ``SPEC_NAME`` and ``SPAWN_NAME``): it loads the hook by its absolute
path and hands it the data file beside it (``DATA``, JSON: the launch spec, and which torchgen-patch
wrote it), which ``site`` never parses. Whatever happened to either file, an
interpreter's start goes on: a hook that is gone or fails to load, and a data file that cannot be
read as a spec, are said in one line (the data file's at ``import torch``). Both are outputs like
any other: written atomically (the data file first, so the line never names data half-written), by
the account that owns the site-packages directory, and listed in pip's RECORD of this tool when the
tool is installed in that same directory, so ``pip uninstall torchgen-patch`` removes them too.
``status`` and ``disable`` read them as data: neither loads the hook.

The library is built (or found) when enabling, and its path is part of the spec: each process
pays the install step only (it falls back to the cache's key lookup where that build is gone or
belongs to another torch). Where no build can be used and none made, a process runs unpatched and
says why in one line, unless the spec is ``strict`` (``enable --strict``): then it stops (exit 3).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import dataclasses
import io
import os
from dataclasses import dataclass
from typing import Any

from ...errors import EnvironmentProblem, InputError
from ...version import __version__
from ...vocabulary import Backend, Origin, plural
from .spec import LaunchSpec, written_by
from .status import unsafe_file, unsafe_site

FILE = "torchgen_patch_enable.pth"
DATA = "torchgen_patch_enable.json"
HOOK_NAME = "_torchgen_patch_hook"  # the hook's module name (site/_torchgen_patch_hook.py), never imported here
HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "site", HOOK_NAME + ".py")
# the hook's parts, files beside it that it loads by their path (never imported here): what each one gone leaves undone
SPEC_NAME, SPAWN_NAME = "_torchgen_patch_spec", "_torchgen_patch_spawn"
PARTS = {SPEC_NAME: "it does nothing", SPAWN_NAME: "run in this environment names no process that drops the hook"}
MAX_DATA = 1 << 20  # the hook's own limit
_REPAIR = "`torchgen-patch enable` writes it again, `torchgen-patch disable` removes it"


@dataclass(frozen=True)
class State:
    """What the environment's files say, and whether they are what this torchgen-patch writes."""

    site: str  # the site-packages directory
    path: str  # the .pth file, there or not
    present: bool
    spec: LaunchSpec | None = None  # its launch spec, when it is one
    version: str | None = None  # the torchgen-patch that wrote it
    problem: str | None = None  # why it does not patch as this torchgen-patch would (None: it does)
    recorded: bool | None = None  # pip's RECORD of this tool lists it (None: no RECORD of the tool there)
    data: str = ""  # the data file, there or not
    data_present: bool = False
    unsafe_site: tuple[str, str] | None = None  # why another account could change the site-packages (message, hint)


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
    and for a file to be written (not ``removing`` one: ``disable``), one its group or others can write."""
    from ...fs.protected import owner_name

    try:
        st = os.stat(site)
    except OSError as e:
        raise EnvironmentProblem(f"cannot use {site}: {e.strerror}") from None
    if st.st_uid != os.geteuid():
        raise EnvironmentProblem(f"{site} belongs to {owner_name(st.st_uid)}: this account does not enable an "
                                 "environment it does not own", "run torchgen-patch enable as that account, or in "
                                                                "an environment of your own")
    if not removing and (unsafe := unsafe_site(site, st)) is not None:
        raise EnvironmentProblem(*unsafe)
    if not os.access(site, os.W_OK):
        raise EnvironmentProblem(f"cannot write into {site}: " + (
            "it is on a read-only file system" if _read_only(site) else "permission denied"),
            "enable a writable environment (a read-only image is enabled when it is built)")


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def render(site: str, hook: str = HOOK) -> str:
    """The ``.pth`` file's one ASCII line, which ``site`` executes: it loads ``hook`` by its path and
    starts it with the data file of ``site``; whatever fails (the hook gone, damaged, the data file
    unreadable) is one line on stderr, and the interpreter's start goes on. It names no data: writing
    new data never makes it stale."""
    pth, data, here = (ascii(os.path.join(site, n)) for n in (FILE, DATA, os.path.dirname(hook)))
    body = ("try:\n"
            f" d = {here}\n"
            f" if not os.path.isfile(os.path.join(d, {HOOK_NAME + '.py'!r})):\n"
            "  raise LookupError('its hook ' + os.path.join(d, " + repr(HOOK_NAME + ".py") + ") + ' is gone "
            "(torchgen-patch was uninstalled or moved)')\n"
            " sys.path.insert(0, d)\n"
            " try:\n"
            f"  import {HOOK_NAME} as h\n"
            " finally:\n"
            "  sys.path.remove(d)\n"
            f" h.enabled({data})\n"
            "except Exception as e:\n"
            " try:\n"
            "  w = (str(e).splitlines() or [''])[0]\n"
            f"  sys.stderr.write('torchgen-patch: NOT active in pid %d: %s: %s: %s (hint: {_REPAIR})\\n' % "
            f"(os.getpid(), {pth}, type(e).__name__, w))\n"
            "  sys.stderr.flush()\n"
            " except Exception:\n"
            "  pass\n")
    # once per process: site reads a site-packages directory twice in some layouts (a venv of pyenv's Python)
    code = "if not getattr(sys, '_torchgen_patch_enable', False):\n sys._torchgen_patch_enable = True\n" + \
        "".join(" " + line + "\n" for line in body.splitlines())
    return "import os, sys; exec(" + ascii(code) + ")\n"


def render_data(spec: LaunchSpec, version: str = __version__, hook: str = HOOK) -> bytes:
    """The data file: the launch spec, and which torchgen-patch (version, hook) wrote it."""
    return (dataclasses.replace(spec, enabled_by={"torchgen_patch": version, "hook": hook}).to_json()
            + "\n").encode()


def _read(path: str) -> tuple[bytes, os.stat_result] | None:
    """A file's bytes (up to MAX_DATA + 1) and the status of what was read (fstat on its descriptor);
    None where it does not exist. Never blocks (a FIFO is not read), never follows a symlink."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(MAX_DATA + 1), st
    finally:
        os.close(fd)


def state(site: str | None = None) -> State:
    """The environment's two files, read as data (the hook is never loaded here)."""
    site = site or site_dir()
    path, data_path = os.path.join(site, FILE), os.path.join(site, DATA)
    recorded = _recorded(site)
    data_problem: str | None  # why the data file cannot be read (None: it can)
    try:
        data = _read(data_path)
    except OSError as e:
        data, data_problem = None, f"cannot read {data_path}: {e.strerror}"
    else:
        data_problem = None
    common: dict[str, Any] = dict(recorded=recorded, data=data_path,
                                  data_present=data is not None or data_problem is not None)
    try:
        got = _read(path)
    except OSError as e:
        return State(site, path, True, problem=f"cannot read it: {e.strerror}", **common)
    if got is None:
        return State(site, path, False, **common)
    raw, st = got
    site_st = os.stat(site)
    common["unsafe_site"] = unsafe_site(site, site_st)
    raw_data, version, hook, why = _data(data, site, data_problem, site_st.st_uid)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        problem: str | None = "it holds bytes that are not ASCII" + (
            "" if _utf8(raw) else f", not even UTF-8: Python's site stops every interpreter of this environment at "
                                  f"start (repair: rm {path})")
        return State(site, path, True, problem=f"{problem} ({_by(st.st_uid)})", **common)
    if text != render(site, hook or HOOK):
        return State(site, path, True, problem=_foreign(text, st.st_uid), **common)
    problem, spec = unsafe_file(st, site_st.st_uid, site) or why, None
    if problem is None and version != __version__:
        problem = f"written by torchgen-patch {version}; this is {__version__}"
    elif problem is None and not os.path.isfile(hook):  # type: ignore[arg-type]  # no problem: a hook
        problem = f"its hook {hook} is gone (that torchgen-patch was uninstalled or moved): it does nothing"
    elif problem is None and (gone := _part_gone(hook)) is not None:  # type: ignore[arg-type]  # no problem: a hook
        problem = gone
    elif problem is None and hook != HOOK:
        problem = f"it loads the hook of another torchgen-patch install ({hook})"
    elif problem is None:
        try:
            spec = dataclasses.replace(LaunchSpec.parse(raw_data, data_path), enabled_by=None)  # stamp: version, hook
        except InputError as e:  # said once, after the file's name
            problem = e.message
    return State(site, path, True, spec, version, problem, **common)


def _part_gone(hook: str) -> str | None:
    """Why a part of the hook at ``hook`` is gone (the first one that is), or None: both are there."""
    for name, undone in PARTS.items():
        part = os.path.join(os.path.dirname(hook), name + ".py")
        if not os.path.isfile(part):
            return f"its hook's part {part} is gone (that torchgen-patch install is damaged: reinstall it): {undone}"
    return None


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _foreign(text: str, uid: int) -> str:
    """Why a .pth file of this name that is not this install's line is not torchgen-patch's."""
    lines = text.splitlines()
    if len(lines) == 2 and lines[0].startswith("# torchgen-patch ") and ":" in lines[0]:
        version = lines[0][len("# torchgen-patch "):].split(":", 1)[0]
        return f"written by torchgen-patch {version} in a form this one does not read"
    return f"it is not as torchgen-patch writes it ({_by(uid)}): what it does is its own"


def _data(got, site: str, problem: str | None, owner: int) -> tuple[bytes | None, str | None, str | None, str | None]:
    """(its bytes, version, hook, problem) of the data file as ``_read`` got it (``owner``: of the
    site-packages directory, the one account that writes it): which torchgen-patch wrote it, read
    before its launch spec is (a spec of another version is said as that, not as what this one
    makes of it)."""
    data_path = os.path.join(site, DATA)
    if problem is not None:
        return None, None, None, problem
    if got is None:
        return None, None, None, f"its data file {data_path} is missing"
    raw, st = got
    if (unsafe := unsafe_file(st, owner, site)) is not None:
        return None, None, None, f"{data_path}: {unsafe}"
    try:
        if len(raw) > MAX_DATA:
            raise ValueError("larger than the hook reads")
        version, hook = written_by(raw.decode("utf-8"))
    except (ValueError, MemoryError):
        return None, None, None, f"{data_path} is damaged (not the JSON torchgen-patch writes)"
    return raw, version, hook, None


def _by(uid: int) -> str:
    from ...fs.protected import owner_name

    return "edited?" if uid == os.geteuid() else f"{owner_name(uid)} owns it: replaced by that account?"


def enable(spec: LaunchSpec, site: str) -> State:
    """Write the data file, then the ``.pth`` line, then pip's RECORD of this tool where there is one
    (each atomically); a failure puts back what each file was (nothing left half-written). Killed in
    between, the line (which names no data) loads the old data or the new, whole."""
    path, data_path = os.path.join(site, FILE), os.path.join(site, DATA)
    line, payload = render(site).encode(), render_data(spec)
    record = _record_path(site)
    steps = [(data_path, payload), (path, line)]
    if record is not None:
        steps.append((record, _record_with(record, {FILE: line, DATA: payload})))
    before = {p: _previous(p) for p, _ in steps}
    done = []
    try:
        for p, b in steps:
            _write(p, b, site)
            done.append(p)
    except EnvironmentProblem:
        for p in reversed(done):
            with contextlib.suppress(EnvironmentProblem):  # a second fault: the first one is what is said
                _write(p, before[p] or b"", site) if before[p] is not None else _remove(p, site)
        raise
    return state(site)


def _previous(path: str) -> bytes | None:
    try:
        got = _read(path)
    except OSError:
        return None
    return None if got is None else got[0]


def disable(site: str) -> State:
    """Remove the ``.pth`` line, then the data file, then their RECORD lines; the state before."""
    before = state(site)
    if before.data_present and _is_dir(before.data):  # not a file of enable's: nothing removed, said first
        raise EnvironmentProblem(f"{before.data} is a directory, not the file `torchgen-patch enable` writes",
                                 f"look at what it holds and remove it (rm -r {before.data}), then disable again")
    record = _record_path(site)
    rewritten = None  # RECORD without enable's lines, made before anything is removed (one that cannot be
    if record is not None:  # read stops here, with nothing done)
        lines = _lines(record)
        if before.recorded or any(_names(x) == DATA for x in lines):
            rewritten = _record_with(record, None)
    if before.present:
        _remove(before.path, site)
    if before.data_present:
        _remove(before.data, site)
    if rewritten is not None:
        _write(record, rewritten, site)  # type: ignore[arg-type]  # rewritten: record is there
    return before


def _is_dir(path: str) -> bool:
    import stat

    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _write(path: str, data: bytes, site: str) -> None:
    from ...fs.atomic import atomic_write

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
    try:
        return any(_names(line) == FILE for line in _lines(record))
    except EnvironmentProblem:
        return None


def _lines(record: str) -> list[str]:
    """RECORD's lines, each with its end; bytes that are not UTF-8 (a damaged or foreign line) kept as
    they are (surrogate escapes), so a RECORD written back holds them byte for byte. One that cannot be
    read: EnvironmentProblem (never an empty RECORD, which would be written back as one)."""
    try:
        with open(record, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise EnvironmentProblem(f"cannot read pip's record {record}: {e.strerror or e}",
                                 "make it readable, or reinstall torchgen-patch") from None
    return data.decode("utf-8", "surrogateescape").splitlines(keepends=True)


def _names(line: str) -> str | None:
    """The path a RECORD line names (its first CSV field)."""
    try:
        row = next(csv.reader([line]), None)
    except csv.Error:
        return None
    return row[0] if row else None


def _record_with(record: str, files: dict[str, bytes] | None) -> bytes:
    """RECORD as it is, byte for byte, without the lines of enable's files, and with a line for each of
    ``files`` (name -> its bytes; None: none), ended as RECORD's own lines are."""
    lines = _lines(record)
    kept = [line for line in lines if _names(line) not in (FILE, DATA)]
    if files:
        end = next((line[len(line.rstrip("\r\n")):] for line in lines if line.rstrip("\r\n") != line), "\n")
        if kept and kept[-1].rstrip("\r\n") == kept[-1]:
            kept[-1] += end
        out = io.StringIO()
        w = csv.writer(out, lineterminator=end)
        for name, data in sorted(files.items()):
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            w.writerow([name, f"sha256={digest}", str(len(data))])
        kept.append(out.getvalue())
    return "".join(kept).encode("utf-8", "surrogateescape")


def prepared(opts, backend: str, ops: list[str] | None, *, quiet: bool = False, verbose: bool = False,
             log=None, strict: bool = False, check_saved: str | None = None,
             findings: str | None = None, check_every: int = 1) -> tuple[LaunchSpec, str]:
    """The spec of an enabled environment, with its library built (or found) now, so its processes pay
    the install step only: (spec, what the processes will install, for people). ``strict``: a process
    that cannot have the kernels stops (else it runs unpatched, said in one line); ``check_saved``:
    each process also turns the saved-tensor check on in that mode (each step checked with probability
    1/``check_every``), writing its findings to the folder ``findings`` too (absolute)."""
    import sys

    from . import launcher as launch

    library = None
    if backend == Backend.CPP:
        from .. import library as compose

        art = compose(opts, verbose=verbose, log=log or sys.stderr)
        n = len(art.kernels) if ops is None else len(ops)
        if art.origin == Origin.PREBUILT:
            what = f"{plural(n, 'kernel')} from the prebuilt kernels {art.prebuilt}"
        else:
            library = art.path
            what = f"{plural(n, 'kernel')}, {'built now' if art.origin == Origin.BUILD else 'from the cached build'}"
    else:
        from ...pipeline import plan

        _, p = plan(opts)  # the scan cached for the processes
        what = f"{plural(len(p.kernels) if ops is None else len(ops), 'Python kernel')}, no compiler needed"
    saved = None
    if check_saved is not None:
        words, saved = _check_hooks(verbose, log or sys.stderr)
        what += "; " + words
    from ..compile.toolchain import here

    found = here()  # what the processes build with, a cleared environment's included
    spec = launch.launch_spec(opts, backend, ops, [], [], quiet=quiet, library=library, strict=strict,
                              check_saved=check_saved, findings=findings, check_every=check_every)
    return dataclasses.replace(spec, toolchain=None if found is None else found.table(), saved_library=saved), what


def _check_hooks(verbose: bool, log) -> tuple[str, str | None]:
    """The saved-tensor check's native hooks made ready now (the prebuilt wheel's, the cache's, or built),
    so the processes compile nothing; in words, and the build they load (None: the wheel's, or none).
    Where they cannot be had, the processes run the check on its Python hooks, and this says why (a build
    that failed is remembered: they do not try it again)."""
    from ...errors import ToolError
    from ..checklib import ready

    try:
        words, path = ready(verbose, log)
        return f"the saved-tensor check's native hooks {words}", path
    except ToolError as e:
        return f"the saved-tensor check on its Python hooks ({e.summary()})", None
