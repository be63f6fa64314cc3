"""The live operator registry: mutating operators in any namespace (custom ops
defined with torch.library.Library(...).define, extensions, FSDP2's own) that
no ADInplaceOrView kernel covers."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import InputError, Location
from . import dispatcher as d


@dataclass(frozen=True)
class RuntimeOp:
    name: str  # ns::op.overload
    schema: str
    written: tuple[str, ...]
    loc: Location


def import_modules(modules: list[str]) -> None:
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # the user's module failed to import: bad input, not our bug
            raise InputError(None, None, f"--import {m}: {type(e).__name__}: {e}") from None


def uncovered(namespaces: list[str] | None = None) -> list[RuntimeOp]:
    """Operators that write an argument, are not views, are not composite
    (CompositeImplicitAutograd: they decompose into ops that bump) and have no
    ADInplaceOrView kernel."""
    out = []
    for name in d.all_op_names():
        if namespaces and name.split("::", 1)[0] not in namespaces:
            continue
        schema = d.schema_of(name)
        if schema is None:
            continue
        written = d.written_args(schema)
        if not written or d.is_view(schema):
            continue
        if d.has_kernel(name, "ADInplaceOrView") or d.has_kernel(name, "CompositeImplicitAutograd"):
            continue
        out.append(RuntimeOp(name, str(schema), written, Location(*d.registered_at(name))))
    return out
