"""PyTorch's full source tree from Debian's source package ``pytorch`` (trixie: 2.6.0+dfsg), fetched with
apt through a private sources list (the machine's own apt setup is never read for packages nor changed;
only the mirror its sources name is reused), cached, and unpacked as a git checkout (stdlib only).

apt checks what it downloads against the archive's signed index and keeps its privilege drop: run as
root, it downloads as its own account (``_apt``), into a directory made for it. The tarball's SHA-256
and size are pinned by the package's ``.dsc``: every use of a cached copy checks them (a copy no
``.dsc`` names, or whose bytes differ, is never used), and the tree is unpacked from the bytes checked.

    fetch_tarball(cache)          -> (path of pytorch_<v>.orig.tar.xz, "") or (None, why not)
    pinned_sha256(tarball)        -> the SHA-256 the .dsc beside it gives
    tree_from_tarball(tar, root)  -> root: the tree at root, committed to a fresh git repository
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

PACKAGE, SUITE = "pytorch", "trixie"
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


def dsc_checksums(path: str) -> dict[str, tuple[str, int]]:
    """file name -> (SHA-256, size), from a .dsc's Checksums-Sha256 field."""
    out, inside = {}, False
    for line in open(path, encoding="utf-8", errors="replace").read().split("\n"):
        if line.startswith("Checksums-Sha256:"):
            inside = True
        elif inside and line.startswith(" "):
            parts = line.split()
            if len(parts) == 3 and re.fullmatch(r"[0-9a-f]{64}", parts[0]) and parts[1].isdigit():
                out[parts[2]] = (parts[0], int(parts[1]))
        else:
            inside = False
    return out


def _pins(src: str) -> dict[str, set[tuple[str, int]]]:
    """file name -> every (SHA-256, size) the package's .dsc files in ``src`` give it."""
    pins: dict[str, set[tuple[str, int]]] = {}
    for dsc in sorted(glob.glob(os.path.join(src, f"{PACKAGE}_*.dsc"))):
        for name, pin in dsc_checksums(dsc).items():
            pins.setdefault(name, set()).add(pin)
    return pins


def _mismatch(path: str, fh, pins: dict) -> str | None:
    """Why the open tarball ``fh`` (named ``path``) is not the one a .dsc pins, or None (``fh`` is left at
    its start)."""
    name = os.path.basename(path)
    pin = pins.get(name, set())
    if not pin:
        return f"{name}: no {PACKAGE}_*.dsc beside it gives its SHA-256"
    if len(pin) > 1:
        return f"{name}: the .dsc files beside it give it different SHA-256s"
    (sha, size), = pin
    fh.seek(0)
    h, got_size = hashlib.sha256(), 0
    for block in iter(lambda: fh.read(1 << 20), b""):
        h.update(block)
        got_size += len(block)
    fh.seek(0)
    if (h.hexdigest(), got_size) != (sha, size):
        return f"{name}: SHA-256 {h.hexdigest()[:12]}… ({got_size} bytes), not the {sha[:12]}… ({size} bytes) " \
               "its .dsc gives"
    return None


def pinned_sha256(tarball: str) -> str:
    """The SHA-256 the .dsc beside ``tarball`` gives it (ValueError unless exactly one is given)."""
    pin = _pins(os.path.dirname(tarball)).get(os.path.basename(tarball), set())
    if len(pin) != 1:
        raise ValueError(f"no single SHA-256 for {os.path.basename(tarball)} in the .dsc files beside it")
    return next(iter(pin))[0]


def cached_tarball(cache: str) -> tuple[str | None, str]:
    """The newest upstream tarball in ``cache/src`` whose bytes are those a .dsc there pins, every cached
    copy checked at every use: (path, "") or (None, why none is)."""
    src = os.path.join(cache, "src")
    pins, why = _pins(src), []
    for path in sorted(glob.glob(os.path.join(src, f"{PACKAGE}_*.orig.tar.*")), reverse=True):
        with open(path, "rb") as fh:
            bad = _mismatch(path, fh, pins)
        if bad is None:
            return path, ""
        why.append(bad)
    return None, "; ".join(why) or f"no {PACKAGE}_*.orig.tar.* in {src}"


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


def fetch_tarball(cache: str, timeout: int = 600) -> tuple[str | None, str]:
    """The upstream tarball of the source package, downloaded into ``cache/src`` once and checked against
    its .dsc at every use; (None, why) when apt is missing, the mirror cannot be reached, apt could not
    drop its privileges, or what it fetched is not what the .dsc pins."""
    found, why = cached_tarball(cache)
    if found:
        return found, ""
    if shutil.which("apt-get") is None:
        cached = glob.glob(os.path.join(cache, "src", f"{PACKAGE}_*.orig.tar.*"))
        return None, "no apt-get on this machine" + (f", and no cached copy is the pinned one: {why}" if cached else "")
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
                f"-oDir::State::Lists={lists}"]
        for args, cwd in ((["update"], work), (["source", "--download-only", PACKAGE], down)):
            try:
                r = subprocess.run(["apt-get", "-q", *opts, *args], cwd=cwd, capture_output=True, text=True,
                                   timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as e:
                return None, f"apt-get {args[0]}: {e}"
            said = (r.stderr or "") + (r.stdout or "")
            if r.returncode != 0:
                lines = [ln for ln in said.splitlines() if ln.startswith(("E:", "Err"))]
                return None, f"apt-get {args[0]} exited {r.returncode}: {(lines or ['no message'])[0]}"
            unsandboxed = [ln.strip() for ln in said.splitlines() if "unsandboxed" in ln]
            if unsandboxed:
                return None, f"apt-get {args[0]} could not drop its privileges: {unsandboxed[0]}"
        pins = _pins(down)
        for name in sorted(os.listdir(down)):
            if re.fullmatch(rf"{PACKAGE}_.*\.orig\.tar\.\w+", name):
                with open(os.path.join(down, name), "rb") as fh:
                    bad = _mismatch(name, fh, pins)
                if bad:
                    return None, f"apt-get source fetched {bad}"
        src = os.path.join(cache, "src")
        os.makedirs(src, exist_ok=True)
        for name in sorted(os.listdir(down)):
            if name.startswith(f"{PACKAGE}_") and os.path.isfile(os.path.join(down, name)):
                shutil.copyfile(os.path.join(down, name), os.path.join(src, f".{name}.part"))
                os.replace(os.path.join(src, f".{name}.part"), os.path.join(src, name))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found, why = cached_tarball(cache)
    return (found, "") if found else (None, f"apt-get source left no checked {PACKAGE}_*.orig.tar.*: {why}")


def release_of(tarball: str) -> str:
    """'2.6.0' from pytorch_2.6.0+dfsg.orig.tar.xz."""
    m = re.match(rf"{PACKAGE}_(\d+\.\d+\.\d+)", os.path.basename(tarball))
    if m is None:
        raise ValueError(f"no release in the name {os.path.basename(tarball)}")
    return m.group(1)


def tree_from_tarball(tarball: str, root: str, parts: list[str] | None = None, git: bool = True) -> str:
    """Unpack the tarball's single top folder at ``root`` (only the given top-level ``parts`` when
    given, e.g. ``["torchgen", "tools", "aten/src/ATen"]``), committed to a fresh git repository. What
    is unpacked is what was checked: the bytes of one open file, pinned by the .dsc beside it, read by
    tar from that descriptor (ValueError when they are not the pinned ones)."""
    os.makedirs(root, exist_ok=True)
    z = {".xz": ["-J"], ".gz": ["-z"], ".bz2": ["-j"]}.get(os.path.splitext(tarball)[1], [])
    with open(tarball, "rb") as fh:
        bad = _mismatch(tarball, fh, _pins(os.path.dirname(tarball)))
        if bad:
            raise ValueError(f"not unpacking {tarball}: {bad}")
        with subprocess.Popen(["tar", *z, "-tf", "-"], stdin=fh, stdout=subprocess.PIPE, text=True) as lister:
            top = lister.stdout.readline().split("/", 1)[0]  # the first member names the top folder
            lister.kill()
        fh.seek(0)
        members = [f"{top}/{p}" for p in parts] if parts else []
        subprocess.run(["tar", *z, "-xf", "-", "-C", root, "--strip-components=1", *members], stdin=fh, check=True)
    if git:
        for args in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree", "--no-verify"]):
            subprocess.run(["git", *args], cwd=root, check=True)
    return root
