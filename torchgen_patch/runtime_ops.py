"""The live operator registry: mutating operators in any namespace (custom ops
defined with torch.library.Library(...).define, extensions, FSDP2's own) that
no ADInplaceOrView kernel covers."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from .errors import InputError
from .lint import Finding

RULE_RUNTIME = "missing-inplace-or-view-kernel"
_REGISTERED = re.compile(r"^debug: registered at (.+?):(\d+)\s*$", re.M)


@dataclass(frozen=True)
class RuntimeOp:
    name: str  # ns::op.overload
    schema: str
    written: tuple[str, ...]
    file: str
    line: int


def import_modules(modules: list[str]) -> None:
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # the user's module failed to import: bad input, not our bug
            raise InputError(None, None, f"--import {m}: {type(e).__name__}: {e}") from None


def _location(name: str) -> tuple[str, int]:
    import torch

    m = _REGISTERED.search(torch._C._dispatch_dump(name))
    return (m.group(1), int(m.group(2))) if m else ("<runtime>", 0)


def written_args(schema) -> tuple[str, ...]:
    return tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def is_view(schema) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def schema_of(name: str):
    import torch

    base, _, overload = name.partition(".")
    try:
        return torch._C._get_schema(base, overload)
    except RuntimeError:
        return None


def uncovered(namespaces: list[str] | None = None) -> list[RuntimeOp]:
    """Operators that write an argument, are not views, are not composite
    (CompositeImplicitAutograd: they decompose into ops that bump) and have no
    ADInplaceOrView kernel."""
    import torch

    names = torch._C._dispatch_get_all_op_names()
    out = []
    for name in sorted(names):
        if namespaces and name.split("::", 1)[0] not in namespaces:
            continue
        schema = schema_of(name)
        if schema is None:
            continue
        written = written_args(schema)
        if not written or is_view(schema):
            continue
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        if has(name, "ADInplaceOrView") or has(name, "CompositeImplicitAutograd"):
            continue
        file, line = _location(name)
        out.append(RuntimeOp(name, str(schema), written, file, line))
    return out


def findings(ops: list[RuntimeOp]) -> list[Finding]:
    return [Finding(o.file, o.line, o.name, RULE_RUNTIME,
                    f"{o.name}: writes {', '.join(o.written)} and has no ADInplaceOrView kernel: "
                    "nothing bumps the version counters of what it writes") for o in ops]
