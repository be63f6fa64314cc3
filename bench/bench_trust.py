"""Issue 18: what the trust checks (owner and permissions of the library and its directories,
the SHA-256 of the library against its build record) add to a cached install().

Side by side, interleaved, each in a fresh interpreter (the check hashes a library once per
process): a cached ``install()`` as it is, against the same ``install()`` with the record read
without any check (the anchor). Also the check alone, timed in those same processes.

    .venv/bin/python bench/bench_trust.py [--rounds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import paired, ratio_line, run_py, save  # noqa: E402

MEASURE = r"""
import json, os, sys, time
import torch
import torchgen_patch
from torchgen_patch import pipeline
from torchgen_patch.runtime import install as inst
from torchgen_patch.sources import Options

_, plan = pipeline.plan(Options())
checked = inst._trusted_record
spent = []

def timed(library):
    t = time.perf_counter()
    try:
        return checked(library)
    finally:
        spent.append(time.perf_counter() - t)

def unchecked(library):  # the record as install() read it before the checks
    with open(os.path.join(os.path.dirname(os.path.abspath(library)), "build-info.json")) as fh:
        return json.load(fh)

inst._trusted_record = timed if sys.argv[1] == "checked" else unchecked
t = time.perf_counter()
rep = torchgen_patch.install(plan=plan)
dt = time.perf_counter() - t
assert rep.registered and not rep.refused, rep.summary()
if len(sys.argv) > 2:
    with open(sys.argv[2], "a") as fh:
        fh.write(f"{sum(spent)}\n")
print(dt)
"""


def main(rounds: int = 7) -> dict:
    import tempfile

    run_py(MEASURE, args=["checked"])  # the library built and the scan cached before anything is timed
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "checks.txt")
        xs, ys = paired(lambda: run_py(MEASURE, args=["checked", log]), lambda: run_py(MEASURE, args=["unchecked"]),
                        rounds)
        with open(log) as fh:
            checks = [float(x) for x in fh.read().split()]
    result = ratio_line("cached install() with the trust checks vs without", xs, ys, None)
    result["check_median_ms"] = statistics.median(checks) * 1000
    result["check_max_ms"] = max(checks) * 1000
    print(f"the checks alone (owner, modes, SHA-256 of the library), once per process: "
          f"median {result['check_median_ms']:.2f} ms, max {result['check_max_ms']:.2f} ms", flush=True)
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
