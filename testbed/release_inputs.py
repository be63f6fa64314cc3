"""What the release check takes from its cache of Debian's source package ``pytorch``, and when.

A ``.dsc`` is used only when its size and SHA-256 are those of a pin: ``PINNED_DSC``, kept here (the
release the check is made for), or an entry of the Sources index that apt has just verified against
the archive's signed Release (``index_pins``, at a fetch). Any other ``.dsc`` is refused, whatever its
name or version: one planted in the cache never names the tree, and a newer version nobody pinned
never wins over the pinned one. The upstream tarball is used only when its size and SHA-256 are those
the checked ``.dsc``'s Checksums-Sha256 gives it.

Every file is opened ``O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC`` relative to a checked directory
descriptor (the cache's: torchgen-patch's own rules, ``torchgen_patch.fs.dirs.open_dir``: owned by you
or root and writable by nobody else, as is every file in it), checked on its own descriptor as a
regular file of the size its pin gives, then read, hashed and unpacked from that descriptor alone. A
FIFO, a device or a symlink is refused at once: never waited on, never followed.

    checked_source(src_dir, pins)  -> Checked: the .dsc's version and the tarball, open on the checked bytes
    index_pins(apt_cache_output)   -> the .dsc pins of the package's entries in a verified Sources index
    Refused                        -> one line: why nothing in the cache is used (``exit_code``: 2 or 3)
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from typing import BinaryIO

from torchgen_patch.errors import ToolError
from torchgen_patch.fs.dirs import Dir, open_dir
from torchgen_patch.fs.protected import Missing, problem, trusted_uids

PACKAGE = "pytorch"
# .dsc name -> (SHA-256, size) of trixie's source package, as its signed Sources index gives them; the
# first that the cache holds is the one used
PINNED_DSC: dict[str, tuple[str, int]] = {
    "pytorch_2.6.0+dfsg-7.dsc": ("24783f3515b228ee476e788608ea0beea80409dbc8e861b6b8035c592d79646e", 3614),
}
FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+~_-]*\Z")  # a file name a source package may list: no path
_ORIG = re.compile(rf"{PACKAGE}_[^/]*\.orig\.tar\.(?:xz|gz|bz2)\Z")
REFUSAL = ("uses no PyTorch source from there", "the release check would unpack and run what they put there")


class Refused(ValueError):
    """Nothing usable: one line saying why. ``exit_code`` 2 when a file that is there was refused
    (input), 3 when the machine could not fetch one (environment)."""

    exit_code = 2


class Unavailable(Refused):
    exit_code = 3


def checksums(text: str) -> dict[str, tuple[str, int]]:
    """file name -> (SHA-256, size), from every Checksums-Sha256 field of a .dsc or of Sources entries."""
    out: dict[str, tuple[str, int]] = {}
    inside = False
    for line in text.split("\n"):
        if line.startswith("Checksums-Sha256:"):
            inside = True
        elif inside and line.startswith(" "):
            parts = line.split()
            if len(parts) == 3 and re.fullmatch(r"[0-9a-f]{64}", parts[0]) and parts[1].isdigit() \
                    and _NAME.match(parts[2]):
                out[parts[2]] = (parts[0], int(parts[1]))
        else:
            inside = False
    return out


def index_pins(showsrc: str) -> dict[str, tuple[str, int]]:
    """The .dsc pins of ``apt-cache showsrc`` output read from an index apt verified: .dsc name ->
    (SHA-256, size), for the package's own .dsc files only."""
    return {n: pin for n, pin in checksums(showsrc).items() if n.startswith(f"{PACKAGE}_") and n.endswith(".dsc")}


def vouched(index: dict[str, tuple[str, int]]) -> dict[str, tuple[str, int]]:
    """The pins a fetch uses: the verified index's entries first (what apt just fetched), then ``PINNED_DSC``."""
    return {**index, **PINNED_DSC}


@dataclass
class Checked:
    """A .dsc that a pin vouches for and the upstream tarball it pins, open on the bytes checked."""

    dsc: str  # its name
    dsc_pin: tuple[str, int]  # the (SHA-256, size) that vouched for it
    version: str  # its Version field
    tarball: str  # the tarball's path
    sha256: str
    size: int
    fh: BinaryIO  # the tarball, at its start
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # the .dsc's Checksums-Sha256
    refused: list[str] = field(default_factory=list)  # every other .dsc there, and why it was not used

    def __enter__(self) -> Checked:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.fh.close()


def _kind(mode: int) -> str:
    return "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else \
        "a directory" if stat.S_ISDIR(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def open_checked(d: Dir, name: str, size: int, owners: bool = True) -> BinaryIO:
    """``name`` in ``d``, opened with ``FLAGS`` and checked on its descriptor: a regular file of ``size``
    bytes (and with ``owners``, of a trusted owner, writable by nobody else). Refused otherwise, at once."""
    path = d.join(name)
    try:
        fd = os.open(name, FLAGS, dir_fd=d.fd)
    except FileNotFoundError:
        raise Refused(f"{path} is missing") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Refused(f"{path} is a symlink: the release check follows none in its cache") from None
        raise Refused(f"cannot open {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is {_kind(st.st_mode)}, not a regular file: not read")
        why = owners and problem(path, st, True, trusted_uids(), *REFUSAL)
        if why:
            raise Refused(why[0])
        if st.st_size != size:
            raise Refused(f"{path} is {st.st_size} bytes, not the {size} its pin gives")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_all(fh: BinaryIO, path: str) -> bytes:
    """What the open file holds from where it is (Refused, one line, when the disk will not give it)."""
    try:
        return fh.read()
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror}") from None


def digest(fh: BinaryIO, size: int, path: str) -> str:
    """The SHA-256 of the open file's ``size`` bytes, read from its start (Refused if it holds another
    number of bytes now, or cannot be read); ``fh`` is left at its start."""
    h, got = hashlib.sha256(), 0
    try:
        fh.seek(0)
        for block in iter(lambda: fh.read(min(1 << 20, size + 1 - got)), b""):  # noqa: B023 — got as the loop counts it
            h.update(block)
            got += len(block)
            if got > size:
                break
        fh.seek(0)
    except OSError as e:
        raise Refused(f"cannot read {path}: {e.strerror}") from None
    if got != size:
        raise Refused(f"{path} changed size while it was read")
    return h.hexdigest()


def _pinned(d: Dir, name: str, pin: tuple[str, int], owners: bool, what: str) -> BinaryIO:
    """``name`` open and checked against ``pin`` (SHA-256, size); ``what`` names the pin in a refusal."""
    sha, size = pin
    fh = open_checked(d, name, size, owners)
    try:
        got = digest(fh, size, d.join(name))
        if got != sha:
            raise Refused(f"{d.join(name)}: SHA-256 {got[:12]}…, not the {sha[:12]}… {what} gives")
        return fh
    except BaseException:
        fh.close()
        raise


def _one(d: Dir, dsc: str, pin: tuple[str, int], owners: bool) -> Checked:
    with _pinned(d, dsc, pin, owners, "its pin") as fh:
        text = read_all(fh, d.join(dsc)).decode("utf-8", errors="replace")
    files = checksums(text)
    origs = sorted(n for n in files if _ORIG.match(n))
    if len(origs) != 1:
        raise Refused(f"{d.join(dsc)} names {len(origs)} upstream tarballs, not one")
    version = (re.findall(r"^Version:\s*(\S+)", text, re.M) or ["?"])[0]
    fh = _pinned(d, origs[0], files[origs[0]], owners, f"{dsc} gives")
    return Checked(dsc, pin, version, d.join(origs[0]), files[origs[0]][0], files[origs[0]][1], fh, files)


def checked_dir(d: Dir, pins: dict[str, tuple[str, int]] | None = None, owners: bool = True) -> Checked:
    """The first .dsc in ``d`` that ``pins`` (default ``PINNED_DSC``) vouches for, with its tarball.
    Refused, one line, when none is."""
    pins = PINNED_DSC if pins is None else pins
    try:
        names = set(d.names())
    except OSError as e:
        raise Refused(f"cannot list {d.path}: {e.strerror}") from None
    found = sorted(n for n in names if n.startswith(f"{PACKAGE}_") and n.endswith(".dsc"))
    unpinned = [f"{d.join(n)}: no pin names it" for n in found if n not in pins]
    why: list[str] = []
    for name, pin in pins.items():
        if name not in names:
            continue
        try:
            got = _one(d, name, pin, owners)
        except Refused as e:
            why.append(str(e))
            continue
        got.refused = why + unpinned
        return got
    why += unpinned
    if not why:
        raise Unavailable(f"no {PACKAGE}_*.dsc in {d.path}")
    raise Refused("; ".join(why))


def cache_dir(src: str, create: bool = False) -> Dir:
    """The cache directory ``src``, opened and checked by the cache's rules (``create``: made private
    where missing). Unavailable when it does not exist; Refused when it fails them."""
    try:
        return open_dir(src, REFUSAL, create=create)
    except Missing:
        raise Unavailable(f"no {PACKAGE}_*.dsc in {src}: it does not exist") from None
    except ToolError as e:  # InputError and EnvironmentProblem
        raise Refused(e.message) from None


def checked_source(src: str, pins: dict[str, tuple[str, int]] | None = None) -> Checked:
    """``checked_dir`` on the cache directory ``src``."""
    with cache_dir(src) as d:
        return checked_dir(d, pins)


def copy_checked(got: Checked, frm: Dir, to: Dir) -> None:
    """The .dsc of ``got`` and every file it lists, each checked against its pin again on its own
    descriptor in ``frm`` (whoever owns it: the pins vouch for the bytes) and written whole into ``to``
    from those bytes."""
    for name, pin in sorted({got.dsc: got.dsc_pin, **got.files}.items()):
        with _pinned(frm, name, pin, False, "its pin") as fh:
            data = read_all(fh, frm.join(name))
        try:
            to.replace(name, data)
        except OSError as e:
            raise Unavailable(f"cannot write {to.join(name)}: {e.strerror}") from None
