"""Baselines: accept known findings so a team can adopt the lint and ratchet.

A baseline is JSON, one accepted finding per line, keyed by rule and op (not
by line number, which moves with every edit of the yaml)::

    {"version": 1, "tool": "torchgen-patch", "accepted": [
    {"op": "aten::_fused_adam_", "rule": "missing-inplace-or-view-kernel"},
    ...
    ]}

An entry that matches no finding any more is itself a finding (stale), so
the baseline only ever shrinks.
"""

from __future__ import annotations

import json

from ..errors import InputError
from ..files import load_json, read_text
from . import Finding, rules

VERSION = 1


def render(fs: list[Finding]) -> str:
    keys = sorted({(f.op, f.rule) for f in fs if f.rule != rules.STALE_BASELINE.id})
    rows = [json.dumps({"op": op, "rule": rule}, sort_keys=True) for op, rule in keys]
    return (f'{{"version": {VERSION}, "tool": "torchgen-patch", "accepted": [\n'
            + ",\n".join(rows) + ("\n" if rows else "") + "]}\n")


def load(path: str) -> list[tuple[str, str, int]]:
    """(op, rule, line) of every accepted finding."""
    text = read_text(path, "baseline")
    doc = load_json(text, path, "baseline")
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("accepted"), list):
        raise InputError(path, 1, f"not a torchgen-patch baseline (version {VERSION})",
                         "create one with --write-baseline")
    lines = text.splitlines()
    out = []
    for e in doc["accepted"]:
        if not (isinstance(e, dict) and isinstance(e.get("op"), str) and isinstance(e.get("rule"), str)):
            raise InputError(path, None, f"baseline entry must be {{\"op\": ..., \"rule\": ...}}, not {e!r}")
        needle = json.dumps({"op": e["op"], "rule": e["rule"]}, sort_keys=True)
        line = next((i + 1 for i, row in enumerate(lines) if needle in row), 1)
        out.append((e["op"], e["rule"], line))
    return out


def apply(fs: list[Finding], path: str) -> tuple[list[Finding], int]:
    """Drop accepted findings; add one for each stale entry. Also returns how many it accepted."""
    accepted = load(path)
    keys = {(op, rule) for op, rule, _ in accepted}
    kept = [f for f in fs if (f.op, f.rule) not in keys]
    present = {(f.op, f.rule) for f in fs}
    stale = [rules.stale_baseline(path, line, op, rule) for op, rule, line in accepted if (op, rule) not in present]
    return kept + sorted(stale, key=lambda f: f.line or 0), len(fs) - len(kept)
