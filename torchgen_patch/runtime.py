"""Cross-check static verdicts against the dispatcher of the imported torch."""

from __future__ import annotations

from dataclasses import dataclass

from .model import COVERED, Scan


@dataclass(frozen=True)
class Drift:
    op: str
    kind: str  # absent | schema | kernel-missing | kernel-unexpected
    detail: str


def dispatcher_state(op: str):
    """(the registered FunctionSchema or None if absent, has an ADInplaceOrView kernel)."""
    import torch

    ns_name, _, overload = op.partition(".")
    try:
        schema = torch._C._get_schema(ns_name, overload)
    except RuntimeError:
        return None, False
    return schema, bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, "ADInplaceOrView"))


def same_schema(yaml_schema: str, runtime_schema) -> bool:
    """Compare with torch's own schema parser, so that default values spelled
    differently (``Mean`` and ``1``, ``0`` and ``0.``) compare equal."""
    import torch

    try:
        return torch._C.parse_schema(yaml_schema) == runtime_schema
    except RuntimeError:
        return yaml_schema == str(runtime_schema)


def cross_check(scan: Scan, patched: set[str] = frozenset()) -> list[Drift]:
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
            drifts.append(Drift(r.name, "kernel-unexpected", f"{r.verdict}, yet an ADInplaceOrView kernel is registered"))
    return drifts
