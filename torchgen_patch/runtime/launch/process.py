"""The install step in each Python process of a program under `run` or in an enabled environment:
what the hook (``site/_torchgen_patch_hook.py``) calls right after torch (or a module of
``--import``) has finished importing. It reads the launch spec, resolves the library (the build the
spec names, the installed prebuilt kernels, the cached build, or a build under the cache's lock),
registers the kernels and hands the hook the one line to say; the hook prints it and, where the
kernels cannot be had, stops the process with the error's exit code under ``run`` (and in an
environment enabled with ``--strict``); a process of an enabled environment otherwise runs
unpatched, its line naming the cause and the fix.

The tool works in the program's process without changing what the program sees: stdout and
stderr as the program left them (closed, or redirected to an object that cannot flush), its
``sys.path`` untouched (the hook routes the tool's own imports).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from dataclasses import dataclass

from ...errors import EnvironmentProblem, InputError, ToolError
from ...vocabulary import Backend, Origin, plural
from .spec import LaunchSpec, hint_for, is_run_source

@dataclass(frozen=True)
class Outcome:
    """What one call of ``after_import`` did, for the hook: whether anything is left to do, the
    line to say (None: nothing), and the exit code to stop the process with (None: go on)."""

    done: bool
    line: str | None = None
    exit_code: int | None = None


class _Sink:
    """A stream that writes to ``target`` when it can (nowhere for None) and always flushes: what the
    program's own stream cannot do costs nothing."""

    def __init__(self, target=None):
        self._target = target

    @property
    def target(self):
        return self._target

    def write(self, text: str) -> int:
        try:
            self.target.write(text)
        except Exception:  # noqa: BLE001 — the program's sink, not ours to fix
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self.target.flush()
        except Exception:  # noqa: BLE001 — the program's sink, not ours to fix
            pass

    def isatty(self) -> bool:
        try:
            return bool(self.target.isatty())
        except Exception:  # noqa: BLE001 — the program's sink: not a terminal
            return False


class _Stderr(_Sink):
    """Where build messages go: stderr as the program has it at the moment (closed: nowhere;
    ``redirect_stderr`` to a write-only object: there)."""

    @property
    def target(self):
        return sys.stderr


class _Quiet(_Sink):
    """Where -q sends build messages: nowhere (no file opened, in the program's process or the CLI's)."""

    def write(self, text: str) -> int:
        return len(text)


def build_log(quiet: bool):
    """The build messages' stream: stderr as it is when they are written, or nowhere (-q)."""
    return _Quiet() if quiet else _Stderr()


def read(text: str | None, mode: str, source: str, data: tuple[str | None, str | None, str] | None = None, *,
         isolated: bool = False) -> tuple[LaunchSpec | None, Outcome | None]:
    """The launch spec in ``text`` (from ``source``: ``$TORCHGEN_PATCH_RUN``, or an enabled
    environment's data file), or what to do instead: a ``$TORCHGEN_PATCH_RUN`` that is no launch spec
    stops the process (exit 2); an enabled environment's file that is none (damaged, edited) leaves
    the program running unpatched, said in one line: a file in site-packages must never make the
    environment's programs unusable. ``data``: in an enabled environment whose process has
    ``$TORCHGEN_PATCH_RUN`` too, its data file (text, why it cannot be read, path); ``isolated``: the
    interpreter runs with -I or -E (``governing`` decides between the two)."""
    if data is not None:
        return governing(text, mode, data, isolated=isolated)
    try:
        return LaunchSpec.parse(text, source), None
    except InputError as e:
        _DONE.update(("kernels", "runtime"))
        if is_run_source(source):  # run's own variable, not what run writes: stop, as every bad input does
            return None, Outcome(True, e.render(), e.exit_code)
        return None, Outcome(True, f"torchgen-patch: NOT active in pid {os.getpid()}: {e.message} (hint: {e.hint})")


def governing(env_text: str | None, mode: str, data: tuple[str | None, str | None, str], *,
              isolated: bool) -> tuple[LaunchSpec | None, Outcome | None]:
    """An enabled environment's process where ``$TORCHGEN_PATCH_RUN`` is set as well: the variable governs
    only where run's own hook passed it on (``mode`` "run": its PYTHONPATH entry loaded the hook, so the
    environment chose this process's code already), never under -I or -E, and never with fewer kernels,
    runtime ops or checks than the environment's data file; it never chooses where the tool and its
    dependencies come from nor the compiler (the file's ``roots`` and ``toolchain``; the hook imports the
    tool from where it is itself).
    Where the file governs instead the Outcome is not done and carries the one line that says why; a
    file that cannot be read leaves the variable governing under run, else the program unpatched."""
    text, broken, path = data
    try:
        own = LaunchSpec.parse(text, path) if text and not broken else None
    except InputError:
        own = None
    if own is None:  # the file cannot be its spec: run's variable as before the file, else the file's own line
        return read(env_text, mode, "$TORCHGEN_PATCH_RUN") if mode == "run" and not isolated else \
            _damaged(text, broken, path)
    why = "python -I or -E: the environment chooses nothing" if isolated else None
    if why is None and mode != "run":
        why = "it did not come with run's PYTHONPATH entry, and only run passes it on in an enabled environment"
    if why is None:
        try:
            env = LaunchSpec.parse(env_text, "$TORCHGEN_PATCH_RUN")
        except InputError as e:
            why = e.message.removeprefix("$TORCHGEN_PATCH_RUN: ")
        else:
            why = weaker(env, own)
            if why is None:
                return dataclasses.replace(env, roots=own.roots, toolchain=own.toolchain,
                                           saved_library=own.saved_library), None
    return own, Outcome(False, f"torchgen-patch: $TORCHGEN_PATCH_RUN not used in pid {os.getpid()} "
                               f"({_who('enable')}): {why}; this environment's own launch spec governs ({path})")


def weaker(env: LaunchSpec, own: LaunchSpec) -> str | None:
    """How the spec ``env`` asks for less than ``own`` (an enabled environment's), or None."""
    if env.ops is not None and (own.ops is None or not set(own.ops) <= set(env.ops)):
        return f"it asks for {plural(len(env.ops), 'op')}, fewer than the environment installs"
    if not set(own.runtime_ops) <= set(env.runtime_ops):
        return "it leaves out runtime ops the environment installs"
    if own.check_saved is not None and env.check_saved is None:
        return "it turns off the saved-tensor check the environment runs"
    if own.check_saved is not None and env.check_every > own.check_every:
        return f"it checks 1 step in {env.check_every}, fewer than the environment's 1 in {own.check_every}"
    return None


def _damaged(text: str | None, broken: str | None, path: str) -> tuple[LaunchSpec | None, Outcome | None]:
    """An enabled environment's data file that cannot be its spec: the program runs unpatched, said once."""
    if broken or not text:
        why = broken or "it is empty"
        return None, Outcome(True, f"torchgen-patch: NOT active in pid {os.getpid()}: {path}: {why} "
                                   f"(hint: {hint_for(path)})")
    return read(text, "enable", path)


def resolve(spec: LaunchSpec, log) -> tuple[str | None, str | None]:
    """The one call into the build machinery: (the compiled library of the plan's kernels, where it
    came from), the library None where install() needs none (the Python backend; installed prebuilt
    kernels that fit). ``spec.library``: the build an enabled environment made (or run's
    --runtime-op check found), used while it is this torch's; else found by the inputs' key, built
    under the cache's lock where the cache lacks it."""
    if spec.backend != Backend.CPP:
        return None, None
    from .. import artifact_at, library as compose

    refused = None
    if spec.library:
        try:
            return artifact_at(spec.library, Origin.CACHE).path, "from the cached build"
        except ToolError as e:  # gone, another torch's, not this account's to use: found or built as without it
            refused = e
    try:
        art = compose(spec.options, verbose=spec.verbose, log=log)
    except ToolError as e:
        if refused is None:
            raise
        raise _both(refused, e) from None
    if art.origin == Origin.PREBUILT:  # install() finds them itself
        return None, f"from the prebuilt kernels ({art.prebuilt})"
    return art.path, "built now" if art.origin == Origin.BUILD else "from the cached build"


def _both(named: ToolError, instead: ToolError) -> ToolError:
    """The named build could not be used and none could be had instead: both causes in one error, the
    named build's first (its fix is the one that helps), of the kind of the second. Where the second is
    the first again (the cache's lookup reached the same build, refused by the same check), it is said
    once, as is a fix both give."""
    if (named.location, named.message) == (instead.location, instead.message):
        return instead
    message = f"{named.summary()}; and none can be had instead: {instead.summary()}"
    hint = "; ".join(dict.fromkeys(h for h in (named.hint, instead.hint) if h)) or None
    if isinstance(instead, EnvironmentProblem):
        return EnvironmentProblem(message, hint)
    return InputError(instead.path, instead.line, message, hint)


_DONE: set[str] = set()  # what this process installed already: "kernels", "runtime"


def after_import(name: str, spec: LaunchSpec, mode: str, program_import=None) -> Outcome:
    """Right after ``name`` (torch, or a module of --import) finished importing: install what can be
    installed now. Runtime ops wait until torch and every --import module are imported (a module
    whose own import pulled torch in defines its operators only once it finished); the modules not
    imported yet are imported here (``program_import``: as the program finds them). ``spec``: what
    ``read`` made of the launch spec; ``mode``: "run" or "enable". Kernels that cannot be had leave
    an enabled environment's program running unpatched, said in one line, unless the spec is
    ``strict``; under ``run`` they stop the process."""
    if "runtime" in _DONE:
        return Outcome(True)
    if "torch" not in sys.modules or _importing("torch", name):
        return Outcome(False)  # torch not (wholly) imported yet: its own hook comes once it is
    try:
        with _usable_streams(), _toolchain(spec):
            line = _install(spec, name, mode, program_import)
    except ToolError as e:  # the kernels cannot be had (a refused cache: exit 2; no compiler: exit 3)
        _DONE.update(("kernels", "runtime"))
        if mode == "enable" and not spec.strict:  # every program of an environment goes on: said, not stopped
            return Outcome(True, unpatched_line(e, _who(mode)))
        return Outcome(True, e.render(brief=True), e.exit_code)  # run, or enable --strict: never run unpatched
    except Exception as e:  # noqa: BLE001 — a bug of this tool: report, never break the program's import
        _DONE.update(("kernels", "runtime"))
        line = f"torchgen-patch: NOT active in pid {os.getpid()}: {type(e).__name__}: {e}"
        # enable --strict: a process that cannot have the kernels stops, whatever the cause
        return Outcome(True, line, 3 if mode == "enable" and spec.strict else None)
    return Outcome("runtime" in _DONE, line)


def unpatched_line(e: ToolError, who: str) -> str:
    """The one line of an enabled environment's process that runs unpatched: the cause and its fix."""
    where = f"{e.location.render()}: " if e.location else ""
    hint = f"{e.hint}; " if e.hint else ""
    return (f"torchgen-patch: NOT active in pid {os.getpid()} ({who}), running unpatched: {where}{e.summary()} "
            f"(hint: {hint}`torchgen-patch enable --strict` stops such a process instead)")


def _importing(module: str, done: str) -> bool:
    """Whether ``module`` is being imported right now (its import is what imported torch)."""
    m = sys.modules.get(module)
    return module != done and m is not None and getattr(getattr(m, "__spec__", None), "_initializing", False)


def _who(mode: str) -> str:
    """Which process a line is about: its program (torchrun's launcher imports torch too), its rank."""
    argv0 = (getattr(sys, "argv", None) or [""])[0]
    parts = ["python -c" if argv0 == "-c" else os.path.basename(argv0) or "python"]
    if os.environ.get("RANK") is not None:
        parts.append(f"rank {os.environ['RANK']}")
    if mode == "enable":
        parts.append("enabled")
    return ", ".join(parts)


def _install(spec: LaunchSpec, name: str, mode: str, program_import) -> str | None:
    """Install what is due now; the line to say about it, or None."""
    import importlib

    from .. import install as inst

    line, refused = "", False
    if "kernels" not in _DONE:
        _DONE.add("kernels")
        library, origin = resolve(spec, build_log(spec.quiet))
        rep = inst.install(None if spec.ops is None else list(spec.ops), backend=spec.backend, library=library,
                           options=spec.options, check_saved=spec.check_saved, check_every=spec.check_every,
                           check_quiet=spec.quiet, saved_library=spec.saved_library)
        if spec.findings is not None and spec.check_saved is not None:  # --findings: the check writes there too
            from ...saved import findings_to

            findings_to(spec.findings)
        line = kernels_line(len(rep.registered) + len(rep.already), spec.backend, len(rep.refused), origin,
                            len(rep.optimizers))
        refused = bool(rep.refused)
    waiting = [m for m in spec.imports if _importing(m, name)]
    if spec.runtime_ops and not waiting:
        _DONE.add("runtime")
        part = "; runtime ops" if line else "torchgen-patch: runtime ops"
        try:
            for m in spec.imports:  # the program's own modules: found as the program finds them
                (program_import or importlib.import_module)(m)
            r = inst.install(backend=spec.backend, runtime_ops=list(spec.runtime_ops), options=spec.options,
                             boxed_library=spec.boxed)
            line += f"{part}: {len(r.registered) + len(r.already)} active, {len(r.refused)} refused"
            refused = refused or bool(r.refused)
        except Exception as e:  # noqa: BLE001 — said on the start line; the program goes on
            line += f"{part} NOT active: " + (e.message if isinstance(e, ToolError) else f"{type(e).__name__}: {e}")
    elif not spec.runtime_ops:
        _DONE.add("runtime")
    if line and (not spec.quiet or "NOT active" in line or refused):
        return process_line(line, os.getpid(), _who(mode))
    return None


def kernels_line(n: int, backend: str, refused: int, origin: str | None, optimizers: int) -> str:
    """What the kernels did in a process, as its line says it (``origin``: where the library came from)."""
    return (f"torchgen-patch: {plural(n, 'kernel')} active ({backend}), {refused} refused"
            + (f", {origin}" if origin else "")
            + f"; {plural(optimizers, 'optimizer entry', 'optimizer entries')} active")


def process_line(line: str, pid: int, who: str) -> str:
    """A process's line: what happened, and which process it is."""
    return f"{line}, in pid {pid} ({who})"


@contextlib.contextmanager
def _toolchain(spec: LaunchSpec):
    """While the tool works in the program's process: a process started without PATH builds with the
    toolchain `enable` recorded (any other, or with none recorded, with its own), and a build that failed
    in its toolchain within the hour is not tried again."""
    from ..compile import recorded, remembering

    with recorded(spec.toolchain), remembering():
        yield


@contextlib.contextmanager
def _usable_streams():
    """While the tool works in the program's process: a closed file descriptor 2 (``2>&-``) is the
    null device, so a file it opens never becomes the stderr of a compiler it starts (closed again
    afterwards, as the program had it); and ``sys.stdout``/``sys.stderr`` that are None (closed at
    start) or cannot flush (``redirect_stderr`` to a write-only object) are wrapped, so code that
    flushes them (cpp_extension does) works, and what is written still reaches the program's sink."""
    try:
        os.fstat(2)
        closed = False
    except OSError:
        closed = True
    if closed:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 2:
            os.dup2(fd, 2)
            os.close(fd)
    saved = {n: getattr(sys, n) for n in ("stdout", "stderr")}
    wrapped = {n: _Sink(s) for n, s in saved.items()
               if s is None or not callable(getattr(s, "flush", None)) or not callable(getattr(s, "write", None))}
    for n, w in wrapped.items():
        setattr(sys, n, w)
    try:
        yield
    finally:
        for n, w in wrapped.items():
            if getattr(sys, n) is w:
                setattr(sys, n, saved[n])
        if closed:
            os.close(2)

