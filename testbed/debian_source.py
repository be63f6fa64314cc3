"""PyTorch's full source tree from Debian's source package ``pytorch`` (trixie: 2.6.0+dfsg), fetched with
apt through a private sources list (the machine's own apt setup is never read for packages nor changed;
only the mirror its sources name is reused), cached, and unpacked as a git checkout.

apt checks what it downloads against the archive's signed index and keeps its privilege drop: run as
root, it downloads as its own account (``_apt``), into a directory made for it. What is used, cached or
just fetched, is what ``release_inputs`` vouches for: a ``.dsc`` pinned by the project or by the signed
index apt has just verified, and the tarball with the size and SHA-256 that ``.dsc`` gives, each read
from one checked descriptor; the tree is unpacked from the bytes checked.

    fetch_source(cache)           -> release_inputs.Checked (Refused, one line, when none is to be had)
    fetch_tarball(cache)          -> (path of pytorch_<v>.orig.tar.xz, "") or (None, why not)
    tree_from_source(got, root)   -> root: the tree at root, committed to a fresh git repository
    tree_from_tarball(tar, root)  -> the same from the cached tarball's path, checked again
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile

from testbed.release_inputs import (PACKAGE, REFUSAL, Checked, Refused, Unavailable, cache_dir, checked_dir,
                                    checked_source, copy_checked, index_pins, vouched)
from torchgen_patch.fs.dirs import Dir

SUITE = "trixie"
SOURCES = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")) + \
    sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
DEFAULT_MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def mirror(sources: list[str] = SOURCES) -> str:
    """The Debian mirror the machine's apt sources name (the first ``.../debian`` URI), else the default."""
    for path in sources:
        try:
            text = open(path, encoding="utf-8").read()
        except OSError:
            continue
        for uri in re.findall(r"^(?:URIs:\s*|deb(?:-src)?\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M):
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    return DEFAULT_MIRROR


APT_ACCOUNT = "_apt"  # the account apt downloads as when it runs as root (APT::Sandbox::User)


def _sandbox_uid() -> int | None:
    """``_apt``'s uid when this process is root (apt then drops to it to download), else None."""
    import pwd

    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(APT_ACCOUNT).pw_uid
    except KeyError:
        return None


def fetch_source(cache: str, timeout: int = 600) -> Checked:
    """The source package: its checked .dsc and upstream tarball in ``cache/src`` (``release_inputs``),
    downloaded there first when none is. Refused (one line) when apt is missing, the mirror cannot be
    reached, apt could not drop its privileges, or nothing a pin vouches for is to be had."""
    src = os.path.join(cache, "src")
    try:
        return checked_source(src)
    except Refused as e:
        cached = e
    if shutil.which("apt-get") is None:
        if isinstance(cached, Unavailable):
            raise Unavailable("no apt-get on this machine")
        raise Refused(f"no apt-get on this machine, and nothing cached is usable: {cached}")
    try:
        pins = _download(src, timeout)
    except OSError as e:  # the temporary directory apt downloads into: full, gone, not writable
        raise Unavailable(f"cannot fetch with apt-get: {e}") from None
    try:
        return checked_source(src, pins)
    except Refused as e:
        raise Refused(f"apt-get source left no checked {PACKAGE} source in {src}: {e}") from None


def _download(src: str, timeout: int) -> dict[str, tuple[str, int]]:
    """apt-get source into a private directory, what it fetched checked and copied into ``src``; the
    pins that vouched for it."""
    work = tempfile.mkdtemp(prefix="pytorch-src-apt-")  # in the temporary directory, which _apt can reach
    try:
        os.chmod(work, 0o755)
        lists, down = os.path.join(work, "lists"), os.path.join(work, "src")
        os.makedirs(os.path.join(lists, "partial"))
        os.makedirs(down)
        uid = _sandbox_uid()
        if uid is not None:  # apt downloads as _apt: the directory it downloads into is _apt's
            os.chown(down, uid, -1)
        signed = f"[signed-by={KEYRING}] " if os.path.isfile(KEYRING) else ""
        with open(os.path.join(work, "sources.list"), "w", encoding="utf-8") as f:
            f.write(f"deb-src {signed}{mirror()} {SUITE} main\n")
        opts = [f"-oDir::Etc::SourceList={work}/sources.list", "-oDir::Etc::SourceParts=/dev/null",
                f"-oDir::State::Lists={lists}", "-oDir::Cache::pkgcache=", "-oDir::Cache::srcpkgcache="]
        for args, cwd in ((["update"], work), (["source", "--download-only", PACKAGE], down)):
            try:
                r = subprocess.run(["apt-get", "-q", *opts, *args], cwd=cwd, capture_output=True, text=True,
                                   timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise Unavailable(f"apt-get {args[0]}: {e}") from None
            said = (r.stderr or "") + (r.stdout or "")
            if r.returncode != 0:
                lines = [ln for ln in said.splitlines() if ln.startswith(("E:", "Err"))]
                raise Unavailable(f"apt-get {args[0]} exited {r.returncode}: {(lines or ['no message'])[0]}")
            unsandboxed = [ln.strip() for ln in said.splitlines() if "unsandboxed" in ln]
            if unsandboxed:
                raise Refused(f"apt-get {args[0]} could not drop its privileges: {unsandboxed[0]}")
        # the .dsc entries of the index apt just verified against the signed Release, then the project's pins
        pins = vouched(index_pins(_showsrc(opts, work, timeout)))
        with Dir(os.open(down, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), down, REFUSAL) as d:
            try:
                got = checked_dir(d, pins, owners=False)  # _apt's files: their pins vouch for them
            except Refused as e:
                raise Refused(f"apt-get source fetched nothing a pin vouches for: {e}") from None
            with got, cache_dir(src, create=True) as to:
                copy_checked(got, d, to)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return pins


def _showsrc(opts: list[str], cwd: str, timeout: int) -> str:
    """``apt-cache showsrc`` of the package from the private lists ('' when apt-cache says nothing)."""
    try:
        r = subprocess.run(["apt-cache", "-q", *opts, "showsrc", "--only-source", PACKAGE], cwd=cwd,
                           capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout if r.returncode == 0 else ""


def fetch_tarball(cache: str, timeout: int = 600) -> tuple[str | None, str]:
    """``fetch_source`` as (the upstream tarball's path, "") or (None, why not)."""
    try:
        with fetch_source(cache, timeout) as got:
            return got.tarball, ""
    except Refused as e:
        return None, str(e)


def release_of(tarball: str) -> str:
    """'2.6.0' from pytorch_2.6.0+dfsg.orig.tar.xz."""
    m = re.match(rf"{PACKAGE}_(\d+\.\d+\.\d+)", os.path.basename(tarball))
    if m is None:
        raise ValueError(f"no release in the name {os.path.basename(tarball)}")
    return m.group(1)


def tree_from_source(got: Checked, root: str, parts: list[str] | None = None, git: bool = True) -> str:
    """Unpack the checked tarball's single top folder at ``root`` (only the given top-level ``parts``
    when given, e.g. ``["torchgen", "tools", "aten/src/ATen"]``), committed to a fresh git repository.
    What is unpacked is what was checked: tar reads the descriptor whose bytes were hashed."""
    os.makedirs(root, exist_ok=True)
    z = {".xz": ["-J"], ".gz": ["-z"], ".bz2": ["-j"]}.get(os.path.splitext(got.tarball)[1], [])
    fd = got.fh.fileno()
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        with subprocess.Popen(["tar", *z, "-tf", "-"], stdin=fd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True) as lister:
            top = lister.stdout.readline().split("/", 1)[0]  # the first member names the top folder
            lister.kill()
    except OSError as e:
        raise Unavailable(f"cannot run tar: {e.strerror}") from None
    os.lseek(fd, 0, os.SEEK_SET)
    members = [f"{top}/{p}" for p in parts] if parts else []
    steps = [["tar", *z, "-xf", "-", "-C", root, "--strip-components=1", *members]]
    if git:
        steps += [["git", "init", "-q"], ["git", "add", "-A"],
                  ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree", "--no-verify"]]
    for argv in steps:  # the bytes were checked: a failure here is the machine's (a full disk, no git)
        try:
            r = subprocess.run(argv, stdin=fd if argv[0] == "tar" else subprocess.DEVNULL,
                               cwd=None if argv[0] == "tar" else root, capture_output=True, text=True)
        except OSError as e:
            raise Unavailable(f"cannot run {argv[0]}: {e.strerror}") from None
        if r.returncode != 0:
            said = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            raise Unavailable(f"{' '.join(argv[:2])} in {root} failed: {said}")
    return root


def tree_from_tarball(tarball: str, root: str, parts: list[str] | None = None, git: bool = True) -> str:
    """``tree_from_source`` of the cached source package whose tarball is ``tarball``, checked again
    (Refused, a ValueError, when its .dsc or its bytes are not the pinned ones)."""
    try:
        got = checked_source(os.path.dirname(tarball))
    except Refused as e:
        raise Refused(f"not unpacking {tarball}: {e}") from None
    with got:
        if got.tarball != tarball:
            raise Refused(f"not unpacking {tarball}: the checked {got.dsc} pins {os.path.basename(got.tarball)}")
        return tree_from_source(got, root, parts, git)
