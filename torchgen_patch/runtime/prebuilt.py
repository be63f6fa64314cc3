"""Prebuilt kernels: a platform wheel (``torchgen-patch-kernels``) holding the compiled library
for one torch build and the plan it was built from, so that machines without a compiler (a
cluster's nodes, a production image) install the kernels without building them.

``make_wheel`` packs a finished build with setuptools through ``pip wheel``; ``lookup`` finds an
installed one and says why it may not be used: another torch build (version, git hash, C++
ABI, CUDA), another torchgen-patch, other inputs, a missing or damaged library, two copies
installed. The wheel's record is read like a cached build's (a regular file of a trusted owner
that nobody else can write, in a package directory checked from ``/`` down, no symlink
followed); the library's SHA-256 is in it and checked before the library is loaded
(``library_problem``: the same checks as a cached build's, runtime/load/trust.py), and the library
itself states the torch it was built against, which must be this one whatever the record says.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from ..errors import EnvironmentProblem, InputError, ToolError, printable
from ..fs.decode import loads
from ..fs.dirs import Dir, open_dir
from ..fs.protected import Missing, library_refusal
from ..sources import Options, overlay_path
from ..version import __version__
from .compile.key import TorchIdentity
from .compile.record import LibraryRecord, Manifest, sha256_of
from .load.trust import verify

DIST = "torchgen-patch-kernels"
PACKAGE = "torchgen_patch_kernels"
RECORD = "record.json"
FORMAT = 2  # 2: the library states its own build (and the record its key)


@dataclass(frozen=True, kw_only=True)
class WheelRecord(LibraryRecord):
    """What a prebuilt kernels wheel says of itself (``record.json``): the torch build it was made for, the
    torchgen-patch that made it, its library with digest and build key (``LibraryRecord``, the part it shares
    with a build's record), the overlay and plan it was built from, and the saved-tensor check's native
    hooks beside it (None: it holds none that can be used). ``parse`` is its one reader, ``to_json`` its one
    writer's form."""

    format: int
    torch: TorchIdentity
    torchgen_patch: str | None
    overlay_sha256: str | None
    plan: Manifest
    saved: LibraryRecord | None = None

    @classmethod
    def parse(cls, data: bytes, path: str) -> WheelRecord:
        """The record ``data`` (its bytes) of the wheel named ``path`` (its distribution and version): an
        InputError saying, in one line, why it is not used."""
        try:
            raw = loads(data)
            torch, lib, digest, plan, fmt = raw["torch"], raw["library"], raw["sha256"], raw["plan"], raw["format"]
            manifest = Manifest.of(plan)
            if not isinstance(torch, dict) or not isinstance(lib, str) or not isinstance(digest, str):
                raise TypeError("torch, library or sha256 of another type")
            identity = TorchIdentity.of(torch)
            key, made, overlay = raw.get("key"), raw.get("torchgen_patch"), raw.get("overlay_sha256")
            if not all(v is None or isinstance(v, str) for v in (key, made, overlay)):
                raise TypeError("key, torchgen_patch or overlay_sha256 of another type")
        except (ValueError, KeyError, TypeError) as e:
            why = f"its {RECORD} is missing or damaged ({type(e).__name__}: {e})"
            raise InputError(None, None, f"{path}: {why}") from None
        if fmt != FORMAT:
            said = printable(repr(fmt))  # a number as it is; anything else escaped, on one line
            said = said if len(said) <= 60 else said[:60] + "..."
            raise InputError(None, None, f"{path}: record format {said}, this torchgen-patch reads {FORMAT}")
        return cls(lib, digest, key, format=fmt, torch=identity, torchgen_patch=made, overlay_sha256=overlay,
                   plan=manifest, saved=_saved(raw.get("saved")))

    def to_json(self) -> dict[str, Any]:
        out = {**super().to_json(), "format": self.format, "torchgen_patch": self.torchgen_patch,
               "torch": self.torch.to_json(), "overlay_sha256": self.overlay_sha256, "plan": self.plan.to_json()}
        if self.saved is not None:
            out["saved"] = self.saved.to_json()
        return out


def _saved(raw) -> LibraryRecord | None:
    """The saved-tensor hooks a wheel's record names, where it names them whole (None: it holds none)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("library"), str) or not isinstance(raw.get("sha256"), str):
        return None
    key = raw.get("key")
    return LibraryRecord(raw["library"], raw["sha256"], key if isinstance(key, str) else None)


@dataclass(frozen=True)
class Prebuilt:
    library: str
    version: str  # the wheel's version
    record: WheelRecord
    root: str  # the package directory: where the strict trust rule starts


def wheel_version(identity: TorchIdentity) -> str:
    """``<torchgen-patch version>+torch<version>.<cpu|cuXY>.<cxx11abi|precxx11abi>.g<hash>``
    (a PEP 440 local version naming the torch build)."""
    base = str(identity.version).split("+")[0]
    variant = "cu" + identity.cuda.replace(".", "") if identity.cuda else "cpu"
    abi = "cxx11abi" if identity.cxx11_abi else "precxx11abi"
    local = f"torch{base}.{variant}.{abi}.g{(identity.git_version or 'unknown')[:10]}"
    return f"{__version__}+" + re.sub(r"[^a-z0-9.]+", ".", local.lower())


def overlay_sha256(opts: Options) -> str | None:
    import hashlib

    from ..files import read_bytes

    path = overlay_path(opts)
    try:
        return None if path is None else hashlib.sha256(read_bytes(path, "overlay")).hexdigest()
    except ToolError:
        return f"unreadable: {path}"  # matches no record; the plan reports the overlay itself


def library_problem(d: Dir, name: str, sha256: str | None) -> str | None:
    """Why the library ``name`` in the wheel's checked package directory ``d`` must not be loaded, or
    None: the same rules as a cached build's (owner and modes from the package directory down; a
    regular file, no symlink; the SHA-256 the wheel recorded)."""
    try:
        fd = d.open(name)
    except Missing:
        return f"cannot check {d.join(name)} before loading native code from it: No such file or directory"
    except EnvironmentProblem as e:
        return e.message
    try:
        verify(fd, d.join(name), sha256)
    except EnvironmentProblem as e:
        return e.message
    except OSError as e:
        return f"its library {d.join(name)} cannot be read ({e.strerror})"
    finally:
        os.close(fd)
    return None


def record(library: int, name: str, key: str | None, manifest: Manifest, opts: Options) -> WheelRecord:
    """What the wheel says about itself: torch build, library (``library``: its open, checked descriptor)
    and its digest, its build key, inputs, plan."""
    return WheelRecord(name, sha256_of(library), key, format=FORMAT, torch=TorchIdentity.here(),
                       torchgen_patch=__version__, overlay_sha256=overlay_sha256(opts), plan=manifest)


_PYPROJECT = """\
[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "{version}"
description = "ADInplaceOrView kernels prebuilt by torchgen-patch for torch {torch}"
requires-python = ">={python}"

[tool.setuptools]
packages = ["{package}"]

[tool.setuptools.package-data]
{package} = ["*.so", "{record}"]
"""

# a library inside makes it a platform wheel (cpXY-cpXY-<platform>), never a py3-none-any one
_SETUP = """\
from setuptools import setup
from setuptools.dist import Distribution


class PlatformDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=PlatformDistribution)
"""


def _checked_bytes(art) -> tuple[int, bytes]:
    """(an open descriptor on ``art``'s library, its bytes), read from the descriptor its checks ran on."""
    from .load.trust import check_library

    fd = check_library(art.path, art.sha256, art.root)
    try:
        return fd, os.pread(fd, os.fstat(fd).st_size, 0)
    except BaseException:
        os.close(fd)
        raise


def make_wheel(out_dir: str, artifact, opts: Options, log=None, saved=None) -> str:
    """Pack ``artifact`` (runtime.Artifact: a finished build, its library read from the descriptor its
    checks ran on) and its plan into a wheel in ``out_dir``, with ``saved`` (the saved-tensor check's
    native hooks, an Artifact of their build) beside it where given; returns the wheel's path. Built by
    setuptools through ``pip wheel``, with no network (no build isolation) and a fixed
    SOURCE_DATE_EPOCH, so the same build gives the same wheel bytes."""
    log = sys.stderr if log is None else log  # the stream of the call, not the one at import
    fd, data = _checked_bytes(artifact)
    try:
        rec = record(fd, os.path.basename(artifact.path), artifact.key, artifact.manifest, opts)
    finally:
        os.close(fd)
    extra = {}
    if saved is not None:
        fd, extra_data = _checked_bytes(saved)
        os.close(fd)
        hooks = LibraryRecord(os.path.basename(saved.path), saved.sha256, saved.key)
        rec = dataclasses.replace(rec, saved=hooks)
        extra[hooks.library] = extra_data
    version = wheel_version(rec.torch)
    with tempfile.TemporaryDirectory(prefix="tgp-wheel-") as tmp:
        project, pkg, dist = (os.path.join(tmp, p) for p in ("project", os.path.join("project", PACKAGE), "dist"))
        os.makedirs(pkg)
        with open(os.path.join(project, "pyproject.toml"), "w") as fh:
            fh.write(_PYPROJECT.format(dist=DIST, version=version, torch=rec.torch.version, package=PACKAGE,
                                       record=RECORD, python=f"{sys.version_info[0]}.{sys.version_info[1]}"))
        with open(os.path.join(project, "setup.py"), "w") as fh:
            fh.write(_SETUP)
        with open(os.path.join(pkg, "__init__.py"), "w") as fh:
            fh.write(f'"""Prebuilt torchgen-patch kernels; torchgen_patch.install() finds them ({RECORD})."""\n')
        with open(os.path.join(pkg, RECORD), "w") as fh:
            json.dump(rec.to_json(), fh, indent=1, sort_keys=True)
            fh.write("\n")
        for name, payload in [(rec.library, data), *extra.items()]:
            with open(os.path.join(pkg, name), "wb") as fh:
                fh.write(payload)
        print(f"torchgen-patch: packing {DIST} {version} with pip wheel ...", file=log, flush=True)
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--disable-pip-version-check", "-q", "-w", dist, project], capture_output=True, text=True,
                           env=dict(os.environ, SOURCE_DATE_EPOCH="315532800"), cwd=tmp)
        wheels = sorted(os.listdir(dist)) if os.path.isdir(dist) else []
        if r.returncode != 0 or len(wheels) != 1:
            said = (r.stderr or "") + (r.stdout or "")
            tail = " ".join(said.strip().splitlines()[-3:])
            raise EnvironmentProblem(f"pip wheel could not pack the kernels (exit {r.returncode}): "
                                     f"{tail or 'no wheel made'}", wheel_hint(said))
        target = os.path.join(out_dir, wheels[0])
        _publish(os.path.join(dist, wheels[0]), target, out_dir)
    return target


def wheel_hint(said: str) -> str:
    """The fix for a failed ``pip wheel`` that fits what pip said: setuptools only where pip says it
    lacks setuptools or bdist_wheel (anything else, pip's own words are the cause: a loaded machine's
    time-out or a full disk is no missing package)."""
    low = said.lower()
    if "no space left" in low or "disk quota" in low:
        return "free space in the output directory and in TMPDIR"
    if any(w in low for w in ("setuptools", "bdist_wheel", "no module named 'wheel'", "invalid command")):
        return "this Python needs pip and setuptools>=70.1 (bdist_wheel built in), or the wheel package"
    return "pip's own words above say why (a machine short of memory or time is one cause)"


def _publish(made: str, target: str, out_dir: str) -> None:
    """Write the wheel to ``target`` whole or not at all (a partial copy on a full disk is removed),
    through the directory ``fs.walk.find`` reached (the output rules: a directory another account
    controls is refused, and a symlink of another account in a sticky directory is not followed),
    with the modes the umask gives a new file (another account, a CI user, may pip install it)."""
    import errno

    from ..fs import atomic
    from ..fs.walk import find

    with open(made, "rb") as src:  # made in this call's private temporary directory
        data = src.read()
    with find(target, "wheel") as f:
        try:
            if f.st is not None and not stat.S_ISREG(f.st.st_mode):
                raise InputError(target, None, "cannot write the wheel: not a regular file")
            f.check_replace(target, "wheel")
            f.make_dirs()
            atomic.replace_at(f.dir_fd, f.name, data, checked=f.st, shown=f.path)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise EnvironmentProblem(f"no space left on the device of {out_dir}: the wheel was not written",
                                         "free some space, or give another -o directory") from None
            raise InputError(out_dir, None, f"cannot write the wheel: {e.strerror}") from None


def _installed() -> list:
    """Every installed copy of the kernels distribution on sys.path (by location and version)."""
    from importlib import metadata

    found: dict = {}
    for d in metadata.distributions(name=DIST):
        key = (os.path.realpath(str(d.locate_file(PACKAGE))), d.version)
        found.setdefault(key, d)
    return [found[k] for k in sorted(found)]


def saved_library() -> tuple[tuple[str, str, str, str | None] | None, str | None]:
    """The saved-tensor check's native hooks in the installed prebuilt wheel, if it holds them and was made
    for exactly this torch by this torchgen-patch: ((path, sha256, root, key), None); else (None, why not),
    or (None, None) when no wheel is installed or it holds none."""
    dists = _installed()
    if len(dists) != 1:
        return None, None if not dists else f"{len(dists)} copies of {DIST} are installed"
    dist = dists[0]
    where = os.path.abspath(str(dist.locate_file(PACKAGE)))
    name = f"{DIST} {dist.version}"
    try:
        d = open_dir(where, library_refusal(where))
    except (Missing, EnvironmentProblem) as e:
        return None, f"{name}: {getattr(e, 'message', e)}"
    with d:
        rec = _read_record(d, name)
        if isinstance(rec, str):
            return None, rec
        saved = rec.saved
        if saved is None:
            return None, None
        lib, why = _fitting_library(d, name, rec, Options(), saved)
        if why:
            return None, why
    return (os.path.join(where, lib), str(saved.sha256), where, saved.key), None


def lookup(opts: Options) -> tuple[Prebuilt | None, str | None]:
    """The installed prebuilt kernels if they may serve ``opts`` in this torch: (prebuilt, None);
    else (None, why not), or (None, None) when none is installed."""
    dists = _installed()
    if not dists:
        return None, None
    if len(dists) > 1:
        copies = ", ".join(f"{d.version} in {d.locate_file('')}" for d in dists)
        return None, f"{len(dists)} copies of {DIST} are installed ({copies}): uninstall all but one"
    dist = dists[0]
    where = os.path.abspath(str(dist.locate_file(PACKAGE)))
    name = f"{DIST} {dist.version}"
    try:
        d = open_dir(where, library_refusal(where))
    except Missing as e:
        return None, f"{name}: {e} is missing"
    except EnvironmentProblem as e:
        return None, f"{name}: {e.message}"
    with d:
        found = _read_record(d, name)
        if isinstance(found, str):
            return None, found
        lib, why = _fitting_library(d, name, found, opts, found)
        if why:
            return None, why
    return Prebuilt(os.path.join(where, lib), dist.version, found, where), None


def _fitting_library(d: Dir, name: str, rec: WheelRecord, opts: Options, named: LibraryRecord):
    """(the library's name in the wheel's directory ``d``, None) where the wheel fits ``opts`` in this torch
    and the library is the one its record names; else (None, why not)."""
    why = _unfit(rec, name, opts)
    if why:
        return None, why
    lib = os.path.basename(named.library)
    if lib != named.library or lib in ("", ".", ".."):  # a path, not a file of the package: one made elsewhere
        return None, f"{name}: its {RECORD} names the library {printable(named.library)!r}, not a file of its package"
    problem = library_problem(d, lib, named.sha256)
    return (None, f"{name}: {problem}") if problem else (lib, None)


def _read_record(d: Dir, name: str) -> WheelRecord | str:
    """The wheel's record from its checked package directory (a regular file of a trusted owner that
    nobody else can write, no symlink followed), or why not."""
    try:
        return WheelRecord.parse(d.read(RECORD), name)
    except EnvironmentProblem as e:
        return f"{name}: its {RECORD} is not used: {e.message}"
    except (Missing, OSError) as e:
        return f"{name}: its {RECORD} is missing or damaged ({type(e).__name__}: {e})"
    except InputError as e:
        return e.message


def _unfit(rec: WheelRecord, name: str, opts: Options) -> str | None:
    """Why a wheel with the record ``rec`` may not serve ``opts`` in this torch, or None."""
    differ = rec.torch.differences(TorchIdentity.here())
    if differ:
        return f"{name} was built for another torch build: " + "; ".join(differ)
    if rec.torchgen_patch != __version__:
        return f"{name} was made by torchgen-patch {rec.torchgen_patch}, this is {__version__}"
    if opts.native_functions or opts.tags or opts.pytorch_root:
        return f"{name} holds the kernels of the installed torch's own yaml; other inputs were asked for"
    if not opts.requires_grad_check:  # `torchgen-patch wheel` builds the default plan, whose out= kernels refuse it
        return f"{name} holds kernels that refuse requires_grad in out= ops; no such check was asked for"
    if rec.overlay_sha256 != overlay_sha256(opts):
        return f"{name} was built with another overlay than the one asked for"
    return None
