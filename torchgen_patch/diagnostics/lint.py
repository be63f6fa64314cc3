"""Lint: the missing and unsupported ops of a scan that the overlay does not accept."""

from __future__ import annotations

from ..plan.overlay import Overlay
from ..scan.model import MISSING, UNSUPPORTED, Scan
from . import Finding, rules


def findings(scan: Scan, overlay: Overlay) -> list[Finding]:
    out = []
    for r in scan.by_verdict(MISSING) + scan.by_verdict(UNSUPPORTED):
        if overlay.skipped(r.name):
            continue
        out.append(rules.missing(r) if r.verdict == MISSING else rules.unsupported(r))
    return sorted(out, key=Finding.sort_key)
