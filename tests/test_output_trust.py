"""Outputs in shared directories, written as the kernel would write them: a symlinked output (a file,
or `gen -o`'s directory) is followed only where the kernel's fs.protected_symlinks rule would follow
it (whatever the sysctl says here), new files get the umask's mode, a replaced file of one's own keeps
its mode, and every write goes through the directory found once (tests/test_output_dirs.py: directories
another account controls). gen's lock is a file of the user's own
beside the output; its swap keeps the directory's owner, works without RENAME_EXCHANGE, loses no
directory and no file of anyone's when killed between any two steps; `lint --generated` compares the
files with what the plan renders and reads one snapshot. Other accounts: chown (root), or a real
second account (tests/test_cache_input.py's useradd helper) where a process must run as one."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
import threading
import time

import pytest

from tests.test_cache_input import _second_account
from tests.test_outputs import FILE_OUTPUTS, FUNCS, ctx, tree

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="other owners are made with chown, which needs root")


def _kernel_rule() -> str:
    """What this machine's kernel does with links in sticky directories (the tool's rule is its own)."""
    try:
        return "fs.protected_symlinks=" + open("/proc/sys/fs/protected_symlinks").read().strip()
    except OSError:
        return "fs.protected_symlinks unknown"


@pytest.fixture
def sticky():
    """A sticky directory every account may write, as /tmp is (in /tmp: other accounts reach it)."""
    import pathlib
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="tgp-shared-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    """The plan of a 4-entry yaml (3 kernels): rendered in 1 and in 3 shards, two outputs of one plan."""
    from tests.support import scan_of
    from tests.yaml_fixtures import subset_yaml
    from torchgen_patch.plan import make_plan
    from torchgen_patch.plan.overlay import empty

    native, tags = subset_yaml(str(tmp_path_factory.mktemp("small")), FUNCS)
    return make_plan(scan_of(native, tags, cache=False), empty())


def _one_error(rc, err):
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err


# ---------------------------------------------------------------------------
# files: symlinks, modes, owners, descriptors


@needs_root
@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_a_link_another_account_planted_in_a_sticky_directory_is_not_followed(key, ctx, sticky, run_cli):
    """The issue's case: a victim's 0600 file, the attacker's link to it in /tmp, `lint -o link`."""
    victim = ctx["tmp"] / "private" / "secret"
    victim.parent.mkdir(mode=0o700)
    victim.write_text("the victim's\n")
    os.chmod(victim, 0o600)
    link = sticky / "report"
    os.symlink(victim, link)
    os.lchown(link, NOBODY, NOBODY)
    argv, _ = FILE_OUTPUTS[key](ctx, link)
    rc, _, err = run_cli(*argv)
    _one_error(rc, err)
    assert "not following the symlink" in err and "nobody (uid 65534) owns it" in err, (err, _kernel_rule())
    assert victim.read_text() == "the victim's\n" and stat.S_IMODE(os.stat(victim).st_mode) == 0o600
    assert os.path.islink(link) and not [n for n in os.listdir(victim.parent) if n != "secret"]


@needs_root
def test_a_link_of_ones_own_is_followed_and_the_target_keeps_its_mode_but_none_of_a_sticky_dirs_other_owner(
        ctx, sticky, run_cli):
    target = ctx["tmp"] / "mine.txt"
    target.write_text("old\n")
    os.chmod(target, 0o600)
    os.symlink(target, sticky / "own")  # root's own link, root following it
    assert run_cli("lint", ctx["native"], "-o", sticky / "own")[0] == 1
    assert "3 finding(s)" in target.read_text() and stat.S_IMODE(os.stat(target).st_mode) == 0o600
    os.chown(sticky, NOBODY, NOBODY)  # a sticky directory another account owns: they may rename anything in it
    os.symlink(target, sticky / "owners")
    os.lchown(sticky / "owners", NOBODY, NOBODY)
    target.write_text("old\n")
    rc, _, err = run_cli("lint", ctx["native"], "-o", sticky / "owners")
    _one_error(rc, err)
    assert "nobody (uid 65534) owns that directory (mode 1777)" in err and target.read_text() == "old\n", err


@needs_root
@pytest.mark.parametrize("end", ["device", "fifo"])
def test_a_chain_to_a_device_or_fifo_through_another_accounts_link_is_refused(ctx, sticky, run_cli, end):
    """A link of one's own, to another account's link in a sticky directory, to a device or to that
    account's FIFO (which would hand the report to them): every hop is judged by the same rule as a
    chain to a regular file, and nothing is written."""
    target = sticky / "fifo"
    if end == "fifo":
        os.mkfifo(target, 0o622)
        os.chown(target, NOBODY, NOBODY)
    else:
        target = "/dev/null"
    hop = sticky / "hop"
    os.symlink(target, hop)
    os.lchown(hop, NOBODY, NOBODY)
    mine = ctx["tmp"] / "out"
    os.symlink(hop, mine)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(target, "rb").read()), daemon=True)
    if end == "fifo":
        reader.start()
    rc, _, err = run_cli("lint", ctx["native"], "-o", mine, "--format", "json")
    if end == "fifo":
        deadline = time.monotonic() + 30
        while not got:  # nothing was written: let the reader go, once it has opened the FIFO
            try:
                os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
                break
            except OSError as e:  # ENXIO: no reader yet (the refusal can come before the thread opens it)
                if e.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        reader.join(30)
        assert got == [b""], got[0][:80]
    _one_error(rc, err)
    assert f"not following the symlink {hop}: nobody (uid 65534) owns it" in err, (err, _kernel_rule())


def test_standard_output_and_a_descriptor_of_the_shell_are_written_through(ctx):
    """``-o /dev/stdout`` and ``-o /dev/fd/N`` onto a pipe: a link of /proc whose target names no path."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    def lint(out, **kw):
        return subprocess.run([sys.executable, "-m", "torchgen_patch", "lint", ctx["native"], "-o", out, "--format",
                               "json"], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                              **kw)

    p = lint("/dev/stdout")
    summary, _, report = p.stdout.partition("\n")  # the summary, then the report on the same pipe
    assert p.returncode == 1 and p.stderr == "lint report: /dev/stdout\n" and json.loads(report)["findings"], p.stderr
    r, w = os.pipe()
    p = lint(f"/dev/fd/{w}", pass_fds=(w,))
    os.close(w)
    with os.fdopen(r) as fh:
        said = fh.read()
    assert p.returncode == 1 and p.stdout == summary + "\n" and p.stderr == f"lint report: /dev/fd/{w}\n", p.stderr
    assert json.loads(said)["findings"], said


@needs_root
def test_gen_into_a_linked_directory_another_account_planted_is_refused(ctx, sticky, run_cli):
    mine = ctx["tmp"] / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine\n")
    os.symlink(mine, sticky / "gen")
    os.lchown(sticky / "gen", NOBODY, NOBODY)
    rc, _, err = run_cli("gen", "--native-functions", ctx["native"], "-o", sticky / "gen")
    _one_error(rc, err)
    assert os.listdir(mine) == ["keep.txt"] and os.listdir(sticky) == ["gen"]


def test_new_outputs_get_the_umasks_mode_and_a_replaced_one_keeps_its_own(ctx, run_cli):
    old = os.umask(0o027)
    try:
        assert run_cli("lint", ctx["native"], "-o", "new.txt")[0] == 1
        assert run_cli("gen", "--native-functions", ctx["native"], "-o", "g")[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat("new.txt").st_mode) == 0o640
    assert {stat.S_IMODE(os.stat(os.path.join("g", n)).st_mode) for n in os.listdir("g")} == {0o640}
    assert stat.S_IMODE(os.stat("g").st_mode) == 0o750
    os.chmod("new.txt", 0o600)
    assert run_cli("lint", ctx["native"], "-o", "new.txt", "--format", "json")[0] == 1
    assert stat.S_IMODE(os.stat("new.txt").st_mode) == 0o600 and open("new.txt").read().startswith("{")


@needs_root
def test_a_file_another_account_planted_in_a_sticky_directory_is_not_replaced(ctx, sticky, run_cli, tmp_path):
    """The kernel's protected_regular rule: root's `lint -o /tmp/x` over an x another account made (0666)
    would hand them root's report, theirs to read and rewrite. Where that account owns the sticky
    directory, nothing in it is written."""
    from torchgen_patch.errors import InputError
    from torchgen_patch.runtime import prebuilt

    planted = sticky / "report.json"
    planted.write_text("planted\n")
    os.chmod(planted, 0o666)
    os.chown(planted, NOBODY, NOBODY)
    rc, _, err = run_cli("lint", ctx["native"], "-o", planted, "--format", "json")
    _one_error(rc, err)
    assert f"not replacing {planted}: nobody (uid 65534) owns it" in err, err
    assert planted.read_text() == "planted\n" and os.stat(planted).st_uid == NOBODY
    made = tmp_path / "made.whl"
    made.write_bytes(b"PK")
    (sticky / "x.whl").write_bytes(b"theirs")
    os.chown(sticky / "x.whl", NOBODY, NOBODY)
    with pytest.raises(InputError, match="not replacing"):
        prebuilt._publish(str(made), str(sticky / "x.whl"), str(sticky))
    assert (sticky / "x.whl").read_bytes() == b"theirs"
    os.chown(sticky, NOBODY, NOBODY)  # now the directory's owner's file, in their directory
    rc, _, err = run_cli("lint", ctx["native"], "-o", planted, "--format", "json")
    _one_error(rc, err)
    assert "nobody (uid 65534) owns that directory" in err and planted.read_text() == "planted\n", err


@needs_root
def test_a_fifo_another_account_planted_in_a_sticky_directory_gets_nothing(ctx, sticky, run_cli):
    """The kernel's protected_fifos rule: root's `lint -o /tmp/f` into a FIFO another account made (and
    reads) would hand them the report; refused before it is opened. One's own FIFO there is written."""
    import threading

    planted = sticky / "fifo"
    os.mkfifo(planted, 0o666)
    os.chown(planted, NOBODY, NOBODY)
    listening = os.open(planted, os.O_RDONLY | os.O_NONBLOCK)  # their reader, there all along
    try:
        rc, _, err = run_cli("lint", ctx["native"], "-o", planted, "--format", "json")
        try:
            leaked = os.read(listening, 1 << 16)
        except BlockingIOError:
            leaked = b""
    finally:
        os.close(listening)
    assert leaked == b"", leaked[:200]
    _one_error(rc, err)
    assert f"not writing into the FIFO {planted}: nobody (uid 65534) owns it" in err, err
    os.chown(planted, os.geteuid(), os.getegid())
    got = []
    reader = threading.Thread(target=lambda: got.append(open(planted, "rb").read()))
    reader.start()
    assert run_cli("lint", ctx["native"], "-o", planted, "--format", "json")[0] == 1
    reader.join(30)
    assert got and got[0].startswith(b"{")


@needs_root
def test_enable_refuses_a_site_packages_others_can_write_and_status_names_who_replaced_its_file(tmp_path):
    """enable's file in a directory any account can write is theirs to replace (and every Python of the
    environment runs it): refused in one line; a file of another account's there is named as theirs."""
    from torchgen_patch.errors import EnvironmentProblem
    from torchgen_patch.runtime.launch import enable

    site = tmp_path / "site-packages"
    site.mkdir()
    os.chmod(site, 0o777)
    with pytest.raises(EnvironmentProblem, match=r"site-packages is writable by its group and others \(mode 0777\): "
                                                 "any account "):
        enable.check_writable(str(site))
    os.chmod(site, 0o775)  # a group's write bit: refused as the others' is
    with pytest.raises(EnvironmentProblem, match=r"site-packages is writable by its group \(mode 0775\): any account "):
        enable.check_writable(str(site))
    enable.check_writable(str(site), removing=True)  # disable may remove what is there
    os.chmod(site, 0o755)
    enable.check_writable(str(site))
    pth = site / enable.FILE
    pth.write_text("import os; os.system('id')\n")
    assert enable.state(str(site)).problem == "it is not as torchgen-patch writes it (edited?): what it does is its own"
    os.chown(pth, NOBODY, NOBODY)
    assert enable.state(str(site)).problem == ("it is not as torchgen-patch writes it (nobody (uid 65534) owns it: "
                                               "replaced by that account?): what it does is its own")
    os.chown(pth, os.geteuid(), os.getegid())  # the writer's line, with data nested 100,000 deep
    pth.write_text(enable.render(str(site)))
    (site / enable.DATA).write_text("[" * 100000 + "]" * 100000)
    # no RecursionError
    assert enable.state(str(site)).problem.endswith("is damaged (not the JSON torchgen-patch writes)")


def test_a_directory_swapped_for_a_link_after_the_lookup_gets_nothing(ctx, run_cli, monkeypatch):
    """The output's directory is replaced by a symlink to another directory just before the report
    file is created: the report lands in the directory that was looked up, never in the other."""
    out, victim = ctx["tmp"] / "out", ctx["tmp"] / "victim"
    out.mkdir()
    victim.mkdir()
    (victim / "report.txt").write_text("the victim's\n")
    real_open, swapped = os.open, []

    def open_then_swap(path, flags, *a, **k):
        if ".tmp-" in os.fspath(path) and not swapped:
            swapped.append(True)
            os.rename(out, ctx["tmp"] / "moved")
            os.symlink(victim, out)
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", open_then_swap)
    rc, _, err = run_cli("lint", ctx["native"], "-o", out / "report.txt")
    monkeypatch.undo()
    assert swapped and rc == 1, err
    assert (victim / "report.txt").read_text() == "the victim's\n" and os.listdir(victim) == ["report.txt"]
    assert (ctx["tmp"] / "moved" / "report.txt").read_text().endswith("(of 4 functions)\n")


# ---------------------------------------------------------------------------
# gen's lock


def _hold_flock_as(uid: int, path: str) -> int:
    """A process of the account ``uid`` holding an exclusive flock on ``path`` (a directory here) until
    it is killed; returns its pid once it holds it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            fd = os.open(path, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(w, b"x")
            time.sleep(600)
        finally:
            os._exit(1)
    os.close(w)
    assert os.read(r, 1) == b"x"
    os.close(r)
    return pid


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second account needs root")
def test_another_account_holding_a_lock_on_the_shared_parent_does_not_stall_gen(small_plan, sticky):
    from torchgen_patch.codegen import render, write_all

    pid = _hold_flock_as(_second_account(), str(sticky))
    try:
        done = []
        t = threading.Thread(target=lambda: done.append(write_all(str(sticky / "out"), render(small_plan, 1))),
                             daemon=True)
        t.start()
        t.join(30)
        assert done, "gen waited for a lock another account holds on the shared directory"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert sorted(os.listdir(sticky)) == ["out"]


def test_a_gen_that_waits_for_another_says_so_after_a_second(small_plan, tmp_path):
    from torchgen_patch.codegen import render, write_all
    from torchgen_patch.fs.locks import LOCK

    lock = os.open(tmp_path / f".out{LOCK}", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another gen into the same directory, running
    said, done = [], []
    t = threading.Thread(target=lambda: done.append(write_all(str(tmp_path / "out"), render(small_plan, 1),
                                                              said.append)), daemon=True)
    t0 = time.monotonic()
    t.start()
    while not said and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    waited = time.monotonic() - t0
    os.close(lock)  # that gen ends
    t.join(30)
    assert said == [f"waiting for another gen into {tmp_path / 'out'}"] and 0.9 < waited < 5, (said, waited)
    assert done and sorted(os.listdir(tmp_path)) == ["out"]


@needs_root
def test_a_lock_file_another_account_owns_is_refused(ctx, run_cli):
    from torchgen_patch.fs.locks import LOCK

    lock = ctx["tmp"] / f".g{LOCK}"
    lock.write_text("")
    os.chown(lock, NOBODY, NOBODY)
    rc, _, err = run_cli("gen", "--native-functions", ctx["native"], "-o", "g")
    _one_error(rc, err)
    assert "owned by nobody (uid 65534)" in err and not os.path.exists("g")


# ---------------------------------------------------------------------------
# gen's swap: owners, no RENAME_EXCHANGE, a kill between any two steps, files others write meanwhile


@pytest.fixture(params=["exchange", "no exchange"])
def exchange(request, monkeypatch):
    """gen's swap as it is here (renameat2 RENAME_EXCHANGE), and as it is where the file system cannot
    exchange (NFS, some FUSE): forced by making the exchange unavailable."""
    from torchgen_patch.codegen import output

    if request.param == "no exchange":
        monkeypatch.setattr(output, "_exchange", lambda *a: False)
    return request.param


@needs_root
def test_roots_gen_into_a_users_directory_is_refused_and_changes_nothing(small_plan, tmp_path, exchange):
    """The directory is theirs: they could swap or rewrite what root writes into it before it is used."""
    from torchgen_patch.codegen import render, write_all
    from torchgen_patch.errors import InputError

    out = tmp_path / "out"
    write_all(str(out), render(small_plan, 1))
    (out / "notes.txt").write_text("mine\n")
    for p in [out, *out.iterdir()]:
        os.chown(p, NOBODY, NOBODY)
    os.chmod(out, 0o2750)
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    with pytest.raises(InputError, match=r"nobody \(uid 65534\) owns that directory \(mode 2750\)"):
        write_all(str(out), render(small_plan, 3))
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before and os.listdir(tmp_path) == ["out"]


# calls that change the file system: a kill at each one is a kill between two of gen's steps
_MUTATING = ("mkdir", "rename", "replace", "unlink", "rmdir", "link", "symlink", "fchmod", "chmod", "fchown",
             "chown", "utime", "fsync", "open")
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def _in_child(fn, kill_at: int | None = None, each=None) -> int:
    """``fn()`` in a forked child whose ``kill_at``-th call that changes the file system SIGKILLs it
    (``each()`` runs before every such call); the child's wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            count, busy = [0], [False]
            for name in _MUTATING:
                real = getattr(os, name)

                def wrap(*a, _real=real, _name=name, **k):
                    if busy[0] or (_name == "open" and not (a[1] if len(a) > 1 else k["flags"]) & _WRITES):
                        return _real(*a, **k)
                    count[0] += 1
                    if count[0] == kill_at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    if each:
                        busy[0] = True
                        try:
                            each()
                        finally:
                            busy[0] = False
                    return _real(*a, **k)

                setattr(os, name, wrap)
            fn()
            os._exit(0)
        except BaseException:  # noqa: BLE001 — the forked child's sink: its exit status says it
            os._exit(1)
    return os.waitpid(pid, 0)[1]


def _tree(d) -> dict[str, bytes]:
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def test_a_kill_between_any_two_steps_loses_no_directory_and_no_file_of_yours(small_plan, tmp_path, exchange):
    """SIGKILL at every call of gen's that changes the file system, in turn (both ways of swapping):
    the output directory is always there with the user's own file in it (with the exchange: wholly the
    old or the new output), and the next gen leaves it whole, the user's file kept, nothing beside."""
    from torchgen_patch.codegen import render, write_all

    out = str(tmp_path / "out")
    versions = [render(small_plan, 1), render(small_plan, 3)]
    write_all(out, versions[0])
    with open(os.path.join(out, "notes.txt"), "w") as fh:
        fh.write("mine\n")
    mine = {"notes.txt": b"mine\n"}
    kills = 0
    for source, target in ((versions[0], versions[1]), (versions[1], versions[0])):  # each way, every step
        for n in range(1, 500):
            write_all(out, source)
            status = _in_child(lambda target=target: write_all(out, target), kill_at=n)
            assert os.path.isdir(out), f"no output directory after a kill at step {n} ({exchange})"
            assert open(os.path.join(out, "notes.txt")).read() == "mine\n", f"the user's file, kill at step {n}"
            if exchange == "exchange":
                assert _tree(out) in (dict(source, **mine), dict(target, **mine)), f"a mix after step {n}"
            write_all(out, target)
            assert _tree(out) == dict(target, **mine) and os.listdir(tmp_path) == ["out"], n
            if os.WIFEXITED(status):  # this run had fewer steps than n: every step has been killed once
                assert os.WEXITSTATUS(status) == 0
                break
            assert os.WTERMSIG(status) == signal.SIGKILL
            kills += 1
    assert kills > 20, kills


def test_files_others_write_into_the_directory_while_gen_swaps_it_are_kept(small_plan, tmp_path, exchange):
    from torchgen_patch.codegen import render, write_all

    out = str(tmp_path / "out")
    write_all(out, render(small_plan, 1))
    made = []

    def another_process_writes():
        name = f"late-{len(made)}.txt"
        fd = os.open(os.path.join(out, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        made.append(name)

    made_in_child = tmp_path / "made.json"

    def run():
        write_all(out, render(small_plan, 3))
        made_in_child.write_text(json.dumps(made))

    assert _in_child(run, each=another_process_writes) == 0
    names = json.loads(made_in_child.read_text())
    assert len(names) > 10
    write_all(out, render(small_plan, 3))  # what a gen left beside, moved in by the next
    lost = [n for n in names if not os.path.exists(os.path.join(out, n))]
    assert not lost, f"{len(lost)} of {len(names)} files written during the swap are gone: {lost[:3]}"
    assert sorted(os.listdir(tmp_path)) == ["made.json", "out"]


# ---------------------------------------------------------------------------
# lint --generated: the files against the plan, one snapshot


def test_a_rehashed_edit_that_registers_another_kernel_is_found(tmp_path, run_cli):
    """cummax's registration pointed at cummin's kernel, the manifest's hash updated to match."""
    import hashlib

    out = tmp_path / "g"
    assert run_cli("gen", "-o", out)[0] == 0
    reg = out / "RegisterADInplaceOrViewPatch.cpp"
    text = reg.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith('    {"_cummax_helper", '))
    other = next(ln for ln in text.splitlines() if ln.startswith('    {"_cummin_helper", '))
    edited = text.replace(line, line.split(",", 1)[0] + "," + other.split(",", 1)[1])
    assert edited != text
    reg.write_text(edited)
    m = out / "torchgen_patch_manifest.json"
    doc = json.loads(m.read_text())
    doc["files"][reg.name] = hashlib.sha256(edited.encode()).hexdigest()
    m.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    rc, said, _ = run_cli("lint", "--generated", out, "--format", "json")
    found = {(f["rule"], os.path.basename(f["path"])) for f in json.loads(said)["findings"]}
    assert rc == 1 and ("generated-file-modified", reg.name) in found, found


def test_a_manifest_nested_too_deeply_is_one_line_for_lint_and_damaged_for_gen(ctx, run_cli):
    """lint --generated reads the manifest: one FILE:LINE line, exit 2; gen over the directory takes it as
    any damaged manifest (it knows no earlier outputs, and writes a new one); never a RecursionError."""
    out = ctx["tmp"] / "g"
    assert run_cli("gen", "--native-functions", ctx["native"], "-o", out)[0] == 0
    manifest = out / "torchgen_patch_manifest.json"
    manifest.write_text('{"shards": 2,\n "x": ' + "[" * 100_000 + "\n")
    rc, _, err = run_cli("lint", ctx["native"], "--generated", out)
    _one_error(rc, err)
    assert err.startswith("g/torchgen_patch_manifest.json:2: error: torchgen_patch_manifest.json is not valid JSON: "
                          "nested more than 64 levels deep"), err
    rc, _, err = run_cli("gen", "--native-functions", ctx["native"], "-o", out)
    assert rc == 0 and "Traceback" not in err, err
    assert json.loads(manifest.read_text())["generator"] == "torchgen-patch"


def test_lint_while_gen_swaps_sees_one_snapshot(small_plan, tmp_path, exchange):
    """A gen rewriting the directory again and again (the same plan in 1 and in 3 shards, both
    current) while lint --generated reads it: never a finding."""
    from torchgen_patch.codegen import render, write_all
    from torchgen_patch.diagnostics.generated import check

    out = str(tmp_path / "out")
    versions = [render(small_plan, 1), render(small_plan, 3)]
    write_all(out, versions[0])
    stop, rounds = threading.Event(), [0]

    def gen_again_and_again():
        while not stop.is_set():
            write_all(out, versions[rounds[0] % 2])
            rounds[0] += 1

    t = threading.Thread(target=gen_again_and_again, daemon=True)
    t.start()
    try:
        seen = [check(small_plan, out) for _ in range(30)]
    finally:
        stop.set()
        t.join(60)
    assert rounds[0] >= 5, rounds
    bad = [fs for fs in seen if fs]
    assert not bad, f"{len(bad)} of {len(seen)} runs found {sorted({f.rule for f in bad[0]})}"

