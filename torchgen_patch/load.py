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
from .model import OpRecord, Scan


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


def scan(sources: Sources, use_cache: bool = True) -> Scan:
    """Classify every function of ``sources`` (through the cache when allowed)."""
    native_b = _read_bytes(sources.native, "native_functions.yaml")
    tags_b = _read_bytes(sources.tags, "tags.yaml")
    tv = torch_version()
    key = hashlib.sha256(b"\0".join([native_b, tags_b, tv.encode(), _tool_fingerprint().encode()])).hexdigest()
    path = os.path.join(cache_dir(), f"scan-{key[:32]}.json")
    if use_cache:
        cached = _read_cache(path, sources, tv)
        if cached is not None:
            return cached
    from . import classify, tg

    functions = tg.parse(sources.native, sources.tags, native_b.decode(), tags_b.decode())
    result = classify.classify(sources.native, sources.tags, functions, tv)
    if use_cache:
        _write_cache(path, result)
    return result


def _read_cache(path: str, sources: Sources, tv: str) -> Scan | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    s = Scan(sources.native, sources.tags, tv)
    s.records = [OpRecord.from_json(r) for r in data["records"]]
    # the cache is keyed by content, not by path: re-attach the caller's path
    s.records = [_with_file(r, sources.native) for r in s.records]
    return s


def _with_file(r: OpRecord, file: str) -> OpRecord:
    if r.file == file:
        return r
    d = r.to_json()
    d["file"] = file
    return OpRecord.from_json(d)


def _write_cache(path: str, s: Scan) -> None:
    from .write import atomic_write

    data = {"records": [r.to_json() for r in s.records]}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, json.dumps(data, sort_keys=True).encode())
    except OSError:
        pass  # a cache that cannot be written is only a slower next run
