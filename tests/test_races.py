"""Races another account can run against what the tool writes, and the machine's own faults:

- an output file: its owner and mode come from the file that was checked, never from a second look
  at the name; a file that appears at the name (or another file there) between the check and the
  write is not replaced and gives its owner and mode to nothing;
- gen's lock: in a directory others can write it is a file of the user's own cache, so nothing
  another account makes there stops or joins a gen;
- the cache: a directory of another account that comes and goes at the cache's name is one line,
  never a traceback;
- a lease taken without /proc names no kernel and is judged by its pid and age;
- a full disk while writing an output is the environment's problem (exit 3), nothing left half-written.

The other account is a real one (tests/test_cache_input.py's useradd helper), acting in forked children."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time

import pytest

from tests.test_cache_input import _second_account
from tests.test_output_trust import small_plan, sticky
from tests.test_outputs import FUNCS, ctx, tmpfs, tree

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second account needs root")
THEIRS = b"the other account's\n"


def _as(uid: int, fn) -> int:
    """Run ``fn()`` in a forked child as the account ``uid``; its pid (exit 0: ``fn`` returned)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            fn()
            code = 0
        finally:
            os._exit(code)
    return pid


def _wait_ok(pid: int) -> None:
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _plant(path: str) -> None:
    """The other account's file at ``path``: made with O_EXCL, 0666, holding THEIRS."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    os.fchmod(fd, 0o666)
    os.write(fd, THEIRS)
    os.close(fd)


@contextlib.contextmanager
def _umask(m: int):
    old = os.umask(m)
    try:
        yield
    finally:
        os.umask(old)


# ---------------------------------------------------------------------------
# 1. an output file: owner and mode from what was checked


@needs_root
@pytest.mark.parametrize("case", ["appears where none was", "replaces the checked file"])
def test_a_file_made_between_the_check_and_the_write_gets_nothing_of_roots(case, sticky, monkeypatch):
    """The window made reproducible: the other account acts right between the check and the write
    (inside the call of ``replace_at``). Where nothing was there, its new file in a sticky shared
    directory; where root's own file was checked, its file renamed over it in a directory it may
    write (no sticky bit). On the code that took the owner and mode from a second look at the name,
    root's report became theirs (their owner, 0666); now nothing is written, in one line."""
    from torchgen_patch import files
    from torchgen_patch.errors import InputError
    from torchgen_patch.fs import atomic

    uid = _second_account()
    if case == "appears where none was":
        d = sticky
    else:
        d = sticky / "open"  # where they may rename over root's file
        d.mkdir()
        os.chmod(d, 0o777)
    out = d / "report.txt"
    if case == "replaces the checked file":
        out.write_bytes(b"root's old report\n")
        os.chmod(out, 0o600)
    real = atomic.replace_at

    def between(*a, **k):
        def swap():
            if case == "appears where none was":
                _plant(str(out))
            else:
                _plant(str(d / "theirs"))
                os.rename(d / "theirs", out)
        _wait_ok(_as(uid, swap))
        return real(*a, **k)

    monkeypatch.setattr(atomic, "replace_at", between)
    secret = b"root's report\n"
    with _umask(0o077), pytest.raises(InputError, match="not written: .*nothing was written"):
        files.write_output(str(out), secret, "report")
    st = os.lstat(out)
    assert out.read_bytes() == THEIRS and st.st_uid == uid  # theirs, as they left it: nothing of root's
    assert not [n for n in os.listdir(d) if n.startswith(".tmp-")]


@needs_root
def test_another_account_racing_files_into_the_name_never_gets_roots_report(sticky):
    """Thousands of writes by root into a sticky shared directory while the other account makes and
    removes files at the name in a tight loop: every write is refused (their file there at the check,
    or made between the check and the write: some of each) or lands as root's own file with the
    umask's mode; no file of theirs ever holds root's content or gives its mode to root's."""
    from torchgen_patch import files
    from torchgen_patch.errors import ToolError

    uid = _second_account()
    out = str(sticky / "report.txt")
    stop = sticky / "stop"

    r, w = os.pipe()

    def churn():  # their file there about half the time, for a random while
        import random

        os.write(w, b"x")
        end = time.monotonic() + 30
        while time.monotonic() < end and not os.path.exists(stop):
            try:
                _plant(out)
            except (FileExistsError, PermissionError):
                continue
            mine = os.lstat(out)
            with contextlib.suppress(OSError):
                if os.path.samestat(os.lstat(out), mine):
                    os.unlink(out)
            for _ in range(random.randrange(2000)):  # absent for a random while (a few to 100 µs)
                pass

    pid = _as(uid, churn)
    os.close(w)
    assert os.read(r, 1) == b"x"
    os.close(r)
    outcomes = {"written": 0, "refused": 0, "raced": 0}
    try:
        with _umask(0o077):
            t0 = time.monotonic()
            for i in range(5000):  # hundreds at least, for 1.5 s
                if i >= 300 and time.monotonic() - t0 > 1.5:
                    break
                secret = f"root's report {i}\n".encode()
                try:
                    files.write_output(out, secret, "report")
                    outcomes["written"] += 1
                except ToolError as e:  # theirs there at the check, or made after it
                    outcomes["raced" if "nothing was written" in e.message else "refused"] += 1
                try:
                    fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW)
                except FileNotFoundError:
                    continue
                with os.fdopen(fd, "rb") as fh:
                    st, data = os.fstat(fd), fh.read()
                if st.st_uid == uid:  # theirs (empty for an instant, as they make it), never root's report
                    assert data in (THEIRS, b""), f"their file holds root's report (try {i}): {data!r}"
                else:
                    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, (i, oct(st.st_mode), st.st_uid)
                    assert data.startswith(b"root's report")
                    os.unlink(out)  # root's own: gone, so the next write races them again
            took = time.monotonic() - t0
    finally:
        stop.touch()
        os.waitpid(pid, 0)
    assert all(outcomes.values()), outcomes  # root won some, they some, and some landed between check and write
    assert took < 20, took
    assert not [n for n in os.listdir(sticky) if n.startswith(".tmp-")]


@needs_root
def test_gen_into_a_shared_directory_gives_nothing_the_owner_and_mode_of_a_planted_file(small_plan, sticky):
    """gen's output directory itself writable by every account (sticky): a file another account
    planted at one of gen's names is replaced by root's own (the umask's mode), never made theirs."""
    from torchgen_patch.codegen import render, write_all

    uid = _second_account()
    out = sticky / "out"
    with _umask(0o022):
        write_all(str(out), render(small_plan, 1))
    os.chmod(out, 0o1777)
    name = "ADInplaceOrViewPatch_0.cpp"
    assert name in os.listdir(out)
    os.unlink(out / name)
    _wait_ok(_as(uid, lambda: _plant(str(out / name))))
    with _umask(0o022):
        write_all(str(out), render(small_plan, 1))
    st = os.lstat(out / name)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644), (st.st_uid, oct(st.st_mode))
    assert (out / name).read_bytes().startswith(b"// @generated by torchgen-patch")


# ---------------------------------------------------------------------------
# 2. gen's lock: nothing another account makes in a shared directory stops gen


@needs_root
def test_a_squatted_lock_name_in_a_shared_directory_neither_stops_nor_serves_gen(small_plan, sticky):
    """The other account makes every name beside the output that gen could be expected to use for a
    lock (files, a directory, a symlink), in the sticky shared directory: root's gen into it works,
    twice, and leaves what they made as it was. On the code that kept the lock beside the output,
    the owner of the output could never gen there again."""
    from torchgen_patch.codegen import render, write_all
    from torchgen_patch.fs.locks import LOCK

    uid = _second_account()
    squats = [f".out{LOCK}", ".out.lock", ".torchgen-patch-lock", f".out{LOCK}.d"]

    def squat():
        for n in squats[:-1]:
            _plant(str(sticky / n))
        os.mkdir(sticky / squats[-1])
        os.symlink("/etc/passwd", sticky / ".out.torchgen-patch.lock")

    _wait_ok(_as(uid, squat))
    before = {n: os.lstat(sticky / n) for n in os.listdir(sticky)}
    for shards in (1, 3):
        write_all(str(sticky / "out"), render(small_plan, shards))
    assert sorted(os.listdir(sticky)) == sorted([*before, "out"])
    for n, st in before.items():
        assert os.path.samestat(os.lstat(sticky / n), st) and os.lstat(sticky / n).st_uid == uid
    assert "ADInplaceOrViewPatch_2.cpp" in os.listdir(sticky / "out")


@needs_root
def test_two_gens_into_a_shared_directory_still_serialize_and_leave_no_lock_there(small_plan, sticky):
    """While one gen holds the lock of an output in a shared directory, another waits (and says so),
    then runs; the lock is nowhere in the shared directory (another account could not make it first)."""
    from torchgen_patch.codegen import render, write_all
    from torchgen_patch.fs.locks import output_lock

    said, done = [], []
    fd = os.open(sticky, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with output_lock(fd, "out", str(sticky / "out")):  # a gen into sticky/out, running
            assert os.listdir(sticky) == []
            t = threading.Thread(target=lambda: done.append(write_all(str(sticky / "out"), render(small_plan, 1),
                                                                      said.append)), daemon=True)
            t.start()
            t0 = time.monotonic()
            while not said and time.monotonic() - t0 < 10:
                time.sleep(0.05)
            assert said == [f"waiting for another gen into {sticky / 'out'}"] and not done
        t.join(30)
    finally:
        os.close(fd)
    assert done and sorted(os.listdir(sticky)) == ["out"]


# ---------------------------------------------------------------------------
# 3. the cache's name, changing under it


@needs_root
def test_a_directory_coming_and_going_at_the_cache_name_is_never_a_traceback(sticky):
    """The other account makes and removes a directory (and a file) at the cache's name in a sticky
    shared directory, in a tight loop, while the cache is opened hundreds of times: each open gives the
    directory, Missing, or one of the tool's own errors; never another exception (on the code that
    looked at the name twice: FileNotFoundError)."""
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.fs.protected import Missing
    from torchgen_patch.errors import ToolError

    uid = _second_account()
    name = str(sticky / "cache")
    stop = sticky / "stop"

    def churn():
        end = time.monotonic() + 30
        i = 0
        while time.monotonic() < end and not os.path.exists(stop):
            i += 1
            with contextlib.suppress(OSError):
                if i % 3:
                    os.mkdir(name, 0o755)
                    os.rmdir(name)
                else:
                    _plant(name)
                    os.unlink(name)

    pid = _as(uid, churn)
    seen: dict[str, int] = {}
    try:
        t0 = time.monotonic()
        for i in range(20000):  # hundreds at least, for 1.5 s
            if i >= 600 and time.monotonic() - t0 > 1.5:
                break
            create = bool(i % 2)
            try:
                with open_dir(name, create=create) as d:
                    seen["opened"] = seen.get("opened", 0) + 1
                    if os.fstat(d.fd).st_uid == 0:
                        os.rmdir(name)  # root's own, made by create: gone, so the race goes on
            except Missing:
                assert not create
                seen["missing"] = seen.get("missing", 0) + 1
            except ToolError as e:  # InputError and EnvironmentProblem: the tool's own, one line
                assert "\n" not in e.render()
                seen[type(e).__name__] = seen.get(type(e).__name__, 0) + 1
    finally:
        stop.touch()
        os.waitpid(pid, 0)
    assert seen.get("EnvironmentProblem"), seen  # their directory was met: the race ran


def test_open_dir_answers_a_name_that_changes_between_two_looks_in_one_line(tmp_path, monkeypatch):
    """The cases a churn hits now and then, made certain: the directory made by another process and
    removed right after (create), a symlink removed between the look that finds it and its reading."""
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.fs.protected import Missing
    from torchgen_patch.errors import EnvironmentProblem

    name = tmp_path / "c"
    real_mkdir = os.mkdir

    def made_elsewhere(p, *a, **k):  # someone else was first, and removed it at once
        if p == "c":
            raise FileExistsError(17, "File exists")
        return real_mkdir(p, *a, **k)

    monkeypatch.setattr(os, "mkdir", made_elsewhere)
    with pytest.raises(EnvironmentProblem, match="kept changing"):
        open_dir(str(name), create=True)
    monkeypatch.undo()
    os.symlink(tmp_path / "elsewhere", name)
    (tmp_path / "elsewhere").mkdir()
    real_readlink = os.readlink

    def gone_first(p, *a, **k):
        if p == "c":
            os.unlink(name)
        return real_readlink(p, *a, **k)

    monkeypatch.setattr(os, "readlink", gone_first)
    with pytest.raises(Missing):
        open_dir(str(name))


def test_a_directory_swapped_for_a_symlink_while_it_is_removed_loses_nothing_it_pointed_at(tmp_path, monkeypatch):
    """Dir.remove (the sweep of a stale build) meets a symlink where it found a directory: the link
    goes, what it points at stays, and no exception escapes (on the code that looked first, then
    opened the name: ELOOP)."""
    from torchgen_patch.fs.dirs import open_dir

    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "f").write_text("x")
    root = tmp_path / "root"
    os.mkdir(root, 0o700)
    os.mkdir(root / "t", 0o700)
    real_open = os.open

    def swapped(p, *a, **k):
        if p == "t" and (root / "t").is_dir() and not (root / "t").is_symlink():
            os.rename(root / "t", tmp_path / "moved")
            os.symlink(keep, root / "t")
        return real_open(p, *a, **k)

    with open_dir(str(root)) as d:
        monkeypatch.setattr(os, "open", swapped)
        d.remove("t")
        monkeypatch.undo()
    assert os.listdir(root) == [] and os.listdir(keep) == ["f"]


def test_a_build_the_sweep_cannot_remove_is_left_for_the_next(tmp_path, monkeypatch):
    from torchgen_patch.fs import leases
    from torchgen_patch.fs.dirs import Dir, open_dir

    os.mkdir(tmp_path / "builds", 0o700)
    os.mkdir(tmp_path / "builds" / ".build-x", 0o700)
    os.utime(tmp_path / "builds" / ".build-x", (0, 0))  # no lease, days old: expired

    def busy(self, name):
        raise OSError(39, "Directory not empty")

    monkeypatch.setattr(Dir, "remove", busy)
    with open_dir(str(tmp_path / "builds")) as d:
        assert leases.sweep(d, (".build-",)) == []
    assert os.listdir(tmp_path / "builds") == [".build-x"]


# ---------------------------------------------------------------------------
# 4. a lease without /proc


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


@pytest.fixture
def builds(tmp_path):
    from torchgen_patch.fs.dirs import open_dir

    os.mkdir(tmp_path / "builds", 0o700)
    with open_dir(str(tmp_path / "builds")) as d:
        yield d


def _lease(builds, name: str, info: dict | None = None) -> None:
    from torchgen_patch.fs import leases

    with builds.mkdtemp(name) as t:
        if info is not None:
            fd = os.open(leases.LEASE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=t.fd)
            os.write(fd, json.dumps(info).encode())
            os.close(fd)


def test_a_lease_taken_without_proc_names_no_kernel_and_is_swept_once_its_process_is_gone(builds, monkeypatch):
    """Where /proc cannot be read, a build's lease says it has no boot identity ("boot": null), and the
    next build (there too) removes it as soon as its process is gone, not a day later; one whose
    process lives stays."""
    from torchgen_patch.fs import leases

    leases.host_identity.cache_clear()
    monkeypatch.setattr(leases, "_proc", lambda *a, **k: None)  # no /proc (where the leases look)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a build that takes its lease, then dies
            try:
                with builds.mkdtemp(".build-dead-") as t, leases.leased(t):
                    os.write(w, os.path.basename(t.path).encode())
                    os._exit(0)
            finally:
                os._exit(1)
        os.close(w)
        dead = os.read(r, 100).decode()
        os.close(r)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        with builds.sub(dead) as t:
            fd = os.open(leases.LEASE, os.O_RDONLY, dir_fd=t.fd)
            lease = json.loads(os.pread(fd, 4096, 0))
            os.close(fd)
        assert lease["boot"] is None and lease["pidns"] is None and lease["pid"] == pid, lease
        _lease(builds, ".build-alive-", dict(lease, pid=os.getpid()))  # its lock free, its process alive
        assert leases.sweep(builds, (".build-",)) == [dead]
        assert [n for n in builds.names() if n.startswith(".build-alive-")] == builds.names()
    finally:
        monkeypatch.undo()
        leases.host_identity.cache_clear()


def test_a_lease_an_earlier_version_wrote_without_proc_is_not_kept_for_a_day(builds, monkeypatch):
    """Leases that said "boot": "" (written without /proc by earlier versions): removed once their process
    is gone (judged where /proc is missing too: same host, no namespace to tell apart), or, where it
    cannot be judged, after an hour; a lease of another kernel still stays for a day."""
    from torchgen_patch.fs import leases

    real = leases.host_identity()
    host = real["host"]
    old = {"boot": "", "pidns": "", "host": host, "started": time.time()}
    _lease(builds, ".build-gone-", dict(old, pid=_dead_pid()))
    _lease(builds, ".build-hours-", dict(old, pid=os.getpid()))
    _lease(builds, ".build-other-kernel-", dict(old, boot="another-boot", pidns=real["pidns"], pid=_dead_pid()))
    names = {n.split("-")[1]: n for n in builds.names()}
    for n in (names["hours"], names["other"]):
        os.utime(n, (time.time() - 2 * 3600,) * 2, dir_fd=builds.fd)
    monkeypatch.setattr(leases, "host_identity", lambda: {"boot": None, "pidns": None, "host": host})
    assert sorted(leases.sweep(builds, (".build-",))) == sorted([names["gone"], names["hours"]])
    assert builds.names() == [names["other"]]


# ---------------------------------------------------------------------------
# 5. a full disk while writing an output


@pytest.fixture
def full_fs(tmp_path):
    """A tiny tmpfs filled to the last block."""
    with tmpfs(tmp_path / "full", "64k") as mnt:
        (mnt / "report.txt").write_text("the old report\n")
        with contextlib.suppress(OSError), open(mnt / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        yield mnt


def test_an_output_on_a_full_disk_is_the_environments_problem(ctx, full_fs, run_cli):
    """`lint -o` onto a full file system: exit 3 (the machine's, not the input's), one line naming the
    file, the old report as it was and no temporary file left."""
    out = full_fs / "report.txt"
    rc, _, err = run_cli("lint", ctx["native"], "-o", out)
    assert rc == 3 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"{os.path.relpath(out)}: error: cannot write lint report: "), err
    assert "No space left on device (hint: free space" in err, err
    assert out.read_text() == "the old report\n"
    assert sorted(os.listdir(full_fs)) == ["filler", "report.txt"]
