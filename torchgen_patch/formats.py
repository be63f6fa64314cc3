"""Renderers of lint findings for CI tools: lintrunner, SARIF 2.1.0, GitHub
workflow annotations. Each takes data and returns text; the CLI decides exit codes."""

from __future__ import annotations

import hashlib
import json
import os

from .errors import InputError, display_path
from .lint import CODE, RULES, Finding

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


# lintrunner: one LintMessage JSON object per line; the adapter always exits 0.
def lintrunner(fs: list[Finding]) -> str:
    return "".join(json.dumps({
        "path": display_path(f.path), "line": f.line, "char": None, "code": f.code, "severity": f.severity,
        "name": f.rule, "original": None, "replacement": None, "description": f.message,
    }, sort_keys=True) + "\n" for f in fs)


def lintrunner_failure(err: InputError) -> str:
    """Bad input as a LintMessage: at its file and line when known, else a general failure (path null)."""
    return json.dumps({
        "path": display_path(err.path) if err.path and os.path.isfile(err.path) else None, "line": err.line, "char": None,
        "code": CODE, "severity": "error", "name": "bad-input", "original": None, "replacement": None,
        "description": err.render(),
    }, sort_keys=True) + "\n"


# SARIF 2.1.0 for GitHub code scanning: stable rule ids, relative URIs,
# 1-based lines, partial fingerprints that do not move with line numbers.
def sarif(fs: list[Finding], version: str) -> str:
    rule_ids = sorted(RULES)
    results = []
    for f in fs:
        uri, base = _uri(f.path)
        loc = {"artifactLocation": {"uri": uri}, "region": {"startLine": max(1, f.line)}}
        if base:
            loc["artifactLocation"]["uriBaseId"] = base
        results.append({
            "ruleId": f"{f.code}/{f.rule}",
            "ruleIndex": rule_ids.index(f.rule),
            "level": "error" if f.severity == "error" else "warning",
            "message": {"text": f.message},
            "locations": [{"physicalLocation": loc}],
            "partialFingerprints": {
                "torchgenPatch/v1": hashlib.sha256(f"{f.rule}\0{f.op}".encode()).hexdigest()[:32]},
        })
    doc = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "torchgen-patch",
                "version": version,
                "rules": [{
                    "id": f"{CODE}/{r}",
                    "name": RULES[r][0],
                    "shortDescription": {"text": RULES[r][1]},
                    "fullDescription": {"text": RULES[r][2]},
                    "defaultConfiguration": {"level": "error" if r != "stale-baseline-entry" else "warning"},
                } for r in rule_ids],
            }},
            "results": results,
        }],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _uri(path: str) -> tuple[str, str | None]:
    rel = display_path(path)
    if os.path.isabs(rel):
        return "file://" + rel, None
    return rel.replace(os.sep, "/"), "%SRCROOT%"


# GitHub Actions workflow commands.
def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def github(fs: list[Finding]) -> str:
    out = []
    for f in fs:
        kind = "error" if f.severity == "error" else "warning"
        props = f"file={_escape_property(display_path(f.path))},line={f.line},title={_escape_property(f'{f.code} {f.rule}')}"
        out.append(f"::{kind} {props}::{_escape_data(f.message)}\n")
    return "".join(out)
