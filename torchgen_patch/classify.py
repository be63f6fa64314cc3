"""Classify every NativeFunction into exactly one verdict.

The rule for *covered* is the upstream autograd codegen's own (called through
``tg.upstream_generates``), not a re-derivation of it.
"""

from __future__ import annotations

import os

from . import tg
from .model import (
    COMPOSITE,
    COVERED,
    CppSig,
    MISSING,
    NOT_MUTATING,
    UNSUPPORTED,
    VERDICTS,
    OpRecord,
    Scan,
)

SUPPORTED_FORMS = {"tensor", "tensor_list", "optional_tensor"}


def classify(native_path: str, tags_path: str, functions: list, torch_version: str,
             raw_schemas: dict[int, str] | None = None, keep: tuple[str, ...] | None = None, lazy=None) -> Scan:
    """Every function's verdict. ``keep``: build records only for these
    verdicts (the rest are counted and named); ``lazy`` then loads them all."""
    registers = [tg.upstream_registers(f) for f in functions]
    bases = {str(f.func.name.name.base) for f, r in zip(functions, registers) if r and not f.is_abstract}
    derived = tg.derivative_signatures(os.path.join(tg.packaged_autograd_dir(), "derivatives.yaml"), bases)
    infos_cache: dict = {}

    def infos():
        if "d" not in infos_cache:
            infos_cache["d"] = tg.load_infos(native_path, tags_path)
        return infos_cache["d"]

    records, verdicts = [], {}
    for f, reg in zip(functions, registers):
        generates = reg if not reg else tg.upstream_uses_derived(f, derived, infos)
        if keep is None:
            records.append(_one(f, generates, raw_schemas))
            continue
        verdict, _ = _verdict(f, tg.kind(f), tg.written_args(f), generates)
        verdicts[f"aten::{f.func.name}"] = verdict
        if verdict in keep:
            records.append(_one(f, generates, raw_schemas))
    records.sort(key=lambda r: r.name)
    if keep is None:
        return Scan(native_path, tags_path, torch_version, records)
    counts = {v: 0 for v in VERDICTS}
    for v in verdicts.values():
        counts[v] += 1
    partial = {v: [r for r in records if r.verdict == v] for v in keep}
    return Scan(native_path, tags_path, torch_version, lazy=lazy, counts=counts, partial=partial,
                verdicts=dict(sorted(verdicts.items())))


def _one(f, generates: bool | None, raw_schemas) -> OpRecord:
    written = tg.written_args(f)
    kind = tg.kind(f)
    verdict, reason = _verdict(f, kind, written, generates)
    name = str(f.func.name)
    return OpRecord(
        name=f"aten::{name}",
        schema=tg.schema_str(f, raw_schemas, name),
        file=f.loc.file,
        line=f.loc.line,
        kind=kind,
        written=written,
        returns=len(f.func.returns),
        verdict=verdict,
        reason=reason,
        composite_implicit=not f.is_abstract,
        manual=tg.is_manual_autograd(f),
    )


def cpp_signatures(functions: list, ops: set[str]) -> dict[str, CppSig]:
    """The C++ dispatcher signatures (torchgen's C++ API) of ``ops``."""
    out = {}
    for f in functions:
        name = tg.op_name(f)
        if name in ops:
            s = tg.cpp_signature(f)
            out[name] = CppSig(tuple(s.formals), tuple(s.arg_names), s.unambiguous_name, s.root_name)
    return out


def _verdict(f, kind, written, generates: bool | None) -> tuple[str, str]:
    """``generates``: the upstream codegen emits a kernel (None: no codegen to ask)."""
    if generates:
        return COVERED, "the autograd codegen emits an ADInplaceOrView kernel"
    if not written:
        if tg.is_manual_autograd(f):
            return NOT_MUTATING, "writes no argument; its kernels are written by hand in VariableTypeManual.cpp"
        if tg.is_view(f):
            return NOT_MUTATING, "view op without its own kernel (composite)"
        return NOT_MUTATING, "writes no argument"
    if tg.returns_nothing(f):
        if tg.is_view(f):
            return UNSUPPORTED, "both a view and mutating: a view kernel must return the view"
        if kind == "functional":
            why = "handled by hand in VariableTypeManual.cpp" if tg.is_manual_autograd(f) else \
                "writes only metadata, not tensor data"
            return UNSUPPORTED, f"schema marks '{written[0].name}' written but torchgen calls it functional; {why}"
        if kind == "scratch":
            return UNSUPPORTED, "scratch-kind schema: the written arguments are scratch space, not outputs"
        bad = [w for w in written if w.form not in SUPPORTED_FORMS]
        if bad:
            return UNSUPPORTED, f"written argument '{bad[0].name}' has a form no kernel handles ({bad[0].form})"
        what = {"out": "out= op", "inplace": "in-place op", "mutable": "mutable op"}[kind]
        names = ", ".join(w.name for w in written)
        return MISSING, f"{what} writes {names} and returns nothing: no ADInplaceOrView kernel bumps it"
    if generates is None:
        return COVERED, "assumed covered: this torchgen ships no autograd codegen to ask"
    if tg.is_manual_autograd(f):
        return COMPOSITE, "kernels written by hand in VariableTypeManual.cpp"
    return COMPOSITE, "CompositeImplicitAutograd: the ops it decomposes into bump the counters"
