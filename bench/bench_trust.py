"""What every check on the cache and the library costs a cached install(): the cache walked and used
by descriptor, entries proven, the library opened once without following symlinks, hashed,
loaded from that descriptor under a name of its own and made to state its build, against the
same install() of the code before (``--baseline``, a commit unpacked with `git archive` into a
temporary directory and imported from there; by default the code before the checks by
descriptor).

Two calls, each side by side, interleaved, in fresh interpreters on the same warm cache: the
plan given (``install(plan=plan)``: render, the build's key, its record) and the plain
``install()`` (the library found by its inputs' key, nothing rendered). Target <= 1.05 each.

And the same two calls and ``run``'s start-up (``torchgen-patch run -q -- python -c "import torch"``,
the launcher and its child, timed from outside) against the code before the file system layer, the
typed values at its boundaries and the runtime's split (``UNCHANGED``): those left them as they were,
within 2 %. The same against the code before the saved-tensor check was on by default and before an
enabled environment's own data file governed (``DEFAULTS``): within 2 % too.

    .venv/bin/python bench/bench_trust.py [--rounds N] [--baseline REF] [--target X] [--launcher] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import paired, ratio_line, run_py, save  # noqa: E402

ANCHOR = "1162100"  # the code before the cache and the builds were used by descriptor
UNCHANGED = "a21acc2"  # before the file system layer, the typed boundaries and the runtime split
DEFAULTS = "bccad49"  # before the check on by default and the launch spec's say limited to run's own processes
MEASURE_PLAN = r"""
import time
import torch
import torchgen_patch
from torchgen_patch import pipeline
from torchgen_patch.sources import Options

_, plan = pipeline.plan(Options())
t = time.perf_counter()
rep = torchgen_patch.install(plan=plan)
dt = time.perf_counter() - t
assert rep.registered and not rep.refused, rep.summary()
print(dt)
"""
MEASURE_INDEX = r"""
import time
import torch
import torchgen_patch

t = time.perf_counter()
rep = torchgen_patch.install()
dt = time.perf_counter() - t
assert rep.registered and not rep.refused, rep.summary()
print(dt)
"""
MEASURE_RUN = r"""
import subprocess
import sys
import time

t = time.perf_counter()
subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "-q", "--", sys.executable, "-c", "import torch"],
               check=True)
print(time.perf_counter() - t)
"""


def _anchor_tree(d: str, ref: str) -> str:
    import subprocess

    from common import ROOT

    tree = os.path.join(d, "anchor")
    os.makedirs(tree)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def _package_of(pythonpath: str | None, cwd: str) -> str:
    """Where ``torchgen_patch`` is imported from, run as the measured code runs."""
    import subprocess

    from common import ROOT, _env

    e = _env(PYTHONPATH=os.pathsep.join(p for p in (pythonpath, ROOT) if p))
    r = subprocess.run([sys.executable, "-c", "import torchgen_patch; print(torchgen_patch.__file__)"],
                       capture_output=True, text=True, env=e, cwd=cwd, check=True)
    return os.path.dirname(os.path.dirname(r.stdout.strip()))


def main(rounds: int = 7, baseline: str = ANCHOR, target: float = 1.05, launcher: bool = False) -> list[dict]:
    """The two cached install() calls (and with ``launcher``, run's start-up) against ``baseline``."""
    import tempfile

    from common import ROOT

    out = []
    with tempfile.TemporaryDirectory() as d:
        old = _anchor_tree(d, baseline)
        # each side imports its own tree (python -c puts its working directory first on the path)
        assert _package_of(None, ROOT) == ROOT and _package_of(old, old) == old

        def new_side(code):
            return run_py(code)

        def old_side(code):
            return run_py(code, pythonpath=old, cwd=old)

        measured = [("cached install(plan=...)", MEASURE_PLAN), ("cached install()", MEASURE_INDEX)]
        if launcher:
            measured.append(("run -q -- python -c 'import torch', warm build cache,", MEASURE_RUN))
        for _, code in measured:  # built, scanned and indexed before anything is timed
            new_side(code)
            old_side(code)
        for what, code in measured:
            xs, ys = paired(lambda code=code: new_side(code), lambda code=code: old_side(code), rounds)
            result = ratio_line(f"{what} with every check vs the same at {baseline}", xs, ys, target)
            result["anchor"] = baseline
            out.append(result)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", default=ANCHOR, help="the commit to compare with (default: %(default)s)")
    ap.add_argument("--target", type=float, default=1.05, help="the largest ratio met (default: %(default)s)")
    ap.add_argument("--launcher", action="store_true", help="also run's start-up")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    res = main(args.rounds, args.baseline, args.target, args.launcher)
    if args.json:
        section = "defaults" if args.baseline == DEFAULTS else "unchanged" if args.launcher else "trust"
        save([{"section": section, "results": res}], args.json)
    print(json.dumps(res, indent=2))
    sys.exit(0)
