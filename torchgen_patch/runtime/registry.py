"""The live operator registry: mutating operators in any namespace (custom ops
defined with torch.library.Library(...).define, extensions, FSDP2's own) that
no ADInplaceOrView kernel covers."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InputError, Location
from . import dispatcher as d


@dataclass(frozen=True)
class RuntimeOp:
    name: str  # ns::op.overload
    schema: str
    written: tuple[str, ...]
    loc: Location


# ns::name.overload -> where its library's define() was called, for ops defined in Python while
# import_modules ran (the dispatcher only knows torch's own torch/library.py line for those)
_DEFINED_AT: dict[str, Location] = {}


def import_modules(modules: list[str]) -> None:
    """Import the user's modules, recording where each operator they define in Python is
    defined. Whatever they print goes to stderr: stdout carries the report."""
    import contextlib
    import sys

    with _recording_defines(), contextlib.redirect_stdout(sys.stderr):
        for m in modules:
            try:
                importlib.import_module(m)
            except Exception as e:  # noqa: BLE001 — the user's module failed to import: bad input, not our bug
                raise InputError(None, None, f"--import {m}: {type(e).__name__}: {e}") from None


@contextlib.contextmanager
def _recording_defines():
    import os
    import traceback

    import torch.library as tl

    real = tl.Library.define
    # the definer is the innermost frame that is not torch's definition machinery
    # (torch/library.py, torch/_library/), the standard library (functools.singledispatch
    # wraps torch.library.define) or the import system; it may be torch itself (a torch
    # module imported lazily by the library defines its own ops: those stay torch's)
    torch_dir = os.path.dirname(os.path.abspath(tl.__file__))
    machinery = (os.path.join(torch_dir, "library.py"), os.path.join(torch_dir, "_library") + os.sep)
    stdlib = os.path.dirname(os.path.abspath(os.__file__)) + os.sep

    def ours(f: str) -> bool:
        return f.startswith(machinery) or (f.startswith(stdlib) and "-packages" + os.sep not in f[len(stdlib):])

    def define(self, schema, *args, **kwargs):
        result = real(self, schema, *args, **kwargs)
        for frame in reversed(traceback.extract_stack()[:-1]):
            if not frame.filename.startswith("<") and not ours(os.path.abspath(frame.filename)) \
                    and frame.filename != __file__:
                _DEFINED_AT[f"{self.ns}::{str(schema).split('(', 1)[0].strip()}"] = Location(frame.filename,
                                                                                           frame.lineno)
                break
        return result

    tl.Library.define = define  # type: ignore[method-assign]  # recorded while the modules import
    try:
        yield
    finally:
        tl.Library.define = real  # type: ignore[method-assign]  # torch's own again


def location_of(name: str) -> Location:
    """Where ``name`` was defined: the define() call site of an op defined in Python during
    ``import_modules``; else the dispatcher's record when that file exists on this machine and
    is not torch's own torch/library.py; else unknown (path None), never a foreign build path."""
    if name in _DEFINED_AT:
        return _DEFINED_AT[name]
    import os

    path, line = d.registered_at(name)
    if path and os.path.isfile(path) and not path.replace(os.sep, "/").endswith("torch/library.py"):
        return Location(path, line)
    return Location(None, None)


def check_namespaces(namespaces: list[str] | None) -> None:
    """Refuse a namespace with no operator in the live registry: a lint of it would always pass."""
    have = sorted({name.split("::", 1)[0] for name in d.all_op_names()})
    for ns in namespaces or []:
        if ns not in have:
            shown = ", ".join(have[:12]) + (f" and {len(have) - 12} more" if len(have) > 12 else "")
            raise InputError(None, None, f"--namespace {ns!r}: no operator of the live registry is in it "
                                         f"(namespaces with operators: {shown})",
                             "an extension's operators exist once it is imported: add --import MODULE "
                             "(e.g. --import torch.distributed.fsdp)")


def uncovered(namespaces: Sequence[str] | None = None) -> list[RuntimeOp]:
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
        out.append(RuntimeOp(name, str(schema), written, location_of(name)))
    return out
