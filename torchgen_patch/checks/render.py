"""verify's renderers, one per format of its report: the counts of a run, the text table, the
markdown report for people (with the legend of the verdicts, which the CLI's --help also shows) and
JSON, for the version check and for ``--check requires-grad``. Each takes results and returns text;
the CLI decides printing and exit codes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from .verify import ERROR, EXTRA, MISS, NOT_RUN, PASS, XFAIL, XPASS, GradResult, OpResult, counts

# What each verdict means, for people: the report's legend and the CLI's --help say it from here.
LEGEND = {
    PASS: "every tensor the op writes went up by exactly one version",
    MISS: "some written tensor kept its version: autograd cannot see the write",
    EXTRA: "some written tensor went up by more than one version",
    ERROR: "the call raised (the message says why)",
    NOT_RUN: "no sample can run here (another device, a missing state); the reason is given",
    XFAIL: "failed, as the overlay expects",
    XPASS: "passed, although the overlay expects a failure",
}


def _versions(r: OpResult) -> str:
    return " ".join(f"{t.arg} {t.before}->{t.after}" for t in r.tensors) or "-"


def count_text(results: Sequence[OpResult] | Sequence[GradResult]) -> str:
    """The verdict counts of one run (of either check), as the reports write them: ``MISS 20, PASS 154``."""
    return ", ".join(f"{k} {v}" for k, v in counts(results).items())


def summary(runs: dict[str, list[OpResult]]) -> str:
    """One line per run: its verdict counts."""
    return "\n".join(f"{name}: {count_text(rs)}" for name, rs in runs.items())


def table(results: list[OpResult]) -> str:
    """One run as a table for a terminal: a row per op, then its counts."""
    w = max([len(r.op) for r in results] + [2])
    lines = [f"{'op':<{w}}  {'device':<6}  {'patch':<5}  {'verdict':<7}  "
             "versions (per written argument: before->after)"]
    for r in results:
        lines.append(f"{r.op:<{w}}  {r.device:<6}  {'yes' if r.patched else 'no':<5}  {r.verdict:<7}  "
                     f"{_versions(r)}{('  ' + r.message) if r.message else ''}")
    lines.append("counts: " + count_text(results))
    return "\n".join(lines) + "\n"


def _failing(results_by_run: dict[str, list[OpResult]]) -> list[str]:
    """The markdown list of every op that failed, per run and verdict (or a line saying none did)."""
    lines = []
    for name, rs in results_by_run.items():
        for verdict in (MISS, EXTRA, ERROR):
            ops = [r.op for r in rs if r.verdict == verdict]
            if ops:
                lines.append(f"- {name}, {verdict} ({len(ops)}): " + ", ".join(f"`{op}`" for op in ops))
    return lines or ["- none: no op missed a bump, bumped twice or raised"]


def markdown(results_by_run: dict[str, list[OpResult]], meta: dict) -> str:
    """The report for people: what was run, the legend, the failing ops, then every op's row."""
    runs = list(results_by_run)
    lines = ["# torchgen-patch verify report", ""]
    for k, v in meta.items():
        lines.append(f"- {k}: `{v}`")
    lines.append("")
    lines += ["- " + line for line in summary(results_by_run).splitlines()]
    lines += ["", "Every op here lacks the ADInplaceOrView kernel that bumps versions; many still bump because "
                  "their backend kernel does it by itself, so only some MISS without the patch. Each op runs once on "
                  "a small sample; the cells show, for every tensor it writes, its version before and after the "
                  "call (`0->1`).", ""]
    lines += [f"- **{k}**: {v}" for k, v in LEGEND.items()]
    lines += ["", "## Failing ops", ""] + _failing(results_by_run)
    lines += ["", "## Every op", "", "| op | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    by_op = _by_op(results_by_run)
    for op in sorted(by_op):
        cells = []
        for run_name in runs:
            r = by_op[op].get(run_name)
            if r is None:
                cells.append("")
                continue
            cell = f"{r.verdict} {_versions(r)}" if r.tensors else r.verdict
            if r.message:
                cell += f" ({r.message.replace('|', '/')[:100]})"
            cells.append(cell)
        lines.append(f"| `{op}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _by_op(results_by_run: dict[str, list]) -> dict[str, dict]:
    """op -> run name -> its result."""
    by_op: dict[str, dict] = {}
    for run_name, rs in results_by_run.items():
        for r in rs:
            by_op.setdefault(r.op, {})[run_name] = r
    return by_op


def to_json(results_by_run: dict[str, list[OpResult]] | dict[str, list[GradResult]], meta: dict) -> str:
    """Either check's runs, every result with its counts, and ``meta``, as one JSON document."""
    doc = {"meta": meta, "runs": {k: {"counts": counts(v), "results": [asdict(r) for r in v]}
                                  for k, v in results_by_run.items()}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def grad_table(runs: dict[str, list[GradResult]], meta: dict) -> str:
    """The requires-grad check for a terminal: a table per run, each with its counts."""
    out = []
    for name, rs in runs.items():
        w = max([len(r.op) for r in rs] + [2])
        out += [f"== {name}", f"{'op':<{w}}  {'device':<6}  {'verdict':<7}  message"]
        out += [f"{r.op:<{w}}  {r.device:<6}  {r.verdict:<7}  {r.message}" for r in rs]
        out.append(f"counts: {count_text(rs)}")
    return "\n".join(out) + "\n"


def grad_markdown(runs: dict[str, list[GradResult]], meta: dict) -> str:
    """The requires-grad report for people: what was run, each run's counts, a row per op."""
    names = list(runs)
    lines = ["# torchgen-patch verify --check requires-grad", ""] + [f"- {k}: `{v}`" for k, v in meta.items()]
    lines += [""] + [f"- {n}: {count_text(rs)}" for n, rs in runs.items()]
    lines += ["", "| op | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    by_op = _by_op(runs)
    for op in sorted(by_op):
        cells = [by_op[op][n].verdict + (f" ({by_op[op][n].message[:80]})" if by_op[op][n].verdict in (ERROR, NOT_RUN)
                                         else "") if n in by_op[op] else "" for n in names]
        lines.append(f"| `{op}` | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"
