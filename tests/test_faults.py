"""Issue 8: faults and determinism: killed runs, concurrent runs, read-only
outputs, locales."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.support import packaged_yaml

from tests.conftest import ROOT

ENV = dict(os.environ, PYTHONPATH=ROOT)


def _gen(out, *extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "torchgen_patch", "gen", "--out", str(out), "--quiet", *extra],
                            env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _snapshot(d):
    return {p: (d / p).read_bytes() for p in sorted(os.listdir(d)) if not p.startswith(".tmp-")}


def test_killed_gen_leaves_old_or_new_directory(tmp_path):
    """SIGKILL at random moments while gen writes a new version of every file: the directory is
    always wholly the old version or wholly the new one (gen fills a staging directory beside it
    and swaps it in), and the next gen clears what the killed one left beside it."""
    native, tags = packaged_yaml()
    text = open(native).read()
    inputs = {}
    for name, prefix in (("a", ""), ("b", "# one more line: every kernel's yaml line moves\n")):
        d = tmp_path / f"yaml-{name}"
        d.mkdir()
        (d / "native_functions.yaml").write_text(prefix + text)
        (d / "tags.yaml").write_text(open(tags).read())
        inputs[name] = ["--native-functions", str(d / "native_functions.yaml"), "--shards", "200"]
    versions = {}
    for name, args in inputs.items():
        d = tmp_path / f"ref-{name}"
        p = _gen(d, *args)
        assert p.wait() == 0, p.stderr.read()
        versions[name] = _snapshot(d)
    changed = [n for n in versions["a"] if versions["a"][n] != versions["b"][n]]
    assert len(changed) > 100  # every shard that holds a kernel
    work = tmp_path / "work"
    work.mkdir()
    out = work / "out"
    assert _gen(out, *inputs["a"]).wait() == 0
    rng = random.Random(20261130)
    mid = 0
    for i in range(16):
        p = _gen(out, *inputs["b" if i % 2 == 0 else "a"])
        # kill once the write phase has begun (a staging directory appears beside the output)
        while p.poll() is None and not [n for n in os.listdir(work) if ".staging-" in n]:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 0.02))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            mid += 1
        p.wait()
        snap = _snapshot(out)
        assert snap in (versions["a"], versions["b"]), f"a mixed directory after kill {i}"
    assert mid >= 1, "no kill landed while gen was writing; the test proved nothing"
    assert _gen(out, *inputs["a"]).wait() == 0 and os.listdir(work) == ["out"]


def test_two_gens_into_one_directory(tmp_path):
    ref = tmp_path / "ref"
    assert _gen(ref).wait() == 0
    out = tmp_path / "out"
    procs = [_gen(out) for _ in range(2)]
    assert [p.wait() for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert _snapshot(out) == _snapshot(ref)
    assert not [p for p in os.listdir(out) if p.startswith(".tmp-")]


def test_read_only_output_directory(run_cli, tmp_path, monkeypatch):
    """As root, permission bits do not stop a write, so the check is driven
    through os.access; as another user the chmod alone does it."""
    out = tmp_path / "ro"
    out.mkdir()
    (out / "keep").write_text("x")
    os.chmod(out, 0o555)
    try:
        if os.geteuid() == 0:
            real = os.access
            monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == str(out) else real(p, m))
        rc, _, err = run_cli("gen", "--out", out)
    finally:
        os.chmod(out, 0o755)
    assert rc == 2 and err == f"{out}: error: output directory is not writable\n"
    assert os.listdir(out) == ["keep"]


@pytest.mark.parametrize("env", [{"LC_ALL": "C"}, {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"},
                                 {"PYTHONHASHSEED": "4242", "LC_ALL": "POSIX"}])
def test_same_bytes_under_other_locales_and_hash_seeds(tmp_path, env):
    ref = tmp_path / "ref"
    assert _gen(ref, "--no-cache").wait() == 0
    out = tmp_path / "other"
    p = subprocess.Popen([sys.executable, "-m", "torchgen_patch", "gen", "--out", str(out), "--quiet", "--no-cache"],
                         env=dict(ENV, **env), cwd=str(tmp_path), stderr=subprocess.PIPE)
    assert p.wait() == 0, p.stderr.read()
    assert _snapshot(out) == _snapshot(ref)
