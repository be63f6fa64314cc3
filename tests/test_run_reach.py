"""`torchgen-patch run` keeps its word: every process it starts is patched or says it is not (a
child started with an environment or flags that drop the hook is named in one line; a program that
resets sys.meta_path or answers for torch itself is still patched), the tool's own imports never
come from the program's directory nor widen its path, and stderr closed or redirected changes
nothing. Also the launch spec read as input, and --runtime-op checked before the program starts,
its check cached."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_run import tgp_run

pytestmark = pytest.mark.build
PY = sys.executable
NAME = os.path.basename(PY)  # the interpreter as its command names it: python, python3
NOT_ACTIVE = re.compile(r"^torchgen-patch: NOT active (in a child of pid|in pid) (\d+)( after its exec)? \((.*)\): "
                        r"(.*) \(hint: torchgen-patch enable patches every Python process of an environment\)$", re.M)
PROBE = "import torch, torchgen_patch; print('active', len(torchgen_patch.installed_ops()))"


@pytest.fixture
def short_tmp():
    """A directory of a short path: a line shortens a command of more than 80 characters, and pytest's
    tmp_path may be longer than that on a machine of many workers."""
    import pathlib
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="tgp-", dir="/tmp")
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_a_child_that_drops_the_hook_is_named_with_the_parents_pid_and_why(short_tmp):
    """Children started with their own environment or PYTHONPATH, `env python -I`, scripts whose first line
    says -I or -E, a shell's `python -S`, posix_spawn with a clean environment and an exec into python -I:
    each one line naming the pid and why; a child that keeps the environment, and one that is not Python,
    none. The parent never imports torch: the lines come from its start."""
    tmp_path = short_tmp
    for name, flag in (("isolated.py", f"#!{PY} -I"), ("ignores.py", f"#!/usr/bin/env -S {PY} -E")):
        (tmp_path / name).write_text(f"{flag}\nprint('{name} ran')\n")
        (tmp_path / name).chmod(0o755)
    prog = tmp_path / "spawner.py"
    prog.write_text(f"""import os, subprocess, sys
py = sys.executable
subprocess.run([py, "-c", "print('kept')"])
subprocess.run(["true"], env={{}})
subprocess.run([py, "-c", "print('clean')"], env={{"PATH": os.environ["PATH"]}})
subprocess.run([py, "-c", "print('own path')"], env=dict(os.environ, PYTHONPATH="/nonexistent"))
subprocess.run(["env", py, "-I", "-c", "print('env -I')"])
subprocess.run([{str(tmp_path / 'isolated.py')!r}])
subprocess.run([{str(tmp_path / 'ignores.py')!r}])
subprocess.run(py + " -S -c pass", shell=True)
os.waitpid(os.posix_spawn(py, [py, "-c", "print('spawned')"], {{}}), 0)
sys.stdout.flush()
os.execv(py, [py, "-I", "-c", "print('exec -I')"])
""")
    r = tgp_run("--", PY, prog)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["kept", "clean", "own", "path", "env", "-I", "isolated.py", "ran", "ignores.py", "ran",
                                "spawned", "exec", "-I"]
    lines = NOT_ACTIVE.findall(r.stderr)
    assert len(lines) == len(r.stderr.splitlines()) == 8, r.stderr
    assert len({pid for _, pid, *_ in lines}) == 1  # the program's own pid, in each
    whys = [(cmd.split()[-1] if cmd.endswith(".py") else cmd.split(" -c ")[-1], why) for *_, cmd, why in lines]
    assert whys == [
        ("print('clean')", "its environment has neither torchgen-patch's PYTHONPATH entry nor $TORCHGEN_PATCH_RUN"),
        ("print('own path')", "its own PYTHONPATH leaves out torchgen-patch's hook"),
        ("print('env -I')", f"{NAME} -I: isolated mode ignores PYTHONPATH"),
        (str(tmp_path / "isolated.py"), f"{NAME} -I: isolated mode ignores PYTHONPATH"),
        (str(tmp_path / "ignores.py"), f"{NAME} -E: it ignores PYTHONPATH"),
        ("pass", f"{NAME} -S: it skips the site module, which loads the hook"),
        ("print('spawned')", "its environment has neither torchgen-patch's PYTHONPATH entry nor $TORCHGEN_PATCH_RUN"),
        ("print('exec -I')", f"{NAME} -I: isolated mode ignores PYTHONPATH"),
    ]
    assert lines[-1][2] == " after its exec"


@pytest.mark.parametrize("how", ["env", "shebang", "cleared"])
def test_a_program_that_would_drop_the_hook_itself_is_refused_before_it_starts(tmp_path, how):
    marker = tmp_path / "ran"
    script = tmp_path / "isolated.py"
    script.write_text(f"#!{PY} -I\nopen({str(marker)!r}, 'w')\n")
    script.chmod(0o755)
    program = {"env": ["env", PY, "-I", "-c", f"open({str(marker)!r}, 'w')"], "shebang": [str(script)],
               "cleared": ["env", "-i", PY, "-c", f"open({str(marker)!r}, 'w')"]}[how]
    r = tgp_run("--backend", "python", "--", *program)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not marker.exists(), r.stderr
    assert r.stderr.startswith("torchgen-patch: error: ") and "so the kernels could not be installed in it" in r.stderr
    assert ("(hint: drop -I" if how != "cleared" else "(hint: keep PYTHONPATH and $TORCHGEN_PATCH_RUN") in r.stderr


@pytest.mark.parametrize("prog,expected", [
    # sys.meta_path replaced before `import torch`: the audit hook puts the finder back first
    ("import sys, importlib.machinery as m; sys.meta_path = [m.BuiltinImporter, m.FrozenImporter, m.PathFinder]\n"
     + PROBE, "active 1\n"),
    # a finder of the program's own answers for torch, first on the path: the hook goes before it
    ("import sys, importlib.machinery as m\nclass Mine:\n    @staticmethod\n    def find_spec(name, path=None, "
     "t=None):\n"
     "        return m.PathFinder.find_spec(name, path) if name == 'torch' else None\n"
     "sys.meta_path.insert(0, Mine)\n" + PROBE, "active 1\n"),
    # importlib.import_module (no audit event of its own) past a replaced meta_path: installed at the next import
    ("import sys, importlib, importlib.machinery as m\nsys.meta_path = [m.BuiltinImporter, m.FrozenImporter, "
     "m.PathFinder]\nimportlib.import_module('torch')\nimport fractions\n" + PROBE, "active 1\n"),
])
def test_a_program_that_resets_the_import_machinery_is_still_patched(tmp_path, prog, expected):
    (tmp_path / "p.py").write_text(prog)
    r = tgp_run("--backend", "python", "--op", "aten::_cummax_helper", "--", PY, tmp_path / "p.py")
    assert (r.returncode, r.stdout) == (0, expected), r.stderr
    assert "1 kernel active (python)" in r.stderr


def test_torch_imported_past_the_hook_with_nothing_after_it_is_said_at_exit(tmp_path):
    (tmp_path / "p.py").write_text("import sys, importlib, importlib.machinery as m\nsys.meta_path = "
                                   "[m.BuiltinImporter, m.FrozenImporter, m.PathFinder]\n"
                                   "torch = importlib.import_module('torch')\nprint(torch.ones(1).sum().item())\n")
    r = tgp_run("-q", "--backend", "python", "--op", "aten::_cummax_helper", "--", PY, tmp_path / "p.py")
    assert (r.returncode, r.stdout) == (0, "1.0\n"), r.stderr
    assert re.fullmatch(r"torchgen-patch: NOT active in pid \d+: torch was imported where the hook could not see it "
                        r"finish .*\n", r.stderr), r.stderr


def _beside(d, marker):
    """A yaml.py and a jinja2.py in the program's directory that leave a mark when imported."""
    for name in ("yaml", "jinja2"):
        (d / f"{name}.py").write_text(f"open({str(marker)!r} + '.{name}', 'w')\nOWN = True\n")


def test_modules_beside_the_program_are_never_the_tools(tmp_path):
    """--no-cache: the tool reads the yaml (PyYAML) and renders the kernels (Jinja) in the program's
    process; a yaml.py and jinja2.py beside the program are not imported by it, the process is patched,
    and the program's own `import yaml` still gets its own file."""
    _beside(tmp_path, tmp_path / "imported")
    prog = tmp_path / "p.py"
    prog.write_text("import sys, torch, torchgen_patch\nprint(len(torchgen_patch.installed_ops()), "
                    "sorted(n for n in ('yaml', 'jinja2') if n in sys.modules))\nimport yaml\nprint(yaml.OWN)\n")
    r = tgp_run("--no-cache", "--", PY, prog)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split(" ", 1)[1] == "[]" and int(r.stdout.split()[0]) > 100, r.stdout + r.stderr
    assert not (tmp_path / "imported.jinja2").exists(), r.stderr
    assert (tmp_path / "imported.yaml").exists() and r.stdout.splitlines()[1] == "True"  # the program's own import


def test_the_programs_path_is_its_own_and_another_environment_is_not_widened(tmp_path):
    """The program's Python is another environment's (torch and its one import-time dependency, no
    numpy, no PyYAML): under run its sys.path is what it is without run (runtime/site is not on it),
    and what that environment lacks stays missing, though the tool imported PyYAML there."""
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    env_dir = tmp_path / "other"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    theirs = env_dir / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for name in ("torch", "torchgen", "typing_extensions.py"):
        os.symlink(os.path.join(site, name), theirs / name)
    python = str(env_dir / "bin" / "python")
    code = ("import sys, torch\nprint(sys.path)\nfor name in ('numpy', 'yaml', 'jinja2'):\n    try:\n"
            "        __import__(name)\n        print(name, 'importable')\n    except ImportError:\n"
            "        print(name, 'missing')\n")
    env = {"PYTHONPATH": ""}  # nothing of this environment on the program's path
    plain = subprocess.run([python, "-c", code], capture_output=True, text=True, env=dict(os.environ, **env))
    assert plain.returncode == 0, plain.stderr
    r = tgp_run("--no-cache", "--backend", "python", "--", python, "-c", code, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == plain.stdout and "numpy missing\nyaml missing" in r.stdout
    assert re.search(r"^torchgen-patch: \d+ kernels active \(python\)", r.stderr, re.M), r.stderr


def test_a_fifo_planted_under_a_programs_name_never_blocks_the_program(tmp_path):
    """A program not on PATH, started from a working directory where another account left a FIFO of that
    name (a sticky /tmp): the hook looks for the program's interpreter line and must not open the FIFO
    (the open would block for ever); the program gets its FileNotFoundError and goes on. A script reached
    through a symlink is still read, and a FIFO on PATH is not."""
    from torchgen_patch.runtime.site._torchgen_patch_spawn import dropped

    os.mkfifo(tmp_path / "tgp-not-installed")
    prog = tmp_path / "p.py"
    prog.write_text("import subprocess, torch\ntry:\n    subprocess.run(['tgp-not-installed'])\n"
                    "except FileNotFoundError:\n    print('not installed')\n")
    cmd = [PY, "-m", "torchgen_patch", "run", "--backend", "python", "--op", "aten::_cummax_helper", "--",
           PY, str(prog)]
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), start_new_session=True)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the program blocked on the FIFO for 60 s")
    assert (p.returncode, out) == (0, "not installed\n"), err
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = tmp_path / "isolated.py"
    script.write_text(f"#!{PY} -I\n")
    script.chmod(0o755)
    os.symlink(script, bin_dir / "linked")
    os.mkfifo(bin_dir / "fifo")
    os.chmod(bin_dir / "fifo", 0o755)
    env = {"PATH": str(bin_dir)}
    assert dropped(["linked"], env) == f"{NAME} -I: isolated mode ignores PYTHONPATH"
    assert dropped([str(bin_dir / "fifo")], env) is None and dropped(["fifo"], env) is None


_SHADOW = """open({marker!r}, 'w')
OWN = True
def new(*a, **k):
    raise RuntimeError("the program's hmac")
def compare_digest(a, b):
    return True
"""


@pytest.mark.parametrize("how", ["on the path", "imported first"])
def test_a_stdlib_name_on_the_programs_path_is_never_the_tools(tmp_path, how):
    """A hmac.py on the program's path before the standard library (PYTHONPATH=. in a shared directory),
    or one the program imported itself before torch: the tool's cache proofs use the standard library's
    hmac (a compare_digest that says yes to everything would pass unproven entries), the process is
    patched, and the program's own `import hmac` still gets its own file."""
    lib = tmp_path / "lib"
    lib.mkdir()
    marker = tmp_path / "imported"
    (lib / "hmac.py").write_text(_SHADOW.format(marker=str(marker)))
    first = f"import sys\nsys.path.insert(1, {str(lib)!r})\n" if how == "on the path" else "import hmac\n"
    prog = (tmp_path if how == "on the path" else lib) / "p.py"
    prog.write_text(first + "import torch, torchgen_patch\nprint(len(torchgen_patch.installed_ops()))\n"
                    "import hmac\nprint(hmac.OWN)\n")
    r = tgp_run("--backend", "python", "--op", "aten::_cummax_helper", "--", PY, prog)
    assert (r.returncode, r.stdout) == (0, "1\nTrue\n"), r.stderr
    assert "NOT active" not in r.stderr and "1 kernel active (python)" in r.stderr, r.stderr


def _tiny_overlay(path, default_plan, keep: str) -> None:
    """An overlay that leaves one kernel in the plan: a build of a few seconds."""
    path.write_text("".join(f"{k.op}:\n  action: skip\n  reason: a one-kernel plan\n\n"
                            for k in default_plan.kernels if k.op != keep))


def test_with_stderr_closed_a_build_works_and_no_line_lands_on_stdout(tmp_path, default_plan):
    _tiny_overlay(tmp_path / "tiny.yaml", default_plan, "aten::_cummax_helper")
    cache = tmp_path / "cache"  # empty: the first process builds the library
    prog = tmp_path / "p.py"
    prog.write_text("import sys, torch, torchgen_patch\nprint(sys.stderr, torchgen_patch.installed_ops())\n")
    cmd = [PY, "-m", "torchgen_patch", "run", "--overlay", str(tmp_path / "tiny.yaml"), "--", PY, str(prog)]
    r = subprocess.run(cmd, capture_output=False, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, TORCHGEN_PATCH_CACHE=str(cache)),
                       preexec_fn=lambda: os.close(2))
    assert (r.returncode, r.stdout) == (0, "None ['aten::_cummax_helper']\n")
    assert [n for n in os.listdir(cache / "builds") if not n.endswith(".lock")], "nothing was built"


def test_stderr_redirected_to_a_write_only_sink_during_a_build(tmp_path, default_plan):
    """contextlib.redirect_stderr(sink) around the program's `import torch`, with a sink that only writes:
    the build's messages and the line reach the sink, nothing crashes, the process is patched."""
    _tiny_overlay(tmp_path / "tiny.yaml", default_plan, "aten::_cummin_helper")
    prog = tmp_path / "p.py"
    prog.write_text("import contextlib\nclass Sink:\n    text = ''\n    def write(self, s):\n        Sink.text += s\n"
                    "with contextlib.redirect_stderr(Sink()):\n    import torch\nimport torchgen_patch\n"
                    "print(torchgen_patch.installed_ops(), repr(Sink.text.splitlines()[-1]))\n")
    r = tgp_run("--overlay", tmp_path / "tiny.yaml", "--", PY, prog, env={"TORCHGEN_PATCH_CACHE": str(tmp_path / "c")})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    ops, last = r.stdout.strip().split("] ", 1)
    assert ops == "['aten::_cummin_helper'" and re.fullmatch(
        r"'torchgen-patch: 1 kernel active \(cpp\), 0 refused, built now; 0 optimizer entries active, in pid \d+ "
        r"\(p\.py\)'", last), r.stdout


@pytest.mark.parametrize("value,why", [
    ("{bad", "JSONDecodeError: Expecting property name enclosed in double quotes"),
    ('{"roots": {"torchgen_patch": "%s"}}' % ROOT, "'backend' is NoneType"),
    ("[]", "(not a JSON object)"),
    ("[" * 100_000, "JSONDecodeError: nested more than"),
])
def test_a_malformed_launch_spec_stops_the_program_at_import_torch_with_one_line(value, why):
    r = subprocess.run([PY, "-c", "import torch; print('went on')"], capture_output=True, text=True,
                       env=dict(os.environ, TORCHGEN_PATCH_RUN=value,
                                PYTHONPATH=os.path.join(ROOT, "torchgen_patch", "runtime", "site")))
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith("torchgen-patch: error: $TORCHGEN_PATCH_RUN: not a launch spec of torchgen-patch (")
    assert why in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_a_process_with_the_hook_but_no_launch_spec_says_so_and_goes_on():
    r = subprocess.run([PY, "-c", "import torch; print('went on')"], capture_output=True, text=True,
                       env=dict(os.environ, TORCHGEN_PATCH_RUN="",
                                PYTHONPATH=os.path.join(ROOT, "torchgen_patch", "runtime", "site")))
    assert (r.returncode, r.stdout) == (0, "went on\n"), r.stderr
    assert re.fullmatch(r"torchgen-patch: NOT active in pid \d+: \$TORCHGEN_PATCH_RUN is not set \(the process that "
                        r"started this one left it out of its environment\) \(hint: .*\)\n", r.stderr), r.stderr


@pytest.mark.parametrize("op,message", [
    ("noname", "torchgen-patch: error: runtime op 'noname' needs its namespace ('ns::op.overload')"),
    ("tgp_test::write_on", "torchgen-patch: error: --runtime-op tgp_test::write_on: no such operator (hint: did you "
                           "mean tgp_test::write_one, tgp_test::write_opt, tgp_test::write_list?; the module that "
                           "defines it goes in --import MOD)"),
    ("tgp_test::read_only", "torchgen-patch: error: --runtime-op tgp_test::read_only: its schema writes no argument"),
])
def test_runtime_op_names_are_checked_before_the_program_starts(tmp_path, op, message):
    marker = tmp_path / "ran"
    r = tgp_run("--backend", "python", "--runtime-op", op, "--import", "testbed.custom_ops", "--",
                PY, "-c", f"open({str(marker)!r}, 'w')")
    assert (r.returncode, r.stderr) == (2, message + "\n") and not marker.exists()


def test_a_second_runtime_op_launch_uses_the_cached_check_and_the_librarys_messages_print_once(tmp_path):
    cache = {"TORCHGEN_PATCH_CACHE": str(tmp_path / "c")}
    args = ("-v", "--backend", "python", "--runtime-op", "tgp_noisy::*", "--import", "tests.noisy_ops", "--",
            PY, "-c", "import torch, tests.noisy_ops")
    first, second = tgp_run(*args, env=cache), tgp_run(*args, env=cache)
    for r in (first, second):
        assert r.returncode == 0, r.stderr
        assert (r.stdout + r.stderr).count("a note printed to stdout on import") == 1, r.stdout + r.stderr
        assert "runtime ops: 1 active, 0 refused" in r.stderr
    assert "--runtime-op check: the cached verdict" not in first.stderr
    assert "note: --runtime-op check: the cached verdict (runtime-check-" in second.stderr


def test_a_cached_runtime_op_verdict_is_used_only_while_the_builds_it_names_are_this_caches(tmp_path, monkeypatch):
    """The verdict's libraries are looked at through the cache: one naming a file outside the cache's
    builds, or a build since removed, is checked again; one naming a build that is there is the verdict."""
    from torchgen_patch import cache
    from torchgen_patch.fs.dirs import subdir
    from torchgen_patch.runtime.launch import launcher as launch  # its internals
    from torchgen_patch.sources import Options

    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(tmp_path / "c"))
    spec = launch.launch_spec(Options(), "cpp", None, ["tgp_test::*"], [])
    name = f"runtime-check-{launch._check_key(spec)[:32]}.json"
    checked = []
    monkeypatch.setattr(launch, "_checked_elsewhere", lambda s: checked.append(s) or (["tgp_test::fresh"], None, None))
    outside = tmp_path / "lib.so"  # a file that is there, but no build of this cache
    outside.write_bytes(b"")
    with subdir("builds") as builds, builds.sub("build-0", create=True) as b:
        b.create("lib.so", b"")
        built = b.join("lib.so")
    for boxed, used in ((str(outside), False), (built, True), (os.path.join(os.path.dirname(built), "gone.so"), False)):
        cache.write(name, {"ops": ["tgp_test::cached"], "boxed": boxed, "library": None})
        checked.clear()
        ops, _, _ = launch._runtime_check(spec)
        assert (ops, len(checked)) == ((["tgp_test::cached"], 0) if used else (["tgp_test::fresh"], 1)), boxed


def test_the_processes_torchs_compile_machinery_starts_are_not_named_and_a_programs_own_still_are(short_tmp):
    """Inductor's probe of the CPU's vector units runs `python -c` with a PYTHONPATH of its own: a child of
    torch's compile machinery (a frame of torch._inductor, torch._dynamo, Triton on the stack) compiles and
    runs no autograd, so it is not named; the same child started by the program's own code still is."""
    prog = short_tmp / "spawns.py"
    prog.write_text("""import os, subprocess, sys
env = dict(os.environ, PYTHONPATH="/nonexistent")
ns = {"__name__": "torch._inductor.cpu_vec_isa", "subprocess": subprocess, "sys": sys, "env": env}
exec("def probe():\\n    subprocess.run([sys.executable, '-c', 'print(1)'], env=env)\\n", ns)
ns["probe"]()
subprocess.run([sys.executable, "-c", "print(2)"], env=env)
""")
    r = tgp_run("--", PY, prog)
    assert r.returncode == 0 and r.stdout.split() == ["1", "2"], r.stderr
    lines = NOT_ACTIVE.findall(r.stderr)
    assert [cmd.split(" -c ")[-1] for *_, cmd, _ in lines] == ["print(2)"], r.stderr


def test_a_child_the_programs_own_compiled_function_starts_is_still_named(short_tmp):
    """A function of the program's own, compiled by torch.compile, runs under torch._dynamo's frames:
    what it starts is the program's, and is named as any other."""
    prog = short_tmp / "own.py"
    prog.write_text("""import subprocess, sys, torch
def f(x):
    subprocess.run([sys.executable, "-I", "-c", "print(1)"])
    return x + 1
torch.compile(f)(torch.ones(2))
""")
    r = tgp_run("--", PY, prog)
    assert r.returncode == 0, r.stderr
    assert [why for *_, why in NOT_ACTIVE.findall(r.stderr)] == [f"{NAME} -I: isolated mode ignores PYTHONPATH"], \
        r.stderr


def test_a_compiled_program_under_run_prints_no_line_of_its_compile_workers(short_tmp):
    """torch.compile on CPU (inductor probes the CPU and compiles C++ in processes of its own), forward and
    backward: the program runs patched and no line names a process it did not start."""
    prog = short_tmp / "compiled.py"
    prog.write_text("""import torch
f = torch.compile(lambda x: (x.sin() + 1).sum())
x = torch.randn(8, requires_grad=True)
f(x).backward()
print("grad", tuple(x.grad.shape))
""")
    r = tgp_run("--", PY, prog)
    assert r.returncode == 0 and r.stdout.split() == ["grad", "(8,)"], r.stderr
    assert "NOT active" not in r.stderr, r.stderr
