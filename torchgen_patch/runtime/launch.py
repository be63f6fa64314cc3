"""`torchgen-patch run`: run any program with the kernels installed in every Python process
it starts, and nothing else changed.

The parent never imports torch. It checks what it can without it (the program, the interpreter's
flags, the plan and ``--op``), then runs the program with ``runtime/site/`` first on PYTHONPATH
(the user's own entries kept after it, verbatim; an empty PYTHONPATH adds nothing) and
``$TORCHGEN_PATCH_RUN`` saying what to install. That folder's ``sitecustomize`` only adds an
import hook: when a process of the program first imports torch, the kernels are installed right
after torch has finished importing (``after_import``), so settings the program makes before
its own ``import torch`` (OMP_NUM_THREADS, TORCH_* variables) reach torch as without ``run``.
The library is resolved there, in the first process that needs it: the installed prebuilt
kernels, the cached build, or a build under the cache's lock (torchrun's workers wait for it and
reuse it). A ``sitecustomize`` of the user's own, further on the path, still runs.

With ``--runtime-op`` the patterns and ``--import`` modules need torch: they are checked, and the
libraries built, in one separate process before the program starts.

``python -I``, ``-E`` and ``-S`` skip PYTHONPATH or site, so a process started so could not be
patched: ``run`` refuses them (exit 2) rather than run the program unpatched.
"""

from __future__ import annotations

import json
import os
import re
import sys

from .. import cache

ENV = "TORCHGEN_PATCH_RUN"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?t?$")
# interpreter flags that keep the kernels out, and why
_BLOCKING = {"I": "isolated mode ignores PYTHONPATH", "E": "it ignores PYTHONPATH",
             "S": "it skips the site module, which loads the hook"}


def interpreter_flags(program: list[str]) -> set[str]:
    """The single-letter options of a ``python`` command line, up to its script, -c or -m."""
    if not program or not _PYTHON.match(os.path.basename(program[0])):
        return set()
    flags: set[str] = set()
    args = iter(program[1:])
    for a in args:
        if a in ("-", "--") or not a.startswith("-"):
            break
        if a.startswith("--"):
            if a == "--check-hash-based-pycs":
                next(args, None)
            continue
        for i, c in enumerate(a[1:]):
            if c in "cm":  # the program follows
                return flags
            if c in "WX":  # takes a value: the rest of this word, or the next one
                if i == len(a) - 2:
                    next(args, None)
                break
            flags.add(c)
    return flags


def check_program(program: list[str]) -> None:
    """Refuse a Python command line whose flags would run the program unpatched."""
    from ..errors import InputError

    for flag, why in _BLOCKING.items():
        if flag in interpreter_flags(program):
            raise InputError(None, None, f"{os.path.basename(program[0])} -{flag}: {why}, so the kernels could "
                                         "not be installed in it",
                             f"drop -{flag}, or call torchgen_patch.install() in the program itself")


def prepare(opts, backend: str, ops: list[str] | None, runtime_ops: list[str], imports: list[str],
            verbose: bool = False, quiet: bool = False, check_saved: str | None = None) -> dict[str, str]:
    """The environment the program runs with. ``opts`` (sources.Options) travel along with absolute
    paths, so each process installs from the same inputs and overlay as the parent's plan, whatever
    its working directory. ``quiet``: no build messages, and each process says only when the patch
    is NOT active. ``check_saved``: each process also turns the saved-tensor check on in that mode.
    Imports no torch here; with runtime ops, one separate process checks them."""
    import dataclasses

    def absolute(p):
        return os.path.abspath(p) if p else p

    opts = dataclasses.replace(opts, native_functions=absolute(opts.native_functions), tags=absolute(opts.tags),
                               overlay=absolute(opts.overlay))
    spec = {"backend": backend, "ops": ops, "runtime_ops": runtime_ops, "imports": imports,
            "library": None, "boxed": None, "options": dataclasses.asdict(opts), "package": PKG_PARENT,
            "quiet": quiet, "verbose": verbose, "check_saved": check_saved}
    if runtime_ops:
        spec = _checked_elsewhere(spec)
    user = os.environ.get("PYTHONPATH")
    env = {ENV: json.dumps(spec), "PYTHONPATH": SITE + os.pathsep + user if user else SITE}
    if os.environ.get(cache.ENV):  # absolute: a process that starts in another directory finds the same cache
        env[cache.ENV] = cache.directory()
    return env


def _checked_elsewhere(spec: dict) -> dict:
    """Run ``_check`` in a separate Python (this one's), so the parent never imports torch; its
    error comes back as this process's error (same message, same exit code)."""
    import subprocess

    from ..errors import EnvironmentProblem, InputError

    code = ("import sys; sys.path[0] = sys.argv[1]; from torchgen_patch.runtime.launch import _check_main; "
            "_check_main()")
    r = subprocess.run([sys.executable, "-c", code, PKG_PARENT], input=json.dumps(spec), stdout=subprocess.PIPE,
                       text=True)
    try:
        answer = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise EnvironmentProblem(f"checking the runtime ops failed (exit {r.returncode})") from None
    if "error" in answer:
        e = answer["error"]
        if e["code"] == 3:
            raise EnvironmentProblem(e["message"], e["hint"])
        raise InputError(e["path"], e["line"], e["message"], e["hint"])
    return answer["spec"]


def _check_main() -> None:
    """The separate process of ``_checked_elsewhere``: spec on stdin, answer on stdout's last line."""
    from ..errors import InputError

    spec = json.loads(sys.stdin.read())
    try:
        from .install import expand_patterns
        from .registry import import_modules

        import_modules(spec["imports"])
        spec["runtime_ops"] = expand_patterns(spec["runtime_ops"])
        spec["library"], spec["boxed"] = resolve(spec, _log(spec))
        answer = {"spec": spec}
    except InputError as e:
        answer = {"error": {"message": e.message, "hint": e.hint, "path": e.path, "line": e.line,
                            "code": e.exit_code}}
    sys.stdout.write(json.dumps(answer) + "\n")


class _Quiet:
    """Where -q sends build messages: nowhere (no file opened in the program's process)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _log(spec: dict):
    return _Quiet() if spec.get("quiet") else sys.stderr


def resolve(spec: dict, log) -> tuple[str | None, str | None]:
    """The one call into the build machinery: (the compiled library of the plan's kernels, the boxed
    library for runtime ops), each None where install() needs none (the Python backend; installed
    prebuilt kernels that fit; no runtime ops). Builds only what the cache lacks, under its lock."""
    if spec["backend"] != "cpp":
        return spec["library"], spec["boxed"]
    from ..sources import Options
    from . import library as compose
    from .build import build_boxed

    opts, verbose = Options(**spec["options"]), spec.get("verbose", False)
    library = spec["library"]
    if library is None:
        # installed prebuilt kernels that fit: install() finds them itself (None), nothing compiles
        art = compose(opts, verbose=verbose, log=log)
        library = None if art.origin == "prebuilt" else art.path
    boxed = spec["boxed"]
    if spec["runtime_ops"] and boxed is None:
        boxed = build_boxed(verbose=verbose, log=log).path
    return library, boxed


_DONE: set[str] = set()  # what this process installed already: "kernels", "runtime"


def after_import(name: str) -> None:
    """In each process of the program, right after ``name`` (torch, or a module of --import)
    finished importing: install what can be installed now, say so. Runtime ops wait until torch
    and every --import module are imported (a module whose own import pulled torch in defines its
    operators only once it finished); the modules not imported yet are imported here, as before."""
    spec = os.environ.get(ENV)
    if not spec or "torch" not in sys.modules or "runtime" in _DONE or _importing("torch", name):
        return  # torch not (wholly) imported yet: its own hook comes once it is
    spec = json.loads(spec)
    from ..errors import InputError

    try:
        _install(spec, name)
    except InputError as e:  # the kernels cannot be had (no compiler, a refused cache): stop, never run unpatched
        _DONE.update(("kernels", "runtime"))
        print(e.render(), file=sys.stderr, flush=True)
        import threading

        if threading.current_thread() is not threading.main_thread():
            os._exit(e.exit_code)  # SystemExit would end this thread only, and the program go on unpatched
        raise SystemExit(e.exit_code) from None
    except Exception as e:  # noqa: BLE001 — a bug of this tool: report, never break the program's import
        _DONE.update(("kernels", "runtime"))
        print(f"torchgen-patch: NOT active in pid {os.getpid()}: {type(e).__name__}: {e}", file=sys.stderr,
              flush=True)


def _importing(module: str, done: str) -> bool:
    """Whether ``module`` is being imported right now (its import is what imported torch)."""
    m = sys.modules.get(module)
    return module != done and m is not None and getattr(getattr(m, "__spec__", None), "_initializing", False)


def _install(spec: dict, name: str) -> None:
    import importlib

    from ..sources import Options
    from . import install as inst

    opts = Options(**spec["options"])
    line, refused, optimizers = "", False, ""
    if "kernels" not in _DONE:
        _DONE.add("kernels")
        library, _ = resolve(spec, _log(spec))
        rep = inst.install(spec["ops"], backend=spec["backend"], library=library, options=opts,
                           check_saved=spec.get("check_saved"))
        line = f"torchgen-patch: {len(rep.registered)} kernels active ({spec['backend']}), {len(rep.refused)} refused"
        optimizers = f"; {len(rep.optimizers)} optimizer entries active"
        refused = bool(rep.refused)
    waiting = [m for m in spec["imports"] if _importing(m, name)]
    if spec["runtime_ops"] and not waiting:
        _DONE.add("runtime")
        part = "; runtime ops" if line else "torchgen-patch: runtime ops"
        try:
            for m in spec["imports"]:
                importlib.import_module(m)
            r = inst.install(backend=spec["backend"], runtime_ops=spec["runtime_ops"], options=opts,
                             boxed_library=spec["boxed"])
            line += f"{part}: {len(r.registered)} active, {len(r.refused)} refused"
        except Exception as e:  # noqa: BLE001
            line += f"{part} NOT active: {type(e).__name__}: {e}"
    elif not spec["runtime_ops"]:
        _DONE.add("runtime")
    if line and (not spec.get("quiet") or "NOT active" in line or refused):
        print(f"{line}{optimizers}, in pid {os.getpid()}", file=sys.stderr, flush=True)


def run_program(program: list[str], env: dict[str, str]) -> int:
    """Run ``program``; forward SIGTERM and SIGHUP to it (a scheduler stopping the job stops the
    program), leave SIGINT to the terminal's process group (the program gets its own Ctrl-C once),
    and return its exit status the way a shell reports it (128 + N for a program killed by N)."""
    import signal
    import subprocess

    proc = subprocess.Popen(program, env=env)
    forwarded = {s: signal.signal(s, lambda signum, _frame: proc.send_signal(signum))
                 for s in (signal.SIGTERM, signal.SIGHUP)}
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc = proc.wait()
    finally:
        for s, h in forwarded.items():
            signal.signal(s, h)
        signal.signal(signal.SIGINT, previous_int)
    return 128 - rc if rc < 0 else rc
