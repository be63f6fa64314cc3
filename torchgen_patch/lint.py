"""Lint: the missing ops that the overlay does not accept, as diagnostics.

A diagnostic is data (code, file, line, message, op); ``report`` renders it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .model import MISSING, UNSUPPORTED, Scan
from .overlay import Overlay

CODE = "VERSIONCOUNTER"
RULE_MISSING = "missing-inplace-or-view-kernel"
RULE_UNSUPPORTED = "unsupported-mutating-op"


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    op: str
    rule: str
    message: str
    severity: str = "error"
    code: str = CODE

    def to_json(self) -> dict:
        return asdict(self)


def findings(scan: Scan, overlay: Overlay) -> list[Finding]:
    out = []
    for r in scan.by_verdict(MISSING) + scan.by_verdict(UNSUPPORTED):
        if overlay.skipped(r.name):
            continue
        rule = RULE_MISSING if r.verdict == MISSING else RULE_UNSUPPORTED
        out.append(Finding(r.file, r.line, r.name, rule, f"{r.name}: {r.reason}"))
    return sorted(out, key=lambda f: (f.path, f.line, f.op))
