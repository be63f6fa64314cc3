"""Faults while building and installing: one line and the right exit code, never a traceback, and
nothing left behind (a damaged record is rebuilt, a killed build's directory is removed by the next
run, its compilers end with it, a wheel is written whole or not at all)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT
from torchgen_patch.errors import EnvironmentProblem, InputError
from torchgen_patch.runtime import compile as build
from torchgen_patch.runtime import load

pytestmark = pytest.mark.build
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


def _files(tmp_path):
    from tests.test_build import _fixture_library

    return _fixture_library(tmp_path)[1]


def _cli(*argv, env=None, cwd=ROOT):
    e = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, "-m", "torchgen_patch", *map(str, argv)], capture_output=True, text=True,
                          env=e, cwd=cwd)


@pytest.mark.parametrize("argv", [["build"], ["install"], ["run", "--", sys.executable, "-c", "import torch"]])
def test_a_compiler_that_fails_is_one_line_exit_3(tmp_path, argv):
    # a fresh cache, so that nothing is found already built
    r = _cli(*argv, env={"CXX": "/bin/false", "TORCHGEN_PATCH_CACHE": str(tmp_path / "c")})
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1] == ("torchgen-patch: error: the C++ compiler /bin/false does not run: "
                                         "'/bin/false --version' exits 1 (hint: install g++ (or set CXX), or use "
                                         "install(backend='python'))")
    assert not os.path.isdir(tmp_path / "c" / "builds") or os.listdir(tmp_path / "c" / "builds") == []


def test_no_ninja_is_said_before_compiling(tmp_path, monkeypatch):
    files = _files(tmp_path)
    monkeypatch.setattr(build, "ninja_path", lambda: (_ for _ in ()).throw(
        EnvironmentProblem("ninja is not installed (the kernels are built with it)", "pip install ninja")))
    log = open(tmp_path / "log", "w")
    with pytest.raises(EnvironmentProblem, match="ninja is not installed"):
        build.build(files, [], 1, root=str(tmp_path / "b"), log=log)
    log.close()
    assert open(tmp_path / "log").read() == ""


def test_a_damaged_build_record_is_rebuilt_cleanly(tmp_path):
    files = _files(tmp_path)
    root = str(tmp_path / "b")
    lib = build.build(files, [], 1, root=root)
    for damage in ("{", ""):
        with open(os.path.join(lib.directory, build.RECORD), "w") as fh:
            fh.write(damage)
        again = build.build(files, [], 1, root=root)
        assert again.built and again.path == lib.path
        assert build.build(files, [], 1, root=root).built is False
        assert sorted(os.listdir(root)) == sorted([os.path.basename(lib.directory),
                                                   os.path.basename(lib.directory) + ".lock"])


@needs_root
def test_a_full_disk_is_an_environment_problem_and_leaves_nothing(tmp_path):
    files = _files(tmp_path)
    root = tmp_path / "tiny"
    root.mkdir(mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k,mode=0700", "tmpfs", str(root)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(EnvironmentProblem) as e:
            build.build(files, [], 1, root=str(root), log=open(os.devnull, "w"))
        assert e.value.message == f"no space left on the device of {root} while building the kernels"
        assert [n for n in os.listdir(root) if not n.endswith(".lock")] == []
    finally:
        subprocess.run(["umount", "-l", str(root)])


@needs_root
def test_a_wheel_on_a_full_disk_is_not_written_at_all(tmp_path):
    from torchgen_patch.runtime import prebuilt

    made = tmp_path / "made.whl"
    made.write_bytes(os.urandom(1 << 20))
    out = tmp_path / "out"
    out.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(out)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(EnvironmentProblem, match="no space left"):
            prebuilt._publish(str(made), str(out / "x.whl"), str(out))
        assert os.listdir(out) == []
    finally:
        subprocess.run(["umount", "-l", str(out)])


def test_a_wheel_gets_the_modes_of_the_umask(tmp_path):
    from torchgen_patch.runtime import prebuilt

    made = tmp_path / "made.whl"
    made.write_bytes(b"PK")
    old = os.umask(0o022)
    try:
        prebuilt._publish(str(made), str(tmp_path / "x.whl"), str(tmp_path))
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "x.whl").st_mode & 0o777 == 0o644


@needs_root
def test_a_wheel_is_not_written_through_another_accounts_link_in_a_sticky_directory(tmp_path):
    """-o through a symlink another account owns in a sticky directory others can write (/tmp): the
    kernel's protected_symlinks rule, which the wheel's writer keeps; the link's target is untouched."""
    from tests.test_cache_input import _second_account
    from torchgen_patch.runtime import prebuilt

    made = tmp_path / "made.whl"
    made.write_bytes(b"PK")
    sticky, theirs = tmp_path / "sticky", tmp_path / "theirs"
    sticky.mkdir()
    theirs.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(sticky, 0o1777)
    uid = _second_account()
    link = sticky / "dist"
    os.symlink(theirs, link)
    os.lchown(link, uid, uid)
    with pytest.raises(InputError, match="not following the symlink"):
        prebuilt._publish(str(made), str(link / "x.whl"), str(link))
    assert os.listdir(theirs) == []
    os.lchown(link, os.geteuid(), os.getegid())  # one's own link is followed
    prebuilt._publish(str(made), str(link / "x.whl"), str(link))
    assert (theirs / "x.whl").read_bytes() == b"PK"


def test_install_in_a_child_forked_while_another_thread_installs(tmp_path):
    """The install lock is held by another thread at fork: the child must not wait for it forever."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with load.REGISTRY.lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if load.REGISTRY.lock.acquire(timeout=10) else 1)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the install lock")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        release.set()
        t.join()


def _compilers_in(path: str) -> list[int]:
    """The compilers and ninja working in ``path`` (by command line or working directory)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if (path in cmd or cwd.startswith(path + os.sep)) and \
                ("ninja" in cmd or "cc1plus" in cmd or "c++" in cmd or "g++" in cmd):
            out.append(int(pid))
    return out


def _start_build(tmp_path, root):
    import json

    files = _files(tmp_path)
    json.dump({k: v.decode("latin1") for k, v in files.items()}, open(tmp_path / "f.json", "w"))
    code = (f"import sys; sys.path.insert(0, {ROOT!r}); import json;"
            "from torchgen_patch.runtime import compile as build;"
            f"files = {{k: v.encode('latin1') for k, v in json.load(open({str(tmp_path / 'f.json')!r})).items()}};"
            f"build.build(files, [], 1, root={root!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    assert "compiling" in line, line + proc.stderr.read()
    deadline = time.monotonic() + 60
    while not _compilers_in(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _compilers_in(root), "the build never started its compilers"
    return files, proc


def _gone(root: str, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while _compilers_in(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _compilers_in(root)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_killed_build_ends_its_compilers_and_the_next_run_cleans_up(tmp_path, sig):
    root = str(tmp_path / "b")
    files, proc = _start_build(tmp_path, root)
    proc.send_signal(sig)
    rc = proc.wait(60)
    err = proc.stderr.read()
    assert rc == {signal.SIGTERM: 143, signal.SIGINT: -2, signal.SIGKILL: -9}[sig], err
    if sig == signal.SIGTERM:
        assert "Traceback" not in err
    assert _gone(root), "compilers kept running after the build was stopped"
    if sig != signal.SIGKILL:  # the run removes its own temporary directory on the way out
        assert not [n for n in os.listdir(root) if n.startswith(".build-")]
    lib = build.build(files, [], 1, root=root)  # the next run: removes what a killed one left, builds
    assert lib.built
    assert sorted(os.listdir(root)) == sorted([os.path.basename(lib.directory),
                                               os.path.basename(lib.directory) + ".lock"])


def test_run_hands_its_children_an_absolute_cache(tmp_path, monkeypatch):
    from torchgen_patch.runtime import launch
    from torchgen_patch.sources import Options

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", "relative-cache")
    env = launch.prepare(Options(), "python", None, [], [])
    assert env["TORCHGEN_PATCH_CACHE"] == str(tmp_path / "relative-cache")


BROKEN_CXX = """#!{python} -IS
import os, sys
with open({log!r}, "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\\n")
with open({log!r} + ".env", "a") as fh:  # what its environment holds (no shell's default PATH)
    fh.write("PATH=" + os.environ.get("PATH", "<none>") + "\\n")
if sys.argv[1:] == ["--version"]:
    os.execv({real!r}, [{real!r}, "--version"])
sys.stderr.write("In file included from a.cpp:1:\\nc++: fatal error: no assembler in this toolchain\\n"
                 "compilation terminated.\\n")
sys.exit(1)
"""


def _broken_compiler(tmp_path) -> tuple[str, str]:
    """A compiler that answers --version and fails every compile, logging each call and its PATH: (its path,
    the log)."""
    import shutil

    d = tmp_path / "bin"
    d.mkdir()
    log = tmp_path / "calls"
    log.write_text("")
    real = os.path.realpath(shutil.which("c++") or "/bin/false")
    (d / "c++").write_text(BROKEN_CXX.format(python=sys.executable, log=str(log), real=real))
    (d / "c++").chmod(0o755)
    return str(d / "c++"), str(log)


def test_a_failed_build_is_remembered_where_programs_build_and_tried_again_where_it_may_work(tmp_path, monkeypatch):
    """A compile that fails is remembered in the cache (the toolchain and inputs' key, its reason, its time):
    within ``remembering`` (a program's process) it is not tried again for an hour, and said in one line
    whose reason is the compiler's last error line. Tried again: outside ``remembering`` (a command), with
    another PATH (another key), once the entry is older than an hour, and where the entry is not one to
    trust (writable by its group, owned by another account). Before, every start compiled again."""
    import glob

    from torchgen_patch import cache
    from torchgen_patch.fs import root as cache_root
    from torchgen_patch.runtime.compile import FAILED_FOR, record, remembering

    cxx, log = _broken_compiler(tmp_path)
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.setenv(cache_root.ENV, str(tmp_path / "cache"))

    def attempt(remember=True):
        before = open(log).read().count("\n")
        with pytest.raises(InputError) as e:
            with remembering() if remember else contextlib.nullcontext():
                build.build({"a.cpp": b"int a;\n"}, [], 0, root=str(tmp_path / "builds"), sources=["a.cpp"])
        return e.value, open(log).read().count("\n") - before

    first, calls = attempt()
    assert calls > 1 and first.cause == "c++: fatal error: no assembler in this toolchain"
    assert first.summary() == "the generated kernels do not compile: c++: fatal error: no assembler in this toolchain"
    assert first.message.startswith("the generated kernels do not compile:\n")  # the whole story for the CLI
    again, calls = attempt()
    assert calls == 0 and "\n" not in again.summary(), again.message  # not even --version
    assert again.summary().startswith("the generated kernels do not compile: c++: fatal error: no assembler in this "
                                      f"toolchain (remembered: the build with {cxx} failed ")
    assert attempt(remember=False)[1] > 1  # a command tries again
    [entry] = glob.glob(str(tmp_path / "cache" / "failed-build-*.json"))
    monkeypatch.setenv("PATH", os.environ["PATH"] + os.pathsep + str(tmp_path))  # another PATH: another entry
    assert attempt()[1] > 1 and attempt()[1] == 0
    monkeypatch.setenv("PATH", os.environ["PATH"].rsplit(os.pathsep, 1)[0])
    assert attempt()[1] == 0
    name = os.path.basename(entry)
    held = cache.read(name)
    cache.write(name, dict(held, time=held["time"] - FAILED_FOR - 1))  # an hour old: tried again, and remembered
    assert attempt()[1] > 1 and attempt()[1] == 0
    os.chmod(entry, 0o664)  # an entry others could have written never suppresses a build
    assert attempt()[1] > 1 and attempt()[1] == 0
    if os.geteuid() == 0:
        subprocess.run(["sh", "-c", "id tgpeer || useradd -m tgpeer"], capture_output=True)
        import pwd

        os.chown(entry, pwd.getpwnam("tgpeer").pw_uid, -1)  # another account's entry: ignored
        assert attempt()[1] > 1 and attempt()[1] == 0
    cache.write(name, dict(cache.read(name), time=int(time.time()) + 10 * FAILED_FOR))  # dated in the future
    assert attempt()[1] > 1
    assert record.failure_name("k", "/usr/bin") != record.failure_name("k", "/bin")


def test_without_path_the_compilers_driver_gets_the_path_it_was_found_on(tmp_path, monkeypatch):
    """No PATH at all (a cleared environment): the compiler is found on the system's default path, and its
    driver runs with that path (where it finds the assembler and the linker), not with none. Before, the
    driver ran without PATH and could not find ld."""
    from torchgen_patch.fs import root as cache_root

    cxx, log = _broken_compiler(tmp_path)
    monkeypatch.setenv("CXX", cxx)
    monkeypatch.setenv(cache_root.ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("PATH")
    with pytest.raises(InputError):
        build.build({"a.cpp": b"int a;\n"}, [], 0, root=str(tmp_path / "builds"), sources=["a.cpp"])
    said = set(open(log + ".env").read().splitlines())
    assert said == {"PATH=" + (os.confstr("CS_PATH") or os.defpath)}, said


def test_only_a_process_without_path_builds_with_the_toolchain_enable_recorded(monkeypatch):
    """The recorded toolchain stands in for the one a cleared environment lacks: a process with a PATH of
    its own keeps its own toolchain; without PATH, the recorded compiler, its driver's PATH and its flags,
    while that compiler is there."""
    from torchgen_patch.runtime.compile import toolchain as tc

    table = {"cxx": sys.executable, "path": "/recorded/bin", "cflags": "-g"}  # any executable file will do
    with tc.recorded(table):
        assert tc.compiler_path() != sys.executable and tc.driver_path() == os.environ["PATH"]
    monkeypatch.delenv("PATH")
    with tc.recorded(table):
        assert (tc.compiler_path(), tc.driver_path(), tc.default_flags()) == (sys.executable, "/recorded/bin",
                                                                            build.CFLAGS + ("-g",))
        assert tc.driver_env()["PATH"] == "/recorded/bin"
    with tc.recorded(dict(table, cxx="/nonexistent/c++")):  # gone: the process's own (the default path)
        assert tc.driver_path() == (os.confstr("CS_PATH") or os.defpath)
    assert tc.driver_path() == (os.confstr("CS_PATH") or os.defpath)  # and nothing recorded outside the block


def test_a_compile_that_fails_under_run_stops_its_process_in_one_line(tmp_path):
    """run's process whose kernels do not compile stops, saying so in one line whose reason is the
    compiler's last error line (the command line's `build` keeps the whole story). Before, ninja's output
    followed the error line."""
    cxx, _ = _broken_compiler(tmp_path)
    r = _cli("run", "--", sys.executable, "-c", "import torch", env={"CXX": cxx})
    # left out: the line said before compiling, and run's line about the compiler (a Python script run with -I)
    lines = [x for x in r.stderr.splitlines() if not x.startswith(("torchgen-patch: compiling ",
                                                                    "torchgen-patch: NOT active in a child of pid "))]
    assert r.returncode == 2 and lines == ["torchgen-patch: error: the generated kernels do not compile: c++: fatal "
                                           "error: no assembler in this toolchain"], r.stderr
