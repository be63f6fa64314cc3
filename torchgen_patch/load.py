"""Load: resolve the input files, parse them through torchgen, classify.

A scan is cached under a key made of the inputs' content, the tool's own
source and the torch version, so a re-run on unchanged inputs skips torchgen.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from . import __version__
from .errors import InputError
from .model import MISSING, UNSUPPORTED, OpRecord, Scan


@dataclass(frozen=True)
class Sources:
    native: str
    tags: str

    @staticmethod
    def resolve(native: str | None = None, tags: str | None = None, pytorch_root: str | None = None) -> Sources:
        from . import tg

        if pytorch_root is not None:
            if native or tags:
                raise InputError(None, None, "--pytorch-root excludes --native-functions/--tags")
            if not os.path.isdir(pytorch_root):
                raise InputError(pytorch_root, None, "--pytorch-root is not a directory")
            d = os.path.join(pytorch_root, "aten", "src", "ATen", "native")
            n = os.path.join(d, "native_functions.yaml")
            if not os.path.isfile(n):
                raise InputError(pytorch_root, None, "not a PyTorch source tree: aten/src/ATen/native/native_functions.yaml is missing")
            return Sources(n, os.path.join(d, "tags.yaml"))
        if native is None:
            if tags is not None:
                raise InputError(None, None, "--tags needs --native-functions")
            n, t = tg.packaged_yaml()
            return Sources(n, t)
        if tags is None:
            tags = os.path.join(os.path.dirname(native), "tags.yaml")
        return Sources(native, tags)


def torch_version() -> str:
    """The installed torch's version, without importing torch (read from
    torch/version.py; importlib.metadata as a fallback)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py"), encoding="utf-8") as fh:
                text = fh.read()
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
            if m:
                return m.group(1)
        except OSError:
            pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def _tool_fingerprint() -> str:
    h = hashlib.sha256(__version__.encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as fh:
                h.update(name.encode() + fh.read())
    return h.hexdigest()


def cache_dir() -> str:
    base = os.environ.get("TORCHGEN_PATCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torchgen-patch")
    return base


def _read_bytes(path: str, what: str) -> bytes:
    from .tg import read_text

    return read_text(path, what).encode("utf-8")  # validates existence and encoding


# The verdicts whose records a summary cache file carries (what lint needs).
SUMMARY_VERDICTS = (MISSING, UNSUPPORTED)


def scan(sources: Sources, use_cache: bool = True, full: bool = True, cpp: bool = False) -> Scan:
    """Classify every function of ``sources`` (through the cache when allowed).

    The cache holds two files per key: a summary (counts, every op's verdict,
    and the records a lint needs) and the full records. ``full=False`` (lint)
    writes only the summary; the full records are written, and loaded, only
    when something asks for them. ``cpp=True`` (the codegen): when torchgen
    parses anyway, also compute the missing ops' C++ signatures from that parse.
    """
    native_b = _read_bytes(sources.native, "native_functions.yaml")
    tags_b = _read_bytes(sources.tags, "tags.yaml")
    tv = torch_version()
    key = hashlib.sha256(b"\0".join([native_b, tags_b, tv.encode(), _tool_fingerprint().encode()])).hexdigest()
    full_path = os.path.join(cache_dir(), f"scan-{key[:32]}.json")
    summary = os.path.join(cache_dir(), f"scan-{key[:32]}.summary.json")
    if use_cache:
        cached = _read_cache(full_path, summary, sources, tv, key)
        if cached is not None and (not full or os.path.exists(full_path)):
            return cached
    from . import classify, tg

    functions, raw = tg.parse(sources.native, sources.tags, native_b.decode(), tags_b.decode())
    if full:
        result = classify.classify(sources.native, sources.tags, functions, tv, raw)
    else:  # records only for what a lint needs; the rest on demand (parsing again)
        result = classify.classify(sources.native, sources.tags, functions, tv, raw, keep=SUMMARY_VERDICTS,
                                   lazy=lambda: scan(sources, use_cache=use_cache, full=True).records)
    if cpp:
        result.cpp = classify.cpp_signatures(functions, {r.name for r in result.by_verdict(MISSING)})
    if use_cache:
        result.cache_key = key
        if full:
            _write_full(full_path, result)
        if result.cpp is not None:
            write_json_cache(f"cpp-{key[:32]}.json", {k: v.to_json() for k, v in sorted(result.cpp.items())})
        _write_cache(summary, {"counts": result.counts(),
                               "verdicts": {n: result.verdict_of(n) for n in result.names()},
                               "records": [dict(r.to_json(), file="") for v in SUMMARY_VERDICTS
                                           for r in result.by_verdict(v)]})
    return result


def _write_full(path: str, result: Scan) -> None:
    _write_cache(path, {"records": [dict(r.to_json(), file="") for r in result.records]})


def cpp_signatures(scan: Scan) -> dict:
    """C++ signatures of the scan's missing ops, for the codegen (cached by the
    scan's content key; computing them needs torchgen's parse again)."""
    from .model import CppSig

    if scan.cpp is not None:
        return scan.cpp
    name = f"cpp-{scan.cache_key[:32]}.json" if scan.cache_key else None
    if name is not None:
        cached = read_json_cache(name)
        if cached is not None:
            return {k: CppSig.from_json(v) for k, v in cached.items()}
    from . import classify, tg

    native = _read_bytes(scan.native_path, "native_functions.yaml").decode()
    tags = _read_bytes(scan.tags_path, "tags.yaml").decode()
    functions, _raw = tg.parse(scan.native_path, scan.tags_path, native, tags)
    sigs = classify.cpp_signatures(functions, {r.name for r in scan.by_verdict(MISSING)})
    if name is not None:
        write_json_cache(name, {k: v.to_json() for k, v in sorted(sigs.items())})
    scan.cpp = sigs
    return sigs




def _load_json(path: str):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _read_cache(full: str, summary: str, sources: Sources, tv: str, key: str) -> Scan | None:
    # the cache is keyed by content, not by path: attach the caller's path
    def records(data) -> list[OpRecord]:
        return [OpRecord.from_json(dict(r, file=sources.native)) for r in data["records"]]

    head = _load_json(summary)
    if head is None:
        return None

    def lazy() -> list[OpRecord]:
        data = _load_json(full)
        if data is None:  # not written yet (a lint wrote only the summary): classify now
            result = scan(sources, use_cache=False)
            _write_full(full, result)
            return result.records
        return records(data)

    partial: dict[str, list[OpRecord]] = {v: [] for v in SUMMARY_VERDICTS}
    for r in records(head):
        partial[r.verdict].append(r)
    return Scan(sources.native, sources.tags, tv, lazy=lazy, counts=head["counts"], partial=partial,
                verdicts=head["verdicts"], cache_key=key)


def read_json_cache(name: str):
    try:
        with open(os.path.join(cache_dir(), name), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write_json_cache(name: str, data) -> None:
    _write_cache(os.path.join(cache_dir(), name), data)


def _write_cache(path: str, data) -> None:
    from .write import atomic_write

    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, json.dumps(data, separators=(",", ":")).encode(), durable=False)
    except OSError:
        pass  # a cache that cannot be written is only a slower next run
