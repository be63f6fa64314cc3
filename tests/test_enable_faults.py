"""An enabled environment under faults: a build that cannot be used and none that can be made (the
programs run unpatched, one line each; --strict stops them), damaged files (no start ever fails, and
the documented repair works as written), the hook gone (status and disable still work), atomic
writes; and the saved-tensor check turned on for the whole environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_enable import Env, wheel

END = "import torch; print('end')"
UNPATCHED = re.compile(r"^torchgen-patch: NOT active in pid \d+ \(python -c, enabled\), running unpatched: (.+) "
                       r"\(hint: (.*)`torchgen-patch enable --strict` stops such a process instead\)$")


@pytest.fixture(scope="module")
def cached(tmp_path_factory, wheel):
    """One environment with a cache of its own (its build is made unusable here, and put back)."""
    d = tmp_path_factory.mktemp("faults")
    cache = d / "cache"
    e = Env(d / "venv", wheel)
    e.cache = str(cache)
    return e


def _tool(env, *args, **kw):
    return env.run("-m", "torchgen_patch", *args, env={"TORCHGEN_PATCH_CACHE": env.cache}, **kw)


def _prog(env, extra=None, code=END):
    return env.run("-c", code, env=dict({"TORCHGEN_PATCH_CACHE": env.cache}, **(extra or {})))


def _library(env) -> str:
    with open(os.path.join(env.site, "torchgen_patch_enable.json")) as fh:
        return json.load(fh)["library"]


def _no_compiler(env) -> dict:
    """PATH with no c++, g++ or ninja (an empty directory); CXX, where this environment sets one, a
    name found nowhere."""
    empty = os.path.join(os.path.dirname(env.cache), "empty-bin")
    os.makedirs(empty, exist_ok=True)
    return dict({"PATH": empty}, **{k: os.path.join(empty, "c++") for k in ("CXX", "CC") if k in os.environ})


def _cases(env):
    """The four ways the named build cannot be used, none made instead: (what the line says, make it so,
    undo it, the program's environment)."""
    lib = _library(env)
    d = os.path.dirname(lib)
    dmode, lmode = os.stat(d).st_mode & 0o7777, os.stat(lib).st_mode & 0o7777
    return [
        ("writable by its group", lambda: os.chmod(d, dmode | 0o020), lambda: os.chmod(d, dmode), {}),
        ("writable by others", lambda: os.chmod(lib, lmode | 0o002), lambda: os.chmod(lib, lmode), {}),
        ("is owned by nobody", lambda: os.chown(lib, 65534, -1), lambda: os.chown(lib, 0, -1), {}),
        ("compiler", lambda: os.rename(env.cache, env.cache + ".away"),  # no compiler, the cache and its build gone
         lambda: os.rename(env.cache + ".away", env.cache), _no_compiler(env)),
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="the library of another account needs root to chown")
def test_an_unusable_build_leaves_every_program_running_unpatched_unless_strict(cached):
    """Each case, fail open: the program runs to its end (rc 0) and stderr is one line with the cause and
    the fix; enabled --strict: exit 3, the error in one line; status says which is in force. Before this
    change each of them exited 3 at `import torch` (no fail-open path, no --strict)."""
    env = cached
    for strict in (False, True):
        r = _tool(env, "enable", *(["--strict"] if strict else []))
        assert r.returncode == 0, r.stderr
        r = _tool(env, "status")
        says = "strict: a process that cannot have the kernels stops (exit 3)" if strict else \
            "fail open: a process that cannot have the kernels runs unpatched, said in one line"
        assert r.returncode == 0 and says in r.stdout, r.stdout
        for name, break_it, undo, extra in _cases(env):
            break_it()
            try:
                r = _prog(env, extra)
            finally:
                undo()
            if strict:
                assert (r.returncode, r.stdout) == (3, ""), (name, r.stderr)
                assert r.stderr.count("\n") == 1 and ": error: " in r.stderr and \
                    name in r.stderr, (name, r.stderr)
            else:
                assert (r.returncode, r.stdout) == (0, "end\n"), (name, r.stderr)
                line = UNPATCHED.match(r.stderr.rstrip("\n"))
                assert r.stderr.count("\n") == 1 and line and name in line.group(1), (name, r.stderr)
        r = _prog(env)  # everything put back: patched again
        assert r.returncode == 0 and "kernels active" in r.stderr and "NOT" not in r.stderr, r.stderr


def _repair() -> str:
    """The repair of docs/enable.md, exactly as written there."""
    text = open(os.path.join(ROOT, "docs", "enable.md"), encoding="utf-8").read()
    section = text.split("### When no interpreter of the environment starts", 1)[1]
    return section.split("```sh\n", 1)[1].split("\n```", 1)[0]


def test_a_pth_of_bytes_not_utf8_is_repaired_by_the_documented_line_then_status_and_disable_work(cached):
    """A .pth with non-UTF-8 bytes (as damage, or an older version's file, would leave it) stops every
    interpreter in site (Python's own behaviour); the documented line, run as written with the
    environment's python first on PATH, removes it; status then names the data file left over and
    disable removes it and the RECORD lines, rc 0, no traceback."""
    env = cached
    assert _tool(env, "enable").returncode == 0
    with open(env.pth, "wb") as fh:
        fh.write(b"import os # \xff\xfe damaged\n")
    r = env.run("-c", "pass")
    if r.returncode == 0:
        pytest.skip("this locale decodes any byte: the interpreter starts")
    assert "init_import_site" in r.stderr
    path = os.path.dirname(env.python) + os.pathsep + os.environ["PATH"]
    r = subprocess.run(["sh", "-c", _repair()], capture_output=True, text=True, env=dict(os.environ, PATH=path),
                       cwd="/")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert not os.path.exists(env.pth) and os.path.exists(os.path.join(env.site, "torchgen_patch_enable.json"))
    r = _tool(env, "status")
    assert r.returncode == 1 and "torchgen_patch_enable.json is left over: `torchgen-patch disable` removes it" \
        in r.stdout, r.stdout + r.stderr
    r = _tool(env, "disable")
    assert r.returncode == 0 and r.stdout.startswith("disabled: removed ") and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(env.site, "torchgen_patch_enable.json"))
    assert "torchgen_patch_enable" not in open(env.record).read()


@pytest.mark.parametrize("base", ["/usr/bin/python3", sys.executable])
def test_the_documented_repair_finds_the_file_in_a_venv_of_any_python(base, tmp_path):
    """Under -S, Debian's and Ubuntu's Python pick a site-packages scheme of their own (posix_local:
    /usr/local/lib/pythonX/dist-packages) and no Python knows its venv: the line finds the file in a venv
    made from the system's Python as from this one's, removes only it and says where it was."""
    if not os.path.exists(base):
        pytest.skip(f"no {base}")
    venv = tmp_path / "v"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pth = os.path.join(site, "torchgen_patch_enable.pth")
    with open(pth, "wb") as fh:
        fh.write(b"import os # \xff\xfe damaged\n")
    open(os.path.join(site, "other.pth"), "w").close()
    r = subprocess.run(["sh", "-c", _repair()], capture_output=True, text=True, cwd="/",
                       env=dict(os.environ, PATH=str(venv / "bin") + os.pathsep + os.environ["PATH"]))
    assert (r.returncode, r.stderr, r.stdout) == (0, "", f"removed {os.path.realpath(pth)}\n"), r.stderr
    assert not os.path.exists(pth) and os.path.exists(os.path.join(site, "other.pth"))
    assert subprocess.run([python, "-c", "pass"]).returncode == 0


def test_a_truncated_data_file_starts_every_program_with_one_line_and_no_syntax_error(cached):
    """Cut in the middle: a program that never imports torch says nothing, one that does runs to its
    end with one line naming the data file; never a SyntaxError at start (the .pth names no data)."""
    env = cached
    assert _tool(env, "enable").returncode == 0
    data = os.path.join(env.site, "torchgen_patch_enable.json")
    whole = open(data, "rb").read()
    with open(data, "wb") as fh:
        fh.write(whole[:len(whole) // 2])
    r = env.run("-c", "print('started')")
    assert (r.returncode, r.stdout, r.stderr) == (0, "started\n", "")
    r = _prog(env)
    assert (r.returncode, r.stdout) == (0, "end\n") and "SyntaxError" not in r.stderr, r.stderr
    assert re.fullmatch(rf"torchgen-patch: NOT active in pid \d+: {re.escape(data)}: not a launch spec of "
                        r"torchgen-patch \(JSONDecodeError: .*\) \(hint: `torchgen-patch enable` writes it again, "
                        r"`torchgen-patch disable` removes it\)\n", r.stderr), r.stderr
    r = _tool(env, "status")
    assert r.returncode == 1 and f"{data} is damaged" in r.stdout


def test_the_hook_gone_status_and_disable_still_work_and_a_program_says_it_once(cached):
    """The installed tool's own hook file removed: status names it (exit 1), disable removes both files
    (exit 0), one line each, no traceback; before, both failed with an ImportError (enable.py imported
    the hook) and the .pth stayed."""
    env = cached
    assert _tool(env, "enable").returncode == 0
    hook = os.path.join(env.site, "torchgen_patch", "runtime", "site", "_torchgen_patch_hook.py")
    os.rename(hook, hook + ".away")
    try:
        r = _prog(env)
        assert (r.returncode, r.stdout) == (0, "end\n") and r.stderr.count("\n") == 1, r.stderr
        assert f"its hook {hook} is gone" in r.stderr and r.stderr.startswith("torchgen-patch: NOT active in pid ")
        r = _tool(env, "status")
        assert r.returncode == 1 and f"its hook {hook} is gone" in r.stdout and "Traceback" not in r.stderr, r.stderr
        r = _tool(env, "disable")
        assert r.returncode == 0 and "Traceback" not in r.stderr and r.stdout.count("\n") == 1, r.stderr
        assert not os.path.exists(env.pth) and not os.path.exists(os.path.join(env.site, "torchgen_patch_enable.json"))
    finally:
        os.rename(hook + ".away", hook)


def test_enable_check_saved_reaches_every_process_and_status_shows_it(cached):
    """enable --check-saved (warn, then raise): a program of the environment that writes a saved tensor
    through .data between forward and backward gets the warning (or the exception), after the line that
    says the check is on; status shows the mode (sampled by default, off where asked)."""
    env = cached
    assert _tool(env, "enable").returncode == 0
    assert "saved-tensor check: warn, 1 step in 32;" in _tool(env, "status").stdout
    assert _tool(env, "enable", "--check-saved=off").returncode == 0
    assert "saved-tensor check: off;" in _tool(env, "status").stdout
    prog = ("import torch\nx = torch.ones(3, requires_grad=True)\ny = torch.ones(3)\nz = (x * y).sum()\n"
            "y.data.mul_(2)\nz.backward()\nprint('backward done')\n")
    for mode in ("warn", "raise"):
        assert _tool(env, "enable", f"--check-saved={mode}").returncode == 0
        assert f"saved-tensor check: {mode}, every step;" in _tool(env, "status").stdout
        r = _prog(env, code=prog)
        on = re.search(rf"^torchgen-patch: saved-tensor check on \({mode}, every step\) in pid \d+", r.stderr, re.M)
        assert on and r.stderr.count("saved-tensor check on") == 1, r.stderr
        if mode == "warn":
            assert r.returncode == 0 and r.stdout == "backward done\n", r.stderr
            assert re.search(r"saved tensor|saved for backward", r.stderr[on.end():]), r.stderr
        else:
            assert r.returncode == 1 and r.stdout == "" and "Traceback" in r.stderr, r.stderr
    assert _tool(env, "disable").returncode == 0


def _spec(**kw) -> dict:
    from torchgen_patch.runtime import launch
    from torchgen_patch.sources import Options

    return launch.launch_spec(Options(), "python", kw.pop("ops", None), [], [], **kw)


def test_enable_writes_the_data_first_and_a_failure_leaves_the_old_state_whole(tmp_path, monkeypatch):
    """The .pth line names no data (the same bytes for any spec), so a kill after the data file was
    replaced leaves the line loading the new data, whole; a write that fails after the data file puts
    the old data back (and removes new files where there were none): status reads the old spec, with no
    problem. Before, the one .pth file held the spec; there was no data file and no restore."""
    from torchgen_patch.errors import EnvironmentProblem
    from torchgen_patch.runtime.launch import enable as en

    site = tmp_path / "site-packages"
    site.mkdir()
    first = en.enable(_spec(ops=["aten::_cummin_helper"]), str(site))
    assert first.problem is None and first.spec.ops == ("aten::_cummin_helper",)
    line = (site / en.FILE).read_bytes()
    assert line.isascii() and line.count(b"\n") == 1 and line.startswith(b"import ")
    assert en.render(str(site)).encode() == line  # no spec in it: new data never makes it stale
    real, written = en._write, []

    def fail_after_data(path, data, where):
        if path.endswith(en.FILE):
            raise EnvironmentProblem(f"cannot write {path}: No space left on device")
        written.append(path)
        real(path, data, where)

    monkeypatch.setattr(en, "_write", fail_after_data)
    with pytest.raises(EnvironmentProblem, match="No space left"):
        en.enable(_spec(ops=None, quiet=True), str(site))
    assert written[0].endswith(en.DATA)  # the data file was written first, then put back
    after = en.state(str(site))
    assert after.problem is None and after.spec == first.spec and (site / en.FILE).read_bytes() == line
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EnvironmentProblem):
        en.enable(_spec(), str(empty))
    assert os.listdir(empty) == []  # nothing half-written: the new data file removed again
    monkeypatch.undo()
    (site / en.FILE).write_bytes(b"import os # \xff damaged\n")
    assert "not even UTF-8: Python's site stops every interpreter of this environment at start (repair: rm " \
        in en.state(str(site)).problem
    assert en.disable(str(site)).present and os.listdir(site) == []


def test_a_record_with_bytes_not_utf8_keeps_every_line_through_enable_and_disable(cached):
    """pip's RECORD with a line that is not UTF-8 (damage, another tool's edit): enable adds its two lines
    and disable takes them away, every other byte kept (it was written back holding only enable's lines,
    so `pip uninstall` left the package's files behind)."""
    env = cached
    assert _tool(env, "disable").returncode in (0, 1)
    with open(env.record, "ab") as fh:
        fh.write(b"caf\xe9.txt,,\n")
    before = open(env.record, "rb").read()
    r = _tool(env, "enable", "-q")
    assert r.returncode == 0, r.stderr
    during = open(env.record, "rb").read()
    assert during.startswith(before) and during.count(b"\n") == before.count(b"\n") + 2
    assert _tool(env, "disable").returncode == 0
    assert open(env.record, "rb").read() == before
    with open(env.record, "wb") as fh:
        fh.write(before.replace(b"caf\xe9.txt,,\n", b""))


def _edit_data(env, change=None) -> bytes:
    """Change the enabled environment's data file in place as its owner would (same file, same mode;
    ``change`` None: empty it); returns the bytes it had."""
    data = os.path.join(env.site, "torchgen_patch_enable.json")
    old = open(data, "rb").read()
    spec = json.loads(old)
    if change is not None:
        change(spec)
    with open(data, "w") as fh:
        fh.write(json.dumps(spec) if change is not None else "")
    return old


def _put_back(env, old: bytes) -> None:
    with open(os.path.join(env.site, "torchgen_patch_enable.json"), "wb") as fh:
        fh.write(old)


@pytest.mark.parametrize("strict", [False, True])
def test_a_broken_dependency_stops_a_strict_environments_program_only(cached, strict):
    """The tool's dependencies not where the data file says (a removed or broken dependency), where the
    process must plan (its cache gone): one line naming it; the program runs on unpatched, or with
    --strict stops with the error's exit code (it ran on before, whatever --strict said)."""
    env = cached
    assert _tool(env, "enable", "-q", *(["--strict"] if strict else [])).returncode == 0
    old = _edit_data(env, lambda spec: spec["roots"].update({n: "/nonexistent" for n in spec["roots"]
                                                             if n != "torchgen_patch"}))
    os.rename(env.cache, env.cache + ".away")
    try:
        r = _prog(env)
    finally:
        os.rename(env.cache + ".away", env.cache)
        _put_back(env, old)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("error: " if strict else "NOT active") in r.stderr and "yaml" in r.stderr, r.stderr
    assert (r.returncode, r.stdout) == ((2, "") if strict else (0, "end\n")), r.stderr


def test_an_empty_data_file_is_said_as_such(cached):
    env = cached
    assert _tool(env, "enable", "-q").returncode == 0
    old = _edit_data(env)
    try:
        r = _prog(env)
    finally:
        _put_back(env, old)
    data = os.path.join(env.site, "torchgen_patch_enable.json")
    assert (r.returncode, r.stdout) == (0, "end\n")
    assert re.fullmatch(rf"torchgen-patch: NOT active in pid \d+: {re.escape(data)}: it is empty \(hint: "
                        r"`torchgen-patch enable` writes it again, `torchgen-patch disable` removes it\)\n",
                        r.stderr), r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the cases set modes of the cache's build")
def test_where_none_can_be_built_the_named_builds_own_cause_is_said_first(cached):
    """The named build's directory writable by its group and no compiler on PATH: the line names the
    directory and its fix first, then why none could be made instead (it named only the compiler)."""
    env = cached
    assert _tool(env, "enable", "-q").returncode == 0
    name, break_it, undo, _ = _cases(env)[0]
    break_it()
    try:
        r = _prog(env, _no_compiler(env))
    finally:
        undo()
    assert (r.returncode, r.stdout) == (0, "end\n"), r.stderr
    line = UNPATCHED.match(r.stderr.rstrip("\n"))
    assert r.stderr.count("\n") == 1 and line, r.stderr
    assert line.group(1).index(name) < line.group(1).index("none can be had instead"), r.stderr
    assert "chmod" in line.group(2), r.stderr


def test_a_directory_at_the_data_files_name_stops_disable_before_it_removes_anything(cached):
    """disable removed the .pth, then failed at the directory (exit 3, no hint), leaving pip's RECORD
    lines: now one line first, and nothing removed."""
    env = cached
    assert _tool(env, "enable", "-q").returncode == 0
    data = os.path.join(env.site, "torchgen_patch_enable.json")
    old = open(data, "rb").read()
    os.unlink(data)
    os.mkdir(data)
    record = open(env.record, "rb").read()
    try:
        r = _tool(env, "disable")
        assert r.returncode == 3 and r.stderr.count("\n") == 1 and "is a directory" in r.stderr, r.stderr
        assert os.path.exists(env.pth) and open(env.record, "rb").read() == record
    finally:
        os.rmdir(data)
        with open(data, "wb") as fh:
            fh.write(old)
    assert _tool(env, "disable").returncode == 0


def _peer() -> tuple[int, str]:
    """Another account (tgpeer where this machine has one, else nobody): its uid and the name messages give it."""
    import pwd

    from torchgen_patch.fs.protected import owner_name

    try:
        uid = pwd.getpwnam("tgpeer").pw_uid
    except KeyError:
        uid = 65534
    return uid, owner_name(uid)


def _refusals(env):
    """The ways the load-time checks refuse the build the spec names: (what the refusal says, make it so,
    undo it)."""
    lib = _library(env)
    d = os.path.dirname(lib)
    dmode, lmode = os.stat(d).st_mode & 0o7777, os.stat(lib).st_mode & 0o7777
    uid, name = _peer()
    whole = open(lib, "rb").read()

    def put_back():
        with open(lib, "wb") as fh:
            fh.write(whole)

    return [
        (f"{d} is writable by its group (mode {dmode | 0o020:04o})", lambda: os.chmod(d, dmode | 0o020),
         lambda: os.chmod(d, dmode)),
        (f"{lib} is writable by others (mode {lmode | 0o002:04o})", lambda: os.chmod(lib, lmode | 0o002),
         lambda: os.chmod(lib, lmode)),
        (f"{lib} is owned by {name}, not by you or root", lambda: os.chown(lib, uid, -1),
         lambda: os.chown(lib, 0, -1)),
        (f"{lib} is not the library that was built", lambda: open(lib, "ab").write(b"\0"), put_back),
        (f"cannot check {lib} before loading native code from it: No such file or directory",
         lambda: os.rename(lib, lib + ".away"), lambda: os.rename(lib + ".away", lib)),
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="the library of another account needs root to chown")
def test_status_says_a_build_the_load_checks_refuse_is_refused_with_why_and_the_fix(cached):
    """The build the data file names, refused by the checks each process makes before loading it (a
    directory its group can write, a library others can write or another account owns, its SHA-256 not
    the recorded one, the library gone from its build): status says "refused: <why>" with the fix a
    process's line gives, exit 1. Before, status called the first one "gone", the others "there", exit 0."""
    env = cached
    assert _tool(env, "enable", "-q").returncode == 0
    for says, break_it, undo in _refusals(env):
        break_it()
        try:
            r = _tool(env, "status")
            p = _prog(env)
        finally:
            undo()
        first, refused = (r.stdout.splitlines() + ["", ""])[:2]
        assert r.returncode == 1 and "; the build it names is refused (below);" in first, (says, r.stdout)
        assert refused.startswith(f"refused: {says}") and "every process of this environment that imports torch " \
                                                          "refuses it too" in refused, (says, r.stdout)
        line = UNPATCHED.match(p.stderr.rstrip("\n"))
        hint = refused.split(" (hint: ", 1)[1][:-1] if " (hint: " in refused else ""
        assert line and line.group(2) == (f"{hint}; " if hint else ""), (says, p.stderr, refused)
    r = _tool(env, "status")
    assert r.returncode == 0 and "the build it names is there" in r.stdout and r.stdout.count("\n") == 1, r.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the library of another account needs root to chown")
def test_a_process_whose_build_is_refused_says_the_cause_and_the_fix_once(cached):
    """Each refusal of the named build: the program runs unpatched, its one line giving the cause once and
    each fix once. Before, a directory its group can write was said twice, with its fix twice (the cache's
    lookup reached the same build and was refused by the same check)."""
    env = cached
    assert _tool(env, "enable", "-q").returncode == 0
    for says, break_it, undo in _refusals(env):
        break_it()
        try:
            p = _prog(env)
        finally:
            undo()
        assert (p.returncode, p.stdout) == (0, "end\n"), (says, p.stderr)
        line = UNPATCHED.match(p.stderr.rstrip("\n"))
        assert p.stderr.count("\n") == 1 and line and line.group(1).count(says) == 1, (says, p.stderr)
        assert "none can be had instead" not in line.group(1), (says, p.stderr)
        fixes = [h for h in line.group(2).split("; ") if h]
        assert len(fixes) == len(set(fixes)) <= 1, (says, p.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="files of another account need root to chown")
def test_status_names_files_of_another_account_and_a_site_packages_others_can_write(cached):
    """The .pth line or its data file, as enable writes them but owned by another account (or writable by
    the group): named with its owner, exit 1. A site-packages directory its group or others may write
    (with the sticky bit or without): named with the fix, exit 1, after the line that says what is
    enabled. Before, all but the data file's owner were "enabled", exit 0."""
    env = cached
    assert _tool(env, "enable", "-q").returncode == 0
    uid, name = _peer()
    site_mode = os.stat(env.site).st_mode & 0o7777
    mode = os.stat(env.pth).st_mode & 0o7777
    for path in (env.pth, env.data):
        os.chown(path, uid, -1)
        try:
            r = _tool(env, "status")
        finally:
            os.chown(path, 0, -1)
        assert r.returncode == 1 and r.stdout.count("\n") == 1, r.stdout
        assert f"{path}: {name} owns it, not root (uid 0), who owns {env.site}: that account may have replaced it" \
            in r.stdout, r.stdout
    os.chmod(env.pth, mode | 0o020)
    try:
        r = _tool(env, "status")
    finally:
        os.chmod(env.pth, mode)
    assert r.returncode == 1 and r.stdout.startswith(f"{env.pth}: it is writable by its group (mode "), r.stdout
    for extra, who, replace in [(0o020, "its group", True), (0o002, "others", True), (0o1002, "others", False)]:
        os.chmod(env.site, site_mode | extra)
        try:
            r = _tool(env, "status")
        finally:
            os.chmod(env.site, site_mode)
        lines = r.stdout.splitlines()
        assert r.returncode == 1 and len(lines) == 2 and lines[0].startswith(f"enabled: {env.pth} ("), r.stdout
        assert lines[1].startswith(f"{env.site} is writable by {who} (mode {site_mode | extra:04o}): any account "
                                   "that may write it could ") and lines[1].endswith(f"(hint: chmod go-w {env.site})")
        assert ("replace the files `torchgen-patch enable` writes" in lines[1]) == replace, lines[1]
    assert _tool(env, "status").returncode == 0


def test_enable_refuses_a_site_packages_its_group_can_write_and_writes_nothing(cached):
    """SECURITY.md says enable writes only into a site-packages directory others cannot write: a group's
    write bit is refused as the others' one is, in one error line, exit 3, before any work (nothing
    written, the files there as they were). Before, enable wrote there, exit 0."""
    env = cached
    assert _tool(env, "enable", "-q").returncode == 0
    before = env.listing(), open(env.pth, "rb").read(), open(env.data, "rb").read()
    site_mode = os.stat(env.site).st_mode & 0o7777
    os.chmod(env.site, site_mode | 0o020)
    try:
        r = _tool(env, "enable", "--op", "aten::_cummin_helper")
    finally:
        os.chmod(env.site, site_mode)
    assert (r.returncode, r.stdout) == (3, "") and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"torchgen-patch: error: {env.site} is writable by its group (mode "
                               f"{site_mode | 0o020:04o}): ") and r.stderr.endswith(f"(hint: chmod go-w {env.site})\n")
    assert (env.listing(), open(env.pth, "rb").read(), open(env.data, "rb").read()) == before
