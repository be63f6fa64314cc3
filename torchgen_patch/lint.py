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
RULE_STALE = "stale-baseline-entry"
RULE_KERNEL_MISSING = "generated-kernel-missing"
RULE_KERNEL_STALE = "generated-kernel-out-of-date"

# rule -> (name, short description, what it finds and why it matters)
RULES = {
    RULE_MISSING: ("MissingInplaceOrViewKernel", "Mutating op with no ADInplaceOrView kernel",
                   "The op writes arguments and returns nothing, so PyTorch's autograd codegen emits no "
                   "ADInplaceOrView kernel for it; whether it bumps version counters depends on its backend "
                   "kernel, and autograd can silently compute gradients from overwritten tensors."),
    RULE_UNSUPPORTED: ("UnsupportedMutatingOp", "Mutating op a generated kernel cannot serve",
                       "The op writes arguments and returns nothing but is not in-place, out= or mutable by "
                       "torchgen's rules (or writes a form no kernel handles); decide in the overlay."),
    RULE_STALE: ("StaleBaselineEntry", "Baseline entry that no longer matches a finding",
                 "The baseline accepts a finding that is gone; remove the entry so it cannot hide a new one."),
    RULE_KERNEL_MISSING: ("GeneratedKernelMissing", "Op of the plan without a generated kernel",
                          "The generated directory has no kernel for this op; run torchgen-patch gen."),
    RULE_KERNEL_STALE: ("GeneratedKernelOutOfDate", "Generated kernel differs from what gen makes now",
                        "The kernel in the generated directory is out of date; run torchgen-patch gen."),
}


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
