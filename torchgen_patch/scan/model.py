"""Plain frozen data that flows from the scan on: facts, records, the scan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import Location
from ..sources import Sources
from ..sources.facts import CppSig, WrittenArg
from ..vocabulary import Form, Gap, Kind, Verdict

# Verdicts, in the order they are reported (the names the rest of the package imports).
COVERED, MISSING, UNSUPPORTED, COMPOSITE, NOT_MUTATING = VERDICTS = tuple(Verdict)

# What the autograd codegen's VariableType kernel of a void op leaves out (independent of the verdict).
OUT_UNCHECKED, INPLACE_UNCHECKED = Gap.OUT, Gap.INPLACE


class OpRecord(NamedTuple):
    name: str  # aten::split_with_sizes_copy.out
    schema: str  # aten::split_with_sizes_copy.out(Tensor self, ...) -> ()
    loc: Location
    kind: Kind
    written: tuple[WrittenArg, ...]
    returns: int
    verdict: Verdict
    reason: str
    composite_implicit: bool = False
    manual: bool = False
    autograd_gap: Gap = Gap.NONE  # what its VariableType kernel leaves out (OUT_UNCHECKED, INPLACE_UNCHECKED)
    grad_name: str = ""  # OUT_UNCHECKED: the name PyTorch's out= refusal prints for it
    grad_inputs: tuple[str, ...] = ()  # OUT_UNCHECKED: its differentiable inputs

    def to_json(self, path: str | None = None) -> dict:
        return {
            "name": self.name, "schema": self.schema, "file": self.loc.path if path is None else path,
            "line": self.loc.line, "kind": self.kind,
            "written": [{"name": w.name, "form": w.form} for w in self.written],
            "returns": self.returns, "verdict": self.verdict, "reason": self.reason,
            "composite_implicit": self.composite_implicit, "manual": self.manual, "autograd_gap": self.autograd_gap,
            **({"grad_name": self.grad_name, "grad_inputs": list(self.grad_inputs)} if self.grad_name else {}),
        }

    @staticmethod
    def from_json(d: dict, path: str) -> OpRecord:
        return OpRecord(d["name"], d["schema"], Location(path, d["line"]), Kind.parse(d["kind"]),
                        _written((w["name"], w["form"]) for w in d["written"]), d["returns"],
                        Verdict.parse(d["verdict"]), d["reason"], d["composite_implicit"], d["manual"],
                        Gap.parse(d.get("autograd_gap", "")), d.get("grad_name", ""), tuple(d.get("grad_inputs", ())))

    def to_row(self) -> list:
        """The compact form the cache keeps (no path: the cache is keyed by content)."""
        return [self.name, self.schema, self.loc.line, self.kind, [list(w) for w in self.written], self.returns,
                self.verdict, self.reason, self.composite_implicit, self.manual, self.autograd_gap,
                self.grad_name, list(self.grad_inputs)]

    @staticmethod
    def from_row(r: list, path: str) -> OpRecord:
        return OpRecord(r[0], r[1], Location(path, r[2]), Kind.parse(r[3]), _written(r[4]), r[5],
                        Verdict.parse(r[6]), r[7], r[8], r[9], Gap.parse(r[10]), r[11], tuple(r[12]))


def _written(pairs) -> tuple[WrittenArg, ...]:
    """Written arguments read back as (name, form) pairs, each form parsed (ValueError for no Form)."""
    return tuple(WrittenArg(name, Form.parse(form)) for name, form in pairs)


@dataclass(frozen=True)
class Scan:
    """The classification of every function of one native_functions.yaml."""

    sources: Sources
    records: tuple[OpRecord, ...]  # sorted by name
    cpp: Mapping[str, CppSig]  # C++ signatures of the ops a kernel can be generated for
    key: str  # content key of everything that decided this scan
    autograd: bool = True  # the VariableType kernels were asked (OpRecord.autograd_gap is known)
    _index: dict = field(default_factory=dict, compare=False, repr=False)
    _counts: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update((r.name, r) for r in self.records)
        self._counts.update((v, 0) for v in VERDICTS)
        for r in self.records:
            self._counts[r.verdict] += 1

    @property
    def native_path(self) -> str:
        return self.sources.native

    @property
    def torch_version(self) -> str:
        return self.sources.torch_version

    def by_verdict(self, verdict: Verdict) -> list[OpRecord]:
        return [r for r in self.records if r.verdict == verdict]

    def counts(self) -> dict[Verdict, int]:
        return dict(self._counts)

    def with_gap(self, gap: Gap) -> list[OpRecord]:
        """The ops whose VariableType kernel leaves out ``gap``'s check (OUT_UNCHECKED, INPLACE_UNCHECKED)."""
        return [r for r in self.records if r.autograd_gap == gap]

    def total(self) -> int:
        return len(self.records)

    def get(self, name: str) -> OpRecord | None:
        return self._index.get(name)

    def verdict_of(self, name: str) -> Verdict | None:
        r = self._index.get(name)
        return None if r is None else r.verdict

    def names(self) -> list[str]:
        return [r.name for r in self.records]
