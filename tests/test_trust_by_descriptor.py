"""What is trusted is what was checked, and only that: the cache's directories are used through the
descriptors their checks ran on (a name swapped after the check changes nothing), a build runs in
a private leased directory and is never loaded by the build, a library states its own build and
is loaded under a name no other load used, cached facts are proven or made again, and leases,
not pids, say which temporary build is alive. Each case is one that the code before got wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from tests.conftest import ROOT
from tests.test_cache_input import SECOND, _cli, _edit, _same_tree, _second_account
from torchgen_patch import cache
from torchgen_patch.errors import EnvironmentProblem
from torchgen_patch.fs import leases
from torchgen_patch.fs import root as cache_root
from torchgen_patch.fs.load import private_copy

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as (and chown to) a second account needs root")
TRIVIAL = {"tgp_trivial.cpp": b'extern "C" int tgp_trivial() { return 1; }\n'}


@pytest.fixture(scope="module")
def warm_once(tmp_path_factory):
    """A private cache with the default scan and overlay in it, and the gen output from it (made once)."""
    d = tmp_path_factory.mktemp("warm")
    r = _cli("gen", "-o", d / "clean", cache_dir=d / "cache")
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture
def warm(warm_once, tmp_path):
    """A copy of ``warm_once`` of the test's own: (cache, its full scan entry, the clean gen output)."""
    c, clean = tmp_path / "cache", tmp_path / "clean"
    shutil.copytree(warm_once / "cache", c)
    shutil.copytree(warm_once / "clean", clean)
    [entry] = [str(c / n) for n in os.listdir(c) if n.startswith("scan-") and not n.endswith("-no-autograd.json")]
    return c, entry, clean


def _fixture_yaml(tmp_path):
    from tests.yaml_fixtures import subset_yaml

    d = tmp_path / "yaml"
    d.mkdir()
    return subset_yaml(str(d), ["_cummax_helper", "_cummin_helper"])


def _wrapper(tmp_path, name: str, body: str) -> str:
    """A C++ compiler that runs ``body`` (sh) first, then the real one."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\nexec {shutil.which('c++')} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def _owned_by(top: str, uid: int) -> list[str]:
    return sorted(os.path.relpath(os.path.join(b, n), top) for b, ds, ns in os.walk(top) for n in ds + ns
                  if os.lstat(os.path.join(b, n)).st_uid == uid)


def _their_cache(theirs: str, uid: int) -> None:
    """The other account's directory, ready to receive a build (a builds/ that anyone may write)."""
    os.makedirs(os.path.join(theirs, "builds"))
    for p in (theirs, os.path.join(theirs, "builds")):
        os.chmod(p, 0o777)
        os.chown(p, uid, -1)


@pytest.fixture
def shared_tmp():
    """A sticky, world-writable directory like /tmp, of its own."""
    d = tempfile.mkdtemp(prefix="tgp-shared-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---- the symlink flip at the cache path ---------------------------------------------------------------

@as_root
def test_a_symlink_of_another_account_at_the_cache_path_is_refused_before_anything_lands(tmp_path, shared_tmp):
    """The victim's TORCHGEN_PATCH_CACHE is a link in a sticky directory that another account owns; it
    points at the victim's own cache while it is checked, and at the other account's directory from
    the compiler's first call on (the flip, made by the compiler wrapper: the worst moment). The
    link is refused at once: nothing is read, compiled or written anywhere."""
    uid = _second_account()
    native, tags = _fixture_yaml(tmp_path)
    victim, theirs, link = (os.path.join(shared_tmp, n) for n in ("victim-real", "theirs", "victim-cache"))
    os.mkdir(victim, 0o700)
    _their_cache(theirs, uid)
    os.symlink(victim, link)
    os.lchown(link, uid, -1)
    flip = _wrapper(tmp_path, "cxx", f'[ "$1" = --version ] && ln -sfn {theirs} {link}.new && chown -h {uid} '
                                     f'{link}.new && mv -T {link}.new {link}')
    r = _cli("build", "--native-functions", native, "--tags", tags, cache_dir=link, env={"CXX": flip})
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        f"torchgen-patch: error: {link} is owned by {SECOND} (uid {uid}), not by you or root: torchgen-patch uses no "
        f"cache under {link} (hint: use a cache of your own (TORCHGEN_PATCH_CACHE), or, if you trust that account "
        "with your processes, name it in $TORCHGEN_PATCH_TRUSTED_OWNERS)"]
    assert _owned_by(theirs, 0) == [] and os.listdir(victim) == []


@as_root
def test_a_cache_path_swapped_after_its_check_changes_nothing_the_build_does(tmp_path, shared_tmp):
    """The victim's own cache passes its checks; then (at the compiler's first call) its name is made to
    point at another account's directory. The build goes on in the directory that was checked,
    through its descriptor: nothing lands in the other directory, and the library is not loaded
    from there (``install()``'s next step, reading the build, walks the path again: refused)."""
    uid = _second_account()
    victim, away, theirs = (os.path.join(shared_tmp, n) for n in ("victim", "victim.checked", "theirs"))
    os.mkdir(victim, 0o700)
    _their_cache(theirs, uid)
    swap = _wrapper(tmp_path, "cxx", f'[ "$1" = --version ] && [ ! -e {away} ] && mv {victim} {away} && '
                                     f'ln -s {theirs} {victim} && chown -h {uid} {victim}')
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {ROOT!r})
        os.environ["CXX"] = {swap!r}
        from torchgen_patch.errors import ToolError
        from torchgen_patch.runtime import artifact_at
        from torchgen_patch.runtime import compile as build
        lib = build.build({TRIVIAL!r}, [], 1, sources=list({TRIVIAL!r}), log=open(os.devnull, "w"))
        try:
            artifact_at(lib.path, "build")  # what install() reads next, then loads
        except ToolError as e:
            print(e.render(), file=sys.stderr)
            sys.exit(e.exit_code)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TORCHGEN_PATCH_CACHE=victim))
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"torchgen-patch: error: {victim} is owned by {SECOND} (uid {uid})")
    assert _owned_by(theirs, 0) == []
    [built] = [n for n in os.listdir(os.path.join(away, "builds")) if not n.endswith(".lock")]
    assert built.startswith("build-")
    assert any(n.endswith(".so") for n in os.listdir(os.path.join(away, "builds", built)))


# ---- leases, namespaces, forks ----------------------------------------------------------------------------

def _slow_build_code(root: str, cxx: str, then: str = "") -> str:
    return textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {ROOT!r})
        os.environ["CXX"] = {cxx!r}
        from torchgen_patch.runtime import compile as build
        lib = build.build({TRIVIAL!r}, [], 1, root={root!r}, sources=list({TRIVIAL!r}))
        print("BUILT", lib.path, flush=True)
        {then}
    """)


def _temporary(root: str, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = [n for n in os.listdir(root) if n.startswith(".build-")] if os.path.isdir(root) else []
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no temporary build appeared in {root}")


def _compiling(root: str, seconds: float = 60) -> bool:
    """Whether ninja runs in a temporary directory of ``root`` (by its working directory), waiting for it."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/cwd").startswith(os.path.join(root, ".build-")) and \
                        b"ninja" in open(f"/proc/{pid}/cmdline", "rb").read():
                    return True
            except OSError:
                continue
        time.sleep(0.05)
    return False


def _free_pid() -> int:
    """A pid no process has in this PID namespace (a small one, far below where new pids are given)."""
    return next(p for p in range(60, 5000) if not os.path.exists(f"/proc/{p}"))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="unshare --pid needs root")
def test_a_build_of_another_pid_namespace_survives_the_stale_sweep(tmp_path):
    """A build running in another PID namespace (a container sharing the cache) under a pid that no
    process has here: its temporary directory is not swept while its lease is held, and the build
    finishes; once it is gone, a temporary directory it left would be swept."""
    from torchgen_patch.runtime import compile as build

    root = str(tmp_path / "builds")
    pid = _free_pid()
    cxx = _wrapper(tmp_path, "slow-cxx", '[ "$1" = --version ] || sleep 3')
    inner = _slow_build_code(root, cxx)
    # in the new namespace, fork until the child's pid is the one free here, and build there
    starter = textwrap.dedent(f"""
        import os, sys
        while True:
            child = os.fork()
            if child == 0:
                if os.getpid() == {pid}:
                    os.execv(sys.executable, [sys.executable, "-c", {inner!r}])
                os._exit(0)
            os.waitpid(child, 0)
            if child >= {pid}:
                break
    """)
    proc = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", starter], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        name = _temporary(root)
        assert f"-{pid}-" in name and not os.path.exists(f"/proc/{pid}")  # that pid is dead here
        assert build.remove_stale(root) == [] and os.path.isdir(os.path.join(root, name))
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "BUILT" in out, err
    assert not [n for n in os.listdir(root) if n.startswith(".build-")]


def test_a_killed_builds_lease_expires_with_it(tmp_path):
    """The other side: a temporary build whose process is gone (SIGKILL, its lease released by the
    kernel) is swept by the next build, and said so."""
    from torchgen_patch.runtime import compile as build

    root = str(tmp_path / "builds")
    cxx = _wrapper(tmp_path, "slow-cxx", '[ "$1" = --version ] || sleep 30')
    proc = subprocess.Popen([sys.executable, "-c", _slow_build_code(root, cxx)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    name = _temporary(root)
    assert _compiling(root), "the build never started its compiler"
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    notes = []
    with cache_root.notes_to(notes.append):
        assert build.remove_stale(root) == [name]
    assert notes == [f"removed {os.path.join(root, name)}, left by process {proc.pid} on {os.uname().nodename}, "
                     "which is gone"]


def test_a_child_forked_while_a_thread_builds_leaves_its_parents_compilers_alone(tmp_path):
    """A thread builds; the main thread forks a child, which exits normally (its atexit handlers run).
    The child ends none of its parent's build processes: the parent's build finishes."""
    root = str(tmp_path / "builds")
    cxx = _wrapper(tmp_path, "slow-cxx", '[ "$1" = --version ] || sleep 3')
    code = textwrap.dedent(f"""
        import os, sys, threading, time
        sys.path.insert(0, {ROOT!r})
        os.environ["CXX"] = {cxx!r}
        from torchgen_patch.runtime import compile as build
        result = []
        def work():
            try:
                result.append(build.build({TRIVIAL!r}, [], 1, root={root!r}, sources=list({TRIVIAL!r})).path)
            except Exception as e:
                result.append(f"FAILED {{type(e).__name__}}: {{e}}")
        t = threading.Thread(target=work)
        t.start()
        sys.path.insert(0, {ROOT!r})
        from tests.test_trust_by_descriptor import _compiling
        assert _compiling({root!r}), "the build never started ninja"
        if os.fork() == 0:
            sys.exit(0)  # the child: a normal exit, atexit handlers and all
        os.wait()
        t.join()
        print(result[0])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(root) and r.stdout.strip().endswith(".so"), r.stdout + r.stderr


# ---- what is loaded is what was checked -------------------------------------------------------------------

RUNTIME_OP = "tgp_test::write_one"


def test_a_reused_descriptor_number_never_loads_another_library(library, tmp_path):
    """A program closes its descriptors after the kernels were installed (daemon libraries do); the
    boxed library's checked descriptor then gets the kernels library's number again. What dlopen
    returns is still the boxed library: every load has a name of its own."""
    from torchgen_patch.runtime.compile import build_boxed

    boxed = build_boxed(log=open(os.devnull, "w")).path
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {ROOT!r})
        import torch, torchgen_patch
        import testbed.custom_ops  # noqa: F401
        os.closerange(3, 4096)  # the kernels library's descriptor gets the first free number
        first = torchgen_patch.install(library={library.path!r})
        assert first.registered, first.summary()
        os.closerange(3, 4096)  # as a daemon does
        rep = torchgen_patch.install(runtime_ops=[{RUNTIME_OP!r}], boxed_library={boxed!r})
        print(rep.registered)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.strip() == str([RUNTIME_OP])


LOAD = """
import sys
sys.path.insert(0, {root!r})
import torch, torchgen_patch
from torchgen_patch.errors import ToolError
{before}
try:
    rep = torchgen_patch.install(library={lib!r})
    print("REGISTERED", len(rep.registered))
except ToolError as e:
    print(e.render(), file=sys.stderr)
    sys.exit(e.exit_code)
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="unmounting /proc needs root")
def test_without_proc_the_library_loads_from_a_private_copy(library):
    code = LOAD.format(root=ROOT, lib=library.path, before="import os; assert not os.path.isdir('/proc/self/fd')")
    r = subprocess.run(["unshare", "--mount", "sh", "-c", 'umount -l /proc && exec "$0" -c "$1"', sys.executable,
                        code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.strip() == f"REGISTERED {len(library.ops)}"


@as_root
def test_without_proc_a_temporary_directory_of_another_account_is_named_as_the_problem(tmp_path, monkeypatch):
    """The private copy is made in $TMPDIR: when that directory is another account's, the line names
    TMPDIR as what to change, not the cache."""
    import tempfile

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setattr(tempfile, "tempdir", str(theirs))
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF")
    fd = os.open(lib, os.O_RDONLY)
    try:
        with pytest.raises(EnvironmentProblem) as e:
            with private_copy(fd, str(lib)):
                pass
    finally:
        os.close(fd)
    assert e.value.message.startswith(f"{theirs} is owned by nobody (uid 65534), not by you or root: ")
    assert e.value.hint == "set TMPDIR to a directory of your own" and os.listdir(theirs) == []


def test_no_free_descriptor_is_said_as_such_never_as_a_damaged_build(library):
    before = ("import torchgen_patch.runtime.install, torchgen_patch.runtime.compile, torchgen_patch.codegen.render\n"
              "import resource, os\nresource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\nheld = []\n"
              "while True:\n    try:\n        held.append(os.open('/dev/null', os.O_RDONLY))\n"
              "    except OSError:\n        break")
    r = subprocess.run([sys.executable, "-c", LOAD.format(root=ROOT, lib=library.path, before=before)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.splitlines()
    assert "no free file descriptor" in line and "ulimit -n" in line, line
    assert "build again" not in line and "not a complete" not in line and "missing" not in line, line


DEEP = b"[" * 100_000  # JSON nested far deeper than the decoder recurses


def test_a_build_record_nested_too_deeply_is_one_line(tmp_path):
    """install(library=) of a build whose build-info.json is nested 100,000 deep: one line naming the
    library, exit 2, never a RecursionError."""
    build = tmp_path / "build"
    build.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    (build / "lib.so").write_bytes(b"\x7fELF not really a library")
    (build / "build-info.json").write_bytes(DEEP)
    r = subprocess.run([sys.executable, "-c", LOAD.format(root=ROOT, lib=str(build / "lib.so"), before="")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == (f"{build / 'lib.so'}: error: not a complete torchgen-patch build (build-info.json: nested "
                        "more than 64 levels deep: line 1 column 65 (char 64))\n"), r.stderr


def test_cache_entries_and_leases_nested_too_deeply_are_ignored(tmp_path, monkeypatch):
    """A proven entry (the same account can sign) and a temporary build's lease holding JSON nested
    deeper than the decoder recurses: the entry is ignored (a -v note), the lease judged as unreadable,
    never a RecursionError."""
    monkeypatch.setenv(cache_root.ENV, str(tmp_path / "cache"))
    cache.write("scan-deep.json", {"x": 1})
    assert cache.read("scan-deep.json") == {"x": 1}
    with cache.open_root() as r:
        k = r.read(cache.KEY_FILE)
        r.replace("scan-deep.json", cache.sign("scan-deep.json", DEEP, k))
        with r.mkdtemp("tmp-") as t:
            os.write(os.open(leases.LEASE, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=t.fd), DEEP[:4096])
            os.utime(t.fd, (0, 0))  # old enough for a lease that died while starting
        notes = []
        with cache_root.notes_to(notes.append):
            assert cache.read("scan-deep.json") is None
            assert len(leases.sweep(r, ("tmp-",))) == 1
    assert notes[0].endswith("scan-deep.json ignored: damaged (JSONDecodeError)"), notes


def test_a_cache_reached_through_a_symlink_names_its_builds_where_they_are(tmp_path, monkeypatch):
    """$TORCHGEN_PATCH_CACHE a link of one's own to the real root: a build path under the root the walk
    reached is one of this cache (as under the root as named); one beside it, or not normalised, is not."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "link")
    monkeypatch.setenv(cache_root.ENV, str(tmp_path / "link"))
    monkeypatch.setattr(cache, "_WALKED", {})
    cache.write("x.json", {"x": 1})  # the root exists
    assert cache.names_a_build(str(real / "builds" / "build-1" / "lib.so"))
    assert cache.names_a_build(str(tmp_path / "link" / "builds" / "build-1" / "lib.so"))
    assert not cache.names_a_build(str(tmp_path / "builds" / "build-1" / "lib.so"))
    assert not cache.names_a_build(str(real / "builds" / ".." / "x.json"))


EXHAUST = ("import resource, os\nresource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\nheld = []\nwhile True:\n"
           "    try:\n        held.append(os.open('/dev/null', os.O_RDONLY))\n    except OSError:\n        break\n")


@pytest.mark.parametrize("entry", ["install", "cli"])
def test_no_free_descriptor_at_the_first_call_is_one_line_exit_3(entry, tmp_path):
    """Nothing of the tool imported yet but its package: the first install() (or a command) meets the
    exhaustion at a lazy import, never as an OSError traceback."""
    native = tmp_path / "native_functions.yaml"
    native.write_text("- func: f(Tensor a) -> Tensor\n")
    call = "rep = torchgen_patch.install(library='/nonexistent/lib.so')" if entry == "install" else \
        f"from torchgen_patch.cli import main\n    sys.exit(main(['lint', {str(native)!r}]))"
    code = (f"import sys\nsys.path.insert(0, {ROOT!r})\nimport torch, torchgen_patch\n"
            "from torchgen_patch.errors import ToolError\n" + EXHAUST +
            f"try:\n    {call}\nexcept ToolError as e:\n    print(e.render(), file=sys.stderr)\n"
            "    sys.exit(e.exit_code)\n")
    if entry == "cli":
        code = code.replace("import torch, torchgen_patch\n", "import torchgen_patch.cli\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("torchgen-patch: error: cannot open ") and "no free file descriptor (EMFILE" in line, line


# ---- a library states its own build; torch's refusal is one line ------------------------------------------

def _small_library(tmp_path, edit=None):
    """A library of the fixture's kernel, built into a root of its own (``edit``: applied to the rendered
    sources first)."""
    from tests.test_build import _fixture_library
    from torchgen_patch.runtime import compile as build

    plan, files = _fixture_library(tmp_path, funcs=("_cummax_helper",))
    if edit:
        files = {n: edit(n, data) for n, data in files.items()}
    return build.build(files, plan.ops(), 1, root=str(tmp_path / "builds"), log=open(os.devnull, "w"))


def test_a_kernel_torch_refuses_is_one_line_never_sigabrt(tmp_path):
    """A kernel whose C++ type is not the one the schema gives (what a tampered scan would make):
    torch's dispatcher refuses it with a c10::Error, which must not cross the library's C entry
    point (it aborted the process): one line, exit 3, nothing registered."""
    def wrong_type(name, data):
        return data.replace(b"int64_t dim", b"double dim") if name.endswith(".cpp") else data

    lib = _small_library(tmp_path, wrong_type)
    r = subprocess.run([sys.executable, "-c", LOAD.format(root=ROOT, lib=lib.path, before="")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 3, (r.returncode, r.stderr)  # not -6 (SIGABRT)
    [line] = r.stderr.splitlines()
    assert line.startswith(f"torchgen-patch: error: torch refused the kernels of {lib.path}: ") and \
        "nothing was registered" in line, line


def test_a_library_is_refused_when_it_states_another_torch_or_another_build(library, tmp_path, monkeypatch):
    """The record can say anything; the library's own statement decides: a torch that is not the one it
    was built against, or a library that is not the build its record names, is not registered."""
    import torch

    import torchgen_patch
    from torchgen_patch.errors import EnvironmentProblem
    from torchgen_patch.runtime import compile as build

    copy = tmp_path / os.path.basename(library.directory)
    shutil.copytree(library.directory, copy)
    os.chmod(copy, 0o700)
    key = json.load(open(copy / build.RECORD))["key"]
    lib = build.Library(str(copy / os.path.basename(library.path)), str(copy), tuple(library.ops), False)
    monkeypatch.setattr(torch, "__version__", "2.14.1")
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    info = os.path.join(lib.directory, build.RECORD)
    rec = json.load(open(info))
    rec["torch"] = "2.14.1"
    json.dump(rec, open(info, "w"))
    with pytest.raises(EnvironmentProblem) as e:
        torchgen_patch.install(library=lib.path)
    assert e.value.message.startswith(f"{lib.path} was built against another torch: version '") and \
        "(this torch: '2.14.1')" in e.value.message and e.value.message.endswith(": it is not registered")
    assert torchgen_patch.installed_ops() == []
    monkeypatch.undo()
    rec["key"] = "0" * 64
    rec["torch"] = torch.__version__
    json.dump(rec, open(info, "w"))
    with pytest.raises(EnvironmentProblem) as e:
        torchgen_patch.install(library=lib.path)
    assert e.value.message.startswith(f"the library loaded for {lib.path} is the build {key[:24]}, not 0000")
    assert torchgen_patch.installed_ops() == []


# ---- cached facts: proven, or made again ------------------------------------------------------------------

def test_a_cached_type_edited_without_the_key_never_reaches_a_kernel(warm, tmp_path):
    c, entry, clean = warm

    def retype(data):
        formals = data["cpp"]["aten::_cummax_helper"]["formals"]
        formals[-1][0] = "double"  # a word of torchgen's C++ API: the form is valid, the content is not
    _edit(entry, retype, sign=False)
    r = _cli("gen", "-v", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out", clean)
    assert f"note: cache entry {entry} ignored: not written by torchgen-patch with this cache's key (edited, " \
           "damaged or from elsewhere)" in r.stderr.splitlines()


def test_a_cached_type_even_with_a_valid_proof_is_made_again_from_the_schema(warm, tmp_path):
    """Who holds the key (a process of the same account) can prove any entry; the C++ types are still
    made from each schema by the function the scan uses, so a wrong one never reaches a kernel."""
    c, entry, clean = warm

    def retype(data):
        data["cpp"]["aten::_cummax_helper"]["formals"][-1][0] = "double"
    _edit(entry, retype)
    r = _cli("gen", "-v", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out", clean)
    assert f"note: cache entry {os.path.basename(entry)}: the C++ signature of aten::_cummax_helper is not what its " \
           "schema gives (1 such); made from the schemas" in r.stderr.splitlines()


def _covered(data):
    """Every finding's verdict flipped with its facts, consistently (the verdict is what they give)."""
    from torchgen_patch.scan.classify import verdict_of
    from torchgen_patch.sources.facts import Facts, WrittenArg

    for row, facts in zip(data["records"], data["facts"], strict=True):
        if row[6] == "missing":
            facts[1] = True
            f = Facts(row[0], row[1], "", row[2], row[3], tuple(WrittenArg(*w) for w in row[4]), row[5], facts[0],
                      True, row[8], row[9], None)
            row[6], row[7] = verdict_of(f)


def test_flipped_verdicts_with_their_facts_do_not_silence_lint(warm):
    c, entry, _ = warm
    before = _cli("lint", cache_dir=c)
    assert before.returncode == 1 and " 0 finding(s)" not in before.stdout
    for n in (entry, entry.replace(".json", "-no-autograd.json")):
        if os.path.exists(n):
            _edit(n, _covered, sign=False)
    after = _cli("lint", cache_dir=c)
    assert (after.returncode, after.stdout) == (1, before.stdout), after.stderr


def test_emptied_autograd_facts_do_not_remove_the_requires_grad_refusal(warm, tmp_path):
    c, entry, clean = warm
    refusals = "".join(open(p).read() for p in (clean / n for n in os.listdir(clean)) if p.suffix == ".cpp")
    assert refusals.count("torchgen_patch::refuse_requires_grad(") > 50  # the out= kernels' refusals

    def empty(data):
        for row in data["records"]:
            row[10], row[11], row[12] = "", "", []
    _edit(entry, empty, sign=False)
    r = _cli("gen", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out", clean)


def test_the_proof_costs_what_reading_the_entry_costs(warm):
    """The measure of the proof: an HMAC-SHA256 over the entry, in the same pass as reading it."""
    c, entry, _ = warm
    raw = open(entry, "rb").read()
    key = open(os.path.join(c, cache.KEY_FILE), "rb").read()
    head, _, body = raw.partition(b"\n")
    t = time.perf_counter()
    for _ in range(10):
        assert cache.sign(os.path.basename(entry), body, key) == raw
    per = (time.perf_counter() - t) / 10
    assert per < 0.05, f"{per * 1000:.1f} ms for {len(raw) // 1024} KiB"


# ---- the prebuilt kernels' record ---------------------------------------------------------------------------

def _fake_dist(tmp_path, digest_of=b"\x7fELF not really a library"):
    """An installed kernels distribution (its metadata and package), library and record made by hand."""
    from torchgen_patch.runtime import prebuilt
    from torchgen_patch.runtime.compile.key import torch_identity
    from torchgen_patch.version import __version__

    site = tmp_path / "site"
    pkg = site / prebuilt.PACKAGE
    info = site / f"{prebuilt.PACKAGE}-0.0.1.dist-info"
    pkg.mkdir(parents=True)
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {prebuilt.DIST}\nVersion: 0.0.1\n")
    (pkg / "lib.so").write_bytes(digest_of)
    import hashlib

    rec = {"format": prebuilt.FORMAT, "torchgen_patch": __version__, "torch": torch_identity(),
           "library": "lib.so", "sha256": hashlib.sha256(digest_of).hexdigest(), "key": "0" * 64,
           "overlay_sha256": prebuilt.overlay_sha256(__import__("torchgen_patch.sources",
                                                                fromlist=["Options"]).Options()),
           "plan": {"kernels": []}}
    (pkg / prebuilt.RECORD).write_text(json.dumps(rec))
    for p in (site, pkg, info):
        os.chmod(p, 0o755)
    return site, pkg


LOOKUP = """
import sys
sys.path[:0] = [{site!r}, {root!r}]
from torchgen_patch.runtime import prebuilt
from torchgen_patch.sources import Options
found, why = prebuilt.lookup(Options())
print("FOUND" if found else why)
"""


@pytest.mark.parametrize("how", ["0666", "symlink"])
def test_a_prebuilt_record_others_could_write_or_a_symlink_is_not_read(tmp_path, how):
    from torchgen_patch.runtime import prebuilt

    site, pkg = _fake_dist(tmp_path)
    rec = pkg / prebuilt.RECORD
    assert subprocess.run([sys.executable, "-c", LOOKUP.format(site=str(site), root=ROOT)], capture_output=True,
                          text=True).stdout.strip() == "FOUND"  # the well-made one is used
    if how == "0666":
        os.chmod(rec, 0o666)
    else:
        elsewhere = tmp_path / "theirs.json"
        shutil.move(rec, elsewhere)
        os.symlink(elsewhere, rec)
        if os.geteuid() == 0:
            os.chown(elsewhere, _second_account(), -1)
    r = subprocess.run([sys.executable, "-c", LOOKUP.format(site=str(site), root=ROOT)], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    said = r.stdout.strip()
    assert said.startswith(f"{prebuilt.DIST} 0.0.1: its record.json is not used: {rec} is "), said
    assert ("writable by group and others (mode 0666)" if how == "0666" else "a symlink") in said, said


# ---- smaller ---------------------------------------------------------------------------------------------

def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    """The XDG spec: a relative $XDG_CACHE_HOME is invalid and ignored (else each working directory
    would have a cache of its own)."""
    monkeypatch.delenv("TORCHGEN_PATCH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative-xdg")
    monkeypatch.chdir(tmp_path)
    assert cache_root.directory() == os.path.join(os.path.expanduser("~/.cache"), "torchgen-patch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))
    assert cache_root.directory() == str(tmp_path / "abs" / "torchgen-patch")


def test_a_cache_that_is_no_directory_is_said_so():
    r = _cli("lint", cache_dir="/dev/null")
    assert r.returncode == 3 and r.stderr.splitlines() == [
        "torchgen-patch: error: /dev/null is not a directory (hint: set TORCHGEN_PATCH_CACHE to a directory of yours)"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="reading as an account that cannot write the cache: root without CAP_DAC_OVERRIDE")
def test_a_shared_read_only_cache_lacking_a_build_says_the_build_directory_is_not_writable(tmp_path):
    """A cache another account built and shares read-only (it owns it; its readers name it in
    TORCHGEN_PATCH_TRUSTED_OWNERS); a build a reader needs is not there: "build directory is not
    writable", as SECURITY.md says, not "remove …lock"."""
    uid = _second_account()
    native, tags = _fixture_yaml(tmp_path)
    shared = tmp_path / "shared"
    (shared / "builds").mkdir(parents=True)
    for p in (shared, shared / "builds"):
        os.chmod(p, 0o755)
        os.chown(p, uid, -1)
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHGEN_PATCH_CACHE=str(shared), TORCHGEN_PATCH_TRUSTED_OWNERS=SECOND)
    r = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", sys.executable, "-m",
                        "torchgen_patch", "build", "--native-functions", native, "--tags", tags],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"{shared / 'builds'}: error: build directory is not writable: Permission denied (hint: set "
        "TORCHGEN_PATCH_CACHE to a cache of your own (a directory you can write))"), r.stderr
    assert os.listdir(shared / "builds") == []


def test_a_one_kernel_build_says_one_kernel(run_cli, monkeypatch, tmp_path):
    """Counts in the build's own words: "1 kernel", never "1 kernels"."""
    from tests.test_cli_flags import _stub_build
    from tests.yaml_fixtures import subset_yaml

    _stub_build(monkeypatch)
    native, tags = subset_yaml(str(tmp_path), ["_cummax_helper"])
    rc, out, err = run_cli("build", "--native-functions", native, "--tags", tags, "--no-overlay")
    assert (rc, out, err) == (0, "/x.so\n", "build: 1 kernel; up to date (cache hit)\n")
