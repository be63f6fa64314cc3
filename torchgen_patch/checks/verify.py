"""Verify: run each op of the plan on its sample and check that every tensor
it writes ends exactly one version higher.

Verdicts: PASS (+1 each), MISS (some tensor not bumped), EXTRA (some tensor
bumped more than once), ERROR (the call raised), NOT_RUN (no sample on this
device, with the reason), and XFAIL/XPASS for ops the overlay expects to fail.

The requires-grad check (``run_grad``): run an out= op of the plan on its sample with every floating
input (not the tensors it writes) requiring grad, in grad mode, and see whether it refuses: REFUSE
(PyTorch's out= message, nothing written), SILENT (the call went through: gradients through its outputs
are lost), ERROR (another failure), NOT_RUN (no sample here, or no floating input).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..runtime.pykernel import OUT_REQUIRES_GRAD
from ..vocabulary import Outcome

PASS, MISS, EXTRA, ERROR, NOT_RUN, XFAIL, XPASS = (Outcome.PASS, Outcome.MISS, Outcome.EXTRA, Outcome.ERROR,
                                                   Outcome.NOT_RUN, Outcome.XFAIL, Outcome.XPASS)
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


def count_text(results: list[OpResult]) -> str:
    """The verdict counts of one run, as the reports write them: ``MISS 20, PASS 154``."""
    return ", ".join(f"{k} {v}" for k, v in counts(results).items())


def summary(runs: dict[str, list[OpResult]]) -> str:
    """One line per run: its verdict counts."""
    return "\n".join(f"{name}: {count_text(rs)}" for name, rs in runs.items())


def table(results: list[OpResult]) -> str:
    w = max([len(r.op) for r in results] + [2])
    lines = [f"{'op':<{w}}  {'device':<6}  {'patch':<5}  {'verdict':<7}  versions (per written argument: before->after)"]
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


def to_json(results_by_run: dict[str, list[OpResult]], meta: dict) -> str:
    doc = {"meta": meta, "runs": {k: {"counts": counts(v), "results": [asdict(r) for r in v]}
                                  for k, v in results_by_run.items()}}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------
# The requires-grad check

REFUSE, SILENT = Outcome.REFUSE, Outcome.SILENT  # and ERROR, NOT_RUN as above
MESSAGE = OUT_REQUIRES_GRAD  # PyTorch's own, after the op's name


@dataclass
class GradResult:
    op: str
    device: str
    patched: bool
    verdict: str
    message: str = ""
    unwritten: bool | None = None  # REFUSE: the written tensors are unchanged (None: not refused)


def _requiring_grad(value, written: set[int]):
    """``value`` with each floating tensor that is not written replaced by a leaf that requires grad."""
    if isinstance(value, (list, tuple)):
        return type(value)(_requiring_grad(v, written) for v in value)
    if hasattr(value, "requires_grad_") and id(value) not in written and value.is_floating_point():
        return value.detach().clone().requires_grad_(True)
    return value


def _same_bits(before, after) -> bool:
    import torch

    if before.shape != after.shape or before.dtype != after.dtype:
        return False
    if before.is_quantized:  # their bytes are not viewable: the integer representation is what is written
        before, after = before.int_repr(), after.detach().int_repr()
    return torch.equal(before.contiguous().reshape(-1).view(torch.uint8),
                       after.detach().contiguous().reshape(-1).view(torch.uint8))


def run_grad_op(op: str, device: str, patched: bool, outputs: bool = False) -> GradResult:
    """``op`` once, in grad mode, with its floating inputs requiring grad (``outputs``: its written
    tensors instead, as leaves that require grad)."""
    import torch

    from .samples import NoSample, opoverload, sample

    try:
        s = sample(op, device)
    except NoSample as e:
        return GradResult(op, device, patched, NOT_RUN, str(e))
    except Exception as e:  # a recipe that does not fit this torch: never a pass
        return GradResult(op, device, patched, ERROR, f"building the sample: {type(e).__name__}: {e}")
    written = {id(t) for _, t in s.written_tensors()}
    if outputs:
        for _, t in s.written_tensors():
            if t.is_floating_point():
                t.requires_grad_(True)
        args, kwargs = s.args, s.kwargs
        asked = any(t.requires_grad for _, t in s.written_tensors())
    else:
        args = [_requiring_grad(a, written) for a in s.args]
        kwargs = {k: _requiring_grad(v, written) for k, v in s.kwargs.items()}
        asked = any(getattr(t, "requires_grad", False) for v in [*args, *kwargs.values()]
                    for t in (v if isinstance(v, (list, tuple)) else [v]))
    if not asked:
        return GradResult(op, device, patched, NOT_RUN, "no floating tensor to require grad")
    before = [t.detach().clone() for _, t in s.written_tensors()]
    try:
        with torch.enable_grad():
            opoverload(op)(*args, **kwargs)
    except RuntimeError as e:
        text = str(e).splitlines()[0] if str(e) else ""
        if text.endswith(MESSAGE):
            same = all(_same_bits(b, t) for b, (_, t) in zip(before, s.written_tensors()))
            return GradResult(op, device, patched, REFUSE, text, same)
        return GradResult(op, device, patched, ERROR, f"RuntimeError: {text}")
    except Exception as e:  # the op's own failure is a result
        return GradResult(op, device, patched, ERROR, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return GradResult(op, device, patched, SILENT)


def run_grad(ops: list[str], device: str, patched: bool, outputs: bool = False) -> list[GradResult]:
    return [run_grad_op(op, device, patched, outputs) for op in sorted(ops)]


def grad_counts(results: list[GradResult]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counts(results).items())


def grad_table(runs: dict[str, list[GradResult]], meta: dict) -> str:
    out = []
    for name, rs in runs.items():
        w = max([len(r.op) for r in rs] + [2])
        out += [f"== {name}", f"{'op':<{w}}  {'device':<6}  {'verdict':<7}  message"]
        out += [f"{r.op:<{w}}  {r.device:<6}  {r.verdict:<7}  {r.message}" for r in rs]
        out.append(f"counts: {grad_counts(rs)}")
    return "\n".join(out) + "\n"


def grad_markdown(runs: dict[str, list[GradResult]], meta: dict) -> str:
    names = list(runs)
    lines = ["# torchgen-patch verify --check requires-grad", ""] + [f"- {k}: `{v}`" for k, v in meta.items()]
    lines += [""] + [f"- {n}: {grad_counts(rs)}" for n, rs in runs.items()]
    lines += ["", "| op | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    by_op = _by_op(runs)
    for op in sorted(by_op):
        cells = [by_op[op][n].verdict + (f" ({by_op[op][n].message[:80]})" if by_op[op][n].verdict in (ERROR, NOT_RUN)
                                         else "") if n in by_op[op] else "" for n in names]
        lines.append(f"| `{op}` | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"
