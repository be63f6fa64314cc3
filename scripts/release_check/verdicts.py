"""What keeps the release check from passing: a verdict for every test whose outcome differs unpatched and
patched (recorded in VERDICTS, or PyTorch's own hang as the stacks and the rates show it), and the defects."""

from __future__ import annotations

import math

from .checkout import codegen_tests_pass, lintrunner_expected
from .config import GROUP_ENV, GROUP_RUNS, MIN_RUNS, TEST_GROUPS, VERDICTS
from .ranks import GLOO_TEARDOWN_DEADLOCK


def _runs(d: dict) -> list[tuple[str, str, dict | None]]:
    """Every run of a differing test: (where, outcome, what its stuck ranks showed or None)."""
    if "runs" in d:  # a group run several times
        return [(f"{side}, group run {i + 1}", r["outcome"], r.get("stuck"))
                for side in ("unpatched", "patched") for i, r in enumerate(d["runs"][side])]
    runs = [(f"{side}, group run", d[side], d.get("stuck", {}).get(side)) for side in ("unpatched", "patched")]
    for side in ("unpatched", "patched"):
        for i, r in enumerate(d.get("reruns", {}).get(side, [])):
            r = {"outcome": r} if isinstance(r, str) else r
            runs.append((f"{side}, alone {i + 1}", r["outcome"], r.get("stuck")))
    return runs


# A differing test whose every failure is PyTorch's own hang (read_stuck) is this verdict, not a defect
UPSTREAM_HANG = "PyTorch's hang"
# The patched side's rate of that hang may not be above the unpatched side's beyond this chance
RATE_P = 0.05


def hang_rates(t: dict) -> dict[str, tuple[int, int]]:
    """side -> (test runs a rank timeout failed by PyTorch's gloo teardown deadlock, test runs that ran), over a
    group's runs."""
    out = {}
    for side in ("unpatched", "patched"):
        c = t.get(side, {}).get("counts", {})
        ran = sum(c.get(k, 0) for k in ("passed", "failed", "error"))
        out[side] = (t.get(side, {}).get("stuck", {}).get("tests_by_cause", {}).get(GLOO_TEARDOWN_DEADLOCK, 0), ran)
    return out


def more_often_patched(rates: dict[str, tuple[int, int]]) -> float:
    """One-sided p of Fisher's exact test that the hang strikes patched test runs more often than unpatched
    ones: P(patched hangs >= those seen | both sides' hangs and runs)."""
    (u, nu), (pt, np_) = rates["unpatched"], rates["patched"]
    k, n = u + pt, nu + np_
    if not k:
        return 1.0
    total = math.comb(n, k)
    return sum(math.comb(np_, x) * math.comb(nu, k - x) for x in range(pt, min(k, np_) + 1)) / total


def verdict(d: dict, t: dict | None = None) -> tuple[str, str]:
    """(verdict, why) of a differing test of group results ``t``: from VERDICTS (read when the report is
    rendered); UPSTREAM_HANG when the test ran MIN_RUNS times or more on each side and passed on each,
    every failure of it was a rank timeout whose ranks' stacks show PyTorch's gloo teardown deadlock and no
    frame of this project, the group's unpatched runs show that hang too, and neither the group's patched
    rate nor this test's is above the unpatched one beyond chance (RATE_P). A test that fails only sometimes
    is no exception: a failure nothing explains may be this project's."""
    if d["test"] in VERDICTS:
        return VERDICTS[d["test"]]
    runs = _runs(d)
    failed = [(where, s) for where, o, s in runs if o != "passed"]
    passed = {side: sum(w.startswith(side) and o == "passed" for w, o, _ in runs) for side in ("unpatched", "patched")}
    enough = all(sum(w.startswith(side) for w, _, _ in runs) >= MIN_RUNS for side in ("unpatched", "patched"))
    if t is None or not (enough and failed and all(passed.values())
                         and all(s and s["cause"] == GLOO_TEARDOWN_DEADLOCK for _, s in failed)):
        return ("unjudged", "no verdict recorded")
    rates = hang_rates(t)
    p = more_often_patched(rates)
    own = {side: (sum(w.startswith(side) and o != "passed" for w, o, _ in runs),
                  sum(w.startswith(side) for w, _, _ in runs)) for side in ("unpatched", "patched")}
    p_own = more_often_patched(own)
    seen = "; in the group, test runs failed by it: " + ", ".join(
        f"{side} {h} of {n}" for side, (h, n) in rates.items()) + f" (one-sided Fisher p = {p:.2f}; this test's " \
        f"runs p = {p_own:.2f})"
    if not rates["unpatched"][0] or p < RATE_P or p_own < RATE_P:
        return ("unjudged", "every failure was PyTorch's gloo teardown deadlock, but it is not seen at a like rate "
                "unpatched" + seen)
    return (UPSTREAM_HANG, f"passed in {len(runs) - len(failed)} of {len(runs)} runs; failed in "
            + ", ".join(w for w, _ in failed) + f" by a rank stuck in {GLOO_TEARDOWN_DEADLOCK} (its stacks: "
            "the destructor joining gloo's workers with the GIL held, a worker waiting for the GIL; no frame of "
            "this project), fixed in PyTorch after 2.6 (pytorch/pytorch#154976)" + seen)


def defects(data: dict) -> list[str]:
    """What keeps the release check from passing, one line each (empty: it passes)."""
    out = []
    c = data.get("checkout")
    if c is None:
        out.append("checkout: not run")
    elif "failed" in c:
        out.append(f"checkout: {c['failed']}")
    else:
        if not c["matrix_row_same"]:
            out.append("checkout: the counts differ from the compatibility matrix's row")
        if not c["upstream_added_are_the_missing"] or c["patched_findings"] or c.get("lintrunner_after"):
            out.append("checkout: the fix does not add exactly the missing kernels, or lint after it is not 0")
        if c.get("lintrunner_before") != lintrunner_expected(c):
            out.append("checkout: lintrunner and `lint` disagree on the unpatched tree")
        if c.get("requires_grad_checks_removed"):
            out.append("checkout: the fix removes requires-grad checks")
        if not c.get("requires_grad_checks_added_are_the_lint_ops"):
            out.append("checkout: the requires-grad checks the fix adds are not exactly the ops "
                       "`lint --autograd` lists")
        if not codegen_tests_pass(c.get("codegen_tests")):
            out.append("checkout: tools/test/test_codegen.py: the fix's cases do not fail unpatched and pass fixed, or "
                       "another test's outcome changed" if c.get("codegen_tests") else
                       "checkout: tools/test/test_codegen.py: not run")
    a = data.get("adapters")
    if a is None:
        out.append("adapters: not run")
    elif c and c.get("fix_edits") and sorted(a["files"]) != sorted(c["fix_edits"]):
        out.append("adapters: its results are of the files the fix edited before, not of those it edits now: "
                   "run it again")
    else:
        for code, e in sorted(a["linters"].items()):
            if e.get("findings") or e.get("failures"):
                out.append(f"adapters: {code}: {len(e['findings'])} findings, {len(e['failures'])} failures")
    r = data.get("regression")
    if r is None or not (r["fails_unpatched"] and r["passes_patched"]):
        out.append("regression test: not run" if r is None else "regression test: not fail -> pass")
    for group in TEST_GROUPS:
        t = data.get("tests", {}).get(group)
        if t is None:
            out.append(f"{group}: not run")
            continue
        if (t.get("files"), t.get("runs", 1), t.get("env", {})) != (TEST_GROUPS[group], GROUP_RUNS.get(group, 1),
                                                                    GROUP_ENV.get(group, {})):
            out.append(f"{group}: its results are of other files, runs or settings than the check's now: run it again")
        for side in ("unpatched", "patched"):
            if t.get(side, {}).get("stuck", {}).get("failed_dumps"):
                out.append(f"{group}: {side}: py-spy could not dump {t[side]['stuck']['failed_dumps']} stuck ranks")
        for d in t["differ"]:
            if verdict(d, t)[0] not in ("intended", UPSTREAM_HANG):
                out.append(f"{group}: {d['test']}: {verdict(d, t)[0]}")
    return out
