"""The release check's inputs (testbed/release_inputs.py, through testbed/debian_source.py and
scripts/pytorch_check.py): a cached or fetched source package is used only as a pin vouches for it, and
every cached file is opened without following a link or waiting, checked on its descriptor. No network:
the packages are tiny ones made here, the pins a table swapped in for the test."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import select
import signal
import subprocess
import sys
import tarfile
import time

import pytest

import testbed.release_inputs as ri
from tests.conftest import ROOT
from testbed.debian_source import fetch_tarball, tree_from_tarball


def _tar_xz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_package(src, version: str = "2.6.0+dfsg-7") -> tuple[str, tuple[str, int], str]:
    """A tiny source package as apt-get source leaves one in ``src``: the upstream tarball (one top folder
    holding version.txt), a debian tarball and the .dsc listing both. (.dsc name, its pin, tarball path)."""
    upstream, release = version.rsplit("-", 1)[0], version.split("+")[0]
    src.mkdir(parents=True, exist_ok=True)
    files = {f"pytorch_{upstream}.orig.tar.xz": _tar_xz({f"pytorch-{release}/version.txt": f"{release}\n".encode()}),
             f"pytorch_{version}.debian.tar.xz": _tar_xz({"debian/changelog": b"pytorch\n"})}
    lines = [f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}" for name, data in files.items()]
    dsc = f"Format: 3.0 (quilt)\nSource: pytorch\nVersion: {version}\nChecksums-Sha256:\n" + "\n".join(lines) + "\n"
    for name, data in {**files, f"pytorch_{version}.dsc": dsc.encode()}.items():
        (src / name).write_bytes(data)
    return f"pytorch_{version}.dsc", (hashlib.sha256(dsc.encode()).hexdigest(), len(dsc)), str(src / next(iter(files)))


@pytest.fixture
def no_apt(tmp_path, monkeypatch):
    """No apt-get: what the cache holds is all there is."""
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None if name == "apt-get" else f"/usr/bin/{name}")


def _pin(monkeypatch, *pins: tuple[str, tuple[str, int]]) -> None:
    monkeypatch.setattr(ri, "PINNED_DSC", dict(pins))


def test_a_planted_dsc_and_tarball_are_refused_and_the_pinned_one_is_used(tmp_path, monkeypatch, no_apt):
    """A .dsc no pin names, or one under the pinned name with other bytes, names no tree: fetch refuses it
    in one line and nothing is unpacked; the genuine pinned one is used and unpacked from its checked bytes."""
    src = tmp_path / "cache" / "src"
    dsc, pin, tarball = make_package(src)
    _pin(monkeypatch, ("pytorch_2.6.0+dfsg-6.dsc", pin))  # the pin names another .dsc
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found is None and why == ("no apt-get on this machine, and nothing cached is usable: "
                                     f"{src}/{dsc}: no pin names it"), why
    with pytest.raises(ValueError, match="not unpacking"):
        tree_from_tarball(tarball, str(tmp_path / "tree"), git=False)
    assert not os.path.exists(tmp_path / "tree" / "version.txt")
    _pin(monkeypatch, (dsc, ("0" * 64, pin[1])))  # the pinned name, other bytes
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found is None and why.endswith(f"{src}/{dsc}: SHA-256 {pin[0][:12]}…, not the 000000000000… its pin "
                                          "gives"), why
    _pin(monkeypatch, (dsc, pin))
    assert fetch_tarball(str(tmp_path / "cache")) == (tarball, "")
    tree = tree_from_tarball(tarball, str(tmp_path / "tree"), git=False)
    assert open(os.path.join(tree, "version.txt")).read() == "2.6.0\n"


def test_a_planted_newer_version_never_wins_over_the_pinned_one(tmp_path, monkeypatch, no_apt):
    src = tmp_path / "cache" / "src"
    dsc, pin, tarball = make_package(src)
    planted, _, _ = make_package(src, "9.9.9+dfsg-1")  # newer, and its .dsc pins its tarball
    _pin(monkeypatch, (dsc, pin))
    assert fetch_tarball(str(tmp_path / "cache")) == (tarball, "")
    with ri.checked_source(str(src)) as got:
        assert (got.dsc, got.version, got.tarball) == (dsc, "2.6.0+dfsg-7", tarball)
        assert got.refused == [f"{src}/{planted}: no pin names it"]
    os.remove(src / dsc)  # without the pinned one, the newer is refused too: never used for want of another
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found is None and why.endswith(f"{src}/{planted}: no pin names it"), why


def _within(seconds: float, fn):
    """``fn()``'s result (or its exception's text) from a forked child, or "hung" when it had none within
    ``seconds`` (the child is killed then: a hang here fails the test, never the suite)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave at once
        os.close(r)
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 - whatever it was, the parent reports it
            out = f"raised {type(e).__name__}: {e}"
        os.write(w, pickle.dumps(out))
        os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], seconds)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            return "hung"
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
        return pickle.loads(data)
    finally:
        os.close(r)
        os.waitpid(pid, 0)


def _fetch_at_once(cache) -> tuple[str | None, str]:
    """fetch_tarball(cache) in a child given 5 s: it must answer, never hang."""
    out = _within(5, lambda: fetch_tarball(str(cache)))
    assert out != "hung", "fetch_tarball hung on the cache"
    return out


@pytest.mark.parametrize("what", ["dsc", "tarball"])
def test_a_fifo_in_the_cache_is_refused_at_once(tmp_path, monkeypatch, no_apt, what):
    src = tmp_path / "cache" / "src"
    dsc, pin, tarball = make_package(src)
    _pin(monkeypatch, (dsc, pin))
    path = str(src / dsc) if what == "dsc" else tarball
    os.remove(path)
    os.mkfifo(path)
    t0 = time.monotonic()
    found, why = _fetch_at_once(tmp_path / "cache")
    assert time.monotonic() - t0 < 1, why
    assert found is None and why.endswith(f"{path} is a FIFO, not a regular file: not read"), why


def test_a_tarball_linked_to_dev_zero_or_larger_than_pinned_is_refused_before_a_byte_is_read(tmp_path, monkeypatch,
                                                                                            no_apt):
    src = tmp_path / "cache" / "src"
    dsc, pin, tarball = make_package(src)
    _pin(monkeypatch, (dsc, pin))
    size = os.path.getsize(tarball)
    os.remove(tarball)
    os.symlink("/dev/zero", tarball)
    found, why = _fetch_at_once(tmp_path / "cache")
    assert found is None and why.endswith(f"{tarball} is a symlink: the release check follows none in its cache"), why
    os.remove(tarball)
    with open(tarball, "wb") as f:  # sparse: 64 GiB that would take minutes to read
        f.truncate(64 << 30)
    found, why = _fetch_at_once(tmp_path / "cache")
    assert found is None and why.endswith(f"{tarball} is {64 << 30} bytes, not the {size} its pin gives"), why
    os.remove(tarball)
    os.remove(src / dsc)
    os.symlink("/dev/zero", src / dsc)  # the .dsc too
    found, why = _fetch_at_once(tmp_path / "cache")
    assert found is None and "is a symlink" in why, why


def test_the_cache_directory_and_its_files_follow_the_caches_rules(tmp_path, monkeypatch, no_apt):
    """A cache directory others may write, or a file of another account in it, is refused: its contents
    could be anyone's."""
    src = tmp_path / "cache" / "src"
    dsc, pin, tarball = make_package(src)
    _pin(monkeypatch, (dsc, pin))
    os.chmod(src, 0o777)
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found is None and f"{src} is writable by group and others (mode 0777)" in why, why
    os.chmod(src, 0o755)
    if os.geteuid() != 0:
        pytest.skip("giving a file to another account needs root")
    os.chown(tarball, 54321, -1)
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found is None and f"{tarball} is owned by uid 54321, not by you or root" in why, why


SHOWSRC = """Package: pytorch
Version: 2.6.0+dfsg-7
Checksums-Sha256:
 {sha} {size} {dsc}
 {tsha} 27212640 pytorch_2.6.0+dfsg.orig.tar.xz
Directory: pool/main/p/pytorch
"""


def _fake_apt(tmp_path, monkeypatch, pkg, showsrc: str) -> None:
    """apt-get on PATH that 'downloads' the package in ``pkg``; apt-cache that prints ``showsrc``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\ncase \" $* \" in *\" source \"*) cp {pkg}/pytorch_* .;; esac\n")
    (tmp_path / "showsrc").write_text(showsrc)
    (bin_dir / "apt-cache").write_text(f"#!/bin/sh\ncat {tmp_path}/showsrc\n")
    for tool in ("apt-get", "apt-cache"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_fetched_dsc_is_used_when_the_verified_index_pins_it(tmp_path, monkeypatch):
    """apt's download of a version the project does not pin: used when the index apt verified gives its
    .dsc's SHA-256, refused when it gives another; every file is copied into the cache as checked."""
    dsc, pin, _ = make_package(tmp_path / "pkg", "2.6.0+dfsg-8")
    _pin(monkeypatch)
    _fake_apt(tmp_path, monkeypatch, tmp_path / "pkg",
              SHOWSRC.format(sha="0" * 64, size=pin[1], dsc=dsc, tsha="1" * 64))
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found is None and why.startswith("apt-get source fetched nothing a pin vouches for: ") and \
        why.endswith(f"/{dsc}: SHA-256 {pin[0][:12]}…, not the 000000000000… its pin gives"), why
    assert not os.path.exists(tmp_path / "cache" / "src" / dsc)
    (tmp_path / "showsrc").write_text(SHOWSRC.format(sha=pin[0], size=pin[1], dsc=dsc, tsha="1" * 64))
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found == str(tmp_path / "cache" / "src" / "pytorch_2.6.0+dfsg.orig.tar.xz"), why
    assert sorted(os.listdir(tmp_path / "cache" / "src")) == sorted(os.listdir(tmp_path / "pkg"))
    assert ri.index_pins(SHOWSRC.format(sha=pin[0], size=pin[1], dsc=dsc, tsha="1" * 64)) == {dsc: pin}


def test_the_release_check_refuses_a_planted_cache_in_one_line(tmp_path):
    """The script's entry point: one `error:` line on stderr, exit 2, no traceback."""
    src = tmp_path / "cache" / "src"
    dsc, _, _ = make_package(src, "9.9.9+dfsg-1")
    (tmp_path / "empty").mkdir()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "pytorch_check.py"), "--render-only",
                        "--source-cache", str(tmp_path / "cache")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PATH=str(tmp_path / "empty")))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr == ("error: no PyTorch source tree: no apt-get on this machine, and nothing cached is usable: "
                        f"{src}/{dsc}: no pin names it\n"), r.stderr


def test_what_the_machine_fails_at_is_one_line_too(tmp_path, monkeypatch):
    """tar failing on the checked bytes, a read the disk refuses, a temporary directory apt cannot
    download into: each a Refused (one line), never a traceback."""
    src = tmp_path / "cache" / "src"
    dsc, _, tarball = make_package(src)
    with open(tarball, "wb") as f:  # bytes no tar reads, pinned all the same
        f.write(b"not a tarball")
    data = (src / dsc).read_text().split("\n")
    data = [f" {hashlib.sha256(b'not a tarball').hexdigest()} 13 {os.path.basename(tarball)}"
            if ln.endswith(os.path.basename(tarball)) else ln for ln in data]
    (src / dsc).write_text("\n".join(data))
    _pin(monkeypatch, (dsc, (hashlib.sha256("\n".join(data).encode()).hexdigest(), len("\n".join(data)))))
    with pytest.raises(ri.Refused, match=r"^tar -J in .* failed: ") as e:
        tree_from_tarball(tarball, str(tmp_path / "tree"), git=False)
    assert e.value.exit_code == 3 and "\n" not in str(e.value)

    class Damaged(io.BytesIO):
        def read(self, n=-1):
            raise OSError(5, "Input/output error")
    with pytest.raises(ri.Refused, match=r"^cannot read x: Input/output error$"):
        ri.digest(Damaged(), 3, "x")
    _fake_apt(tmp_path, monkeypatch, tmp_path / "none", "")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "gone"))
    found, why = fetch_tarball(str(tmp_path / "other-cache"))
    assert found is None and why.startswith("cannot fetch with apt-get: [Errno 2] No such file or directory"), why
