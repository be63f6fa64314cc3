"""Lint: the missing and unsupported ops of a scan that the overlay does not accept (and, asked, the
ops whose autograd kernel skips its requires-grad checks)."""

from __future__ import annotations

from ..plan.overlay import Overlay
from ..scan.model import INPLACE_UNCHECKED, MISSING, OUT_UNCHECKED, UNSUPPORTED, Scan
from . import Finding, rules


def findings(scan: Scan, overlay: Overlay, autograd: bool = False) -> list[Finding]:
    """The version-counter findings; with ``autograd`` also those of the autograd half."""
    out = []
    for r in scan.by_verdict(MISSING) + scan.by_verdict(UNSUPPORTED):
        if overlay.skipped(r.name):
            continue
        out.append(rules.missing(r) if r.verdict == MISSING else rules.unsupported(r))
    if autograd:
        out += autograd_findings(scan, overlay)
    return sorted(out, key=Finding.sort_key)


def autograd_findings(scan: Scan, overlay: Overlay) -> list[Finding]:
    """The autograd half: out= ops whose VariableType kernel never refuses requires_grad, and void
    in-place ops whose kernel skips check_inplace (both as the tree's own codegen writes them)."""
    out = [rules.out_requires_grad(r) for r in scan.with_gap(OUT_UNCHECKED) if not overlay.skipped(r.name)]
    out += [rules.inplace_unchecked(r) for r in scan.with_gap(INPLACE_UNCHECKED) if not overlay.skipped(r.name)]
    return sorted(out, key=Finding.sort_key)
