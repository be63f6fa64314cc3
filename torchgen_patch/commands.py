"""The subcommands: each reads its inputs, runs the pipeline, prints, returns
an exit code. Kept apart from argument parsing so tests can call them."""

from __future__ import annotations

import sys

from . import load, report



def add_subcommands(sub, add_sources) -> None:
    """The subcommands beyond scan/lint, each in its own module."""
    from . import build_cmd, diff_cmd, gen_cmd, verify_cmd

    for mod in (gen_cmd, build_cmd, verify_cmd, diff_cmd):
        mod.add_parser(sub, add_sources)


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
    from . import baseline, formats
    from .errors import InputError
    from .lint import findings

    if args.paths and (args.native_functions or args.pytorch_root):
        raise InputError(None, None, "give yaml paths or --native-functions/--pytorch-root, not both")
    if (args.imports or args.namespace) and not args.runtime:
        raise InputError(None, None, "--import and --namespace go with --runtime")
    runs = []
    if args.runtime:
        if args.paths or args.native_functions or args.pytorch_root or args.generated:
            raise InputError(None, None, "--runtime lints the live registry: no yaml inputs or --generated")
        from . import runtime_ops

        runtime_ops.import_modules(args.imports)
        fs = runtime_ops.findings(runtime_ops.uncovered(args.namespace))
    else:
        for path in args.paths or [None]:
            if path is not None:
                args.native_functions, args.tags = path, None
            scan, overlay = inputs(args, full=args.against_runtime or bool(args.generated))
            runs.append((scan, overlay))
        fs = [f for scan, overlay in runs for f in findings(scan, overlay)]
    if args.generated:
        if len(runs) != 1:
            raise InputError(None, None, "--generated checks one yaml at a time")
        from .gencheck import check
        from .plan import make_plan

        from .lint import RULE_MISSING

        # with generated kernels, a missing op is covered when its kernel is there and current
        scan, overlay = runs[0]
        plan = make_plan(scan, overlay)
        planned = set(plan.ops())
        fs = [f for f in fs if not (f.rule == RULE_MISSING and f.op in planned)] + check(plan, args.generated, scan)
    if args.write_baseline:
        from .write import atomic_write

        atomic_write(args.write_baseline, baseline.render(fs).encode())
        print(f"wrote {len(fs)} finding(s) to {args.write_baseline}", file=sys.stderr)
        return 0
    if args.baseline:
        fs = baseline.apply(fs, args.baseline)
    fs = sorted(fs, key=lambda f: (f.path, f.line, f.op, f.rule))
    if args.format == "lintrunner":
        sys.stdout.write(formats.lintrunner(fs))
        return 0
    if args.format == "sarif":
        from . import __version__

        sys.stdout.write(formats.sarif(fs, __version__))
    elif args.format == "github":
        sys.stdout.write(formats.github(fs))
    elif args.runtime and args.format in ("json", "text"):
        sys.stdout.write(report.runtime_lint(fs, args.format))
    elif args.format == "json":
        sys.stdout.write(report.lint_json(fs, [s for s, _ in runs]))
    else:
        sys.stdout.write(report.lint_text(fs, [s for s, _ in runs]))
    rc = 1 if fs else 0
    if args.against_runtime:
        for scan, _ in runs:
            rc = max(rc, _runtime(scan))
    return rc
