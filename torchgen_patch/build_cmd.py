"""`torchgen-patch build` and `torchgen-patch install`."""

from __future__ import annotations

import sys


def add_parser(sub, add_sources) -> None:
    b = sub.add_parser("build", help="compile the kernels into a shared library (cached)")
    add_sources(b)
    b.add_argument("--shards", type=int, default=2, metavar="N")
    b.add_argument("--verbose", action="store_true", help="show ninja's progress and commands")
    b.set_defaults(func=run_build)

    i = sub.add_parser("install", help="build (if needed) and register the kernels in this process; "
                                       "prints what registered and what was refused")
    add_sources(i)
    i.add_argument("--backend", choices=("cpp", "python"), default="cpp")
    i.add_argument("--op", action="append", help="install only these ops (repeatable)")
    i.set_defaults(func=run_install)


def run_build(args) -> int:
    from .build import build
    from .gen_cmd import generate

    args.strict = False
    plan, files = generate(args)
    lib = build(files, plan.ops(), args.shards, verbose=args.verbose)
    print(lib.path)
    print(f"torchgen-patch: {len(plan.kernels)} kernels; "
          f"{'built' if lib.built else 'up to date (cache hit)'}", file=sys.stderr)
    return 0


def run_install(args) -> int:
    from .installer import install

    if args.pytorch_root:
        from .errors import InputError

        raise InputError(args.pytorch_root, None, "install uses the installed torch's yaml or --native-functions")
    rep = install(args.op, backend=args.backend, native_functions=args.native_functions, tags=args.tags,
                  overlay=args.overlay)
    print(rep.summary())
    return 0
