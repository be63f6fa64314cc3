"""`torchgen-patch run`: run any program with the kernels installed in every Python process it
starts, and nothing else changed; and the install step that `run` and `enable` share in each process.

The parent never imports torch. It checks what it can without it (the program: its interpreter's
flags, seen through ``env`` and a script's first line too; the plan and ``--op``), then runs the
program with ``runtime/site/`` first on PYTHONPATH (the user's own entries kept after it, verbatim;
an empty PYTHONPATH adds nothing) and ``$TORCHGEN_PATCH_RUN`` saying what to install and where this
tool and its dependencies are installed. That folder's hook (``site/_torchgen_patch_hook.py``) waits
for the program's own first ``import torch`` and calls ``after_import`` here right after torch has
finished importing, so settings the program makes before its own ``import torch``
(OMP_NUM_THREADS, TORCH_* variables) reach torch as without ``run``; it also names, in one line,
each Python process the program starts in a way that drops the hook. The library is resolved in
the first process that needs it: the installed prebuilt kernels, the cached build, or a build under
the cache's lock (torchrun's workers wait for it and reuse it).

With ``--runtime-op`` the patterns and ``--import`` modules need torch: they are checked, and the
boxed library built, in one separate process before the program starts; its verdict is cached by
the key of everything it read, so a second launch costs a cache read.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from ... import cache
from ...errors import InputError, ToolError
from ...fs import root as cache_root
from ...vocabulary import Backend
from .process import build_log, resolve
from ..site import _torchgen_patch_hook as hook
from ..site._torchgen_patch_spawn import dropped
from .spec import LaunchSpec

ENV = hook.ENV
SITE = hook.HERE
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# what this tool imports besides itself: taken from where the tool is installed, by name
DEPENDENCIES = ("yaml", "_yaml", "jinja2", "markupsafe", "ninja")


def check_program(program: list[str], env: dict[str, str] | None = None) -> None:
    """Refuse a command line that would run the program unpatched: a Python interpreter with -I, -E
    or -S (named directly, through ``env``, or on a script's first line) or, with ``env`` (the
    environment run gives it), one whose environment drops the hook (``env -i python ...``)."""
    why = dropped(program, env, check_env=env is not None, std=hook.std_module)  # the standard library's shlex
    if why is not None:
        import re

        flag = re.match(r"\S+ -([IES]): ", why)
        fix = f"drop -{flag.group(1)}" if flag else f"keep PYTHONPATH and ${ENV} in its environment"
        raise InputError(None, None, f"{why}, so the kernels could not be installed in it",
                         f"{fix}, or call torchgen_patch.install() in the program itself")


def roots() -> dict[str, str]:
    """The sys.path entries this tool and each of its dependencies are imported from here: the
    program's processes import them from there and nowhere else (the current directory excluded)."""
    import importlib.machinery
    import importlib.util

    cwd = os.getcwd()
    path = [p for p in sys.path if p not in ("", ".") and os.path.abspath(p) != cwd]
    out = {"torchgen_patch": PKG_PARENT}
    for name in DEPENDENCIES:
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None) if module is not None else \
            importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None and module is None:  # an editable install's own finder
            spec = importlib.util.find_spec(name)
        entry = _entry(spec)
        if entry and os.path.abspath(entry) != cwd:
            out[name] = entry
    return out


def _entry(spec) -> str | None:
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:
        locations = list(spec.submodule_search_locations)
        return os.path.dirname(os.path.abspath(locations[0])) if locations and spec.origin else None
    return os.path.dirname(os.path.abspath(spec.origin)) if spec.origin and os.path.isabs(spec.origin) else None


def launch_spec(opts, backend: str, ops: list[str] | None, runtime_ops: list[str], imports: list[str], *,
                verbose: bool = False, quiet: bool = False, library: str | None = None,
                check_saved: str | None = None, strict: bool = False, findings: str | None = None,
                check_every: int = 1) -> LaunchSpec:
    """What every process of the program installs (``$TORCHGEN_PATCH_RUN``, or an enabled
    environment's file). ``opts`` (sources.Options) travel with absolute paths, so each process
    installs from the same inputs and overlay as the parent's plan, whatever its working directory.
    ``check_saved``: each process also turns the saved-tensor check on in that mode, each step checked
    with probability 1/``check_every``; ``findings``: the folder (absolute) where each process writes its
    findings too; ``strict``: an enabled environment's
    process that cannot have the kernels stops (else it runs unpatched, said in one line; under ``run``
    it always stops)."""
    import dataclasses

    from ...vocabulary import CheckMode

    def absolute(p):
        return os.path.abspath(p) if p else p

    opts = dataclasses.replace(opts, native_functions=absolute(opts.native_functions), tags=absolute(opts.tags),
                               overlay=absolute(opts.overlay))
    return LaunchSpec(backend=Backend(backend), ops=None if ops is None else tuple(ops), runtime_ops=tuple(runtime_ops),
                      imports=tuple(imports), library=library, boxed=None, options=opts, quiet=quiet,
                      verbose=verbose, roots=roots(),
                      check_saved=None if check_saved is None else CheckMode(check_saved),
                      strict=strict, findings=findings, check_every=check_every)


def prepare(opts, backend: str, ops: list[str] | None, runtime_ops: list[str], imports: list[str],
            verbose: bool = False, quiet: bool = False, check_saved: str | None = None,
            findings: str | None = None, check_every: int = 1) -> dict[str, str]:
    """The environment the program runs with. ``quiet``: no build messages, and each process says
    only when the patch is NOT active; ``check_saved``: each process also turns the saved-tensor check
    on in that mode, writing its findings to the folder ``findings`` too (absolute). Imports no torch
    here; with runtime ops, one separate process checks them (or the cache has its verdict). A variable
    every process reads that holds no value it takes is refused here."""
    from ...saved.native import variable_problem

    problem = variable_problem()
    if problem is not None:
        raise InputError(None, None, problem, "set it to native or python, or unset it")
    spec = launch_spec(opts, backend, ops, runtime_ops, imports, verbose=verbose, quiet=quiet,
                       check_saved=check_saved, findings=findings, check_every=check_every)
    if runtime_ops:
        import dataclasses

        checked, boxed, library = _runtime_check(spec)
        spec = dataclasses.replace(spec, runtime_ops=tuple(checked), boxed=boxed, library=library)
    user = os.environ.get("PYTHONPATH")
    env = {ENV: spec.to_json(), "PYTHONPATH": SITE + os.pathsep + user if user else SITE}
    if os.environ.get(cache_root.ENV):  # absolute: a process that starts in another directory finds the same cache
        env[cache_root.ENV] = cache_root.directory()
    return env


# ---- the --runtime-op check: in a separate process, its verdict cached by key ---------------------


def _runtime_check(spec: LaunchSpec) -> tuple[list[str], str | None, str | None]:
    """The spec's runtime ops with their patterns expanded, the boxed library for them and the library
    of the plan's kernels (each None where the Python backend or installed prebuilt kernels need
    none), once the patterns and --import modules passed the check; from the cache when nothing it
    read has changed and the builds it names are still there. The libraries are where each process
    looks first (it finds its own where one is gone)."""
    from .. import build_there

    key = _check_key(spec)
    name = f"runtime-check-{key[:32]}.json" if key else None
    hit = cache.read(name) if name else None
    if isinstance(hit, dict) and set(hit) == {"ops", "boxed", "library"} and isinstance(hit["ops"], list) and \
            all(isinstance(o, str) and "::" in o for o in hit["ops"]) and \
            all(v is None or build_there(v) for v in (hit["boxed"], hit["library"])):
        cache_root.note(f"--runtime-op check: the cached verdict ({name})")
        return hit["ops"], hit["boxed"], hit["library"]
    ops, boxed, library = _checked_elsewhere(spec)
    if name:
        cache.write(name, {"ops": ops, "boxed": boxed, "library": library})
    return ops, boxed, library


def _check_key(spec: LaunchSpec) -> str | None:
    """Everything the check's verdict depends on: the patterns, modules, backend and inputs; this
    tool; the Python and its torch (version file); the overlay; and each --import module's files
    (names, sizes, times), as found from the current directory. None: not keyable (no torch found)."""
    import importlib.machinery

    from ...sources import overlay_path

    path = [os.getcwd()] + [p for p in sys.path if p not in ("", ".")]
    torch = importlib.machinery.PathFinder.find_spec("torch", path)
    if torch is None or not torch.origin:
        return None
    fields = spec.to_dict()
    parts: list[bytes | str]  # cache_root.key's
    parts = [json.dumps({k: fields[k] for k in ("backend", "runtime_ops", "imports", "options")}, sort_keys=True),
             sys.executable, os.getcwd(), cache.tool_fingerprint(), os.path.dirname(torch.origin),
             _read(os.path.join(os.path.dirname(torch.origin), "version.py"))]
    overlay = overlay_path(spec.options)
    parts.append(_read(overlay) if overlay else b"")
    for m in spec.imports:
        top = m.split(".")[0]
        if top == "torch":
            continue
        found = importlib.machinery.PathFinder.find_spec(top, path)
        if found is None:
            return None  # the check says why
        parts.append(_stamp(found))
    return cache_root.key(*parts)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _stamp(spec) -> str:
    """A module's files by name, size and modification time (a package: every file under it)."""
    locations = list(spec.submodule_search_locations or [])
    out = []
    for top in locations or [spec.origin]:
        if not locations:
            try:
                st = os.stat(top)
                out.append(f"{top}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                out.append(f"{top}:missing")
            continue
        for base, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for n in sorted(names):
                try:
                    st = os.stat(os.path.join(base, n))
                except OSError:
                    continue
                out.append(f"{os.path.relpath(os.path.join(base, n), top)}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(out)


def _checked_elsewhere(spec: LaunchSpec) -> tuple[list[str], str | None, str | None]:
    """Run ``_check_main`` in a separate Python (this one's), so the parent never imports torch; its
    error comes back as this process's error (same message, same exit code)."""
    import subprocess

    from ...errors import EnvironmentProblem

    code = ("import sys; sys.path[0] = sys.argv[1]; from torchgen_patch.runtime.launch import _check_main; "
            "_check_main()")
    r = subprocess.run([sys.executable, "-c", code, PKG_PARENT], input=spec.to_json(), stdout=subprocess.PIPE,
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
    return answer["ops"], answer["boxed"], answer["library"]


def _check_main() -> None:
    """The separate process of ``_checked_elsewhere``: spec on stdin, answer on stdout's last line.
    What the --import modules print while they import goes nowhere (the program prints it, once)."""
    _stand_down()
    try:
        from ...errors import require_torch
        from ..compile import build_boxed
        from ..registry import import_modules

        spec = LaunchSpec.parse(sys.stdin.read(), f"${ENV}")  # what the program will run with
        require_torch("--runtime-op")  # from the tool's own path, before the current directory is on it
        with _silenced(), _current_directory_first():
            import_modules(list(spec.imports))
        ops = _check_runtime_ops(list(spec.runtime_ops), spec.options)
        log = build_log(spec.quiet)
        boxed = build_boxed(verbose=spec.verbose, log=log).path if spec.backend == Backend.CPP else None
        library, _ = resolve(spec, log)  # torch is imported here anyway: the processes skip the lookup
        answer: dict = {"ops": ops, "boxed": boxed, "library": library}
    except ToolError as e:  # bad input (exit 2) or what this machine lacks (exit 3): the parent says it as its own
        answer = {"error": {"message": e.message, "hint": e.hint, "path": e.path, "line": e.line,
                            "code": e.exit_code}}
    sys.stdout.write(json.dumps(answer) + "\n")


IMPORT_HINT = "the module that defines {} goes in --import MOD"


def _check_runtime_ops(names: list[str], opts) -> list[str]:
    """Each pattern matches an operator and each name given exactly is one this process can patch:
    the names, the patterns expanded."""
    from ...errors import unknown_names
    from ...plan import plan_runtime
    from ..install import expand_patterns, live_op, runtime_overlay
    from ..registry import uncovered

    try:
        ops = expand_patterns(names)
    except InputError as e:  # the pattern's own message; how to make its operators exist, for run
        raise InputError(e.path, e.line, e.message, ((e.hint or "") if e.facts is None else e.facts) + "; "
                         + IMPORT_HINT.format("them")) from None
    todo = plan_runtime(ops, runtime_overlay(opts), live_op, set())
    for name in names:
        why = todo.refused.get(name)
        if why is None:
            continue
        if live_op(name).schema is None:
            unknown = unknown_names("this process's mutating operators without an ADInplaceOrView kernel", [name],
                              [o.name for o in uncovered()])
            raise InputError(None, None, f"--runtime-op {name}: no such operator",
                             (unknown.hint + "; " if unknown.hint else "") + IMPORT_HINT.format("it"))
        raise InputError(None, None, f"--runtime-op {name}: {why}")
    return ops


@contextlib.contextmanager
def _silenced():
    """File descriptors 1 and 2 (and sys.stdout, sys.stderr) to the null device while the block runs."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [null]:
            os.close(fd)


@contextlib.contextmanager
def _current_directory_first():
    """The --import modules are found as ``python -c`` in the current directory finds them."""
    sys.path.insert(0, "")
    try:
        yield
    finally:
        sys.path.remove("")


def _stand_down() -> None:
    """This process is the tool's own: the hook of an enabled environment (or of a run it runs in)
    leaves its torch alone."""
    started = sys.modules.get(hook.NAME)
    if started is not None:
        started.stand_down()


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
