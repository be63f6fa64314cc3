"""The subcommands: each turns its flags into pipeline calls, prints, and
returns an exit code. Nothing below the CLI sees an argparse namespace."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from ..errors import InputError, printable
from ..files import check_output_dir, check_output_file, write_output
from ..sources import Options
from .parser import options


def _drifts(scan) -> int:
    from ..checks.crosscheck import cross_check
    from ..runtime.install import installed_ops

    drifts = cross_check(scan, set(installed_ops()))
    for d in drifts:
        print(f"drift: {d.op}: {d.kind}: {d.detail}", file=sys.stderr)
    print(f"against runtime: {len(drifts)} drift(s) over {scan.total()} functions", file=sys.stderr)
    return 1 if drifts else 0


def _outputs_ok(args, what: str) -> None:
    """Check -o/--output before any work, so a bad path costs nothing and writes nothing."""
    if getattr(args, "output", None):
        check_output_file(args.output, what)


def _emit(args, text: str, what: str) -> None:
    """The command's result: into -o/--output when given, else to stdout."""
    if getattr(args, "output", None):
        write_output(args.output, text.encode(), what)
        _say(args, f"{what}: {args.output}")
    else:
        sys.stdout.write(text)


def _say(args, text: str) -> None:
    """A line for people, on stderr; -q silences it."""
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _summary(args, text: str, to_stdout: bool) -> None:
    """The command's summary for people; -q silences it. On stdout when the result itself went to a
    file (so `make run > log` keeps it), else on stderr beside the result on stdout."""
    if not args.quiet:
        print(text, file=sys.stdout if to_stdout else sys.stderr, flush=True)


def _inputs_note(args, sources) -> None:
    """-v: where each input came from."""
    if args.verbose:
        print("inputs: " + ", ".join(f"{k}={v}" for k, v in sources.describe().items()
                                     if v and not k.endswith("sha256")), file=sys.stderr)


def _progress(args, what: str):
    """A callback for ``(done, total, result)``: -v prints a line per op; on a terminal (not in CI)
    one line rewritten in place; otherwise, and with -q, nothing."""
    if args.quiet:
        return None
    if args.verbose:
        return lambda i, n, r: print(f"{what}: [{i}/{n}] {r.op}: {r.verdict}", file=sys.stderr, flush=True)
    if not sys.stderr.isatty() or os.environ.get("CI"):
        return None

    def show(i, n, r):
        sys.stderr.write(f"\r\033[K{what}: {i}/{n} {r.op}" + ("\r\033[K" if i == n else ""))
        sys.stderr.flush()

    return show


def _needs_torch(what: str) -> None:
    from ..errors import require_torch

    require_torch(what)


def scan(args) -> int:
    from .. import pipeline
    from ..scan.report import scan_json, scan_text

    if args.against_runtime:
        _needs_torch("--against-runtime")
    _outputs_ok(args, "scan report")
    i = pipeline.inputs(dataclasses.replace(options(args), no_overlay=True))
    _inputs_note(args, i.sources)
    verdicts = set(args.verdict) if args.verdict else None
    _emit(args, scan_json(i.scan, verdicts) if args.format == "json" else scan_text(i.scan, verdicts), "scan report")
    return _drifts(i.scan) if args.against_runtime else 0


def lint(args) -> int:
    from .. import pipeline
    from ..diagnostics import Finding, baseline
    from ..diagnostics.render import RENDERERS, Summary, summary_line
    from ..scan.model import VERDICTS

    opts = options(args)
    if args.paths and (args.native_functions or args.pytorch_root or args.tags):
        raise InputError(None, None, "give yaml paths or --native-functions/--tags/--pytorch-root, not both",
                         "each yaml path is read with the tags.yaml beside it")
    if (args.imports or args.namespace) and not args.runtime:
        raise InputError(None, None, "--import and --namespace go with --runtime")
    if args.write_baseline:
        if args.output:
            raise InputError(None, None, "--write-baseline writes the baseline, not a report: drop -o/--output")
        check_output_file(args.write_baseline, "baseline")
    _outputs_ok(args, "lint report")
    runs = []
    if args.runtime:
        if args.paths or args.native_functions or args.tags or args.pytorch_root or args.generated or \
                args.against_runtime:
            raise InputError(None, None, "--runtime lints the live operator registry: no yaml inputs, "
                                         "--generated or --against-runtime")
        if args.no_cache:
            raise InputError(None, None, "--runtime reads no yaml: --no-cache does not apply")
        _needs_torch("lint --runtime")
        from ..diagnostics import rules
        from ..runtime import registry
        from ..runtime.install import runtime_overlay

        overlay = runtime_overlay(opts)  # its skip entries for runtime operators are accepted findings
        registry.import_modules(args.imports)
        fs = [rules.missing_at_runtime(o) for o in registry.uncovered(args.namespace) if not overlay.skipped(o.name)]
        summary = Summary(source="runtime")
    else:
        if args.against_runtime:
            _needs_torch("--against-runtime")
        from ..diagnostics.lint import findings

        for path in args.paths or [None]:
            o = opts if path is None else dataclasses.replace(opts, native_functions=path, tags=None)
            runs.append(pipeline.inputs(o))
            _inputs_note(args, runs[-1].sources)
        fs = [f for i in runs for f in findings(i.scan, i.overlay)]
        counts = {v: sum(i.scan.counts()[v] for i in runs) for v in VERDICTS}
        summary = Summary("yaml", counts, runs[0].sources.torch_version, tuple(i.sources.native for i in runs))
    if args.generated:
        if len(runs) != 1:
            raise InputError(None, None, "--generated checks one yaml at a time")
        from ..checks.generated import check
        from ..diagnostics.rules import MISSING
        from ..plan import make_plan

        # with generated kernels, a missing op is covered when its kernel is there and current
        plan = make_plan(runs[0].scan, runs[0].overlay)
        planned = set(plan.ops())
        fs = [f for f in fs if not (f.rule == MISSING.id and f.op in planned)] + check(plan, args.generated)
    if args.write_baseline:
        write_output(args.write_baseline, baseline.render(fs).encode(), "baseline")
        print(f"wrote {len(fs)} finding(s) to {args.write_baseline}", file=sys.stderr)
        return 0
    if args.baseline:
        fs, accepted = baseline.apply(fs, args.baseline)
        summary = dataclasses.replace(summary, accepted=accepted, baseline=args.baseline)
    fs = sorted(fs, key=Finding.sort_key)
    report = RENDERERS[args.format](fs, summary)
    if args.output or args.format not in ("text", "lintrunner"):  # the text report's last line, for people
        _summary(args, "lint: " + summary_line(fs, summary), bool(args.output))
    _emit(args, report, "lint report")
    if args.format == "lintrunner":
        return 0
    rc = 1 if fs else 0
    if args.against_runtime:
        for i in runs:
            rc = max(rc, _drifts(i.scan))
    return rc


def gen(args) -> int:
    from .. import pipeline
    from ..codegen import cmake_fragment, compiled_sources, output_names, write_all
    from ..files import write_if_changed

    if args.dry_run and not args.output_dependencies:
        raise InputError(None, None, "--dry-run writes only the --output-dependencies file: give one")
    pipeline.check_shards(args.shards)
    # every output checked before any work, so a bad one costs nothing and writes nothing
    if not args.dry_run:
        check_output_dir(args.output)
    if args.output_dependencies:
        check_output_file(args.output_dependencies, "output dependencies", create_dir=True)
        out = args.output.rstrip("/") or "/"
        text = cmake_fragment("TORCHGEN_PATCH_SOURCES", out, compiled_sources(args.shards))
        text += cmake_fragment("TORCHGEN_PATCH_OUTPUTS", out, output_names(args.shards))
    i, plan, files = pipeline.generate(options(args), args.shards, args.strict)
    _inputs_note(args, i.sources)
    if args.output_dependencies:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.output_dependencies)), exist_ok=True)
            write_if_changed(args.output_dependencies, text.encode())
        except OSError as e:
            raise InputError(args.output_dependencies, None, f"cannot write: {e.strerror}") from None
    written = [] if args.dry_run else write_all(args.output, files)
    if args.verbose:
        for name in written:
            print(f"wrote {os.path.join(args.output, name)}", file=sys.stderr)
    for lo in plan.left_out:
        _say(args, f"left out: {lo.op}: {printable(lo.why)}")
    _summary(args, f"gen: {len(plan.kernels)} kernels in {args.shards} shard(s); {len(plan.left_out)} left out; "
                   f"{len(written)} of {len(files)} files written to {args.output}", True)
    return 0


def build(args) -> int:
    from .. import pipeline
    from ..runtime.build import build as build_library

    _needs_torch("build")
    pipeline.check_shards(args.shards)
    _, plan, files = pipeline.generate(options(args), args.shards)
    lib = build_library(files, plan.ops(), args.shards, verbose=args.verbose,
                        log=open(os.devnull, "w") if args.quiet else sys.stderr)
    print(lib.path)
    _say(args, f"build: {len(plan.kernels)} kernels; {'built' if lib.built else 'up to date (cache hit)'}")
    return 0


def install(args) -> int:
    from ..runtime.install import install as install_kernels

    _needs_torch("install")
    rep = install_kernels(args.op, backend=args.backend, options=options(args), verbose=args.verbose,
                          build=not args.no_build)
    if not args.quiet or rep.refused:  # -q: only what did not register
        print(rep.summary())
    return 0


def wheel(args) -> int:
    from .. import pipeline
    from ..runtime import prebuilt
    from ..runtime.build import build as build_library

    from ..codegen.render import MANIFEST

    _needs_torch("wheel")
    out = args.output or "."
    check_output_dir(out)
    opts = Options()
    _, plan, files = pipeline.generate(opts, 2)
    lib = build_library(files, plan.ops(), 2, verbose=args.verbose,
                        log=open(os.devnull, "w") if args.quiet else sys.stderr)
    manifest = json.loads(files[MANIFEST])
    print(prebuilt.make_wheel(out, lib.path, manifest, opts))
    _say(args, f"wheel: {len(plan.kernels)} kernels packed for torch {lib.torch_version}")
    return 0


def verify(args) -> int:
    import platform

    from .. import pipeline
    from ..checks import verify as v
    from ..checks.subclass import SUBCLASSES
    from ..errors import EnvironmentProblem, require_torch
    from ..runtime.install import install as install_kernels

    torch = require_torch("verify")
    _outputs_ok(args, "report")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise EnvironmentProblem("--device cuda: no CUDA device is available")
    opts = options(args)
    _, plan = pipeline.plan(opts)
    ops = plan.pick(args.op)
    xfails = plan.xfails()
    subclasses = SUBCLASSES if args.subclass == "all" else (args.subclass,)
    runs: dict[str, list] = {}
    if args.without_patch or args.both:
        for sub in subclasses:
            runs["without patch" + _on(sub)] = v.run(ops, args.device, False, xfails, sub,
                                                     _progress(args, "verify without patch" + _on(sub)))
    refused = {}
    if not args.without_patch:
        rep = install_kernels(ops, backend=args.backend, plan=plan, verbose=args.verbose)
        refused = rep.refused
        for sub in subclasses:
            name = f"with patch ({args.backend})" + _on(sub)
            runs[name] = v.run(ops, args.device, True, xfails, sub, _progress(args, "verify " + name))
    meta = {"torch": torch.__version__, "device": args.device if args.device == "cpu"
            else f"cuda: {torch.cuda.get_device_name()}", "python": platform.python_version(),
            "ops": len(ops), "command": "torchgen-patch verify " + " ".join(sys.argv[2:])}
    if refused:
        meta["refused"] = "; ".join(f"{k}: {r}" for k, r in sorted(refused.items()))
    if args.format == "json":
        text = v.to_json(runs, meta)
    elif args.format == "markdown":
        text = v.markdown(runs, meta)
    else:
        text = "".join(f"== {name}\n" + v.table(rs) for name, rs in runs.items())
    bad = [r for rs in runs.values() for r in rs if r.patched and r.verdict in v.FAILING]
    for r in bad:
        print(f"verify: {r.op}{_on(r.subclass)}: {r.verdict} {r.message}", file=sys.stderr)
    if args.output:
        _summary(args, "\n".join(f"verify ({args.device}) {line}" for line in v.summary(runs).splitlines()), True)
    _emit(args, text, "report")
    return 1 if bad else 0


def _on(subclass: str) -> str:
    return "" if subclass == "plain" else f", {subclass}"


def run(args) -> int:
    from .. import pipeline
    from ..runtime.launch import prepare, run_program

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise InputError(None, None, "run needs a program after --", "torchgen-patch run -- python train.py")
    if args.imports and not args.runtime_ops:
        raise InputError(None, None, "--import goes with --runtime-op")
    _needs_torch("run")
    opts = options(args)
    _, plan = pipeline.plan(opts)
    if args.op:
        plan.pick(args.op)
    env = dict(os.environ, **prepare(plan, opts, args.backend, args.op, args.runtime_ops, args.imports, args.verbose,
                                       args.quiet))
    try:
        return run_program(program, env)
    except FileNotFoundError:
        raise InputError(None, None, f"no such program: {program[0]}") from None
    except OSError as e:
        raise InputError(None, None, f"cannot run {program[0]}: {e.strerror}") from None


def diff(args) -> int:
    from ..files import read_text
    from ..upstream import patch as up

    if not os.path.isdir(args.pytorch_root):
        raise InputError(args.pytorch_root, None, "--pytorch-root is not a directory")
    if args.check and args.output:
        raise InputError(None, None, "--check writes no diff: drop -o/--output")
    _outputs_ok(args, "diff")
    if args.pr_body:
        if args.check or args.mode != "fix":
            raise InputError(None, None, "--pr-body goes with --mode fix, without --check")
        check_output_file(args.pr_body, "description")
        _needs_torch("--pr-body")
    source = read_text(os.path.join(args.pytorch_root, up.TARGET), "the autograd codegen")
    applied = up.state(source)
    if args.verbose:
        print(f"diff: {os.path.join(args.pytorch_root, up.TARGET)}: "
              + (f"patched (mode {applied})" if applied else "not patched") + f"; writing mode {args.mode}",
              file=sys.stderr)
    if args.check:
        print(f"{up.TARGET}: " + (f"patched (mode {applied})" if applied else "not patched"))
        return 0 if applied else 1
    text = up.tree_diff(args.pytorch_root, source, args.mode)
    body = _pr_body(args.pytorch_root) if args.pr_body else None
    _emit(args, text, "diff")
    if body is not None:
        write_output(args.pr_body, body.encode(), "description")
    return 0


def _pr_body(root: str) -> str:
    from .. import pipeline
    from ..upstream import pr_body

    checkout = pipeline.inputs(Options(pytorch_root=root, no_overlay=True))
    _, plan = pipeline.plan(Options())
    from ..errors import require_torch

    devices = ["cpu"] + (["cuda"] if require_torch("--pr-body").cuda.is_available() else [])
    return pr_body.render(pr_body.missing_by_kind(checkout.scan), checkout.sources.torch_version,
                          [pr_body.measure(plan, d) for d in devices])

COMMANDS = {"scan": scan, "lint": lint, "gen": gen, "build": build, "install": install, "verify": verify,
            "run": run, "diff": diff, "wheel": wheel}

__all__ = ["COMMANDS", "Options"]
