"""`torchgen-patch diff`: a patch for a PyTorch source tree's autograd codegen."""

from __future__ import annotations

import os
import sys

from .errors import InputError


def add_parser(sub, add_sources) -> None:
    d = sub.add_parser("diff", help="write a unified diff that fixes (or guards) PyTorch's own codegen")
    d.add_argument("--pytorch-root", required=True, metavar="DIR", help="a PyTorch source tree")
    d.add_argument("--mode", choices=("fix", "error"), default="fix")
    d.add_argument("-o", "--output", metavar="FILE", help="write the diff here (default: stdout)")
    d.add_argument("--check", action="store_true", help="report whether the tree is already patched "
                                                         "(exit 0 patched, 1 not)")
    d.set_defaults(func=run)


def run(args) -> int:
    from . import upstream_patch as up
    from .tg import read_text

    path = os.path.join(args.pytorch_root, up.TARGET)
    if not os.path.isdir(args.pytorch_root):
        raise InputError(args.pytorch_root, None, "--pytorch-root is not a directory")
    source = read_text(path, "the autograd codegen")
    applied = up.state(source)
    if args.check:
        print(f"{up.TARGET}: " + (f"patched (mode {applied})" if applied else "not patched"))
        return 0 if applied else 1
    text = up.unified_diff(source, up.patched(source, args.mode, path))
    if args.output:
        from .write import atomic_write

        atomic_write(args.output, text.encode())
    else:
        sys.stdout.write(text)
    return 0
