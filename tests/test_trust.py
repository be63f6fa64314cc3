"""Loading compiled code safely: install() loads a library only when it and every directory from
the cache root down belong to this user (or root) and nobody else can write them, and when it is
the file its build recorded (SHA-256). Foreign owners and writable modes are made with explicit
chown/chmod (CI runs as root, which would otherwise own everything)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

import torchgen_patch
from tests.conftest import ROOT
from torchgen_patch.errors import EnvironmentProblem
from torchgen_patch.files import private_dirs
from torchgen_patch.runtime.load import trust
from torchgen_patch import cache
from torchgen_patch.fs.protected import owner_name, trusted_uids
from torchgen_patch.fs.root import OWNERS_ENV

pytestmark = pytest.mark.build
NOBODY = 65534  # an account that is neither this user nor root
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another account needs root")


@pytest.fixture
def cached(tmp_path, monkeypatch, library):
    """A private cache holding a copy of the session's build, where install() finds it by key."""
    root = tmp_path / "cache"
    builds = root / "builds"
    private_dirs(str(builds))
    copy = builds / os.path.basename(library.directory)
    shutil.copytree(library.directory, copy, symlinks=True)
    os.chmod(copy, 0o700)
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(root))
    monkeypatch.delenv(OWNERS_ENV, raising=False)
    lib = str(copy / os.path.basename(library.path))
    yield root, lib
    torchgen_patch.uninstall()


def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _refusal(default_plan) -> str:
    with pytest.raises(EnvironmentProblem) as e:
        torchgen_patch.install(plan=default_plan)
    assert torchgen_patch.installed_ops() == []
    return e.value.render()


def test_install_loads_a_private_cached_build(cached, default_plan):
    root, lib = cached
    rep = torchgen_patch.install(plan=default_plan)
    assert rep.library == lib and not rep.refused and len(rep.registered) == len(default_plan.kernels)


def test_group_writable_cache_is_refused(cached, default_plan):
    root, lib = cached
    os.chmod(root, 0o770)
    # refused at the cache root, before anything is built or loaded there
    assert _refusal(default_plan) == (
        f"torchgen-patch: error: {root} is writable by its group (mode 0770): they could replace what is there, "
        f"so torchgen-patch uses no cache under {root} (hint: chmod go-w {root})")


@pytest.mark.parametrize("where", ["library", "build directory"])
def test_writable_by_others_is_refused(cached, default_plan, where):
    root, lib = cached
    p = lib if where == "library" else os.path.dirname(lib)
    os.chmod(p, os.stat(p).st_mode | 0o002)
    mode = stat.S_IMODE(os.stat(p).st_mode)
    assert _refusal(default_plan) == (
        f"torchgen-patch: error: {p} is writable by others (mode {mode:04o}): they could replace the library, "
        f"so torchgen-patch does not load {lib} (hint: chmod go-w {p})")


@needs_root
def test_library_owned_by_another_user_is_refused(cached, default_plan, monkeypatch):
    root, lib = cached
    os.chown(lib, NOBODY, -1)
    who = owner_name(NOBODY)
    assert _refusal(default_plan) == (
        f"torchgen-patch: error: {lib} is owned by {who}, not by you or root: torchgen-patch loads no native code "
        f"from {lib} (hint: use a cache of your own (TORCHGEN_PATCH_CACHE), or, if you trust that account with "
        f"your processes, name it in ${OWNERS_ENV})")
    # an account the user names as trusted (the owner of a shared, read-only cache) is accepted
    monkeypatch.setenv(OWNERS_ENV, str(NOBODY))
    assert not torchgen_patch.install(plan=default_plan).refused


@needs_root
def test_cache_directory_owned_by_another_user_is_refused(cached, default_plan):
    root, lib = cached
    os.chown(root / "builds", NOBODY, -1)
    assert _refusal(default_plan).startswith(f"torchgen-patch: error: {root / 'builds'} is owned by ")


def test_library_that_is_not_what_was_built_is_refused(cached, default_plan):
    root, lib = cached
    with open(lib, "r+b") as fh:  # an interrupted copy: the tail is missing
        fh.truncate(os.path.getsize(lib) // 2)
    actual = _sha(lib)
    recorded = json.load(open(os.path.join(os.path.dirname(lib), "build-info.json")))["sha256"]
    d = os.path.dirname(lib)
    assert _refusal(default_plan) == (
        f"torchgen-patch: error: {lib} is not the library that was built (sha256 {actual[:16]}, its build "
        f"recorded {recorded[:16]}): damaged (an interrupted copy?) or replaced, so it is not loaded "
        f"(hint: remove {d} and build again (torchgen-patch build))")
    # never rebuilt in the same place behind the user's back: a second install refuses again
    assert _refusal(default_plan).startswith(f"torchgen-patch: error: {lib} is not the library that was built")
    assert _sha(lib) == actual


def test_a_record_without_a_hash_is_refused(cached, default_plan):
    root, lib = cached
    info = os.path.join(os.path.dirname(lib), "build-info.json")
    data = json.load(open(info))
    del data["sha256"]
    json.dump(data, open(info, "w"))
    assert _refusal(default_plan) == (
        f"torchgen-patch: error: {lib} has no SHA-256 in its build record (built by an older torchgen-patch): "
        f"it cannot be checked, so it is not loaded (hint: remove {os.path.dirname(lib)} and build again "
        "(torchgen-patch build))")


def test_cli_install_refusal_is_one_line_exit_3(cached, default_plan):
    root, lib = cached
    os.chmod(root, 0o777)
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHGEN_PATCH_CACHE=str(root))
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "install"], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"torchgen-patch: error: {root} is writable by group and others "
                                                "(mode 0777)")
    assert "Traceback" not in r.stderr


def test_directories_above_the_root(tmp_path):
    """Above the cache root, a directory others may write must be sticky (like /tmp)."""
    shared = tmp_path / "shared"
    root = shared / "cache"
    private_dirs(str(root))
    f = root / "lib.so"
    f.write_bytes(b"x")
    os.chmod(shared, 0o1777)
    trust.check_path(str(f), str(root))  # sticky: nobody can rename what is ours
    os.chmod(shared, 0o777)
    with pytest.raises(EnvironmentProblem) as e:
        trust.check_path(str(f), str(root))
    assert e.value.render() == (
        f"torchgen-patch: error: {shared} is writable by group and others (mode 0777): they could replace the "
        f"library, so torchgen-patch does not load {f} (hint: chmod go-w {shared}, or move the cache "
        "(TORCHGEN_PATCH_CACHE) elsewhere)")


def test_check_library_for_a_prebuilt_file(tmp_path):
    """The entry point for a library that pip installed (a prebuilt kernels wheel)."""
    site = tmp_path / "site-packages"
    private_dirs(str(site / "pkg"))
    lib = site / "pkg" / "lib.so"
    lib.write_bytes(b"\x7fELF not really")
    good = _sha(str(lib))
    trust.check_library(str(lib), good, str(site))
    with pytest.raises(EnvironmentProblem, match="is not the library that was built"):
        trust.check_library(str(lib), "0" * 64, str(site))
    os.mkfifo(site / "pkg" / "fifo.so")
    with pytest.raises(EnvironmentProblem, match="is not a regular file"):
        trust.check_library(str(site / "pkg" / "fifo.so"), good, str(site))


def test_unknown_trusted_owner_is_an_environment_problem(monkeypatch):
    monkeypatch.setenv(OWNERS_ENV, "no-such-account-xyz")
    with pytest.raises(EnvironmentProblem) as e:
        trusted_uids()
    assert e.value.exit_code == 3 and "no-such-account-xyz" in e.value.render()


def test_cache_directories_are_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(tmp_path / "a" / "b"))
    cache.write("x.json", {"k": 1})
    for d in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert cache.read("x.json") == {"k": 1}


def test_a_fresh_build_is_private_and_records_its_hash(library):
    d = library.directory
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    info = json.load(open(os.path.join(d, "build-info.json")))
    assert info["sha256"] == _sha(library.path)
    for base, _, names in os.walk(d):
        for p in [base] + [os.path.join(base, n) for n in names]:
            assert not os.lstat(p).st_mode & 0o022, p
