"""Scan: every function of the sources' yaml, classified (one verdict each).

``scan(sources)`` parses the yaml once, with the sources' own torchgen, and
keeps what later stages need (records, and the C++ signatures of the ops a
kernel can be generated for), so nothing downstream parses again.
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import cache
from ..files import decode, read_bytes
from ..fs import root as cache_root
from ..sources import Sources
from ..sources.facts import CppSig
from .classify import record, validate
from .model import OpRecord, Scan

__all__ = ["scan", "Scan"]


def key_of(sources: Sources) -> str:
    """The content key of everything that decides the scan of ``sources`` (what ``Scan.key`` will be)."""
    return _keyed(sources)[3]


def _keyed(sources: Sources) -> tuple[bytes, bytes, str, str]:
    native_b = read_bytes(sources.native, "native_functions.yaml")
    tags_b = read_bytes(sources.tags, "tags.yaml")
    identity = sources.toolchain.identity()
    key = cache_root.key(native_b, tags_b, sources.world, identity, cache.tool_fingerprint())
    return native_b, tags_b, identity, key


def scan(sources: Sources, use_cache: bool = True, autograd: bool = True) -> Scan:
    """``autograd`` False: without what the VariableType kernels leave out (``OpRecord.autograd_gap``),
    which costs loading derivatives.yaml; a plain lint needs none of it."""
    native_b, tags_b, identity, k = _keyed(sources)
    name = f"scan-{k[:32]}.json"
    lean = f"scan-{k[:32]}-no-autograd.json"
    if use_cache:
        for n in (name,) if autograd else (name, lean):  # a full scan answers for a lean one
            cached = _from_cache(cache.read(n), sources, k, n, n == name)
            if cached is not None:
                return cached
    from ..sources import torchgen

    native = decode(sources.native, native_b, "native_functions.yaml")
    tags = decode(sources.tags, tags_b, "tags.yaml")
    facts = torchgen.facts(sources.toolchain, sources.native, sources.tags, native, tags, identity, autograd)
    facts = sorted(facts, key=lambda f: f.name)
    records = tuple(record(f) for f in facts)
    cpp = {f.name: f.cpp for f in facts if f.cpp is not None}
    result = Scan(sources, records, dict(sorted(cpp.items())), k, autograd)
    if use_cache:
        # the cache is keyed by content, not by path: the caller's path is attached on reading
        cache.write(name if autograd else lean, {"records": [r.to_row() for r in records],
                                                 "facts": [[f.view, f.generates] for f in facts],
                           "cpp": {op: c.to_json() for op, c in result.cpp.items()}})
    return result


def _from_cache(data, sources: Sources, k: str, name: str, autograd: bool = True) -> Scan | None:
    """The cached scan, or None when the entry is missing or fails validation (damaged, truncated,
    edited by hand or by someone else): a bad cache costs a re-parse, never a wrong answer. Every
    string that the codegen writes into C++ passes the checks of ``validate`` first."""
    if data is None:
        return None
    try:
        records = tuple(OpRecord.from_row(r, sources.native) for r in data["records"])
        cpp = {op: CppSig.from_json(c) for op, c in data["cpp"].items()}
        if not records:
            raise ValueError("no records")
        validate(records, cpp, data["facts"])
        return Scan(sources, records, Rederived(cpp, records, sources, name), k, autograd)
    except (TypeError, KeyError, IndexError, ValueError, AttributeError) as e:
        cache.invalid(name, f"{type(e).__name__}: {e}")
        return None


class Rederived(Mapping):
    """A cached scan's C++ signatures (op -> CppSig), used only as what the scan would make: on first
    use (a plan; a lint never asks), every one is made again from its schema and yaml entry by the
    same function the scan uses (``sources.torchgen.cpp_signatures``), and those are what is used.
    A cached one that differs is said (-v note); the cost is torchgen's import and one schema parse
    per kernel candidate, never a wrong type in a kernel."""

    def __init__(self, cached: dict, records, sources: Sources, name: str):
        self._cached, self._sources, self._name = cached, sources, name
        self._wanted = [(r.name, r.schema, r.loc.line) for r in records if r.name in cached]
        self._made: dict | None = None

    def _sigs(self) -> dict:
        if self._made is None:
            from ..sources import torchgen

            src = self._sources
            try:
                made = torchgen.cpp_signatures(src.toolchain, src.native, decode(
                    src.native, read_bytes(src.native, "native_functions.yaml"), "native_functions.yaml"),
                    self._wanted)
            except ValueError as e:  # the records name no entry of this yaml: the scan's own, made again
                cache_root.note(f"cache entry {self._name}: {e}; its C++ signatures made by a scan again")
                made = dict(scan(src, use_cache=False).cpp)
            wrong = sorted(op for op in made if made[op] != self._cached.get(op))
            if wrong:
                cache_root.note(f"cache entry {self._name}: the C++ signature of {wrong[0]} is not what its schema "
                           f"gives ({len(wrong)} such); made from the schemas")
            self._made = made
        return self._made

    def __getitem__(self, op: str):
        return self._sigs()[op]

    def __iter__(self):
        return iter(self._sigs())

    def __len__(self) -> int:
        return len(self._cached)
