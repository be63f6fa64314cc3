"""Plain data that flows through the pipeline: one record per function."""

from __future__ import annotations

from dataclasses import dataclass

# Verdicts, in the order they are reported.
COVERED = "covered"  # the upstream autograd codegen emits an ADInplaceOrView kernel
MISSING = "missing"  # mutates, returns nothing, not a view: no kernel, no bump guarantee
UNSUPPORTED = "unsupported"  # mutates and returns nothing, but a generated kernel cannot serve it
COMPOSITE = "composite"  # mutates and returns, no kernel of its own: decomposes into ops that bump
NOT_MUTATING = "not_mutating"
VERDICTS = (COVERED, MISSING, UNSUPPORTED, COMPOSITE, NOT_MUTATING)


@dataclass(frozen=True)
class WrittenArg:
    name: str
    form: str  # tensor | tensor_list | optional_tensor | optional_tensor_list


@dataclass(frozen=True)
class CppSig:
    """A dispatcher signature in C++ terms, as torchgen's C++ API spells it."""

    formals: tuple[tuple[str, str], ...]  # (type, name), schema order, keyset excluded
    call_args: tuple[str, ...]
    unambiguous_name: str  # at::_ops::<this>
    root_name: str  # ATen/ops/<this>_ops.h

    def to_json(self) -> dict:
        return {"formals": [list(x) for x in self.formals], "call_args": list(self.call_args),
                "unambiguous_name": self.unambiguous_name, "root_name": self.root_name}

    @staticmethod
    def from_json(d: dict) -> CppSig:
        return CppSig(tuple(tuple(x) for x in d["formals"]), tuple(d["call_args"]), d["unambiguous_name"],
                      d["root_name"])


@dataclass(frozen=True)
class OpRecord:
    name: str  # aten::split_with_sizes_copy.out
    schema: str  # aten::split_with_sizes_copy.out(Tensor self, ...) -> ()
    file: str
    line: int
    kind: str  # functional | inplace | out | mutable | scratch
    written: tuple[WrittenArg, ...]
    returns: int
    verdict: str
    reason: str
    composite_implicit: bool = False
    manual: bool = False  # kernels written by hand upstream (VariableTypeManual.cpp)

    def to_json(self) -> dict:
        # by hand: dataclasses.asdict deep-copies and is the slowest part of a cold scan
        return {
            "name": self.name, "schema": self.schema, "file": self.file, "line": self.line, "kind": self.kind,
            "written": [{"name": w.name, "form": w.form} for w in self.written],
            "returns": self.returns, "verdict": self.verdict, "reason": self.reason,
            "composite_implicit": self.composite_implicit, "manual": self.manual,
        }

    @staticmethod
    def from_json(d: dict) -> OpRecord:
        d = dict(d)
        d["written"] = tuple(WrittenArg(**w) for w in d["written"])
        return OpRecord(**d)


class Scan:
    """The classification of every function of one native_functions.yaml.

    Records may be loaded lazily (from the cache): ``counts()`` and
    ``by_verdict()`` for the verdicts a lint needs are answered without
    building all records.
    """

    def __init__(self, native_path: str, tags_path: str, torch_version: str,
                 records: list[OpRecord] | None = None, *, lazy=None, counts: dict | None = None,
                 partial: dict[str, list[OpRecord]] | None = None, verdicts: dict[str, str] | None = None,
                 cache_key: str | None = None):
        self.native_path = native_path
        self.tags_path = tags_path
        self.torch_version = torch_version
        self._records = records if records is not None or lazy is not None else []
        self._lazy = lazy
        self._counts = counts
        self._partial = partial or {}
        self._verdicts = verdicts  # op name -> verdict, known without the full records
        self.cache_key = cache_key  # content key of the inputs, when the cache is in use
        self._idx: dict[str, OpRecord] | None = None
        self.cpp: dict[str, CppSig] | None = None  # C++ signatures of the missing ops, once known

    @property
    def records(self) -> list[OpRecord]:
        if self._records is None:
            self._records = self._lazy()
        return self._records

    def by_verdict(self, verdict: str) -> list[OpRecord]:
        if self._records is None and verdict in self._partial:
            return list(self._partial[verdict])
        return [r for r in self.records if r.verdict == verdict]

    def counts(self) -> dict[str, int]:
        if self._records is None and self._counts is not None:
            return dict(self._counts)
        c = {v: 0 for v in VERDICTS}
        for r in self.records:
            c[r.verdict] += 1
        return c

    def total(self) -> int:
        return sum(self.counts().values())

    def verdict_of(self, name: str) -> str | None:
        """The verdict of ``name`` (None: no such op), without loading every record."""
        if self._records is None and self._verdicts is not None:
            return self._verdicts.get(name)
        r = self.get(name)
        return None if r is None else r.verdict

    def names(self) -> list[str]:
        if self._records is None and self._verdicts is not None:
            return list(self._verdicts)
        return [r.name for r in self.records]

    def get(self, name: str) -> OpRecord | None:
        if self._records is None:
            for rs in self._partial.values():
                for r in rs:
                    if r.name == name:
                        return r
        if self._idx is None:
            self._idx = {r.name: r for r in self.records}
        return self._idx.get(name)
