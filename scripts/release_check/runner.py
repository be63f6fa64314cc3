"""PyTorch's test files run with pytest from the tree's test/ folder, unpatched or under `torchgen-patch
run`, and their per-test outcomes read from pytest's junit xml."""

from __future__ import annotations

import os
import subprocess
import time
import xml.etree.ElementTree as ET

from .config import ROOT
from .ranks import StuckRanks, children, explain_failures
from .venv import run_env

# One pytest command of the check (a group's run, a test alone) may take this long before it is ended
RUN_LIMIT_S = 3600


def _junit(path: str) -> dict[str, str]:
    """test id (module.Class.name) -> passed | failed | error | skipped, from a pytest junit xml."""
    return {test: kind for test, (kind, _) in _junit_cases(path).items()}


def _junit_cases(path: str) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, the failure's or error's message), from a pytest junit xml."""
    cases: dict[str, tuple[str, str]] = {}
    if not os.path.isfile(path):
        return cases
    for case in ET.parse(path).getroot().iter("testcase"):
        kind, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind, message = {"failure": "failed"}.get(child.tag, child.tag), child.get("message") or ""
                break
        cases[f"{case.get('classname')}.{case.get('name')}"] = (kind, message)
    return cases


def _skip_reasons(path: str) -> dict[str, int]:
    """skip message -> how many tests gave it (the three commonest), from a pytest junit xml."""
    seen: dict[str, int] = {}
    if os.path.isfile(path):
        for skipped in ET.parse(path).getroot().iter("skipped"):
            msg = (skipped.get("message") or "").strip()[:120]
            seen[msg] = seen.get(msg, 0) + 1
    return dict(sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))[:3])


def run_tests(tree: str, python: str, files: list[str], patched: bool, xml: str, log: str,
              env: dict[str, str] | None = None) -> dict:
    """PyTorch's test files with pytest from the tree's test/ folder, at low priority; patched under
    `torchgen-patch run`. Returns counts, wall time, exit status, per-test outcomes and, for tests failed by a
    rank timeout, what their stuck ranks' stacks show (StuckRanks; dumps beside the log)."""
    cmd = [python, "-m", "pytest", *files, "-p", "no:cacheprovider", f"--junit-xml={xml}", "-q"]
    if patched:
        cmd = [python, "-m", "torchgen_patch", "run", "--", *cmd]
    py_spy = os.path.join(os.path.dirname(python), "py-spy")
    folder = os.path.splitext(log)[0] + "-stuck"  # made by the first dump
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(["nice", "-n", "10", *cmd], cwd=os.path.join(tree, "test"),
                                env=dict(run_env(python), **(env or {})), stdout=f, stderr=subprocess.STDOUT)
        watch = StuckRanks(proc.pid, py_spy, folder)
        if os.path.isfile(py_spy):
            watch.start()
        try:
            rc = proc.wait(timeout=RUN_LIMIT_S)
        except subprocess.TimeoutExpired:  # pytest itself wedged: its tree ended, its outcomes absent
            for p in [*children(proc.pid), proc.pid]:
                try:
                    os.kill(p, 9)
                except OSError:
                    pass
            rc = proc.wait()
            f.write(f"\nrelease check: ended after {RUN_LIMIT_S} s\n")
        watch.done.set()
        if watch.is_alive():
            watch.join()
    cases = _junit_cases(xml)
    outcomes = {test: kind for test, (kind, _) in cases.items()}
    counts: dict[str, int] = {}
    for kind in outcomes.values():
        counts[kind] = counts.get(kind, 0) + 1
    return {"rc": rc, "wall_s": round(time.monotonic() - t0, 1), "counts": counts, "outcomes": outcomes,
            "skip_reasons": _skip_reasons(xml), "stuck": explain_failures(cases, watch.dumps, ROOT, watch.failed),
            "stuck_ranks": len(watch.dumps) + watch.failed, "failed_dumps": watch.failed, "dumps": watch.dumps,
            "py_spy": os.path.isfile(py_spy)}
