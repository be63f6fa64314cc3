"""Plain data that flows through the pipeline: one record per function."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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
    cpp: CppSig | None = None  # for missing ops: what the codegen needs


    def to_json(self) -> dict:
        d = asdict(self)
        d["written"] = [asdict(w) for w in self.written]
        d["cpp"] = None if self.cpp is None else asdict(self.cpp)
        return d

    @staticmethod
    def from_json(d: dict) -> OpRecord:
        d = dict(d)
        d["written"] = tuple(WrittenArg(**w) for w in d["written"])
        c = d.get("cpp")
        if c is not None:
            d["cpp"] = CppSig(tuple(tuple(x) for x in c["formals"]), tuple(c["call_args"]),
                              c["unambiguous_name"], c["root_name"])
        return OpRecord(**d)


@dataclass
class Scan:
    """The classification of every function of one native_functions.yaml."""

    native_path: str
    tags_path: str
    torch_version: str
    records: list[OpRecord] = field(default_factory=list)

    def by_verdict(self, verdict: str) -> list[OpRecord]:
        return [r for r in self.records if r.verdict == verdict]

    def counts(self) -> dict[str, int]:
        c = {v: 0 for v in VERDICTS}
        for r in self.records:
            c[r.verdict] += 1
        return c

    def get(self, name: str) -> OpRecord | None:
        return self._index().get(name)

    def _index(self) -> dict[str, OpRecord]:
        idx = getattr(self, "_idx", None)
        if idx is None:
            idx = {r.name: r for r in self.records}
            self._idx = idx
        return idx
