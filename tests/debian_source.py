"""PyTorch's full source tree from Debian's source package ``pytorch`` (trixie: 2.6.0+dfsg), fetched with
apt through a private sources list (the machine's own apt setup is never read for packages nor changed;
only the mirror its sources name is reused), cached, and unpacked as a git checkout (stdlib only).

    fetch_tarball(cache)          -> (path of pytorch_<v>.orig.tar.xz, "") or (None, why not)
    tree_from_tarball(tar, root)  -> root: the tree at root, committed to a fresh git repository
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

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


def cached_tarball(cache: str) -> str | None:
    hits = sorted(glob.glob(os.path.join(cache, "src", f"{PACKAGE}_*.orig.tar.*")))
    return hits[-1] if hits else None


def fetch_tarball(cache: str, timeout: int = 600) -> tuple[str | None, str]:
    """The upstream tarball of the source package, downloaded into ``cache/src`` once; (None, why) when
    apt is missing or the mirror cannot be reached."""
    found = cached_tarball(cache)
    if found:
        return found, ""
    if shutil.which("apt-get") is None:
        return None, "no apt-get on this machine"
    apt, src = os.path.join(cache, "apt"), os.path.join(cache, "src")
    os.makedirs(os.path.join(apt, "lists", "partial"), exist_ok=True)
    os.makedirs(src, exist_ok=True)
    signed = f"[signed-by={KEYRING}] " if os.path.isfile(KEYRING) else ""
    with open(os.path.join(apt, "sources.list"), "w", encoding="utf-8") as f:
        f.write(f"deb-src {signed}{mirror()} {SUITE} main\n")
    opts = [f"-oDir::Etc::SourceList={apt}/sources.list", "-oDir::Etc::SourceParts=/dev/null",
            f"-oDir::State::Lists={apt}/lists", "-oAPT::Sandbox::User=root"]
    for args, cwd in ((["update"], apt), (["source", "--download-only", PACKAGE], src)):
        try:
            r = subprocess.run(["apt-get", "-q", *opts, *args], cwd=cwd, capture_output=True, text=True,
                               timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"apt-get {args[0]}: {e}"
        if r.returncode != 0:
            lines = [ln for ln in (r.stderr or r.stdout).splitlines() if ln.startswith(("E:", "Err"))]
            return None, f"apt-get {args[0]} exited {r.returncode}: {(lines or ['no message'])[0]}"
    found = cached_tarball(cache)
    return (found, "") if found else (None, f"apt-get source left no {PACKAGE}_*.orig.tar.* in {src}")


def release_of(tarball: str) -> str:
    """'2.6.0' from pytorch_2.6.0+dfsg.orig.tar.xz."""
    m = re.match(rf"{PACKAGE}_(\d+\.\d+\.\d+)", os.path.basename(tarball))
    if m is None:
        raise ValueError(f"no release in the name {os.path.basename(tarball)}")
    return m.group(1)


def tree_from_tarball(tarball: str, root: str, parts: list[str] | None = None, git: bool = True) -> str:
    """Unpack the tarball's single top folder at ``root`` (only the given top-level ``parts`` when
    given, e.g. ``["torchgen", "tools", "aten/src/ATen"]``), committed to a fresh git repository."""
    os.makedirs(root, exist_ok=True)
    with subprocess.Popen(["tar", "-tf", tarball], stdout=subprocess.PIPE, text=True) as lister:
        top = lister.stdout.readline().split("/", 1)[0]  # the first member names the top folder
        lister.kill()
    members = [f"{top}/{p}" for p in parts] if parts else []
    subprocess.run(["tar", "-xf", tarball, "-C", root, "--strip-components=1", *members], check=True)
    if git:
        for args in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree", "--no-verify"]):
            subprocess.run(["git", *args], cwd=root, check=True)
    return root
