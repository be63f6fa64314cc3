"""Command line: the only place that parses arguments, prints, and decides exit codes.

Exit codes: 0 success/clean, 1 findings (lint) or failures (verify), 2 bad
input, 3 the machine lacks something the command needs.
"""

from __future__ import annotations

import sys

from ..errors import ToolError, descriptors_said
from ..vocabulary import Format


def main(argv: list[str] | None = None) -> int:
    try:
        with descriptors_said():
            from .parser import no_command, parser, unrecognized
    except ToolError as e:  # no free descriptor, before the arguments are known
        print(e.render(), file=sys.stderr)
        return e.exit_code

    hook = sys.modules.get("_torchgen_patch_hook")  # an enabled environment's (or run's): not in the tool itself
    if hook is not None:
        hook.stand_down()
    argv = list(sys.argv[1:] if argv is None else argv)
    program = None
    if next((a for a in argv if not a.startswith("-")), None) == "run" and "--" in argv:
        # `run`'s program is the program's own: no @file expansion, no option parsing past `--`
        i = argv.index("--")
        argv, program = argv[:i], argv[i + 1:]
    p = parser()
    args, extra = p.parse_known_args(argv)
    if args.cmd is None:
        p.error(no_command(p))
    if extra:  # named by the subcommand, whose --help lists what it takes
        p.commands[args.cmd].error(unrecognized(p.commands[args.cmd], extra))
    if program is not None:
        args.program = program
    try:
        with descriptors_said():
            from .commands import COMMANDS, notes

            with notes(args):
                return COMMANDS[args.cmd](args)
    except ToolError as e:  # bad input (exit 2) and what this machine lacks (exit 3), said the same way
        if getattr(args, "format", None) == Format.LINTRUNNER:  # lintrunner's protocol: a message, exit 0
            from ..diagnostics.render import lintrunner_failure

            sys.stdout.write(lintrunner_failure(e))
            return 0
        print(e.render(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("torchgen-patch: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
