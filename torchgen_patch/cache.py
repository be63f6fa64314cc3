"""The cache: content-keyed results (scans, overlays, the index of builds) and built libraries,
treated as input; and the one module of the package that touches a cache or build path.

A key hashes everything that decides a result: the inputs' bytes, the identity of the torchgen
and autograd codegen that did the work and this tool's own source, so a result of one world
never answers for another.

Every path of the cache is reached through the file system layer (``fs``): the root walked from
``/`` and checked on each descriptor (``fs.dirs``), locks (``fs.locks``), leased temporary builds and
their sweep (``fs.leases``), the name a library is loaded by (``fs.load``). This module is the
cache proper: keys, proofs, entries.

An entry is used only when it is a regular file of a trusted owner that nobody else can write
and its proof holds (an HMAC with this cache's key: an entry written by anything else than
torchgen-patch, edited, damaged or copied from another cache is not one); what it holds is then
validated by its reader like any input. An entry that fails is ignored (one ``-v`` note) and
rebuilt; a root that fails is an ``EnvironmentProblem`` (exit 3) naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac  # bound here, when the package is imported (under run, from the standard library's own directory)
import json
import os

from .errors import EnvironmentProblem, InputError, ToolError
from .fs.decode import loads
from .fs.dirs import Dir, open_dir, open_under
from .fs.protected import Missing, cache_refusal, inside, library_refusal
from .fs.root import cache_base, directory, note
from .version import __version__


@functools.cache
def tool_fingerprint() -> str:
    """This tool's own source (the package's .py and .in files, read as package data)."""
    h = hashlib.sha256(__version__.encode())
    pkg = os.path.dirname(os.path.abspath(__file__))
    for base, subdirs, names in os.walk(pkg):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        rel = base[len(pkg) + 1:] + os.sep if base != pkg else ""  # os.path.relpath's answer, without its cost
        for name in sorted(names):
            if name.endswith((".py", ".in")):
                with open(os.path.join(base, name), "rb") as fh:
                    h.update((rel + name).encode() + b"\0" + fh.read())
    return h.hexdigest()


@contextlib.contextmanager
def library_dir(path: str, refusal: tuple[str, str] | None = None):
    """The checked directory of the file ``path`` (a library, a record), and where its strict rule
    starts: the cache root when ``path`` is inside the cache (every directory from the root down
    strict, none followed through a symlink), else its own directory."""
    path = os.path.abspath(path)
    d, root = os.path.dirname(path), directory()
    start = root if inside(d, root) else d
    with open_under(start, os.path.relpath(path, start), refusal or library_refusal(path)) as (dirs, name):
        yield dirs, start, name


def names_a_build(path: str) -> bool:
    """Whether ``path`` (an index entry's) names a file of a build of this cache: a normalised absolute
    path inside ``<root>/builds/``, the root as named or as the walk from ``/`` reached it (a root
    reached through a symlink names its builds by where they are); whether it is one is for the
    build's own checks to say."""
    if os.path.normpath(path) != path:
        return False
    return any(path.startswith(os.path.join(r, "builds") + os.sep) for r in {directory(), _walked_root()} if r)


_WALKED: dict = {}  # the root as named -> as the walk reached it (kept once it could be opened)


def _walked_root() -> str | None:
    d = directory()
    if d not in _WALKED:
        try:
            root = open_root()
        except ToolError:
            return None
        if root is None:
            return None
        _WALKED[d] = root.path
        root.close()
    return _WALKED[d]


# ---- the root, entries, proofs --------------------------------------------------------------------

def open_root(create: bool = False) -> Dir | None:
    """The cache root, checked (created private when ``create``), or None when it does not exist (or
    cannot be created: an unwritable cache only makes the next run slower); a root another account
    could write is an EnvironmentProblem."""
    d = directory()
    try:
        return open_dir(d, cache_refusal(d), create=create)
    except Missing:
        return None
    except InputError:  # could not create it (one others could write: EnvironmentProblem, raised)
        return None


KEY_FILE = "entries.key"
_PROOF = b"tgp-proof-1 "


def _entry_key(r: Dir, create: bool) -> bytes | None:
    """This cache's key for the entries' proofs: random, made once (a trusted owner's regular file
    that nobody else can write, like any entry), None when there is none (and none can be made).
    Read each time (a few microseconds): a cache removed and made again has a key of its own."""
    for _ in range(2):
        try:
            data = r.read(KEY_FILE)
        except Missing:
            if not create:
                return None
            try:
                r.link_new(KEY_FILE, os.urandom(32).hex().encode(), 0o600)
            except OSError:
                return None
            continue
        except (EnvironmentProblem, OSError) as e:
            note(f"cache key {r.join(KEY_FILE)} not used: {getattr(e, 'message', e)}")
            return None
        if len(data) != 64:
            note(f"cache key {r.join(KEY_FILE)} not used: damaged")
            return None
        return data
    return None


def _proof(k: bytes, name: str, body: bytes) -> bytes:
    return hmac.new(k, name.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()


def sign(name: str, body: bytes, k: bytes) -> bytes:
    """What an entry file holds: the proof line, then the body."""
    return _PROOF + _proof(k, name, body) + b"\n" + body


def read(name: str):
    """The JSON of the entry ``name``, or None (missing, unsafe, unproven, damaged: a -v note, never
    an error). The caller validates what it gets like any input."""
    r = open_root()
    if r is None:
        return None
    with r:
        try:
            raw = r.read(name)
        except Missing:
            return None
        except EnvironmentProblem as e:
            note(f"cache entry ignored: {e.message}")
            return None
        except OSError as e:
            note(f"cache entry {r.join(name)} ignored: {e.strerror}")
            return None
        k = _entry_key(r, create=False)
        head, _, body = raw.partition(b"\n")
        if k is None or not head.startswith(_PROOF) or not hmac.compare_digest(head[len(_PROOF):],
                                                                                _proof(k, name, body)):
            note(f"cache entry {r.join(name)} ignored: not written by torchgen-patch with this cache's key "
                 "(edited, damaged or from elsewhere)")
            return None
        try:
            return loads(body)
        except ValueError as e:
            note(f"cache entry {r.join(name)} ignored: damaged ({type(e).__name__})")
            return None


def write(name: str, data) -> None:
    r = open_root(create=True)
    if r is None:
        return
    with r:
        try:
            k = _entry_key(r, create=True)
            if k is not None:
                r.replace(name, sign(name, json.dumps(data, separators=(",", ":")).encode(), k))
        except (OSError, EnvironmentProblem):
            pass  # a full disk or a read-only cache costs the next run time, nothing else


def invalid(name: str, why: str) -> None:
    """A reader found entry ``name`` fails validation: say so (-v) and let it be rebuilt."""
    note(f"cache entry {os.path.join(directory(), name)} ignored: {why}; rebuilt")


def bytecode_dir(identity: str) -> str | None:
    """Where a checkout's torchgen keeps its bytecode: beside the result cache, not in it (emptying the
    result cache does not make the checkout's torchgen compile again), and only when it is private
    (bytecode is code). Python itself writes there by name (``sys.pycache_prefix``)."""
    d = os.path.join(cache_base(), "torchgen-patch-bytecode")
    try:
        with open_dir(d, cache_refusal(d), create=True) as b:
            st = os.fstat(b.fd)
    except (ToolError, Missing, OSError):
        return None
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        return None
    return os.path.join(d, identity[:24])
