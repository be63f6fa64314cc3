"""Renderers of scans and findings: text and JSON (stable, documented)."""

from __future__ import annotations

import json

from .errors import display_path
from .lint import Finding
from .model import VERDICTS, Scan

# Bump when the JSON layout changes incompatibly.
JSON_SCHEMA_VERSION = 1


def _counts(scans: list[Scan]) -> dict[str, int]:
    c = {v: 0 for v in VERDICTS}
    for s in scans:
        for k, n in s.counts().items():
            c[k] += n
    return c


def lint_text(fs: list[Finding], scans: list[Scan]) -> str:
    lines = [f"{display_path(f.path)}:{f.line}: {f.severity}: [{f.code}] {f.message}" for f in fs]
    c = _counts(scans)
    lines.append(f"{len(fs)} finding(s); " + ", ".join(f"{v} {c[v]}" for v in VERDICTS)
                 + f" (of {sum(c.values())} functions)")
    return "\n".join(lines) + "\n"


def lint_json(fs: list[Finding], scans: list[Scan]) -> str:
    c = _counts(scans)
    doc = {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": "torchgen-patch",
        "torch": scans[0].torch_version,
        "native_functions": [display_path(s.native_path) for s in scans],
        "counts": c,
        "total": sum(c.values()),
        "findings": [dict(f.to_json(), path=display_path(f.path)) for f in fs],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def scan_text(scan: Scan, verdicts: set[str] | None = None) -> str:
    rows = [r for r in scan.records if verdicts is None or r.verdict in verdicts]
    w = max([len(r.name) for r in rows] + [2])
    out = [f"{'op':<{w}}  {'kind':<10}  {'verdict':<12}  location  reason"]
    for r in rows:
        out.append(f"{r.name:<{w}}  {r.kind:<10}  {r.verdict:<12}  {display_path(r.file)}:{r.line}  {r.reason}")
    c = scan.counts()
    out.append("total %d: %s" % (len(scan.records), ", ".join(f"{v} {c[v]}" for v in VERDICTS)))
    return "\n".join(out) + "\n"


def scan_json(scan: Scan, verdicts: set[str] | None = None) -> str:
    doc = {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": "torchgen-patch",
        "torch": scan.torch_version,
        "native_functions": display_path(scan.native_path),
        "counts": scan.counts(),
        "total": len(scan.records),
        "ops": [dict(r.to_json(), file=display_path(r.file)) for r in scan.records
                if verdicts is None or r.verdict in verdicts],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def runtime_lint(fs: list[Finding], fmt: str) -> str:
    """`lint --runtime` as text or JSON (the same finding records as the yaml lint)."""
    if fmt == "json":
        doc = {"schema_version": JSON_SCHEMA_VERSION, "tool": "torchgen-patch", "source": "runtime",
               "findings": [dict(f.to_json(), path=display_path(f.path)) for f in fs]}
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    lines = [f"{display_path(f.path)}:{f.line}: {f.severity}: [{f.code}] {f.message}" for f in fs]
    return "\n".join(lines + [f"{len(fs)} finding(s) in the live operator registry"]) + "\n"
