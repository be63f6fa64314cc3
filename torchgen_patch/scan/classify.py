"""Classify: one verdict per function, from its facts alone.

The rule for *covered* is the upstream autograd codegen's own (asked by
``sources.torchgen`` and recorded in ``Facts.generates``), not a re-derivation.
"""

from __future__ import annotations

import re

from ..errors import Location
from ..sources.facts import Facts, kernel_candidate
from ..vocabulary import Form, Gap, Kind, Verdict
from .model import COMPOSITE, COVERED, MISSING, NOT_MUTATING, UNSUPPORTED, OpRecord

SUPPORTED_FORMS = {Form.TENSOR, Form.TENSOR_LIST, Form.OPTIONAL_TENSOR}
_WHAT = {Kind.OUT: "out= op", Kind.INPLACE: "in-place op", Kind.MUTABLE: "mutable op"}


def record(f: Facts) -> OpRecord:
    verdict, reason = verdict_of(f)
    return OpRecord(f.name, f.schema, Location(f.file, f.line), f.kind, f.written, f.returns, verdict, reason,
                    f.composite_implicit, f.manual, f.autograd_gap,
                    f.grad_name, f.grad_inputs)


def verdict_of(f: Facts) -> tuple[Verdict, str]:
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
        if f.kind == Kind.FUNCTIONAL:
            why = "handled by hand in VariableTypeManual.cpp" if f.manual else "writes only metadata, not tensor data"
            return UNSUPPORTED, f"schema marks '{f.written[0].name}' written but torchgen calls it functional; {why}"
        if f.kind == Kind.SCRATCH:
            return UNSUPPORTED, "scratch-kind schema: the written arguments are scratch space, not outputs"
        bad = [w for w in f.written if w.form not in SUPPORTED_FORMS]
        if bad:
            return UNSUPPORTED, f"written argument '{bad[0].name}' has a form no kernel handles ({bad[0].form})"
        names = ", ".join(w.name for w in f.written)
        return MISSING, f"{_WHAT[f.kind]} writes {names} and returns nothing: no ADInplaceOrView kernel bumps it"
    if f.manual:
        return COMPOSITE, "kernels written by hand in VariableTypeManual.cpp"
    return COMPOSITE, "CompositeImplicitAutograd: the ops it decomposes into bump the counters"


# ---- a scan read back from the cache is input: every field checked before any stage uses it ----

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_OP = re.compile(r"[a-z_][a-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)?\Z")
# the words of the C++ types torchgen's dispatcher API spells (torchgen/api/types); a type with any
# other word, or any character beyond these, is not torchgen's, so the entry is rebuilt
_TYPE_CHARS = re.compile(r"[A-Za-z0-9_:<>, &*]+\Z")
_TYPE_WORDS = frozenset("""
    at c10 std const Tensor TensorList ITensorListRef IOptTensorListRef IntArrayRef OptionalIntArrayRef SymInt
    SymIntArrayRef OptionalSymIntArrayRef SymBool ArrayRef OptionalArrayRef optional array List Scalar ScalarType
    Layout Device DeviceIndex MemoryFormat QScheme Storage Stream Generator Dimname DimnameList string_view
    bool double float int64_t int32_t int8_t uint8_t complex Half BFloat16 TensorOptions
""".split())


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def cpp_type_ok(t: object) -> bool:
    """Whether ``t`` reads as a C++ type torchgen emits (words from its API, ``::``, ``<>``, ``,``, ``&``, ``*``)."""
    if not isinstance(t, str) or not _TYPE_CHARS.match(t) or t.count("<") != t.count(">"):
        return False
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+", t)
    return bool(words) and all(w in _TYPE_WORDS or w.isdigit() for w in words) and ":::" not in t


def validate(records, cpp: dict, facts: list) -> None:
    """Raise ValueError unless ``records`` (OpRecords), ``cpp`` (op -> CppSig) and ``facts`` (per record:
    [view, generates]) read back from the cache are what a scan writes: names and types that are safe
    in C++, the enumerations' values, and each verdict and reason the one ``verdict_of`` gives."""
    _check(isinstance(facts, list) and len(facts) == len(records), "facts do not match the records")
    for r, extra in zip(records, facts, strict=True):
        _check(isinstance(r.name, str) and bool(_OP.match(r.name)), f"operator name {r.name!r}")
        _check(isinstance(r.schema, str) and r.schema.isprintable() and r.schema.startswith(r.name + "("),
               f"{r.name}: schema")
        _check(type(r.loc.line) is int and r.loc.line > 0, f"{r.name}: line")
        _check(isinstance(r.kind, Kind) and type(r.returns) is int and r.returns >= 0, f"{r.name}: kind or returns")
        _check(all(type(b) is bool for b in (r.composite_implicit, r.manual, *extra)) and len(extra) == 2,
               f"{r.name}: flags")
        for w in r.written:
            _check(isinstance(w.name, str) and bool(_IDENT.match(w.name)) and isinstance(w.form, Form),
                   f"{r.name}: written argument")
        # the autograd facts name the op and arguments in the kernels' requires-grad refusal
        _check(isinstance(r.autograd_gap, Gap) and isinstance(r.grad_name, str)
               and (r.grad_name == "" or bool(_IDENT.match(r.grad_name)))
               and all(isinstance(a, str) and _IDENT.match(a) for a in r.grad_inputs), f"{r.name}: autograd facts")
        f = Facts(r.name, r.schema, r.loc.path, r.loc.line, r.kind, r.written, r.returns, extra[0], extra[1],
                  r.composite_implicit, r.manual, None)
        _check(verdict_of(f) == (r.verdict, r.reason), f"{r.name}: verdict {r.verdict!r} is not what its facts give")
    candidates = {r.name for r, extra in zip(records, facts, strict=True)
                  if kernel_candidate(r.kind, r.written, r.returns, extra[0])}
    _check(set(cpp) == candidates, "the C++ signatures are not those of the kernel candidates")
    for op, sig in cpp.items():
        _check(isinstance(sig.formals, tuple) and all(len(x) == 2 and cpp_type_ok(x[0]) and isinstance(x[1], str)
                                                      and _IDENT.match(x[1]) for x in sig.formals),
               f"{op}: C++ parameter")
        _check(all(isinstance(a, str) and _IDENT.match(a) for a in sig.call_args), f"{op}: call argument")
        _check(all(isinstance(n, str) and _IDENT.match(n) for n in (sig.unambiguous_name, sig.root_name)),
               f"{op}: C++ name")
        # and what a scan derives from the schema, exactly: the kernel redispatches to this op, with its
        # parameters in their order (a tampered entry must not call another op or swap arguments)
        base = op.split("::", 1)[-1]
        _check(tuple(sig.call_args) == tuple(n for _, n in sig.formals),
               f"{op}: call arguments differ from its parameters")
        _check(sig.unambiguous_name == base.replace(".", "_"), f"{op}: C++ name is not the op's")
        _check(sig.root_name in (base.split(".")[0], base.split(".")[0].rstrip("_")), f"{op}: C++ header name")
