"""Renderers of a scan: text and JSON (stable, documented)."""

from __future__ import annotations

import json

from ..errors import display_path
from .model import VERDICTS, Scan

# Bump when the JSON layout changes incompatibly.
JSON_SCHEMA_VERSION = 2  # 2: "native_functions" is a list, as in lint's JSON
_PATHS = {"root", "native_functions", "tags", "overlay", "torchgen", "autograd_codegen"}


def scan_text(scan: Scan, verdicts: set[str] | None = None) -> str:
    rows = [r for r in scan.records if verdicts is None or r.verdict in verdicts]
    w = max([len(r.name) for r in rows] + [2])
    out = [f"{'op':<{w}}  {'kind':<10}  {'verdict':<12}  location  reason"]
    for r in rows:
        out.append(f"{r.name:<{w}}  {r.kind:<10}  {r.verdict:<12}  {r.loc.render()}  {r.reason}")
    c = scan.counts()
    out.append("total %d: %s" % (len(scan.records), ", ".join(f"{v} {c[v]}" for v in VERDICTS)))
    return "\n".join(out) + "\n"


def scan_json(scan: Scan, verdicts: set[str] | None = None) -> str:
    doc = {
        "schema_version": JSON_SCHEMA_VERSION,
        "tool": "torchgen-patch",
        "torch": scan.torch_version,
        "native_functions": [display_path(scan.native_path)],
        "counts": scan.counts(),
        "total": len(scan.records),
        "ops": [r.to_json(path=display_path(r.loc.path)) for r in scan.records
                if verdicts is None or r.verdict in verdicts],
        "sources": {k: display_path(v) if k in _PATHS and v else v for k, v in scan.sources.describe().items()},
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
