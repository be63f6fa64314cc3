"""The subcommands: each turns its flags into pipeline calls, prints, and
returns an exit code. Nothing below the CLI sees an argparse namespace."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

from ..errors import InputError, printable
from ..files import STDOUT, check_output_dir, check_output_file, write_output
from ..sources import Options, resolve
from ..vocabulary import Format, Origin, plural
from .parser import options, qualified


def _drifts(scan) -> int:
    from ..diagnostics.drift import cross_check
    from ..diagnostics.render import drift_text
    from ..runtime.load import installed_ops

    drifts = cross_check(scan, set(installed_ops()))
    sys.stderr.write(drift_text(drifts, scan.total()))
    return 1 if drifts else 0


def _run_inputs(args) -> list[str]:
    """Every path this run reads: no output may be one of them."""
    from ..sources import input_paths

    paths = input_paths(options(args))
    for y in getattr(args, "paths", None) or []:
        paths += [y, os.path.join(os.path.dirname(y), "tags.yaml")]
    folder = getattr(args, "folder", None)  # `findings DIR`: each file of the folder it reads
    if folder:
        import glob

        paths += sorted(glob.glob(os.path.join(glob.escape(folder), "*.jsonl")))
    return paths + [getattr(args, "baseline", None) or ""]


def _outputs_ok(args, what: str) -> None:
    """Check -o/--output before any work, so a bad path costs nothing and writes nothing."""
    if getattr(args, "output", None):
        check_output_file(args.output, what, inputs=_run_inputs(args))


def _emit(args, text: str, what: str) -> None:
    """The command's result: into -o/--output when given, else to stdout."""
    if getattr(args, "output", None):
        write_output(args.output, text.encode(), what, inputs=_run_inputs(args))
        if args.output != STDOUT:
            say(args, f"{what}: {args.output}")
    else:
        sys.stdout.write(text)


def say(args, text: str) -> None:
    """A line for people, on stderr; -q silences it."""
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def build_log_for(args):
    """The build's messages: stderr, or nowhere with -q."""
    from ..runtime.launch.process import build_log

    return build_log(args.quiet)


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


def notes(args):
    """-v: the cache's notes (an entry ignored and rebuilt, a stale build removed) on stderr."""
    from ..fs import root as cache_root

    if not getattr(args, "verbose", False):
        return contextlib.nullcontext()
    return cache_root.notes_to(lambda text: print(f"note: {text}", file=sys.stderr, flush=True))


def needs_torch(what: str) -> None:
    from ..errors import require_torch

    require_torch(what)


def scan(args) -> int:
    from .. import pipeline
    from ..diagnostics.render import scan_json, scan_text

    if args.against_runtime:
        needs_torch("--against-runtime")
    _outputs_ok(args, "scan report")
    i = pipeline.inputs(dataclasses.replace(options(args), no_overlay=True))
    _inputs_note(args, i.sources)
    verdicts = set(args.verdict) if args.verdict else None
    _emit(args, (scan_json if args.format == Format.JSON else scan_text)(i.scan, verdicts), "scan report")
    return _drifts(i.scan) if args.against_runtime else 0


def lint(args) -> int:
    from ..diagnostics import baseline, lint as lint_
    from ..diagnostics.render import RENDERERS, drift_text, summary_line

    if args.paths and args.native_functions:
        raise InputError(None, None, "give yaml paths or --native-functions, not both",
                         "each yaml path is read with the tags.yaml beside it, or --tags")
    if args.paths and args.pytorch_root:
        args.paths = _checkout_own(args.pytorch_root, args.paths)
    opts = options(args)
    if (args.imports or args.namespace) and not args.runtime:
        raise InputError(None, None, "--import and --namespace go with --runtime")
    if args.write_baseline:
        if args.output:
            raise InputError(None, None, "--write-baseline writes the baseline, not a report: drop -o/--output")
        check_output_file(args.write_baseline, "baseline", inputs=_run_inputs(args))
    _outputs_ok(args, "lint report")
    if args.runtime:
        if args.paths or args.native_functions or args.tags or args.pytorch_root or args.generated or \
                args.against_runtime:
            raise InputError(None, None, "--runtime lints the live operator registry: no yaml inputs, "
                                         "--generated or --against-runtime")
        if args.no_cache:
            raise InputError(None, None, "--runtime reads no yaml: --no-cache does not apply")
        if args.autograd or args.requires_grad:
            flag = "--autograd" if args.autograd else "--requires-grad"
            raise InputError(None, None, f"{flag} asks the yaml's autograd codegen: it does not go with --runtime")
        needs_torch("lint --runtime")
    elif args.against_runtime:
        needs_torch("--against-runtime")

    def noted(i):
        _inputs_note(args, i.sources)
        if i.sources.tags_packaged:
            say(args, f"lint: {printable(i.sources.native)}: no tags.yaml beside it; "
                       f"using torchgen's packaged {printable(i.sources.tags)}")

    req = lint_.Request(opts, tuple(args.paths), args.runtime, tuple(args.imports),
                        tuple(args.namespace) if args.namespace is not None else None, args.generated, args.baseline,
                        args.against_runtime, args.autograd, args.requires_grad)
    rep = lint_.run(req, noted, apply_baseline=not args.write_baseline)
    fs = list(rep.findings)
    if args.write_baseline:
        write_output(args.write_baseline, baseline.render(fs).encode(), "baseline", inputs=_run_inputs(args))
        print(f"wrote {len(fs)} finding(s) to {args.write_baseline}", file=sys.stderr)
        return 0
    report = RENDERERS[args.format](fs, rep.summary)
    if args.output or args.format not in (Format.TEXT, Format.LINTRUNNER):  # the text report's last line, for people
        _summary(args, "lint: " + summary_line(fs, rep.summary), bool(args.output))
    _emit(args, report, "lint report")
    if args.format == Format.LINTRUNNER:
        return 0
    rc = 1 if fs else 0
    for sc, drifts in rep.drifts:
        sys.stderr.write(drift_text(drifts, sc.total()))
        rc = max(rc, 1 if drifts else 0)
    return rc


def _checkout_own(root: str, paths: list[str]) -> list[str]:
    """Yaml paths beside --pytorch-root (as a guide's or a hook's command line gives them): the checkout's
    own yaml is what --pytorch-root lints already, so they are accepted and dropped; another file is refused."""
    from ..sources import YAML_DIR

    own = {os.path.realpath(os.path.join(root, YAML_DIR, n)) for n in ("native_functions.yaml", "tags.yaml")}
    other = [p for p in paths if os.path.realpath(p) not in own]
    if other:
        raise InputError(other[0], None, "not the --pytorch-root checkout's own yaml: --pytorch-root lints "
                                         f"{os.path.join(YAML_DIR, 'native_functions.yaml')} of the checkout",
                         "drop --pytorch-root to lint this file with the installed torch's torchgen")
    return []


def gen(args) -> int:
    from .. import pipeline
    from ..codegen import cmake_fragment, compiled_sources, output_names, write_all

    if args.dry_run and not args.output_dependencies:
        raise InputError(None, None, "--dry-run writes only the --output-dependencies file: give one")
    pipeline.check_shards(args.shards)
    # every output checked before any work, so a bad one costs nothing and writes nothing
    inputs = _run_inputs(args)
    if not args.dry_run:
        check_output_dir(args.output, inputs)
    if args.output_dependencies:
        check_output_file(args.output_dependencies, "output dependencies", create_dir=True, inputs=inputs)
        out = args.output.rstrip("/") or "/"
        text = cmake_fragment("TORCHGEN_PATCH_SOURCES", out, compiled_sources(args.shards))
        text += cmake_fragment("TORCHGEN_PATCH_OUTPUTS", out, output_names(args.shards))
    i, plan, files = pipeline.generate(options(args), args.shards, args.strict)
    _inputs_note(args, i.sources)
    if args.output_dependencies:
        write_output(args.output_dependencies, text.encode(), "output dependencies", inputs, if_changed=True,
                     create_dir=True)
    written = [] if args.dry_run else write_all(args.output, files, (lambda line: None) if args.quiet else None)
    if args.verbose:
        for name in written:
            print(f"wrote {os.path.join(args.output, name)}", file=sys.stderr)
    if written or args.dry_run or args.verbose:  # said when the output changes: a re-run repeats only the count
        for lo in plan.left_out:
            say(args, f"left out: {lo.op}: {printable(lo.why)}")
    _summary(args, f"gen: {len(plan.kernels)} kernels in {args.shards} shard(s); {len(plan.left_out)} left out; "
                   f"{len(written)} of {len(files)} files written to {args.output}", True)
    return 0


def build(args) -> int:
    from .. import pipeline
    from ..runtime import library

    needs_torch("build")
    pipeline.check_shards(args.shards)
    art = library(options(args), shards=args.shards, prebuilt=False, verbose=args.verbose, log=build_log_for(args))
    print(art.path)
    say(args, f"build: {plural(len(art.kernels), 'kernel')}; "
               f"{'built' if art.origin == Origin.BUILD else 'up to date (cache hit)'}")
    return 0


def install(args) -> int:
    from ..runtime.install import install as install_kernels

    needs_torch("install")
    args.op = qualified(args.op)
    if args.op:  # named the way verify and run name them (left out, covered, did you mean)
        from .. import pipeline

        i, plan = pipeline.plan(options(args))
        plan.pick(args.op, i.scan)
    rep = install_kernels(args.op, backend=args.backend, options=options(args), verbose=args.verbose,
                          build=not args.no_build)
    if not args.quiet or rep.refused:  # -q: only what did not register
        print(rep.summary())
    return 0


def wheel(args) -> int:
    from ..runtime import library, prebuilt
    from ..runtime.checklib import saved_build

    needs_torch("wheel")
    out = args.output or "."
    check_output_dir(out, _run_inputs(args))
    opts, log = Options(), build_log_for(args)
    art = library(opts, prebuilt=False, verbose=args.verbose, log=log)
    saved = saved_build(verbose=args.verbose, log=log)
    print(prebuilt.make_wheel(out, art, opts, log=log, saved=saved))
    say(args, f"wheel: {plural(len(art.kernels), 'kernel')} packed for torch {art.torch}, with the saved-tensor "
               "check's native hooks")
    return 0


def verify(args) -> int:
    import platform

    from .. import pipeline
    from ..checks import render as vr
    from ..checks import verify as v
    from ..checks.subclass import SUBCLASSES
    from ..errors import EnvironmentProblem, require_torch
    from ..runtime.install import install as install_kernels

    torch = require_torch("verify")
    _outputs_ok(args, "report")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise EnvironmentProblem("--device cuda: no CUDA device is available")
    opts = options(args)
    i, plan = pipeline.plan(opts)
    ops = plan.pick(qualified(args.op), i.scan)
    if args.check == "requires-grad":
        return _verify_requires_grad(args, plan, ops, torch)
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
    if args.format == Format.JSON:
        text = vr.to_json(runs, meta)
    elif args.format == Format.MARKDOWN:
        text = vr.markdown(runs, meta)
    else:
        text = "".join(f"== {name}\n" + vr.table(rs) for name, rs in runs.items())
    # the exit code is the deciding run's: the run with the patch, or the one run --without-patch makes (a
    # detector of missing kernels); with --both the run without the patch is evidence: the "before" column
    before = [name for name in runs if args.both and not name.startswith("with patch")]
    bad = [r for name, rs in runs.items() if name not in before for r in rs if r.verdict in v.FAILING]
    for r in bad:
        print(f"verify: {r.op}{_on(r.subclass)}: {r.verdict} {r.message}", file=sys.stderr)
    label = {name: ("before, " if name in before else "after, ") if args.both else "" for name in runs}
    if args.output:
        _summary(args, "\n".join(f"verify ({args.device}) {label[name]}{name}: {vr.count_text(rs)}"
                                 for name, rs in runs.items()), True)
    elif before:
        say(args, "\n".join(f"verify: {label[name]}{name}: {vr.count_text(runs[name])} (evidence; the exit code is "
                             "the run with the patch's)" for name in before))
    if not (args.quiet and args.format == Format.TEXT and not args.output):  # -q: the failing rows only, no table
        _emit(args, text, "report")
    return 1 if bad else 0


def _verify_requires_grad(args, plan, ops: list[str], torch) -> int:
    """verify --check requires-grad: the plan's out= ops whose kernels refuse requires_grad, given inputs
    that require it in grad mode, without and then with the kernels."""
    from ..checks import render as vr
    from ..checks import verify as v
    from ..runtime.install import install as install_kernels

    if args.subclass != "plain":
        raise InputError(None, None, "--check requires-grad runs plain tensors: drop --subclass")
    refusing = {k.op for k in plan.kernels if k.refuse_name}
    ops = [op for op in ops if op in refusing]
    if args.op and not ops:
        raise InputError(None, None, "none of the --op ops is an out= op whose kernel refuses requires_grad")
    runs: dict[str, list] = {}
    if args.without_patch or args.both:
        runs["without patch"] = v.run_grad(ops, args.device, False)
    if not args.without_patch:
        install_kernels(ops, backend=args.backend, plan=plan, verbose=args.verbose)
        runs[f"with patch ({args.backend})"] = v.run_grad(ops, args.device, True)
    meta = {"torch": torch.__version__, "device": args.device, "check": "requires-grad", "ops": len(ops)}
    text = {Format.JSON: vr.to_json, Format.MARKDOWN: vr.grad_markdown}.get(args.format, vr.grad_table)(runs, meta)
    bad = [r for rs in runs.values() for r in rs if r.patched and r.verdict not in (v.REFUSE, v.NOT_RUN)]
    for r in bad:
        print(f"verify: {r.op}: {r.verdict} {r.message}", file=sys.stderr)
    if args.output:
        say(args, "\n".join(f"verify --check requires-grad ({args.device}) {name}: {vr.count_text(rs)}"
                             for name, rs in runs.items()))
    _emit(args, text, "report")
    return 1 if bad else 0


def _on(subclass: str) -> str:
    return "" if subclass == "plain" else f", {subclass}"


def run(args) -> int:
    from ..runtime.launch import check_program, prepare, run_program

    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        raise InputError(None, None, "run needs a program after --", "torchgen-patch run -- python train.py")
    if args.imports and not args.runtime_ops:
        raise InputError(None, None, "--import goes with --runtime-op")
    check_program(program)
    _torch_present("run")  # present, not imported: the program's own processes import it
    opts = options(args)
    if not named_checked(args, opts):  # the installed torch's own inputs: the plan is made (or found by its
        resolve(opts)  # inputs' key) where torch is imported
    from .saved import saved_check_of

    check_saved, every, folder = saved_check_of(args)
    env = dict(os.environ, **prepare(opts, args.backend, args.op, args.runtime_ops, args.imports, args.verbose,
                                       args.quiet, check_saved=check_saved, findings=folder, check_every=every))
    check_program(program, env)  # and what it does to that environment (env -i, env PYTHONPATH=...)
    try:
        return run_program(program, env)
    except FileNotFoundError:
        raise InputError(None, None, f"no such program: {program[0]}") from None
    except OSError as e:
        raise InputError(None, None, f"cannot run {program[0]}: {e.strerror}") from None


def findings(args) -> int:
    """Exit 1 where the folder holds a site, 0 where none; each skipped file or line one error on stderr."""
    from ..checks.fleet import report
    from ..checks.fleet_render import RENDERERS

    _outputs_ok(args, "report")
    rep = report(args.folder, (lambda line: print(f"findings: {printable(line)}", file=sys.stderr))
                 if args.verbose else None)
    for p in rep.problems:
        print(p.render(), file=sys.stderr)
    _emit(args, RENDERERS[args.format](rep), "report")
    return 1 if rep.sites else 0


def named_checked(args, opts) -> bool:
    """The inputs and --op ops the user named, checked against the plan before any work (``args.op``
    made qualified); False where there are none (the installed torch's own inputs, every op)."""
    args.op = qualified(args.op)
    if not (args.op or opts.native_functions or opts.tags or opts.overlay):
        return False
    from .. import pipeline

    i, plan = pipeline.plan(opts)
    plan.pick(args.op, i.scan)
    return True


def _torch_present(what: str) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        needs_torch(what)  # says so, the one way every command does


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
        check_output_file(args.pr_body, "description", inputs=_run_inputs(args))
        needs_torch("--pr-body")
    if args.instructions and not args.pr_body:
        raise InputError(None, None, "--instructions goes with --pr-body")
    if args.issue:
        if args.check:
            raise InputError(None, None, "--issue goes without --check")
        check_output_file(args.issue, "issue", inputs=_run_inputs(args))
        needs_torch("--issue")
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
    from ..upstream import issue, pr_body

    issue_text = issue.measured() if args.issue else None  # first: the description installs the kernels
    body = pr_body.measured(args.pytorch_root, args.instructions) if args.pr_body else None
    _emit(args, text, "diff")
    for path, made, what in ((args.pr_body, body, "description"), (args.issue, issue_text, "issue")):
        if made is not None:
            write_output(path, made.encode(), what, inputs=_run_inputs(args))
    return 0


COMMANDS = {"scan": scan, "lint": lint, "gen": gen, "build": build, "install": install, "verify": verify,
            "run": run, "diff": diff, "wheel": wheel,
            "findings": findings}  # and cli/environment.py's: enable, disable, status

__all__ = ["COMMANDS", "Options"]
