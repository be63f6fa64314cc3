"""Every renderer of a report: one per output format of lint findings (text, JSON, lintrunner,
SARIF 2.1.0, GitHub workflow annotations; each takes the findings and a ``Summary``), the
drift lines of ``--against-runtime`` and the scan's table and JSON. Each returns text; the CLI
decides printing and exit codes."""

from __future__ import annotations

import hashlib
import json
import os

from dataclasses import dataclass, field
from typing import TypeGuard

from ..version import __version__
from ..scan.model import VERDICTS, Scan
from ..vocabulary import Format, Verdict
from ..errors import ToolError, display_path, printable
from . import CODE, Finding
from .rules import RULES

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# Bump when the JSON layout changes incompatibly.
JSON_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Summary:
    """What a report says beyond its findings."""

    source: str = "yaml"  # yaml | runtime (the live operator registry)
    counts: dict[Verdict, int] = field(default_factory=dict)  # verdict -> functions, over every yaml linted
    torch: str | None = None
    inputs: tuple[str, ...] = ()  # the native_functions.yaml files linted
    baseline: str | None = None  # the --baseline file, when one was applied
    accepted: int = 0  # findings it accepted (not reported)
    left_out: int = 0  # runtime operators the overlay skips (not reported, but counted)
    probed: int = 0  # optimizer classes of the --import modules (each probed or covered)
    covered: tuple[str, ...] = ()  # of those, the classes an optimizer entry of the overlay covers


def _line(f: Finding) -> str:
    where = f"{printable(display_path(f.path))}:{f.line}" if f.path else "torchgen-patch"
    return f"{where}: {f.severity}: [{f.code}] {printable(f.message)}"


def _accepted(s: Summary) -> str:
    return f"; {s.accepted} accepted by the baseline {display_path(s.baseline)}" if s.baseline else ""


def _left_out(s: Summary) -> str:
    return f"left out by the overlay: {s.left_out}"


def _covered(s: Summary) -> str:
    return f"optimizer classes probed: {s.probed}, covered by the overlay: {len(s.covered)}" + \
        (f" ({', '.join(s.covered)})" if s.covered else "")


def summary_line(fs: list[Finding], s: Summary) -> str:
    """The text report's last line: how many findings, how many the baseline accepted, the verdict counts."""
    if s.source == "runtime":
        return f"{len(fs)} finding(s) in the live operator registry{_accepted(s)}; {_left_out(s)}" + \
            (f"; {_covered(s)}" if s.probed else "")
    return (f"{len(fs)} finding(s){_accepted(s)}; " + ", ".join(f"{v} {n}" for v, n in s.counts.items())
            + f" (of {sum(s.counts.values())} functions)")


def text(fs: list[Finding], s: Summary) -> str:
    return "\n".join([_line(f) for f in fs] + [summary_line(fs, s)]) + "\n"


def json_(fs: list[Finding], s: Summary) -> str:
    doc = {"schema_version": JSON_SCHEMA_VERSION, "tool": "torchgen-patch",
           "findings": [f.to_json() for f in fs]}
    if s.baseline:
        doc["baseline"] = {"path": display_path(s.baseline), "accepted": s.accepted}
    if s.source == "runtime":
        doc["source"] = "runtime"
        doc["left_out_by_overlay"] = s.left_out
        if s.probed:
            doc["optimizers"] = {"probed": s.probed, "covered_by_overlay": list(s.covered)}
    else:
        doc.update(torch=s.torch, native_functions=[display_path(p) for p in s.inputs], counts=s.counts,
                   total=sum(s.counts.values()))
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


# lintrunner: one LintMessage JSON object per line; the adapter always exits 0.
def lintrunner(fs: list[Finding], s: Summary | None = None) -> str:
    notes = [json.dumps({"path": None, "line": None, "char": None, "code": CODE, "severity": "advice",
                         "name": "left-out-by-overlay", "original": None, "replacement": None,
                         "description": _left_out(s)}, sort_keys=True) + "\n"] if _says_left_out(s) else []
    notes += [json.dumps({"path": None, "line": None, "char": None, "code": CODE, "severity": "advice",
                          "name": "covered-by-overlay", "original": None, "replacement": None,
                          "description": f"{c}: covered by an optimizer entry of the overlay"}, sort_keys=True) + "\n"
              for c in (s.covered if s is not None else ())]
    return "".join(json.dumps({
        "path": display_path(f.path) if f.path else None, "line": f.line, "char": None, "code": f.code,
        "severity": f.severity,
        "name": f.rule, "original": None, "replacement": None, "description": f.message,
    }, sort_keys=True) + "\n" for f in fs) + "".join(notes)


def _says_left_out(s: Summary | None) -> TypeGuard[Summary]:
    """Machine formats note the runtime operators the overlay left out when there are any (the text
    and JSON summaries always give the count)."""
    return s is not None and s.source == "runtime" and s.left_out > 0


def lintrunner_failure(err: ToolError) -> str:
    """Bad input (or what the machine lacks) as a LintMessage: at its file and line when known, else a general
    failure (path null)."""
    return json.dumps({
        "path": display_path(err.path) if err.path and os.path.isfile(err.path) else None,
        "line": err.line, "char": None,
        "code": CODE, "severity": "error", "name": "bad-input", "original": None, "replacement": None,
        "description": err.render(),
    }, sort_keys=True) + "\n"


# SARIF 2.1.0 for GitHub code scanning: stable rule ids, relative URIs,
# 1-based lines, partial fingerprints that do not move with line numbers.
def sarif(fs: list[Finding], s: Summary | None = None) -> str:
    rule_ids = sorted(RULES)
    results = []
    for f in fs:
        locations = []
        if f.path:
            uri, base = _uri(f.path)
            loc: dict[str, dict] = {"artifactLocation": {"uri": uri}, "region": {"startLine": max(1, f.line or 1)}}
            if base:
                loc["artifactLocation"]["uriBaseId"] = base
            locations.append({"physicalLocation": loc})
        results.append({
            "ruleId": f"{f.code}/{f.rule}",
            "ruleIndex": rule_ids.index(f.rule),
            "level": "error" if f.severity == "error" else "warning",
            "message": {"text": f.message},
            "locations": locations,
            "partialFingerprints": {
                "torchgenPatch/v1": hashlib.sha256(f"{f.rule}\0{f.op}".encode()).hexdigest()[:32]},
        })
    doc = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "torchgen-patch",
                "version": __version__,
                "rules": [{
                    "id": f"{CODE}/{r}",
                    "name": RULES[r].name,
                    "shortDescription": {"text": RULES[r].short},
                    "fullDescription": {"text": RULES[r].full},
                    "defaultConfiguration": {"level": RULES[r].severity},
                } for r in rule_ids],
            }},
            "results": results,
            **({"properties": {**({"leftOutByOverlay": s.left_out} if _says_left_out(s) else {}),
                               **({"optimizersCoveredByOverlay": list(s.covered)} if s.covered else {})}}
               if _says_left_out(s) or (s is not None and s.covered) else {}),
        }],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _uri(path: str) -> tuple[str, str | None]:
    """A URI reference (RFC 3986): a path's '%', spaces, quotes and newlines percent-encoded."""
    from urllib.parse import quote

    rel = display_path(path)
    if os.path.isabs(rel):
        return "file://" + quote(rel, safe="/"), None
    return quote(rel.replace(os.sep, "/"), safe="/"), "%SRCROOT%"


# GitHub Actions workflow commands.
def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def github(fs: list[Finding], s: Summary | None = None) -> str:
    out = []
    for f in fs:
        kind = "error" if f.severity == "error" else "warning"
        where = f"file={_escape_property(display_path(f.path))},line={f.line}," if f.path else ""
        props = f"{where}title={_escape_property(f'{f.code} {f.rule}')}"
        out.append(f"::{kind} {props}::{_escape_data(f.message)}\n")
    if _says_left_out(s):
        out.append(f"::notice title={_escape_property(CODE)}::{_escape_data(_left_out(s))}\n")
    out += [f"::notice title={_escape_property(CODE)}::"
            f"{_escape_data(c + ': covered by an optimizer entry of the overlay')}\n"
            for c in (s.covered if s is not None else ())]
    return "".join(out)


def drift_text(drifts, total: int) -> str:
    """The drift between a yaml and the running torch (``--against-runtime``), for stderr."""
    return "".join(f"drift: {d.op}: {d.kind}: {d.detail}\n" for d in drifts) + \
        f"against runtime: {len(drifts)} drift(s) over {total} functions\n"


# The scan's renderers: text and JSON (stable, documented).
# Bump when the scan JSON's layout changes incompatibly.
SCAN_JSON_SCHEMA_VERSION = 2  # 2: "native_functions" is a list, as in lint's JSON
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
        "schema_version": SCAN_JSON_SCHEMA_VERSION,
        "tool": "torchgen-patch",
        "torch": scan.torch_version,
        "native_functions": [display_path(scan.native_path)],
        "counts": scan.counts(),
        "total": len(scan.records),
        "ops": [r.to_json(path=display_path(r.loc.path))  # type: ignore[arg-type]  # a yaml's record: a path
                for r in scan.records if verdicts is None or r.verdict in verdicts],
        "sources": {k: display_path(v) if k in _PATHS and v else v for k, v in scan.sources.describe().items()},
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


RENDERERS = {Format.TEXT: text, Format.JSON: json_, Format.LINTRUNNER: lintrunner, Format.SARIF: sarif,
             Format.GITHUB: github}
