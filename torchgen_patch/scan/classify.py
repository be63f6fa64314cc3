"""Classify: one verdict per function, from its facts alone.

The rule for *covered* is the upstream autograd codegen's own (asked by
``sources.torchgen`` and recorded in ``Facts.generates``), not a re-derivation.
"""

from __future__ import annotations

from ..errors import Location
from .model import COMPOSITE, COVERED, MISSING, NOT_MUTATING, UNSUPPORTED, Facts, OpRecord

SUPPORTED_FORMS = {"tensor", "tensor_list", "optional_tensor"}
_WHAT = {"out": "out= op", "inplace": "in-place op", "mutable": "mutable op"}


def record(f: Facts) -> OpRecord:
    verdict, reason = verdict_of(f)
    return OpRecord(f.name, f.schema, Location(f.file, f.line), f.kind, f.written, f.returns, verdict, reason,
                    f.composite_implicit, f.manual, f.autograd_gap,
                    f.grad_name, f.grad_inputs)


def verdict_of(f: Facts) -> tuple[str, str]:
    if f.generates:
        return COVERED, "the autograd codegen emits an ADInplaceOrView kernel"
    if not f.written:
        if f.manual:
            return NOT_MUTATING, "writes no argument; its kernels are written by hand in VariableTypeManual.cpp"
        if f.view:
            return NOT_MUTATING, "view op without its own kernel (composite)"
        return NOT_MUTATING, "writes no argument"
    if f.returns == 0:
        if f.view:
            return UNSUPPORTED, "both a view and mutating: a view kernel must return the view"
        if f.kind == "functional":
            why = "handled by hand in VariableTypeManual.cpp" if f.manual else "writes only metadata, not tensor data"
            return UNSUPPORTED, f"schema marks '{f.written[0].name}' written but torchgen calls it functional; {why}"
        if f.kind == "scratch":
            return UNSUPPORTED, "scratch-kind schema: the written arguments are scratch space, not outputs"
        bad = [w for w in f.written if w.form not in SUPPORTED_FORMS]
        if bad:
            return UNSUPPORTED, f"written argument '{bad[0].name}' has a form no kernel handles ({bad[0].form})"
        names = ", ".join(w.name for w in f.written)
        return MISSING, f"{_WHAT[f.kind]} writes {names} and returns nothing: no ADInplaceOrView kernel bumps it"
    if f.manual:
        return COMPOSITE, "kernels written by hand in VariableTypeManual.cpp"
    return COMPOSITE, "CompositeImplicitAutograd: the ops it decomposes into bump the counters"
