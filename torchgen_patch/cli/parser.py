"""The argument parser: every subcommand and flag, and the translation of a
parsed namespace into the pipeline's ``Options``. argparse lives here only."""

from __future__ import annotations

import argparse
import textwrap

from ..scan.model import VERDICTS
from ..sources import Options
from ..vocabulary import (FINDINGS_FORMATS, LINT_FORMATS, SCAN_FORMATS, VERIFY_FORMATS, Backend, CheckMode, Format,
                          Verdict, Word)

DESCRIPTION = """Find and generate the ADInplaceOrView (version-counter) kernels PyTorch's codegen leaves out.

Exit codes: 0 success/clean, 1 findings (lint) or failures (verify), 2 bad input,
3 the machine lacks something the command needs (torch, a C++ compiler, CUDA)."""


def glossary() -> str:
    """The words of the output, defined once: the top-level --help epilog (and so docs/cli.md)."""
    from ..checks.render import LEGEND

    scan = {
        Verdict.COVERED: "PyTorch's autograd codegen already emits its ADInplaceOrView kernel",
        Verdict.MISSING: "writes an argument and returns nothing, so the codegen emits no kernel: a finding, fixed "
                         "by the plan's kernel",
        Verdict.UNSUPPORTED: "the same, but a generated kernel cannot serve it (a view, metadata only, scratch "
                             "space): a finding, skipped by the shipped overlay",
        Verdict.COMPOSITE: "writes and returns, no kernel of its own: it decomposes into ops that bump (or is "
                           "written by hand)",
        Verdict.NOT_MUTATING: "writes no argument: nothing to bump",
    }
    words = {
        "finding": "one op lint reports (missing or unsupported), at its native_functions.yaml line",
        "plan": "the missing ops, less the overlay's skips: what gen, build, install and verify act on",
        "overlay": "per-op decisions (skip, xfail, another template): native_functions_overlay.yaml",
        "runtime op": "an operator of the live registry (any namespace), defined outside native_functions.yaml",
        "drift": "the yaml and the running torch's dispatcher disagree about an op (--against-runtime)",
    }
    out = []
    for title, terms in (("words used in the output:", words), ("scan verdicts (one per function):", scan),
                         ("verify verdicts (one per op and run):", LEGEND)):
        out.append(title)
        out += [textwrap.fill(v, 100, initial_indent=f"  {k:<13} ", subsequent_indent=" " * 16)
                for k, v in terms.items()]
    return "\n".join(out)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (like every other bad input), exit 2, and the
    closest name for a misspelt command or choice."""

    commands: dict[str, _Parser]  # the top-level parser's: name -> the subcommand's parser

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_closest(message)} (see {self.prog} --help)\n")


def _closest(message: str) -> str:
    """argparse's "invalid choice" message with the closest choice offered ("did you mean lint?")."""
    import difflib
    import re

    m = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not m:
        return message
    what, given = m.group(1), m.group(2)
    choices = [c.strip().strip("'") for c in m.group(3).split(",")]
    close = difflib.get_close_matches(given, choices, n=1)
    head = f"unknown command '{given}'" if what in ("cmd", "COMMAND") else f"argument {what}: invalid choice: '{given}'"
    return head + (f" (did you mean {close[0]}?)" if close else f" (choose from {', '.join(choices)})")


def unrecognized(sub: argparse.ArgumentParser, extra: list[str]) -> str:
    """The message for arguments a subcommand does not know, with the closest option it has."""
    import difflib

    known = [o for a in sub._actions for o in a.option_strings]
    close = [c for e in extra if e.startswith("-") for c in difflib.get_close_matches(e.split("=", 1)[0], known, n=1)]
    return f"unrecognized arguments: {' '.join(extra)}" + (f" (did you mean {close[0]}?)" if close else "")


def no_command(p: _Parser) -> str:
    return "give a command: " + ", ".join(p.commands)


def _inputs(p: argparse.ArgumentParser, checkout: bool, overlay: bool = True) -> None:
    """The input flags. ``checkout``: the command also runs in a PyTorch checkout (no torch needed)."""
    title = ("inputs (default: the installed torch's torchgen and its packaged native_functions.yaml; "
             "--pytorch-root: a checkout's own torchgen, tools/autograd and yaml)") if checkout else \
        "inputs (the running torch: its torchgen's packaged native_functions.yaml, or --native-functions)"
    g = p.add_argument_group(title)
    g.add_argument("--native-functions", metavar="PATH", help="native_functions.yaml to read")
    g.add_argument("--tags", metavar="PATH", help="tags.yaml (default: next to --native-functions)")
    if checkout:
        g.add_argument("--pytorch-root", metavar="DIR",
                       help="a PyTorch source checkout: its own torchgen/, tools/autograd/ and yaml; no torch needed")
    if overlay:
        g.add_argument("--overlay", metavar="PATH", help="overlay of per-op decisions (default: the shipped one)")
        g.add_argument("--no-overlay", action="store_true", help="use no overlay at all")
        g.add_argument("--no-requires-grad-check", action="store_true",
                       help="generated out= kernels do not refuse inputs or outputs that require grad "
                            "(per op: 'requires_grad: allow' in the overlay)")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the scan cache")


def _output(p: argparse.ArgumentParser, output: str | None = None, formats: tuple[str, ...] | None = None,
            default_format: Format = Format.TEXT, compiles: bool = False) -> None:
    """The flags every subcommand shares: -q/-v, and where it writes (-o/--output) in which --format."""
    g = p.add_argument_group("output")
    if formats:
        g.add_argument("--format", choices=formats, default=default_format, type=_format,
                       help=f"report format (default {default_format})")
    if output:
        g.add_argument("-o", "--output", metavar=output.split()[0], help=output.split(" ", 1)[1])
    v = g.add_mutually_exclusive_group()
    v.add_argument("-q", "--quiet", action="store_true", help="print nothing but results and errors")
    v.add_argument("-v", "--verbose", action="store_true",
                   help="say more: progress of every step" + (", the compiler's commands" if compiles else ""))


class _CMakeDir(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        from ..codegen.output import cmake_dir
        from ..errors import EnvironmentProblem

        try:
            print(cmake_dir())
        except EnvironmentProblem as e:
            parser.exit(e.exit_code, e.render() + "\n")
        parser.exit(0)


def _member(words: type[Word]):
    """The ``type=`` of a flag whose choices are the members of ``words``: a word given as its member;
    any other string left as it is, for argparse's choices to refuse (with the closest one)."""
    def member(value: str):
        try:
            return words.parse(value)
        except ValueError:
            return value

    return member


def _steps(value: str) -> int:
    """--check-every's N: a whole number >= 1."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of steps >= 1: {value!r}")
    return n


def _format(value: str):
    return _member(Format)(Format.TEXT if value == "table" else value)  # 'table': verify's older name for 'text'


def qualified(ops: list[str] | None) -> list[str] | None:
    """--op names; one without a namespace is an aten op (the only namespace of native_functions.yaml)."""
    return None if ops is None else [o if "::" in o else f"aten::{o}" for o in ops]


def options(args: argparse.Namespace) -> Options:
    return Options(native_functions=getattr(args, "native_functions", None), tags=getattr(args, "tags", None),
                   pytorch_root=getattr(args, "pytorch_root", None), overlay=getattr(args, "overlay", None),
                   no_overlay=getattr(args, "no_overlay", False), no_cache=getattr(args, "no_cache", False),
                   requires_grad_check=not getattr(args, "no_requires_grad_check", False))


BACKEND = "cpp: the compiled kernels (default); python: torch.library kernels, no compiler needed"


def _backend(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=tuple(Backend), default=Backend.CPP, type=_member(Backend), help=BACKEND)


def _patching(p: argparse.ArgumentParser) -> None:
    """What `run` and `enable` install in each process: the inputs, the backend, the ops."""
    _inputs(p, checkout=False)
    _backend(p)
    p.add_argument("--op", action="append", help="install only these aten ops (repeatable)")


def _check_saved(p: argparse.ArgumentParser) -> None:
    """--check-saved and --check-every of `run` and `enable`: the saved-tensor check in each process."""
    p.add_argument("--check-saved", nargs="?", const=CheckMode.WARN, choices=("off", *CheckMode),
                   type=_member(CheckMode), metavar="off|warn|raise",
                   help="the saved-tensor check in each process: each tensor autograd saves for backward is "
                        "compared when backward uses it, and a write that changed it without moving its version "
                        "(.data, numpy aliases, C++ and Triton kernels, optimizers outside the dispatcher) is a "
                        "finding. On by default, in warn mode, sampled: each step checked with probability 1/32 "
                        "(--check-every), no hooks at all on the others, no compile in a program's process. warn: one "
                        "line per distinct finding and a count at exit; raise: an exception at the first; given "
                        "alone, every step is checked; off: no check (docs/unseen-writes.md)")
    p.add_argument("--check-every", type=_steps, metavar="N",
                   help="check each step with probability 1/N (1: every step; default 32, or 1 where --check-saved "
                        "names a mode)")
    p.add_argument("--findings", metavar="DIR",
                   help="each process also appends every finding of the check as one JSON line to a file of its "
                        "own in DIR (made if missing; yours or root's, writable by no one else unless sticky), for "
                        "`torchgen-patch findings DIR`. "
                        "Also $TORCHGEN_PATCH_FINDINGS, for any check")


def _scan_command(sub) -> None:
    """The `scan` subcommand."""
    s = sub.add_parser("scan", help="classify every function of native_functions.yaml")
    _inputs(s, checkout=True, overlay=False)
    _output(s, "FILE write the table here instead of stdout", SCAN_FORMATS)
    s.add_argument("--verdict", action="append", choices=VERDICTS, type=_member(Verdict),
                   help="show only these verdicts (repeatable)")
    s.add_argument("--against-runtime", action="store_true",
                   help="cross-check with the running torch's dispatcher (needs torch)")


def _lint_command(sub) -> None:
    """The `lint` subcommand."""
    lint = sub.add_parser("lint", help="report mutating ops with no ADInplaceOrView kernel",
                          fromfile_prefix_chars="@",
                          description="Exit codes: 0 clean, 1 findings, 2 bad input; --format lintrunner always "
                                      "exits 0 (failures are messages). Paths may come from @FILE.")
    _inputs(lint, checkout=True)
    lint.add_argument("paths", nargs="*", metavar="NATIVE_FUNCTIONS_YAML",
                      help="yaml files to lint (each with the tags.yaml beside it); pre-commit and lintrunner "
                           "pass them here")
    _output(lint, "FILE write the findings here instead of stdout", LINT_FORMATS)
    lint.add_argument("--against-runtime", action="store_true",
                      help="cross-check with the running torch's dispatcher (needs torch)")
    baseline = lint.add_mutually_exclusive_group()
    baseline.add_argument("--baseline", metavar="FILE", help="accept the findings listed in FILE")
    baseline.add_argument("--write-baseline", metavar="FILE", help="write every current finding to FILE and exit 0")
    lint.add_argument("--generated", metavar="DIR", help="also check the kernels generated in DIR against the plan")
    half = lint.add_mutually_exclusive_group()
    half.add_argument("--requires-grad", action="store_true",
                      help="also report the requires-grad half: out= ops whose autograd kernel never refuses inputs "
                           "that require grad (errors, fixed by diff --mode fix); what CI should check")
    half.add_argument("--autograd", action="store_true",
                      help="--requires-grad, and void in-place ops that skip check_inplace (warnings diff --mode fix "
                           "leaves as they are)")
    lint.add_argument("--runtime", action="store_true",
                      help="lint the live operator registry (any namespace) instead of a yaml (needs torch)")
    lint.add_argument("--import", dest="imports", action="append", default=[], metavar="MOD",
                      help="with --runtime: import MOD first (repeatable), e.g. torch.distributed.fsdp; each "
                           "optimizer class MOD defines gets a probe step (one whose step writes its parameter "
                           "without a version bump is a finding)")
    lint.add_argument("--namespace", action="append", metavar="NS", help="with --runtime: only these namespaces")


def _gen_command(sub) -> None:
    """The `gen` subcommand."""
    g = sub.add_parser("gen", help="generate ADInplaceOrView kernels for the missing ops")
    _inputs(g, checkout=True)
    g.add_argument("-o", "--output", "--out", dest="output", required=True, metavar="DIR",
                   help="output directory (--out: the older spelling)")
    g.add_argument("--shards", type=int, default=2, metavar="N", help="number of kernel files (default 2)")
    g.add_argument("--output-dependencies", metavar="FILE",
                   help="write a CMake fragment listing every output (set(TORCHGEN_PATCH_SOURCES ...))")
    g.add_argument("--dry-run", action="store_true",
                   help="write nothing but the --output-dependencies file (which it requires)")
    g.add_argument("--strict", action="store_true", help="an op that cannot be generated is an error")
    _output(g)


def _build_command(sub) -> None:
    """The `build` subcommand."""
    b = sub.add_parser("build", help="compile the kernels into a shared library against the running torch (cached)")
    _inputs(b, checkout=False)
    b.add_argument("--shards", type=int, default=2, metavar="N", help="number of kernel files (default 2)")
    _output(b, compiles=True)


def _install_command(sub) -> None:
    """The `install` subcommand."""
    i = sub.add_parser("install", help="try install() here: build if needed, register the kernels in a "
                                       "throwaway process and print what registered and what was refused",
                       description="A dry run of torchgen_patch.install(): the kernels are registered in this "
                                   "command's own process, which then exits. To patch a program, use "
                                   "`torchgen-patch run -- PROGRAM` or call torchgen_patch.install() in it.")
    _inputs(i, checkout=False)
    _backend(i)
    i.add_argument("--op", action="append", help="install only these ops (repeatable)")
    i.add_argument("--no-build", action="store_true",
                   help="never compile: use the installed prebuilt kernels (torchgen-patch wheel) or fail")
    _output(i, compiles=True)


def _wheel_command(sub) -> None:
    """The `wheel` subcommand."""
    w = sub.add_parser("wheel", help="build the kernels for the running torch and pack them in a platform wheel "
                                     "(torchgen-patch-kernels) that install() uses with no compiler")
    _output(w, "DIR where to write the wheel (default: the current directory)", compiles=True)


def _verify_command(sub) -> None:
    """The `verify` subcommand."""
    v = sub.add_parser("verify", help="run every op of the plan and check its version bumps",
                       description="Exit codes: 0 every row of the deciding run passed (or failed as the "
                                   "overlay expects), 1 a row of it is MISS, EXTRA or ERROR, 2 bad input, "
                                   "3 the machine lacks torch, a compiler or CUDA. The deciding run is the one "
                                   "with the patch; --without-patch makes only the run without it (a detector of "
                                   "missing kernels); with --both the run without it is the report's 'before' "
                                   "column, evidence that never sets the exit code. -q: the failing rows only, "
                                   "on stderr (-o FILE or --format json|markdown still get the whole report).")
    _inputs(v, checkout=False)
    v.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the samples run (default cpu)")
    m = v.add_mutually_exclusive_group()
    m.add_argument("--without-patch", action="store_true", help="run without installing the kernels")
    m.add_argument("--both", action="store_true", help="run without, then with the patch, in one report")
    _backend(v)
    v.add_argument("--op", action="append", help="only these ops (repeatable)")
    v.add_argument("--subclass", choices=("plain", "wrapper", "dtensor", "all"), default="plain",
                   help="wrap every tensor argument: a __torch_dispatch__ wrapper subclass, DTensor on a one-rank "
                        "process group, or each in turn (the verdict is on the wrapper's counter)")
    v.add_argument("--check", choices=("version", "requires-grad"), default="version",
                   help="version: each written tensor advances by one (default); requires-grad: each out= op whose "
                        "kernel refuses requires_grad does so (REFUSE) where it went through before (SILENT)")
    _output(v, "FILE write the report here instead of stdout", VERIFY_FORMATS, compiles=True)


def _run_command(sub) -> None:
    """The `run` subcommand."""
    r = sub.add_parser("run", help="run a program (python, python -m, torchrun ...) with the kernels installed in "
                                   "every Python process it starts",
                       description="Runs PROGRAM with the kernels installed in each of its Python processes "
                                   "right after that process first imports torch (so settings made before "
                                   "`import torch` act as without run); the library is built once, by the first "
                                   "process that needs it. Passes the exit code through. python -I, -E and -S "
                                   "would skip the patch and are refused (also through env and a script's #! "
                                   "line); a process the program starts that way, or with an environment of its "
                                   "own, is named in one line on stderr. "
                                   "Example: torchgen-patch run --runtime-op 'bitsandbytes::*' --import "
                                   "bitsandbytes -- python train.py")
    _patching(r)
    r.add_argument("--runtime-op", dest="runtime_ops", action="append", default=[], metavar="PATTERN",
                   help="also patch these runtime operators (names or patterns, e.g. 'bitsandbytes::*'; "
                        "repeatable), defined by the modules of --import; checked before the program starts")
    r.add_argument("--import", dest="imports", action="append", default=[], metavar="MOD",
                   help="with --runtime-op: import MOD in each process first, so its operators exist")
    _check_saved(r)
    _output(r, compiles=True)
    r.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM ARGS",
                   help="the command to run, after --")


def _enable_command(sub) -> None:
    """The `enable` subcommand."""
    e = sub.add_parser("enable", help="patch every Python process of this environment that imports torch, whatever "
                                      "starts it (a .pth file in its site-packages)",
                       description="Writes torchgen_patch_enable.pth into this Python environment's site-packages: "
                                   "each Python process of the environment (torchrun's and accelerate's workers, "
                                   "Jupyter kernels, subprocesses with a clean environment, python -I and -E; not "
                                   "-S) then gets the kernels right after its first `import torch`, and says so in "
                                   "one line (-q: only when the patch is NOT active or an op was refused). The "
                                   "library is built now; each process pays the install step only. A process "
                                   "that cannot have the kernels (the build unusable, no compiler to make one) "
                                   "runs unpatched and says why in one line, unless --strict. Undone by "
                                   "`torchgen-patch disable` and by `pip uninstall torchgen-patch` (docs/enable.md: "
                                   "the repair of an environment whose interpreter cannot start).")
    _patching(e)
    e.add_argument("--strict", action="store_true",
                   help="a process that cannot have the kernels stops (exit 3) instead of running unpatched")
    _check_saved(e)
    _output(e, compiles=True)


def _disable_command(sub) -> None:
    """The `disable` subcommand."""
    dis = sub.add_parser("disable", help="undo enable: remove its file from this environment's site-packages")
    _output(dis)


def _status_command(sub) -> None:
    """The `status` subcommand."""
    st = sub.add_parser("status", help="say whether this environment is enabled, and whether the file is what this "
                                       "torchgen-patch writes (exit 0 enabled, 1 not)")
    _output(st)


def _findings_command(sub) -> None:
    """The `findings` subcommand."""
    f = sub.add_parser("findings", help="group the saved-tensor check's findings that the processes of a job wrote "
                                        "to DIR (run --findings DIR) by site, with how many processes, ranks and "
                                        "steps found each",
                       description="Reads every *.jsonl file in DIR (one per process, written by the check with "
                                   "--findings DIR or $TORCHGEN_PATCH_FINDINGS) and groups the findings by site: "
                                   "the op that saved the tensor and the forward call that ran it. A file or line "
                                   "that is not a finding (cut short, damaged, a symlink) is one error line on "
                                   "stderr and is skipped. Exit codes: 0 no site, 1 at least one site, 2 DIR "
                                   "cannot be read.")
    f.add_argument("folder", metavar="DIR", help="the folder the processes wrote their findings to")
    _output(f, "FILE write the report here instead of stdout", FINDINGS_FORMATS)


def _diff_command(sub) -> None:
    """The `diff` subcommand."""
    d = sub.add_parser("diff", help="write a unified diff that fixes (or guards) PyTorch's own codegen")
    d.add_argument("--pytorch-root", required=True, metavar="DIR", help="a PyTorch source checkout")
    d.add_argument("--mode", choices=("fix", "error"), default="fix",
                   help="fix: generate the missing kernels; error: fail the codegen naming each missing op "
                        "(default fix)")
    d.add_argument("--check", action="store_true", help="report whether the tree is already patched "
                                                        "(exit 0 patched, 1 not); writes no diff")
    _output(d, "FILE write the diff here (default: stdout)")
    d.add_argument("--pr-body", metavar="FILE", help="with --mode fix: also write a pull-request description "
                                                     "(markdown), measured with this machine's torch")
    d.add_argument("--instructions", metavar="JSON", help="with --pr-body: the per-call instruction counts to "
                                                          "report (what bench/bench_callgrind.py --json writes)")
    d.add_argument("--issue", metavar="FILE", help="also write a minimal upstream issue about the fused optimizers "
                                                   "(markdown): its repro and the versions of what they write, "
                                                   "measured with this machine's torch")


def parser() -> _Parser:
    from ..version import __version__

    p = _Parser(prog="torchgen-patch", description=DESCRIPTION, epilog=glossary(),
                formatter_class=argparse.RawDescriptionHelpFormatter, fromfile_prefix_chars="@")
    p.add_argument("--version", action="version", version=f"torchgen-patch {__version__}",
                   help="print the version and exit")
    p.add_argument("--cmake-dir", action=_CMakeDir, nargs=0,
                   help="print the folder of the CMake module (TorchgenPatch.cmake) and exit: "
                        "list(APPEND CMAKE_MODULE_PATH <it>), then include(TorchgenPatch)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    p.commands = sub.choices  # name -> the subcommand's parser (its own errors and --help)
    _scan_command(sub)
    _lint_command(sub)
    _gen_command(sub)
    _build_command(sub)
    _install_command(sub)
    _wheel_command(sub)
    _verify_command(sub)
    _run_command(sub)
    _enable_command(sub)
    _disable_command(sub)
    _status_command(sub)
    _findings_command(sub)
    _diff_command(sub)
    return p
