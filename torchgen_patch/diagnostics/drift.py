"""Cross-check a scan's static verdicts against the dispatcher of the running torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.dispatcher import dispatcher_state, same_schema
from ..scan.model import COVERED, Scan


@dataclass(frozen=True)
class Drift:
    op: str
    kind: str  # absent | schema | kernel-missing | kernel-unexpected
    detail: str


def cross_check(scan: Scan, patched: set[str] | frozenset[str] = frozenset()) -> list[Drift]:
    drifts = []
    for r in scan.records:
        schema, has_kernel = dispatcher_state(r.name)
        if schema is None:
            drifts.append(Drift(r.name, "absent", "the yaml has it; the imported torch does not"))
            continue
        if not same_schema(r.schema, schema):
            drifts.append(Drift(r.name, "schema", f"yaml: {r.schema} | runtime: {schema}"))
        if r.name in patched:
            if not has_kernel:
                drifts.append(Drift(r.name, "kernel-missing", "installed by torchgen-patch but not in the dispatcher"))
            continue
        if r.verdict == COVERED and not has_kernel:
            drifts.append(Drift(r.name, "kernel-missing", "covered by the codegen, but no ADInplaceOrView kernel"))
        elif r.verdict != COVERED and has_kernel and not r.manual:
            drifts.append(Drift(r.name, "kernel-unexpected",
                                f"{r.verdict}, yet an ADInplaceOrView kernel is registered"))
    return drifts
