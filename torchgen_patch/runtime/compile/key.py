"""The build key (what the cached library depends on) and the library's statement of its own build:
the translation unit compiled into it, and the check of what it states once loaded."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any

from ...errors import InputError, require_torch
from ...fs.decode import loads
from .record import RECORD_FORMAT

IDENTITY_SOURCE = "torchgen_patch_build.cpp"  # templates/statement/: plain C++
IDENTITY_HEADER = "torchgen_patch_build.h"  # its one generated line
IDENTITY_SYMBOL = "torchgen_patch_build"


@dataclass(frozen=True)
class TorchIdentity:
    """A torch build, exactly: what a library is compiled against and states, what a prebuilt kernels wheel
    records, and what both must match in the running torch. A field a record leaves out is None."""

    version: str | None
    git_version: str | None
    cxx11_abi: bool | None
    cuda: str | None

    @classmethod
    def here(cls) -> TorchIdentity:
        """The running torch build."""
        torch = require_torch("building the kernels")
        return cls(torch.__version__, torch.version.git_version, bool(torch.compiled_with_cxx11_abi()),
                   torch.version.cuda)

    @classmethod
    def parse(cls, data: Any, path: str) -> TorchIdentity:
        """The torch build ``data`` (a table, as ``to_json`` writes it) that ``path`` records: an InputError
        naming ``path`` where it is no table or a field is of another type."""
        try:
            return cls.of(data)
        except TypeError as e:
            raise InputError(path, None, f"its torch build is not one: {e}") from None

    @classmethod
    def of(cls, data: Any) -> TorchIdentity:
        """The torch build ``data``; a TypeError where it is no table or a field is of another type."""
        if not isinstance(data, dict):
            raise TypeError(f"a table, not {type(data).__name__}")
        for f in fields(cls):
            value = data.get(f.name)
            kind = bool if f.name == "cxx11_abi" else str
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"{f.name} is {type(value).__name__}")
        return cls(data.get("version"), data.get("git_version"), data.get("cxx11_abi"), data.get("cuda"))

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "git_version": self.git_version, "cxx11_abi": self.cxx11_abi,
                "cuda": self.cuda}

    def differences(self, here: TorchIdentity) -> list[str]:
        """Each field in which this build is not ``here``, in words: "version '2.14.1' (this torch: '2.13.0')"."""
        return [f"{f.name} {getattr(self, f.name)!r} (this torch: {getattr(here, f.name)!r})" for f in fields(self)
                if getattr(self, f.name) != getattr(here, f.name)]


def torch_identity() -> dict:
    """The running torch build as a library states it (``TorchIdentity.here``'s JSON form)."""
    return TorchIdentity.here().to_json()


@dataclass(frozen=True)
class StatedBuild:
    """What a loaded library says of its own build (``torchgen_patch_build()``, ``identity_source``): the build
    key and torch build its compile was given, and the torch version and C++ ABI torch's headers and the
    compiler saw (None: the compiler defined no ABI macro)."""

    key: str | None
    torch: TorchIdentity
    headers_version: str | None
    headers_cxx11_abi: bool | None

    @classmethod
    def parse(cls, data: str | bytes, path: str) -> StatedBuild:
        """The statement ``data`` of the library ``path``: an InputError where it is in a form this tool does
        not read."""
        try:
            raw = loads(data)
            said, headers = raw["stated"], raw["headers"]
            key, version, abi = said.get("key"), headers.get("version"), headers.get("cxx11_abi")
            kinds = ((key, str), (version, str), (abi, bool))
            if not all(value is None or isinstance(value, kind) for value, kind in kinds):
                raise TypeError("a field of another type")
            return cls(key, TorchIdentity.of(said.get("torch", {})), version, abi)
        except (ValueError, KeyError, TypeError, AttributeError):
            why = f"{path} states its build in a form this torchgen-patch does not read"
            raise InputError(path, None, why) from None


def build_key(files: dict[str, bytes], flags: tuple[str, ...], compiler: str) -> str:
    torch = require_torch("building the kernels")

    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    h.update(" ".join(flags).encode())
    h.update(compiler.encode())
    h.update(_identity_source())  # compiled into every library: a change to it is a new build
    h.update(torch.__version__.encode() + torch.__file__.encode())
    h.update(f"record-{RECORD_FORMAT}".encode())
    return h.hexdigest()


def _identity_source() -> bytes:
    from ...codegen.render import STATEMENT_FOLDER, native_sources

    return native_sources(STATEMENT_FOLDER)[IDENTITY_SOURCE]


def identity_source(key: str) -> dict[str, bytes]:
    """The translation unit that makes a library state its own build, by file name: what it was compiled
    against, as the building Python saw it (torch's version, git hash, C++ ABI, CUDA) and as torch's headers
    and the compiler saw it, and its build key. Read back by ``install`` after ``dlopen``. The C++ is
    templates/statement/torchgen_patch_build.cpp; what varies is its one generated line, the header it includes
    (the statement as a raw string literal)."""
    stated = json.dumps({"key": key, "torch": torch_identity()}, sort_keys=True)
    line = f'#define TORCHGEN_PATCH_STATED R"tgp({stated})tgp"  // @generated by torchgen-patch\n'
    return {IDENTITY_SOURCE: _identity_source(), IDENTITY_HEADER: line.encode()}


def build_problem(stated: str | bytes | None, key: str | None, path: str) -> str | None:
    """Why a library whose ``torchgen_patch_build()`` said ``stated`` must not be registered in this
    torch (None: it is the build of ``key`` for exactly this torch). No record can say otherwise."""
    if stated is None:
        return (f"{path} does not say which torch it was built against (made by an older torchgen-patch, or "
                "not by torchgen-patch)")
    try:
        said = StatedBuild.parse(stated, path)
    except InputError as e:
        return e.message
    if key is not None and said.key != key:
        return (f"the library loaded for {path} is the build {str(said.key)[:24]}, not {key[:24]} that was "
                "checked")
    here = TorchIdentity.here()
    differ = said.torch.differences(here)
    base = str(here.version).split("+")[0]
    if said.headers_version != base:
        differ.append(f"headers of torch {said.headers_version} (this torch: {base})")
    if said.headers_cxx11_abi is not None and said.headers_cxx11_abi != here.cxx11_abi:
        differ.append(f"C++11 ABI {said.headers_cxx11_abi} (this torch: {here.cxx11_abi})")
    if differ:
        return f"{path} was built against another torch: " + "; ".join(differ)
    return None
