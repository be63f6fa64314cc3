"""The cache is input: what another account (or a damaged disk) leaves there never reaches
generated C++, a lint verdict, a lock or a loaded library. Other owners are made with chown
(root only); a second, real account is made with useradd where a process must run as it."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

import torchgen_patch
from tests.conftest import ROOT
from tests.yaml_fixtures import GOLDEN_FUNCS, subset_yaml
from torchgen_patch import cache
from torchgen_patch.fs import root as cache_root
from torchgen_patch.errors import EnvironmentProblem
from torchgen_patch.files import private_dirs
from torchgen_patch.runtime.load import loader
from tests.test_trust import _sha, cached

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another account needs root")
INJECTED = 'int64_t dim) { std::system("touch PWNED"); } static void unused(int64_t'


# What the cache reader does with an entry holds for an entry of any yaml: the tests scan a small one
# (the goldens' ops and the _foreach_add_.List one test edits), not the installed torch's 3,101 functions.
FUNCS = [*GOLDEN_FUNCS, "_foreach_add_.List"]


def _cli(*argv, cache_dir, cwd=ROOT, env=None):
    """The CLI in a process of its own; gen and lint read the small yaml that ``warm`` put beside
    ``cache_dir`` (in yaml/), where there is one."""
    e = dict(os.environ, PYTHONPATH=ROOT, TORCHGEN_PATCH_CACHE=str(cache_dir), **(env or {}))
    small = os.path.join(os.path.dirname(str(cache_dir)), "yaml")
    if argv[0] in ("gen", "lint") and os.path.isdir(small):
        argv = (argv[0], "--native-functions", os.path.join(small, "native_functions.yaml"),
                "--tags", os.path.join(small, "tags.yaml"), *argv[1:])
    return subprocess.run([sys.executable, "-m", "torchgen_patch", *map(str, argv)], capture_output=True,
                          text=True, env=e, cwd=cwd)


@pytest.fixture
def warm(tmp_path):
    """A private cache with the scan and overlay of a small yaml in it, and the gen output from it."""
    c = tmp_path / "cache"
    os.mkdir(tmp_path / "yaml")
    subset_yaml(str(tmp_path / "yaml"), FUNCS)
    r = _cli("gen", "-o", tmp_path / "clean", cache_dir=c)
    assert r.returncode == 0, r.stderr
    [entry] = glob.glob(str(c / "scan-*.json"))
    return c, entry, tmp_path / "clean"


def _body(entry: str) -> dict:
    """An entry's JSON (after its proof line, where it has one)."""
    raw = open(entry, "rb").read()
    return json.loads(raw.partition(b"\n")[2] if raw.startswith(b"tgp-proof-") else raw)


def _edit(entry: str, change, sign: bool = True) -> None:
    """Change an entry's JSON; ``sign``: and prove it with the cache's own key, as only a process that
    read the key could (the entry must then be refused by what it says, not by its proof)."""
    data = _body(entry)
    change(data)
    body = json.dumps(data).encode()
    if sign:
        key = open(os.path.join(os.path.dirname(entry), cache.KEY_FILE), "rb").read()
        body = cache.sign(os.path.basename(entry), body, key)
    with open(entry, "wb") as fh:
        fh.write(body)


def _same_tree(a, b) -> bool:
    return sorted(os.listdir(a)) == sorted(os.listdir(b)) and all(
        open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in os.listdir(a))


def test_what_a_scan_writes_passes_its_own_validation(warm, tmp_path):
    """A warm re-run uses its entries (no note): the checks refuse what is wrong, not what is normal."""
    c, entry, clean = warm
    r = _cli("gen", "-v", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr


def test_a_cached_type_with_cpp_in_it_never_reaches_the_generated_kernels(warm, tmp_path):
    c, entry, clean = warm

    def poison(data):
        op = "aten::_cummax_helper"
        data["cpp"][op]["formals"][-1][0] = INJECTED
    _edit(entry, poison)
    r = _cli("gen", "-v", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "std::system" not in "".join(open(p).read() for p in glob.glob(str(tmp_path / "out" / "*")))
    assert _same_tree(tmp_path / "out", clean)
    assert f"note: cache entry {entry} ignored: ValueError: aten::_cummax_helper: C++ parameter; rebuilt" \
        in r.stderr.splitlines()
    assert INJECTED not in open(entry).read()  # rebuilt from the yaml


@pytest.mark.parametrize("field", ["unambiguous_name", "root_name", "call_args", "name"])
def test_every_cached_string_that_lands_in_cpp_is_validated(warm, tmp_path, field):
    c, entry, clean = warm

    def poison(data):
        op = "aten::_cummax_helper"
        if field == "name":
            row = next(r for r in data["records"] if r[0] == op)
            row[0] = 'aten::_cummax_helper", x); system("id'
        elif field == "call_args":
            data["cpp"][op]["call_args"][0] = "self); system(\"id\""
        else:
            data["cpp"][op][field] = "x(); system(\"id\"); void y"
    _edit(entry, poison)
    r = _cli("gen", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out", clean)


@pytest.mark.parametrize("change", ["swap_call_args", "other_op", "snapshot_arg"])
def test_cached_signatures_that_call_another_op_or_swap_arguments_are_not_used(warm, tmp_path, change):
    """Identifiers all, so C++ stays well-formed; but the kernel would redispatch to another op or with
    its arguments swapped: a scan derives both from the schema, so a cached entry must match exactly."""
    c, entry, clean = warm

    def poison(data):
        sig = data["cpp"]["aten::_foreach_add_.List"]
        if change == "swap_call_args":
            sig["call_args"][0], sig["call_args"][1] = sig["call_args"][1], sig["call_args"][0]
        elif change == "other_op":
            sig["unambiguous_name"] = "_foreach_sub__List"
        else:
            sig["call_args"][0] = "self_before"
    _edit(entry, poison)
    r = _cli("gen", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out", clean)


def test_cached_verdicts_set_to_covered_do_not_silence_lint(warm):
    c, entry, _ = warm
    before = _cli("lint", cache_dir=c)
    assert before.returncode == 1 and " 0 finding(s)" not in before.stdout

    def covered(data):
        for row in data["records"]:
            row[6] = "covered"
    _edit(entry, covered)
    after = _cli("lint", cache_dir=c)
    assert (after.returncode, after.stdout) == (1, before.stdout), after.stderr


@pytest.mark.parametrize("damage", ['{"records": [[1, 2]], "cpp": {}, "facts": []}', '{"records": 5}',
                                    '{"records": [], "cpp": [], "facts": 1}', "[1]", '{"cpp": {"a": 1}}'])
def test_damaged_entries_are_rebuilt_without_a_traceback(warm, tmp_path, damage):
    c, entry, clean = warm
    for name in glob.glob(str(c / "*.json")):
        open(name, "w").write(damage)
    r = _cli("gen", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out", clean)


def test_an_entry_others_can_write_or_a_symlink_is_not_read(warm, tmp_path):
    c, entry, clean = warm
    _edit(entry, lambda d: d["cpp"]["aten::_cummax_helper"].update(root_name="evil"))
    os.chmod(entry, 0o666)
    r = _cli("gen", "-v", "-o", tmp_path / "out", cache_dir=c)
    assert r.returncode == 0 and "is writable by group and others (mode 0666)" in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out", clean)
    elsewhere = tmp_path / "planted.json"
    shutil.copy(entry, elsewhere)
    os.unlink(entry)
    os.symlink(elsewhere, entry)
    r = _cli("gen", "-v", "-o", tmp_path / "out2", cache_dir=c)
    assert r.returncode == 0 and "cache entry" in r.stderr, r.stderr
    assert _same_tree(tmp_path / "out2", clean)


@pytest.mark.parametrize("cmd", ["gen", "lint"])
def test_a_cache_root_others_can_write_is_refused_by_gen_and_lint(warm, tmp_path, cmd):
    c, entry, _ = warm
    os.chmod(c, 0o777)
    r = _cli(cmd, *(["-o", tmp_path / "out"] if cmd == "gen" else []), cache_dir=c)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [
        f"torchgen-patch: error: {c} is writable by group and others (mode 0777): they could replace what is "
        f"there, so torchgen-patch uses no cache under {c} (hint: chmod go-w {c})"]
    assert not os.path.exists(tmp_path / "out")


@needs_root
@pytest.mark.parametrize("cmd", ["gen", "lint"])
def test_a_cache_root_owned_by_another_account_is_refused(warm, tmp_path, cmd):
    c, entry, _ = warm
    os.chown(c, NOBODY, -1)
    r = _cli(cmd, *(["-o", tmp_path / "out"] if cmd == "gen" else []), cache_dir=c)
    assert r.returncode == 3 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"torchgen-patch: error: {c} is owned by ")


def test_a_relative_cache_path_is_made_absolute_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", "rel-cache-x")
    first = cache_root.directory()
    monkeypatch.chdir("/")
    assert first == str(tmp_path / "rel-cache-x") == cache_root.directory()


# ---- libraries: load what was checked ---------------------------------------------------------------

def _mapped_inodes() -> set[int]:
    out = set()
    for line in open("/proc/self/maps"):
        parts = line.split()
        if len(parts) >= 6 and parts[4] != "0":
            out.add(int(parts[4]))
    return out


@pytest.mark.build
def test_the_file_that_is_loaded_is_the_file_that_was_checked(cached, monkeypatch):
    """Another account swaps the path between the check and the load: what loads is still the
    checked file (the swap is done by a hook on the loader, the worst moment for it)."""
    root, lib = cached
    ino = os.stat(lib).st_ino
    other = "/lib/x86_64-linux-gnu/libm.so.6" if os.path.exists("/lib/x86_64-linux-gnu/libm.so.6") else None
    if other is None:
        pytest.skip("no libm.so.6 to swap in")
    real = loader._dlopen
    swapped = []

    def swap_then_load(name):
        os.rename(lib, lib + ".orig")
        os.symlink(other, lib)
        swapped.append(name)
        return real(name)

    monkeypatch.setattr(loader, "_dlopen", swap_then_load)
    rep = torchgen_patch.install(library=lib)
    assert swapped and rep.registered and not rep.refused
    assert ino in _mapped_inodes()


@pytest.mark.build
def test_a_symlink_on_the_path_owned_by_another_account_is_refused(cached, tmp_path):
    root, lib = cached
    link = tmp_path / "link.so"
    os.symlink(lib, link)
    if os.geteuid() != 0:
        pytest.skip("lchown to another account needs root")
    os.lchown(link, NOBODY, -1)
    with pytest.raises(EnvironmentProblem) as e:
        loader.load(str(link), _sha(lib), str(tmp_path))
    assert e.value.message.startswith(f"{link} is owned by ")
    assert torchgen_patch.installed_ops() == []


@pytest.mark.build
@pytest.mark.parametrize("what", ["manifest", "src"])
def test_manifest_and_sources_others_can_write_are_refused(cached, what):
    root, lib = cached
    p = os.path.join(os.path.dirname(lib), "src")
    if what == "manifest":
        p = os.path.join(p, "torchgen_patch_manifest.json")
    os.chmod(p, os.stat(p).st_mode | 0o020)
    with pytest.raises(EnvironmentProblem) as e:
        torchgen_patch.install(library=lib)
    assert e.value.message.startswith(f"{p} is writable by its group")
    assert torchgen_patch.installed_ops() == []


# ---- locks and build directories ------------------------------------------------------------------

def _small_files(tmp_path):
    from tests.test_build import _fixture_library

    return _fixture_library(tmp_path)[1]


@pytest.mark.build
def test_a_planted_lock_symlink_is_refused_and_its_target_untouched(tmp_path, monkeypatch):
    from torchgen_patch.runtime import compile as build
    from torchgen_patch.runtime.compile.key import build_key
    from torchgen_patch.runtime.compile.toolchain import compiler_path, default_flags

    files = _small_files(tmp_path)
    root = tmp_path / "builds"
    private_dirs(str(root))
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.chmod(victim, 0o600)
    key = build_key(files, default_flags(), compiler_path())
    os.symlink(victim, root / f"build-{key[:24]}.lock")
    with pytest.raises(EnvironmentProblem) as e:
        build.build(files, [], 1, root=str(root))
    assert "lock" in e.value.message and victim.read_text() == "precious"
    assert not [n for n in os.listdir(root) if n.startswith(("build-", ".build-")) and not n.endswith(".lock")]


@needs_root
@pytest.mark.build
def test_nothing_is_compiled_into_a_directory_of_another_account(tmp_path):
    from torchgen_patch.runtime import compile as build

    files = _small_files(tmp_path)
    root = tmp_path / "theirs"
    private_dirs(str(root))
    os.chown(root, NOBODY, -1)
    with pytest.raises(EnvironmentProblem) as e:
        build.build(files, [], 1, root=str(root))
    assert e.value.message.startswith(f"{root} is owned by ")
    assert os.listdir(root) == [n for n in os.listdir(root) if n.startswith(".probe-")] == []


@pytest.mark.build
def test_a_no_change_build_renders_nothing_and_a_damaged_index_costs_only_time(library):
    """The library is found by the hash of its inputs: an unchanged `build` neither plans nor renders
    (no jinja2 imported); a damaged or foreign index entry is ignored and written again."""
    env = dict(os.environ, PYTHONPATH=ROOT)

    def build(*flags):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "torchgen_patch", "build", *flags],
                           capture_output=True, text=True, env=env, cwd=ROOT)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert r.stdout.strip() == library.path
        return {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}

    build()
    assert "jinja2" not in build()
    for _ in range(3):  # other test processes sharing the cache may write the entry again before this build
        for entry in glob.glob(os.path.join(cache_root.directory(), "library-*.json")):  # reads it (pytest -n)
            with open(entry, "w") as fh:
                json.dump({"library": "/etc/passwd"}, fh)
        replanned = "jinja2" in build()
        if replanned:
            break
    assert replanned  # planned and rendered again: the index named no build of the cache
    assert "jinja2" not in build()


SECOND = "tgp-second"


def _second_account(name: str = SECOND) -> int:
    """A real second local account (made with useradd, once), for what another user's process does."""
    import pwd

    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pass
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed")
    r = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"useradd failed: {r.stderr.strip()}")
    return pwd.getpwnam(name).pw_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="making and acting as a second account needs root")
def test_a_cache_another_account_prepared_is_refused_and_not_written_through(warm, tmp_path):
    """Another account makes the cache directory first (in a shared sticky /tmp) and plants an entry
    with C++ in it: gen refuses the whole cache, reads nothing from it and writes nothing into it."""
    import tempfile

    uid = _second_account()
    c, entry, clean = warm
    shared = tempfile.mkdtemp(prefix="tgp-shared-", dir="/tmp")
    try:
        os.chmod(shared, 0o1777)
        theirs = os.path.join(shared, "cache")
        planted = _body(entry)
        planted["cpp"]["aten::_cummax_helper"]["formals"][-1][0] = INJECTED
        pid = os.fork()
        if pid == 0:  # the other account's process
            try:
                os.setuid(uid)
                os.mkdir(theirs, 0o755)
                with open(os.path.join(theirs, os.path.basename(entry)), "w") as fh:
                    json.dump(planted, fh)
                os._exit(0)
            except BaseException:  # noqa: BLE001 — the forked child's sink: its exit status says it
                os._exit(1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert os.stat(theirs).st_uid == uid
        before = sorted(os.listdir(theirs))
        r = _cli("gen", "-o", tmp_path / "out", cache_dir=theirs)
        assert r.returncode == 3 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(f"torchgen-patch: error: {theirs} is owned by {SECOND} (uid {uid})")
        assert sorted(os.listdir(theirs)) == before and not os.path.exists(tmp_path / "out")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
