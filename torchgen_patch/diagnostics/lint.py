"""Lint: every finding of a lint run is made here, whatever it looks at: the missing and
unsupported ops of each yaml that the overlay does not accept, the live operator registry
(``--runtime``), a generated directory (``--generated``), the baseline, and the drift between
the yaml and the running torch (``--against-runtime``), and, asked, the autograd half: the out= ops whose autograd
kernel never refuses inputs that require grad (``requires_grad``), and with ``autograd`` also the void in-place ops
that skip check_inplace. The CLI parses flags and prints."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..errors import Location
from ..plan.overlay import Overlay
from ..scan.model import INPLACE_UNCHECKED, MISSING, OUT_UNCHECKED, UNSUPPORTED, VERDICTS, Scan
from ..sources import Options
from ..vocabulary import StepOutcome
from . import Finding, rules
from .render import Summary


@dataclass(frozen=True)
class Request:
    """What a lint run looks at (the CLI's flags, as values)."""

    options: Options
    paths: tuple[str, ...] = ()  # yaml paths (each with its tags.yaml, or options.tags)
    runtime: bool = False
    imports: tuple[str, ...] = ()
    namespaces: tuple[str, ...] | None = None
    generated: str | None = None
    baseline: str | None = None
    against_runtime: bool = False
    autograd: bool = False  # also the autograd half's findings, both rules
    requires_grad: bool = False  # also its out= rule (the one diff --mode fix fixes)


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]  # sorted
    summary: Summary
    inputs: tuple = ()  # pipeline.Inputs of each yaml linted
    drifts: tuple = field(default=())  # (Scan, [Drift]) per yaml, with against_runtime


def findings(scan: Scan, overlay: Overlay, autograd: bool = False, requires_grad: bool = False) -> list[Finding]:
    """The version-counter findings; with ``autograd`` also those of the autograd half, with
    ``requires_grad`` only its out= rule."""
    out = []
    for r in scan.by_verdict(MISSING) + scan.by_verdict(UNSUPPORTED):
        if overlay.skipped(r.name):
            continue
        out.append(rules.missing(r) if r.verdict == MISSING else rules.unsupported(r))
    if autograd or requires_grad:
        out += autograd_findings(scan, overlay, inplace=autograd)
    return sorted(out, key=Finding.sort_key)


def autograd_findings(scan: Scan, overlay: Overlay, inplace: bool = True) -> list[Finding]:
    """The autograd half: out= ops whose VariableType kernel never refuses requires_grad, and (``inplace``)
    void in-place ops whose kernel skips check_inplace (both as the tree's own codegen writes them)."""
    out = [rules.out_requires_grad(r) for r in scan.with_gap(OUT_UNCHECKED) if not overlay.skipped(r.name)]
    if inplace:
        out += [rules.inplace_unchecked(r) for r in scan.with_gap(INPLACE_UNCHECKED) if not overlay.skipped(r.name)]
    return sorted(out, key=Finding.sort_key)


def run(req: Request, noted=lambda inputs: None, apply_baseline: bool = True) -> Report:
    """``noted(inputs)``: called once per yaml as soon as its inputs are resolved (``-v``)."""
    runs = []
    if req.runtime:
        fs, summary = _runtime(req)
    else:
        from .. import pipeline

        for path in req.paths or (None,):
            o = req.options if path is None else dataclasses.replace(req.options, native_functions=path)
            runs.append(pipeline.inputs(o, autograd=req.autograd or req.requires_grad or bool(req.generated)))
            noted(runs[-1])
        fs = [f for i in runs for f in findings(i.scan, i.overlay, req.autograd, req.requires_grad)]
        counts = {v: sum(i.scan.counts()[v] for i in runs) for v in VERDICTS}
        summary = Summary("yaml", counts, runs[0].sources.torch_version, tuple(i.sources.native for i in runs))
    if req.generated:
        fs = _generated(runs, fs, req.generated, req.options)
    if apply_baseline and req.baseline:
        from . import baseline

        fs, accepted = baseline.apply(fs, req.baseline)
        summary = dataclasses.replace(summary, accepted=accepted, baseline=req.baseline)
    drifts: tuple = ()
    if req.against_runtime:
        from ..runtime.load import installed_ops
        from .drift import cross_check

        patched = set(installed_ops())
        drifts = tuple((i.scan, cross_check(i.scan, patched)) for i in runs)
    return Report(tuple(sorted(fs, key=Finding.sort_key)), summary, tuple(runs), drifts)


def _runtime(req: Request) -> tuple[list[Finding], Summary]:
    """The live registry's findings; with ``--import``, also those of the optimizer classes the
    modules define, each given a probe step (runtime/optim_probe.py)."""
    from ..runtime import registry
    from ..runtime.install import runtime_overlay
    from ..runtime.optim_probe import on_the_accelerator, optimizer_classes, probe_modules, unknown_entries

    overlay = runtime_overlay(req.options)  # its skip entries for runtime operators are accepted findings
    registry.import_modules(list(req.imports))
    optimizers = optimizer_classes(list(req.imports)) if req.imports else []
    # --namespace filters the operators: a name of an imported module that defines optimizers (deepspeed
    # or lion, for --import deepspeed.ops.lion) may have none; any other name must
    named = {p for m in req.imports if optimizer_classes([m]) for p in m.split(".")} if optimizers else set()
    registry.check_namespaces([ns for ns in req.namespaces or [] if ns not in named])
    ops = registry.uncovered(req.namespaces)
    fs = [rules.missing_at_runtime(o) for o in ops if not overlay.skipped(o.name)]
    left_out = len(ops) - len(fs)
    fs += [rules.optimizer_entry_unknown(Location(overlay.path, e.line), e.path, what)
           for e, what in unknown_entries(overlay.optimizers)]
    probes = []
    if optimizers:  # the optimizer classes the modules define, each given a probe step
        probes = on_the_accelerator(probe_modules(list(req.imports), overlay.optimizers), list(req.imports))
        fs += [rules.optimizer_probe(p) for p in probes if p.outcome in (StepOutcome.UNSEEN, StepOutcome.NOT_RUN,
                                                                         StepOutcome.UNCHANGED)]
    covered = tuple(p.cls for p in probes if p.outcome == StepOutcome.COVERED)
    return fs, Summary(source="runtime", left_out=left_out, probed=len(probes), covered=covered)


def _generated(runs, fs: list[Finding], directory: str, options: Options) -> list[Finding]:
    from ..errors import InputError
    from ..plan import make_plan
    from .generated import check

    if len(runs) != 1:
        raise InputError(None, None, "--generated checks one yaml at a time")
    # with generated kernels, a missing op is covered when its kernel is there and current (and an
    # out= op's requires-grad gap when that kernel refuses it)
    plan = make_plan(runs[0].scan, runs[0].overlay, requires_grad_check=options.requires_grad_check)
    planned = set(plan.ops())
    refusing = {k.op for k in plan.kernels if k.refuse_name}
    return [f for f in fs if not (f.rule == rules.MISSING.id and f.op in planned)
            and not (f.rule == rules.OUT_REQUIRES_GRAD.id and f.op in refusing)] + check(plan, directory)
