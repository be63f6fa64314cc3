"""`make bench`: every benchmark, each figure a ratio against its anchor,
measured side by side in one run. Writes reports/bench-<device>-torch<ver>.json."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_build  # noqa: E402
import bench_gen  # noqa: E402
import bench_lint  # noqa: E402
import bench_trust  # noqa: E402
import bench_saved  # noqa: E402
import bench_startup  # noqa: E402
from common import ROOT, save  # noqa: E402


def _callgrind(report: bool) -> dict:
    """bench_callgrind.py in a process of its own; its json also in reports/ (one file: the PR body reads it)
    with --report."""
    from torchgen_patch.sources import installed_torch_version as torch_version

    name = f"bench-callgrind-cpu-torch{torch_version().split('+')[0]}.json"
    out = os.path.join(ROOT, "build", name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    r = subprocess.run([sys.executable, os.path.join(HERE, "bench_callgrind.py"), "--json", out],
                       env=dict(os.environ, PYTHONPATH=ROOT))
    if r.returncode != 0:
        return {"not_run": f"bench_callgrind.py exited {r.returncode}"}
    with open(out) as fh:
        data = json.load(fh)
    if report:
        with open(os.path.join(ROOT, "reports", name), "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
    return data


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=("lint", "gen", "build", "call", "callgrind", "trust", "startup", "optim",
                                       "saved"),
                    action="append")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=15, help="paired rounds of the per-call benchmark")
    ap.add_argument("--startup-rounds", type=int, default=11, help="paired rounds of the start-up benchmark")
    ap.add_argument("--report", action="store_true",
                    help="also update the committed report under reports/ (only the sections run are replaced)")
    ap.add_argument("--saved-rounds", type=int, default=15, help="paired rounds of the saved-tensor check's benchmark")
    args = ap.parse_args()
    only = set(args.only or ("lint", "gen", "build", "call", "callgrind", "trust", "startup", "optim", "saved"))
    results = {}
    if "lint" in only:
        print("== lint", flush=True)
        results["lint"] = bench_lint.main()
    if "gen" in only:
        print("== gen", flush=True)
        results["gen"] = bench_gen.main()
    if "build" in only:
        print("== build", flush=True)
        results["build"] = bench_build.main()
    if "trust" in only:
        print("== the cache and library checks in a cached install() vs before them", flush=True)
        results["trust"] = bench_trust.main()
        print(f"== a cached install() and run's start-up vs the code at {bench_trust.UNCHANGED}", flush=True)
        results["unchanged"] = bench_trust.main(baseline=bench_trust.UNCHANGED, target=1.02, launcher=True)
        print(f"== a cached install() and run's start-up vs the code at {bench_trust.DEFAULTS}", flush=True)
        results["defaults"] = bench_trust.main(baseline=bench_trust.DEFAULTS, target=1.02, launcher=True)
    if "call" in only:
        print("== per-call cost: unpatched | PyTorch-shaped kernel | this project's kernel", flush=True)
        out = os.path.join(ROOT, "build", f"bench-call-{args.device}.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        r = subprocess.run([sys.executable, os.path.join(HERE, "bench_call.py"), "--device", args.device,
                            "--json", out, "--rounds", str(args.rounds)], env=dict(os.environ, PYTHONPATH=ROOT))
        if r.returncode != 0:
            return r.returncode
        with open(out) as fh:
            results["call"] = json.load(fh)
    if "callgrind" in only:
        print("== per-call cost in instructions (callgrind): a zero-returns op unpatched | with the kernel PyTorch's "
              "fixed codegen emits | with this project's | a generated in-place op (CPU)", flush=True)
        results["callgrind"] = _callgrind(args.report)
    if "optim" in only:
        print("== an optimizer step with the overlay's optimizer entries active vs not: torch's AdamW, "
              "DeepSpeedCPUAdam",
              flush=True)
        out = os.path.join(ROOT, "build", "bench-optim.json")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
        env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".cache", "torch_extensions"))
        r = subprocess.run([sys.executable, os.path.join(HERE, "bench_optim.py"), "--json", out], env=env)
        if r.returncode != 0:
            return r.returncode
        with open(out) as fh:
            results["optim"] = json.load(fh)
    if "startup" in only:
        print("== start-up: prebuilt wheel, warm cache, python backend vs import torch; the launcher vs the plain "
              "program", flush=True)
        results["startup"] = bench_startup.main(args.startup_rounds)
    if "saved" in only:
        print(f"== the saved-tensor check: a training step with it on / off ({args.device})", flush=True)
        # its own report, one file for this check (reports/saved-check-<device>-torch<version>.md)
        results["saved"] = bench_saved.main(args.saved_rounds, report=args.report, device=args.device)
    from torchgen_patch.sources import installed_torch_version as torch_version

    name = f"bench-{args.device}-torch{torch_version().split('+')[0]}.json"
    # every run lands in build/; the committed report changes only when asked (--report), and then
    # only in the sections this run measured
    targets = [os.path.join(ROOT, "build", name)] + ([os.path.join(ROOT, "reports", name)] if args.report else [])
    for path in targets:
        sections = dict(results)
        if path.startswith(os.path.join(ROOT, "reports")):
            sections.pop("saved", None)  # the saved-tensor check has a report of its own
        if path.startswith(os.path.join(ROOT, "reports")) and os.path.exists(path):
            with open(path) as fh:
                sections = {s["section"]: s["results"] for s in json.load(fh)} | sections
        save([{"section": k, "results": v} for k, v in sorted(sections.items())], path)
        print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
