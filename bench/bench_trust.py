"""What the checks on the cache and the library (owner and modes of the root and every directory,
the library opened once without following symlinks and loaded from that descriptor, its SHA-256,
the record and manifest read the same way) cost a cached install(), against the same install()
of the code before those checks (commit ANCHOR, unpacked with `git archive` into a temporary
directory and imported from there).

Side by side, interleaved, each in a fresh interpreter, on the same warm cache: target <= 1.05.

    .venv/bin/python bench/bench_trust.py [--rounds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import paired, ratio_line, run_py, save  # noqa: E402

ANCHOR = "0539071"
MEASURE = r"""
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


def _anchor_tree(d: str) -> str:
    import subprocess

    from common import ROOT

    tree = os.path.join(d, "anchor")
    os.makedirs(tree)
    archive = subprocess.run(["git", "archive", ANCHOR], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    return tree


def main(rounds: int = 7) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        old = _anchor_tree(d)
        run_py(MEASURE)  # the library built and both scans cached before anything is timed
        run_py(MEASURE, pythonpath=old)
        xs, ys = paired(lambda: run_py(MEASURE), lambda: run_py(MEASURE, pythonpath=old), rounds)
    result = ratio_line(f"cached install() with every check vs the same at {ANCHOR}", xs, ys, 1.05)
    result["anchor"] = ANCHOR
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args()
    res = main(args.rounds)
    if args.json:
        save([{"section": "trust", "results": res}], args.json)
    print(json.dumps(res, indent=2))
    sys.exit(0)
