"""`torchgen-patch verify`: version-counter checks of every op of the plan."""

from __future__ import annotations

import sys

from .errors import InputError


def add_parser(sub, add_sources) -> None:
    v = sub.add_parser("verify", help="run every op of the plan and check its version bumps")
    add_sources(v)
    v.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    g = v.add_mutually_exclusive_group()
    g.add_argument("--without-patch", action="store_true", help="run without installing the kernels")
    g.add_argument("--both", action="store_true", help="run without, then with the patch, in one report")
    v.add_argument("--backend", choices=("cpp", "python"), default="cpp")
    v.add_argument("--op", action="append", help="only these ops (repeatable)")
    v.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    v.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of stdout")
    v.set_defaults(func=run)


def run(args) -> int:
    import platform

    import torch

    from . import verify
    from .installer import default_plan, install

    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError(None, None, "--device cuda: no CUDA device is available")
    if args.pytorch_root:
        raise InputError(args.pytorch_root, None, "verify uses the installed torch's yaml or --native-functions")
    plan, _ = default_plan(args.native_functions, args.tags, overlay=args.overlay)
    ops = plan.ops()
    if args.op:
        unknown = sorted(set(args.op) - set(ops))
        if unknown:
            raise InputError(None, None, f"not in the plan: {', '.join(unknown)}")
        ops = sorted(args.op)
    xfails = {k.op: k.xfail_devices for k in plan.kernels if k.xfail_devices is not None}
    runs: dict[str, list] = {}
    if args.without_patch or args.both:
        runs["without patch"] = verify.run(ops, args.device, False, xfails)
    refused = {}
    if not args.without_patch:
        rep = install(ops, backend=args.backend, native_functions=args.native_functions, tags=args.tags,
                      overlay=args.overlay)
        refused = rep.refused
        runs[f"with patch ({args.backend})"] = verify.run(ops, args.device, True, xfails)
    meta = {"torch": torch.__version__, "device": args.device if args.device == "cpu"
            else f"cuda: {torch.cuda.get_device_name()}", "python": platform.python_version(),
            "ops": len(ops), "command": "torchgen-patch verify " + " ".join(sys.argv[2:])}
    if refused:
        meta["refused"] = "; ".join(f"{k}: {v}" for k, v in sorted(refused.items()))
    if args.format == "json":
        text = verify.to_json(runs, meta)
    elif args.format == "markdown":
        text = verify.markdown(runs, meta)
    else:
        text = "".join(f"== {name}\n" + verify.table(rs) for name, rs in runs.items())
    if args.output:
        from .write import atomic_write

        atomic_write(args.output, text.encode())
    else:
        sys.stdout.write(text)
    bad = [r for rs in runs.values() for r in rs if r.patched and r.verdict in verify.FAILING]
    for r in bad:
        print(f"verify: {r.op}: {r.verdict} {r.message}", file=sys.stderr)
    return 1 if bad else 0
