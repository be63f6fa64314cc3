"""Command line: the only place that prints and decides exit codes.

Exit codes: 0 success/clean, 1 findings (lint) or failures (verify), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys

from .errors import InputError


def _add_sources(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("inputs (default: the installed torchgen's packaged native_functions.yaml)")
    g.add_argument("--native-functions", metavar="PATH", help="native_functions.yaml to read")
    g.add_argument("--tags", metavar="PATH", help="tags.yaml (default: next to --native-functions)")
    g.add_argument("--pytorch-root", metavar="DIR", help="a PyTorch source checkout")
    g.add_argument("--overlay", metavar="PATH", help="overlay of per-op decisions (default: the shipped one)")
    g.add_argument("--no-overlay", action="store_true", help="use no overlay at all")
    g.add_argument("--no-cache", action="store_true", help="do not read or write the scan cache")


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(prog="torchgen-patch", description=__doc__.splitlines()[0] if __doc__ else None,
                                fromfile_prefix_chars="@")
    p.add_argument("--version", action="version", version=f"torchgen-patch {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("scan", help="classify every function of native_functions.yaml")
    _add_sources(s)
    s.add_argument("--format", choices=("text", "json"), default="text")
    s.add_argument("--verdict", action="append", help="show only these verdicts (repeatable)")
    s.add_argument("--against-runtime", action="store_true", help="cross-check with the imported torch's dispatcher")

    lint = sub.add_parser("lint", help="report mutating ops with no ADInplaceOrView kernel",
                          fromfile_prefix_chars="@",
                          description="Exit codes: 0 clean, 1 findings, 2 bad input; --format lintrunner always "
                                      "exits 0 (failures are messages). Paths may come from @FILE.")
    _add_sources(lint)
    lint.add_argument("paths", nargs="*", metavar="NATIVE_FUNCTIONS_YAML",
                      help="yaml files to lint (each with the tags.yaml beside it); pre-commit and lintrunner "
                           "pass them here")
    lint.add_argument("--format", choices=("text", "json", "lintrunner", "sarif", "github"), default="text")
    lint.add_argument("--against-runtime", action="store_true", help="cross-check with the imported torch's dispatcher")
    lint.add_argument("--baseline", metavar="FILE", help="accept the findings listed in FILE")
    lint.add_argument("--write-baseline", metavar="FILE", help="write every current finding to FILE and exit 0")
    lint.add_argument("--generated", metavar="DIR", help="also check the kernels generated in DIR against the plan")
    lint.add_argument("--runtime", action="store_true",
                      help="lint the live operator registry (any namespace) instead of a yaml")
    lint.add_argument("--import", dest="imports", action="append", default=[], metavar="MOD",
                      help="with --runtime: import MOD first (repeatable), e.g. torch.distributed.fsdp")
    lint.add_argument("--namespace", action="append", metavar="NS", help="with --runtime: only these namespaces")

    from . import commands

    commands.add_subcommands(sub, _add_sources)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except InputError as e:
        if getattr(args, "format", None) == "lintrunner":  # lintrunner's protocol: a message, exit 0
            from .formats import lintrunner_failure

            sys.stdout.write(lintrunner_failure(e))
            return 0
        print(e.render(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("torchgen-patch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _dispatch(args) -> int:
    from . import commands

    return commands.run(args)
