"""`torchgen-patch run`: run any program with the kernels installed in every Python process
it starts, with no change to the program.

The parent builds what is needed once (the library of the plan's kernels, the boxed library
for runtime ops), checks the runtime-op patterns, then runs the program with ``runtime/site/``
first on PYTHONPATH (the user's own entries kept after it, verbatim) and ``$TORCHGEN_PATCH_RUN``
saying what to install: that directory's ``sitecustomize`` calls ``startup()`` at interpreter
start in each process (torchrun's workers inherit both), which loads the prebuilt libraries
(never compiles), registers, and prints one line to stderr. A ``sitecustomize`` of the
user's own, further on the path, still runs after it.

What this costs a program: each Python process imports torch at start (a few seconds; and
environment variables a program sets before its own ``import torch``, such as
OMP_NUM_THREADS, come too late). ``python -I``, ``-E`` and ``-S`` skip sitecustomize, so
such processes run unpatched.
"""

from __future__ import annotations

import json
import os
import sys

from .. import cache

ENV = "TORCHGEN_PATCH_RUN"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prepare(plan, opts, backend: str, ops: list[str] | None, runtime_ops: list[str], imports: list[str],
            verbose: bool = False, quiet: bool = False) -> dict[str, str]:
    """Build once, here; return the environment the program runs with. ``opts`` (sources.Options)
    travel along with absolute paths, so each process installs from the same inputs and overlay
    as this plan, whatever its working directory. ``quiet``: no build messages, and each process
    says only when the patch is NOT active."""
    import dataclasses

    def absolute(p):
        return os.path.abspath(p) if p else p

    opts = dataclasses.replace(opts, native_functions=absolute(opts.native_functions), tags=absolute(opts.tags),
                               overlay=absolute(opts.overlay))
    spec = {"backend": backend, "ops": ops, "runtime_ops": runtime_ops, "imports": imports,
            "library": None, "boxed": None, "options": dataclasses.asdict(opts), "package": PKG_PARENT,
            "quiet": quiet}
    if runtime_ops:  # the patterns are checked here, once, not in every process
        from .install import expand_patterns
        from .registry import import_modules

        import_modules(imports)
        spec["runtime_ops"] = expand_patterns(runtime_ops)
    if backend == "cpp":
        from . import library
        from .build import build_boxed

        log = open(os.devnull, "w") if quiet else sys.stderr
        # installed prebuilt kernels that fit: each process finds them itself (library None), nothing compiles
        art = library(opts, plan=plan, verbose=verbose, log=log)
        spec["library"] = None if art.origin == "prebuilt" else art.path
        if runtime_ops:
            spec["boxed"] = build_boxed(verbose=verbose, log=log).path
    user = os.environ.get("PYTHONPATH")
    env = {ENV: json.dumps(spec), "PYTHONPATH": SITE if user is None else SITE + os.pathsep + user}
    if os.environ.get(cache.ENV):  # absolute: a process that starts in another directory finds the same cache
        env[cache.ENV] = cache.directory()
    return env


def startup(site_file: str) -> None:
    """At interpreter start, in each process of the program: install, say so, chain on."""
    if getattr(sys, "_torchgen_patch_site", False):  # a second site folder on the path: once is enough
        return
    sys._torchgen_patch_site = True
    spec = os.environ.get(ENV)
    if spec:
        try:
            _install(json.loads(spec))
        except Exception as e:  # noqa: BLE001 — report, never break the user's interpreter
            print(f"torchgen-patch: NOT active in pid {os.getpid()}: {type(e).__name__}: {e}", file=sys.stderr)
    _chain(os.path.dirname(os.path.realpath(site_file)))


def _install(spec: dict) -> None:
    import importlib

    from ..sources import Options
    from . import install as inst

    opts = Options(**spec["options"])
    rep = inst.install(spec["ops"], backend=spec["backend"], library=spec["library"], options=opts)
    line = f"torchgen-patch: {len(rep.registered)} kernels active ({spec['backend']}), {len(rep.refused)} refused"
    if spec["runtime_ops"]:
        try:
            for m in spec["imports"]:
                importlib.import_module(m)
            r = inst.install(backend=spec["backend"], runtime_ops=spec["runtime_ops"], options=opts,
                             boxed_library=spec["boxed"])
            line += f"; runtime ops: {len(r.registered)} active, {len(r.refused)} refused"
        except Exception as e:  # noqa: BLE001
            line += f"; runtime ops NOT active: {type(e).__name__}: {e}"
    if not spec.get("quiet") or "NOT active" in line or rep.refused:
        print(f"{line}, in pid {os.getpid()}", file=sys.stderr, flush=True)


def _chain(ours: str) -> None:
    """Run the next sitecustomize on sys.path (the user's or the environment's), if any."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.realpath(p or ".") != ours])
    if spec is not None and spec.loader is not None and os.path.dirname(os.path.realpath(spec.origin)) != ours:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


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
