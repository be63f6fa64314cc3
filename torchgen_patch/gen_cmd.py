"""`torchgen-patch gen`: render the plan into C++ sources (a build's codegen step)."""

from __future__ import annotations

import os
import sys

from .errors import InputError


def add_parser(sub, add_sources) -> None:
    p = sub.add_parser("gen", help="generate ADInplaceOrView kernels for the missing ops")
    add_sources(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--shards", type=int, default=2, metavar="N", help="number of kernel files (default 2)")
    p.add_argument("--output-dependencies", metavar="FILE",
                   help="write a CMake fragment listing every output (set(TORCHGEN_PATCH_SOURCES ...))")
    p.add_argument("--dry-run", action="store_true", help="write nothing but the --output-dependencies file")
    p.add_argument("--strict", action="store_true", help="an op that cannot be generated is an error")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def generate(args):
    """Scan → plan → render. Returns (plan, files)."""
    from .commands import inputs
    from .plan import make_plan
    from .render import render

    if args.shards < 1:
        raise InputError(None, None, f"--shards must be at least 1, not {args.shards}")
    scan, overlay = inputs(args, full=False, cpp=True)
    plan = make_plan(scan, overlay, strict=args.strict)
    return plan, render(plan, args.shards)


def run(args) -> int:
    from .render import compiled_sources, output_names
    from .write import cmake_fragment, write_all

    plan, files = generate(args)
    if args.output_dependencies:
        out = args.out.rstrip("/") or "/"
        text = cmake_fragment("TORCHGEN_PATCH_SOURCES", out, compiled_sources(args.shards))
        text += cmake_fragment("TORCHGEN_PATCH_OUTPUTS", out, output_names(args.shards))
        from .write import write_if_changed

        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.output_dependencies)), exist_ok=True)
            write_if_changed(args.output_dependencies, text.encode())
        except OSError as e:
            raise InputError(args.output_dependencies, None, f"cannot write: {e.strerror}") from None
        if args.dry_run:
            return 0
    if args.dry_run:
        written = []
    else:
        written = write_all(args.out, files)
    if not args.quiet:
        for lo in plan.left_out:
            print(f"left out: {lo.op}: {lo.why}", file=sys.stderr)
        print(f"gen: {len(plan.kernels)} kernels in {args.shards} shard(s); {len(plan.left_out)} left out; "
              f"{len(written)} of {len(files)} files written to {args.out}", file=sys.stderr)
    return 0
