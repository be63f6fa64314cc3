"""`lint` over the full yaml against torchgen's own parse_native_yaml on the same
yaml, in both worlds, side by side (interleaved runs):

- installed: the installed torch's torchgen and its packaged yaml;
- checkout: a checkout-layout tree of the installed release (testbed/trees.py),
  linted with --pytorch-root, against the tree's own torchgen parsing the tree's yaml.

Every run is a fresh interpreter timing itself from before its first import to
the end (the interpreter's own start-up excluded on both sides). Cold: an empty
cache. Warm: a re-run on unchanged inputs (cache hit).

And what the requires-grad half costs: `lint --requires-grad` (what the shipped
lintrunner blocks, pre-commit hook and `make run` run) against `lint`, cold and
warm, in both worlds, side by side.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from common import ROOT, paired, ratio_line, run_py

PARSE = """
import sys, time; t = time.perf_counter()
from torchgen.gen import parse_native_yaml
parse_native_yaml(sys.argv[1], sys.argv[2])
print(time.perf_counter() - t)
"""

LINT = """
import sys, time, io, contextlib; t = time.perf_counter()
from torchgen_patch.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["lint"] + sys.argv[1:])
print(time.perf_counter() - t)
"""


def main(n: int = 7) -> list[dict]:
    sys.path.insert(0, ROOT)
    from testbed.trees import tree_from_installed
    from torchgen_patch.sources import Options, resolve

    src = resolve(Options())
    work = tempfile.mkdtemp(prefix="tgp-bench-lint-")
    tree = tree_from_installed(os.path.join(work, "pytorch"), git=False)
    tyaml = os.path.join(tree, "aten", "src", "ATen", "native")
    out = []
    try:
        for world, lint_args, parse_args, parse_path in (
                ("installed", [], [src.native, src.tags], None),
                ("checkout", ["--pytorch-root", tree],
                 [os.path.join(tyaml, "native_functions.yaml"), os.path.join(tyaml, "tags.yaml")], tree)):
            def cold(lint_args=lint_args):
                return run_py(LINT, {"TORCHGEN_PATCH_CACHE": tempfile.mkdtemp(prefix="c-", dir=work)}, lint_args)

            warm_dir = tempfile.mkdtemp(prefix="w-", dir=work)
            run_py(LINT, {"TORCHGEN_PATCH_CACHE": warm_dir}, lint_args)  # fill the cache once

            def warm(warm_dir=warm_dir, lint_args=lint_args):
                return run_py(LINT, {"TORCHGEN_PATCH_CACHE": warm_dir}, lint_args)

            def parse(parse_args=parse_args, parse_path=parse_path):
                return run_py(PARSE, None, parse_args, pythonpath=parse_path)

            xs, ys = paired(cold, parse, n)
            out.append(ratio_line(f"{world}: lint cold vs parse_native_yaml", xs, ys, 1.1))
            xs, ys = paired(warm, parse, n)
            out.append(ratio_line(f"{world}: lint re-run (cache hit) vs parse_native_yaml", xs, ys, 0.1))
            out += requires_grad_half(world, lint_args, work, n)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def requires_grad_half(world: str, lint_args: list[str], work: str, n: int) -> list[dict]:
    """`lint --requires-grad` vs `lint`: cold (each run an empty cache) and warm (each its own filled
    cache). Reported, no target: the choice it informs is where the half is on by default."""
    both = ["--requires-grad", *lint_args]

    def cold(args):
        return lambda: run_py(LINT, {"TORCHGEN_PATCH_CACHE": tempfile.mkdtemp(prefix="c-", dir=work)}, args)

    def warm(args):
        d = tempfile.mkdtemp(prefix="w-", dir=work)
        run_py(LINT, {"TORCHGEN_PATCH_CACHE": d}, args)  # fill it once
        return lambda: run_py(LINT, {"TORCHGEN_PATCH_CACHE": d}, args)

    out = []
    for kind, make in (("cold", cold), ("re-run (cache hit)", warm)):
        xs, ys = paired(make(both), make(lint_args), n)
        out.append(ratio_line(f"{world}: lint --requires-grad {kind} vs lint {kind}", xs, ys, None))
    return out


if __name__ == "__main__":
    main()
