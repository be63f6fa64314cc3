"""The fix's regression test in the tree, and PyTorch's test groups run unpatched and patched (GROUP_RUNS
times each, alternating) and compared test by test."""

from __future__ import annotations

import os
import re
import sys
from collections import Counter

from stack_dump import deadlock_excerpt, read_stuck

from .config import GROUP_ENV, GROUP_RUNS, RERUNS, TEST_GROUPS
from .runner import run_tests


def step_regression(tree: str, work: str, python: str) -> dict:
    from torchgen_patch.upstream.patch import TEST_FILE

    out: dict = {"file": TEST_FILE}
    for side in ("unpatched", "patched"):
        r = run_tests(tree, python, [os.path.relpath(TEST_FILE, "test")], side == "patched",
                      os.path.join(work, f"regression-{side}.xml"), os.path.join(work, f"regression-{side}.log"))
        out[side] = {k: r[k] for k in ("rc", "wall_s", "counts")}
    out["fails_unpatched"] = out["unpatched"]["rc"] != 0 and out["unpatched"]["counts"].get("failed", 0) > 0
    out["passes_patched"] = out["patched"]["rc"] == 0 and not (out["patched"]["counts"].get("failed")
                                                               or out["patched"]["counts"].get("error"))
    return out


def _stuck_summary(r: dict) -> dict:
    """How many ranks of one run were stuck, and how many tests failed by a rank timeout, by cause."""
    causes = Counter(e["cause"] for e in r["stuck"].values())
    return {"ranks": r["stuck_ranks"], "tests_by_cause": dict(causes), "failed_dumps": r.get("failed_dumps", 0)}


def _outcome_text(outcomes: list[str]) -> str:
    """One test's outcomes over a group's runs on one side: "passed", or "passed 2, failed 1"."""
    if len(set(outcomes)) == 1:
        return outcomes[0]
    return ", ".join(f"{o} {outcomes.count(o)}" for o in sorted(set(outcomes)))


def step_tests(group: str, tree: str, work: str, python: str) -> dict:
    """A group run unpatched and patched (GROUP_RUNS times each, alternating), compared test by test; a test
    whose outcomes differ is run again alone (RERUNS times on each side) when the group ran once."""
    n = GROUP_RUNS.get(group, 1)
    slug = re.sub(r"\W+", "-", group).strip("-")
    runs: dict[str, list[dict]] = {"unpatched": [], "patched": []}
    for i in range(n):
        for side in runs:
            name = f"{slug}-{side}" + (f"-{i + 1}" if n > 1 else "")
            r = run_tests(tree, python, TEST_GROUPS[group], side == "patched", os.path.join(work, f"{name}.xml"),
                          os.path.join(work, f"{name}.log"), GROUP_ENV.get(group))
            runs[side].append(r)
            print(f"  {group} {side}" + (f" {i + 1}/{n}" if n > 1 else "") + f": {r['counts']} in {r['wall_s']} s",
                  file=sys.stderr)
    tests = sorted({t for side in runs for r in runs[side] for t in r["outcomes"]})
    differ = []
    for test in tests:
        seen = {side: [r["outcomes"].get(test, "absent") for r in runs[side]] for side in runs}
        if set(seen["unpatched"]) == set(seen["patched"]) and len(set(seen["unpatched"])) == 1:
            continue
        d = {"test": test, **{side: _outcome_text(seen[side]) for side in runs}}
        if n == 1:
            d["stuck"] = {side: runs[side][0]["stuck"][test] for side in runs if test in runs[side][0]["stuck"]}
            d["reruns"] = {side: [_rerun(group, test, tree, work, python, side, i) for i in range(RERUNS)]
                           for side in runs}
        else:
            d["runs"] = {side: [dict(outcome=r["outcomes"].get(test, "absent"),
                                     **({"stuck": r["stuck"][test]} if test in r["stuck"] else {}))
                                for r in runs[side]] for side in runs}
        print(f"  {group} {test}: {d['unpatched']} / {d['patched']}", file=sys.stderr)
        differ.append(d)
    out: dict = {"files": TEST_GROUPS[group], "differ": differ, "env": GROUP_ENV.get(group, {})}
    if n > 1:
        out["runs"] = n
    for side in runs:
        counts = sum((Counter(r["counts"]) for r in runs[side]), Counter())
        out[side] = {"rc": max(r["rc"] for r in runs[side]), "wall_s": round(sum(r["wall_s"] for r in runs[side]), 1),
                     "counts": dict(counts), "skip_reasons": runs[side][0]["skip_reasons"]}
        stuck = [_stuck_summary(r) for r in runs[side]]
        if any(st["ranks"] for st in stuck):
            causes = sum((Counter(st["tests_by_cause"]) for st in stuck), Counter())
            out[side]["stuck"] = {"ranks": sum(st["ranks"] for st in stuck), "tests_by_cause": dict(causes),
                                  "failed_dumps": sum(st["failed_dumps"] for st in stuck)}
        if not all(r.get("py_spy", True) for r in runs[side]):
            out[side]["no_py_spy"] = True
    excerpt = _first_deadlock([p for side in runs for r in runs[side] for p in r.get("dumps", [])])
    if excerpt:
        out["deadlock_stack"] = excerpt
    return out


def _first_deadlock(dumps: list[str]) -> str:
    """The deadlock's two threads from the first of a group's dumps that shows it, or ''."""
    for path in dumps:
        with open(path, encoding="utf-8", errors="replace") as f:
            dump = f.read()
        r = read_stuck(dump)
        if r["gloo_teardown_deadlock"] and not r["ours"]:
            return deadlock_excerpt(dump)
    return ""


def _rerun(group: str, test: str, tree: str, work: str, python: str, side: str, i: int) -> dict:
    """The outcome of ``test`` (junit id ``module.Class.test``) run alone again on ``side``, and, when a rank
    timeout failed it, what its stuck ranks show."""
    cls, name = test.rsplit(".", 2)[-2:]
    slug = re.sub(r"\W+", "-", f"{name}-{side}-{i}").strip("-")
    r = run_tests(tree, python, [*TEST_GROUPS[group], "-k", f"{cls} and {name}"], side == "patched",
                  os.path.join(work, f"rerun-{slug}.xml"), os.path.join(work, f"rerun-{slug}.log"),
                  GROUP_ENV.get(group))
    out = {"outcome": r["outcomes"].get(test, "absent")}
    if test in r["stuck"]:
        out["stuck"] = r["stuck"][test]
    return out
