"""The subcommands: each reads its inputs, runs the pipeline, prints, returns
an exit code. Kept apart from argument parsing so tests can call them."""

from __future__ import annotations

import sys

from . import load, report



def add_subcommands(sub, add_sources) -> None:
    """Subcommands beyond scan/lint are registered here as they are built."""
    for mod in _extensions():
        mod.add_parser(sub, add_sources)


def _extensions():
    import importlib

    mods = []
    for name in ("gen_cmd", "build_cmd", "verify_cmd", "diff_cmd"):
        try:
            mods.append(importlib.import_module(f"torchgen_patch.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"torchgen_patch.{name}":
                raise
    return mods


def inputs(args, use_overlay: bool = True, full: bool = True, cpp: bool = False):
    """Sources → scan → overlay, from the common command-line arguments.
    ``full=False``: the caller needs only the summary (lint)."""
    from . import overlay as ov
    from .render import template_names

    sources = load.Sources.resolve(args.native_functions, args.tags, args.pytorch_root)
    scan = load.scan(sources, use_cache=not args.no_cache, full=full, cpp=cpp)
    if args.no_overlay or not use_overlay:
        return scan, ov.empty()
    path = args.overlay or ov.default_path()
    if path is None:
        return scan, ov.empty()
    return scan, ov.load(path, scan, template_names(), shipped=args.overlay is None)


def run(args) -> int:
    if args.cmd == "scan":
        return cmd_scan(args)
    if args.cmd == "lint":
        return cmd_lint(args)
    return args.func(args)


def _runtime(scan) -> int:
    from .installer import installed_ops
    from .runtime import cross_check

    drifts = cross_check(scan, set(installed_ops()))
    for d in drifts:
        print(f"drift: {d.op}: {d.kind}: {d.detail}", file=sys.stderr)
    print(f"against runtime: {len(drifts)} drift(s) over {len(scan.records)} functions", file=sys.stderr)
    return 1 if drifts else 0


def cmd_scan(args) -> int:
    scan, _overlay = inputs(args)
    verdicts = set(args.verdict) if args.verdict else None
    out = report.scan_json(scan, verdicts) if args.format == "json" else report.scan_text(scan, verdicts)
    sys.stdout.write(out)
    return _runtime(scan) if args.against_runtime else 0


def cmd_lint(args) -> int:
    from .lint import findings

    scan, overlay = inputs(args, full=args.against_runtime)
    fs = findings(scan, overlay)
    sys.stdout.write(report.lint_json(fs, scan) if args.format == "json" else report.lint_text(fs, scan))
    rc = 1 if fs else 0
    if args.against_runtime:
        rc = max(rc, _runtime(scan))
    return rc


