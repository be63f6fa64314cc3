"""Verify: run each op of the plan on its sample and check that every tensor
it writes ends exactly one version higher.

Verdicts: PASS (+1 each), MISS (some tensor not bumped), EXTRA (some tensor
bumped more than once), ERROR (the call raised), NOT_RUN (no sample on this
device, with the reason), and XFAIL/XPASS for ops the overlay expects to fail.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

PASS, MISS, EXTRA, ERROR, NOT_RUN, XFAIL, XPASS = "PASS", "MISS", "EXTRA", "ERROR", "NOT_RUN", "XFAIL", "XPASS"
FAILING = {MISS, EXTRA, ERROR}
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


@dataclass
class TensorResult:
    arg: str
    before: int
    after: int


@dataclass
class OpResult:
    op: str
    device: str
    patched: bool
    verdict: str
    tensors: list[TensorResult] = field(default_factory=list)
    message: str = ""
    subclass: str = "plain"  # the tensor subclass every tensor argument was wrapped in


def run_op(op: str, device: str, patched: bool, xfail: tuple[str, ...] | None = None, call=None,
           subclass: str = "plain", mesh=None) -> OpResult:
    """Run ``op`` once on its sample (every tensor wrapped in ``subclass`` unless plain;
    ``mesh``: the DeviceMesh of ``dtensor``). ``call`` replaces the op (tests of verify itself)."""
    from .samples import NoSample, opoverload, sample
    from .subclass import cannot_run, placements, wrap

    reason = ""
    for placement in placements(subclass):
        try:
            s = sample(op, device)
            call = call or opoverload(op)
            if subclass != "plain":
                s = wrap(s, subclass, mesh, placement)
        except NoSample as e:
            return OpResult(op, device, patched, NOT_RUN, message=str(e), subclass=subclass)
        except Exception as e:  # a recipe that does not fit this torch: a failure, never a pass
            return OpResult(op, device, patched, ERROR, message=f"building the sample: {type(e).__name__}: {e}",
                            subclass=subclass)
        written = s.written_tensors()
        before = [int(t._version) for _, t in written]
        try:
            call(*s.args, **s.kwargs)
        except Exception as e:  # the op's own failure is a result, not a crash of verify
            reason = subclass != "plain" and cannot_run(op, device, subclass, mesh, placement, call)
            if reason:
                continue  # the subclass's own limit: the next placement, or NOT_RUN
            return OpResult(op, device, patched, ERROR, message=f"{type(e).__name__}: {str(e).splitlines()[0]}",
                            subclass=subclass)
        res = [TensorResult(n, b, int(t._version)) for (n, t), b in zip(written, before)]
        deltas = [r.after - r.before for r in res]
        verdict = PASS
        if any(d > 1 for d in deltas):
            verdict = EXTRA
        elif any(d < 1 for d in deltas):
            verdict = MISS
        if xfail is not None and (not xfail or device in xfail):
            verdict = XPASS if verdict == PASS else XFAIL
        return OpResult(op, device, patched, verdict, res, message=placement and f"placements {placement}",
                        subclass=subclass)
    return OpResult(op, device, patched, NOT_RUN, message=reason, subclass=subclass)


def run(ops: list[str], device: str, patched: bool, xfails: dict | None = None, subclass: str = "plain",
        progress=None) -> list[OpResult]:
    """Every op of ``ops`` once, sorted, every tensor wrapped in ``subclass`` unless plain;
    ``progress(done, total, result)`` after each."""
    xfails = xfails or {}

    def each(mesh=None) -> list[OpResult]:
        out = []
        for op in sorted(ops):
            out.append(run_op(op, device, patched, xfails.get(op), subclass=subclass, mesh=mesh))
            if progress is not None:
                progress(len(out), len(ops), out[-1])
        return out

    if subclass != "dtensor":
        return each()
    from .subclass import Unavailable, one_rank_mesh

    try:
        with one_rank_mesh(device) as mesh:
            return each(mesh)
    except Unavailable as e:
        return [OpResult(op, device, patched, NOT_RUN, message=str(e), subclass=subclass) for op in sorted(ops)]


def counts(results: list[OpResult]) -> dict[str, int]:
    c: dict[str, int] = {}
    for r in results:
        c[r.verdict] = c.get(r.verdict, 0) + 1
    return dict(sorted(c.items()))


def _versions(r: OpResult) -> str:
    return " ".join(f"{t.arg} {t.before}->{t.after}" for t in r.tensors) or "-"


def summary(runs: dict[str, list[OpResult]]) -> str:
    """One line per run: its verdict counts."""
    return "\n".join(f"{name}: " + ", ".join(f"{k} {v}" for k, v in counts(rs).items()) for name, rs in runs.items())


def table(results: list[OpResult]) -> str:
    w = max([len(r.op) for r in results] + [2])
    lines = [f"{'op':<{w}}  {'device':<6}  {'patch':<5}  {'verdict':<7}  versions (per written argument: before->after)"]
    for r in results:
        lines.append(f"{r.op:<{w}}  {r.device:<6}  {'yes' if r.patched else 'no':<5}  {r.verdict:<7}  "
                     f"{_versions(r)}{('  ' + r.message) if r.message else ''}")
    lines.append("counts: " + ", ".join(f"{k} {v}" for k, v in counts(results).items()))
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
    by_op: dict[str, dict[str, OpResult]] = {}
    for run_name, rs in results_by_run.items():
        for r in rs:
            by_op.setdefault(r.op, {})[run_name] = r
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


def to_json(results_by_run: dict[str, list[OpResult]], meta: dict) -> str:
    doc = {"meta": meta, "runs": {k: {"counts": counts(v), "results": [asdict(r) for r in v]}
                                  for k, v in results_by_run.items()}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
