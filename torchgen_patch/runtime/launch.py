"""`torchgen-patch run`: run any program with the kernels installed in every Python process
it starts, with no change to the program.

The parent builds what is needed once (the library of the plan's kernels, the boxed library
for runtime ops), then runs the program with ``runtime/site/`` first on PYTHONPATH and
``$TORCHGEN_PATCH_RUN`` saying what to install: that directory's ``sitecustomize`` calls
``startup()`` at interpreter start in each process (torchrun's workers inherit both), which
loads the prebuilt libraries (never compiles), registers, and prints one line to stderr.
A ``sitecustomize`` of the user's own, further on the path, still runs after it.
"""

from __future__ import annotations

import json
import os
import sys

ENV = "TORCHGEN_PATCH_RUN"
SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


def prepare(plan, opts, backend: str, ops: list[str] | None, runtime_ops: list[str], imports: list[str],
            verbose: bool = False) -> dict[str, str]:
    """Build once, here; return the environment the program runs with. ``opts`` (sources.Options)
    travel along, so each process installs from the same inputs and overlay as this plan."""
    import dataclasses

    spec = {"backend": backend, "ops": ops, "runtime_ops": runtime_ops, "imports": imports,
            "library": None, "boxed": None, "options": dataclasses.asdict(opts)}
    if backend == "cpp":
        from ..codegen import render
        from .build import build, build_boxed

        spec["library"] = build(render(plan, 2), plan.ops(), 2, verbose=verbose).path
        if runtime_ops:
            spec["boxed"] = build_boxed(verbose=verbose).path
    pkg_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = [SITE, pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {ENV: json.dumps(spec), "PYTHONPATH": os.pathsep.join(path)}


def startup(site_file: str) -> None:
    """At interpreter start, in each process of the program: install, say so, chain on."""
    spec = os.environ.get(ENV)
    if spec:
        try:
            _install(json.loads(spec))
        except Exception as e:  # noqa: BLE001 — report, never break the user's interpreter
            print(f"torchgen-patch: NOT active in pid {os.getpid()}: {type(e).__name__}: {e}", file=sys.stderr)
    _chain(os.path.dirname(os.path.abspath(site_file)))


def _install(spec: dict) -> None:
    import importlib

    from ..sources import Options
    from . import install as inst

    opts = Options(**spec["options"])
    rep = inst.install(spec["ops"], backend=spec["backend"], library=spec["library"], options=opts)
    n, refused = len(rep.registered), len(rep.refused)
    if spec["runtime_ops"]:
        for m in spec["imports"]:
            importlib.import_module(m)
        r = inst.install(backend=spec["backend"], runtime_ops=spec["runtime_ops"], options=opts)
        n, refused = n + len(r.registered), refused + len(r.refused)
    print(f"torchgen-patch: {n} kernels active ({spec['backend']}), {refused} refused, in pid {os.getpid()}",
          file=sys.stderr, flush=True)


def _chain(ours: str) -> None:
    """Run the next sitecustomize on sys.path (the user's or the environment's), if any."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != ours])
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
