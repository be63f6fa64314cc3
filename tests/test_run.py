"""`torchgen-patch run`: any program, run with the kernels installed in every Python process
it starts (plain scripts, python -m, torchrun's workers), built once, exit code passed through."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.build


def tgp_run(*args, env=None, cwd=ROOT):
    e = dict(os.environ, PYTHONPATH=ROOT)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "torchgen_patch", "run", *map(str, args)], cwd=cwd, env=e,
                          capture_output=True, text=True)


def _probes(out: str) -> list[dict]:
    return [dict(kv.split("=", 1) for kv in m.split())
            for m in re.findall(r"probe (rank=\S+ active=\S+ versions=\S+)", out)]


def test_a_plain_script_runs_patched_and_its_exit_code_passes_through(default_plan):
    r = tgp_run("--", sys.executable, os.path.join(ROOT, "tests", "run_probe.py"), env={"PROBE_EXIT": "3"})
    assert r.returncode == 3, r.stderr
    (p,) = _probes(r.stdout)
    assert p["active"] == str(len(default_plan.kernels)) and p["versions"] == "1,1"
    # which library (prebuilt, cached, built now), the optimizer entries, and which process (its program)
    assert re.search(r"^torchgen-patch: \d+ kernels active \(cpp\), 0 refused, from the cached build; \d+ optimizer "
                     r"entries active, in pid \d+ \(run_probe\.py\)$", r.stderr, re.M), r.stderr


def test_python_dash_m_and_the_python_backend():
    r = tgp_run("--backend", "python", "--op", "aten::split_with_sizes_copy.out", "--",
                sys.executable, "-m", "tests.run_probe")
    assert r.returncode == 0, r.stderr
    assert _probes(r.stdout) == [{"rank": "None", "active": "1", "versions": "1,1"}]
    assert "1 kernel active (python)" in r.stderr


@pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "torchrun")), reason="torchrun is not installed")
def test_torchrun_every_rank_is_patched_and_the_library_is_built_once(tmp_path):
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    cache = tmp_path / "cache"  # a fresh cache: the one build happens in this run
    r = tgp_run("--", torchrun, "--nproc-per-node", "2", "--master-port", "29517",
                os.path.join(ROOT, "tests", "run_probe.py"), env={"TORCHGEN_PATCH_CACHE": str(cache)})
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = sorted(p["rank"] for p in _probes(r.stdout))
    assert ranks == ["0", "1"] and all(p["versions"] == "1,1" and int(p["active"]) > 0 for p in _probes(r.stdout))
    assert r.stderr.count("torchgen-patch: compiling") == 1  # built once, by the first process, under the lock
    # each rank says so, and torchrun's own launcher (it imports torch too), each line naming which it is
    said = sorted(re.findall(r"kernels active \(cpp\), 0 refused, (?:built now|from the cached build); \d+ optimizer "
                             r"entries active, in pid \d+ "
                             r"\((.*)\)$", r.stderr, re.M))
    assert said == ["run_probe.py, rank 0", "run_probe.py, rank 1", "torchrun"], r.stderr


def test_runtime_ops_and_a_users_own_sitecustomize(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys; print('user sitecustomize ran', file=sys.stderr)\n")
    code = ("import torch, testbed.custom_ops, torchgen_patch; out = torch.empty(3); "
            "torch.ops.tgp_test.write_one(torch.ones(3), out); print('write_one version', out._version)")
    r = tgp_run("--backend", "python", "--op", "aten::_foreach_zero_", "--runtime-op", "tgp_test::*",
                "--import", "testbed.custom_ops", "--", sys.executable, "-c", code,
                env={"PYTHONPATH": os.pathsep.join([ROOT, str(tmp_path)])})
    assert r.returncode == 0, r.stderr
    assert "write_one version 1" in r.stdout
    assert "user sitecustomize ran" in r.stderr
    assert re.search(r"1 kernel active \(python\), 0 refused; \d+ optimizer entries active; runtime ops: 3 active, "
                     r"0 refused", r.stderr), r.stderr


@pytest.mark.parametrize("argv,expected", [
    ([], "torchgen-patch: error: run needs a program after -- (hint: torchgen-patch run -- python train.py)"),
    (["--", "no-such-program-xyz"], "torchgen-patch: error: no such program: no-such-program-xyz"),
    (["--import", "x", "--", "true"], "torchgen-patch: error: --import goes with --runtime-op"),
    (["--op", "aten::nope", "--", "true"], "torchgen-patch: error: not in the plan: aten::nope"),
    (["--op", "aten::_foreach_zero", "--", "true"], "torchgen-patch: error: not in the plan: aten::_foreach_zero "
                                                   "(hint: did you mean aten::_foreach_zero_, "
                                                   "aten::_foreach_zero.out, aten::_foreach_erf_?)"),
    (["--op", "aten::record_stream", "--", "true"], "torchgen-patch: error: aten::record_stream is left out of "
                                                   "the plan: skipped by the overlay: records a stream use for the "
                                                   "caching allocator; writes no tensor data, so no version bump "
                                                   "is due"),
])
def test_bad_run_arguments(run_cli, argv, expected):
    assert run_cli("run", *argv) == (2, "", expected + "\n")


def test_the_programs_own_arguments_are_its_own_and_a_signal_death_is_reported_like_a_shell(tmp_path):
    r = tgp_run("--backend", "python", "--op", "aten::_cummax_helper", "--",
                sys.executable, "-c", "import sys; print(sys.argv[1:])", "@args.txt", "--x")
    assert r.returncode == 0 and r.stdout.strip() == "['@args.txt', '--x']", r.stderr
    r = tgp_run("--backend", "python", "--op", "aten::_cummax_helper", "--", "sh", "-c", "kill -9 $$")
    assert r.returncode == 137


def test_the_users_path_keeps_its_order_and_relative_inputs_survive_a_chdir(tmp_path):
    (tmp_path / "localmod.py").write_text("X = 1\n")
    (tmp_path / "ov.yaml").write_text("aten::_cummin_helper:\n  action: skip\n  reason: probe\n")
    code = ("import os, localmod; os.chdir('/'); import torch, torchgen_patch; "  # installed at `import torch`
            "print(sorted(torchgen_patch.installed_ops()))")
    r = tgp_run("--backend", "python", "--overlay", "ov.yaml", "--op", "aten::_cummax_helper", "--",
                sys.executable, "-c", code, env={"PYTHONPATH": os.pathsep + ROOT}, cwd=tmp_path)
    assert r.returncode == 0, r.stderr  # '' (the current directory) still on the path: localmod found
    assert r.stdout.strip() == "['aten::_cummax_helper']"


def test_bad_runtime_patterns_and_programs_fail_in_the_parent(tmp_path):
    r = tgp_run("--backend", "python", "--runtime-op", "nosuchlib::*", "--", sys.executable, "-c", "pass")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "matches no mutating operator" in r.stderr
    script = tmp_path / "noshebang"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    r = tgp_run("--backend", "python", "--", str(script))
    assert (r.returncode, r.stderr) == (2, f"torchgen-patch: error: cannot run {script}: Exec format error\n")


def test_patterns_never_reach_aten_or_prims():
    from torchgen_patch.runtime.install import expand_patterns

    assert [n for n in expand_patterns(["*::*"]) if n.split("::")[0] in ("aten", "prims")] == []


def test_a_program_that_looks_for_torch_before_importing_it_is_patched():
    """importlib.util.find_spec("torch") before `import torch` (transformers, accelerate and lightning
    do it to see whether torch is there) asks the hook for a spec that is thrown away: the real import
    that follows must still install the kernels."""
    prog = ("import importlib.util; assert importlib.util.find_spec('torch') is not None; import torch, "
            "torchgen_patch; print(len(torchgen_patch.installed_ops()) > 0)")
    r = tgp_run("-q", "--", sys.executable, "-c", prog)
    assert (r.returncode, r.stdout) == (0, "True\n"), r.stderr


def test_kernels_that_cannot_be_had_stop_the_program_also_from_a_thread(tmp_path):
    """The first `import torch` in a thread, with no compiler and nothing cached: the process stops
    with the one error line and exit 3 (SystemExit would end that thread only)."""
    prog = ("import threading; t = threading.Thread(target=lambda: __import__('torch')); t.start(); t.join(); "
            "print('went on')")
    r = tgp_run("--", sys.executable, "-c", prog, env={"CXX": "/bin/false",
                                                       "TORCHGEN_PATCH_CACHE": str(tmp_path / "c")})
    assert r.returncode == 3 and "went on" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.splitlines()[-1].startswith("torchgen-patch: error: "), r.stderr


def test_settings_the_program_makes_before_importing_torch_reach_torch(tmp_path):
    """OMP_NUM_THREADS set by the program before its own `import torch`: the same thread count
    under `run` (torch is imported by the program, then the kernels are installed); and
    TORCH_CUSTOM_TERMINATE's crash handler speaks, as PyTorch's test_terminate_handler_on_crash expects."""
    script = tmp_path / "omp.py"
    script.write_text("import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch, torchgen_patch\n"
                      "print(torch.get_num_threads(), len(torchgen_patch.installed_ops()) > 0)\n")
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    r = tgp_run("--", sys.executable, script)
    assert (plain.stdout, r.stdout) == ("1 False\n", "1 True\n"), r.stderr
    crash = ("import os; os.environ['TORCH_CUSTOM_TERMINATE'] = '1'; import torch; import torch._C; "
             "torch._C._abort()")
    r = tgp_run("-q", "--", sys.executable, "-c", crash)
    assert r.returncode == 134 and "Unhandled exception caught in c10/util/AbortHandler.h" in r.stdout, r.stderr


def test_the_parent_never_imports_torch_and_a_program_without_torch_is_left_alone():
    code = ("import sys; from torchgen_patch import cli; rc = cli.main(['run', '-q', '--', sys.executable, '-c', "
            "'import sys; print(\"torch\" in sys.modules)']); print('parent', 'torch' in sys.modules, rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert (r.returncode, r.stdout, r.stderr) == (0, "False\nparent False 0\n", "")


@pytest.mark.parametrize("flags", [["-I"], ["-E"], ["-S"], ["-u", "-Es"], ["-W", "ignore", "-IS"], ["-bI"]])
def test_interpreter_flags_that_would_skip_the_patch_are_refused(run_cli, tmp_path, flags):
    marker = tmp_path / "ran"
    rc, out, err = run_cli("run", "--", sys.executable, *flags, "-c", f"open({str(marker)!r}, 'w')")
    assert rc == 2 and out == "" and err.count("\n") == 1 and not marker.exists()
    assert err.startswith(f"torchgen-patch: error: {os.path.basename(sys.executable)} -") and "(hint: drop -" in err


def test_flags_that_do_not_skip_the_patch_and_a_dash_c_text_are_not_mistaken_for_them():
    from torchgen_patch.runtime.site._torchgen_patch_spawn import dropped, interpreter_flags

    assert interpreter_flags(["python3", "-X", "importtime", "-c", "-I"]) == set()
    assert interpreter_flags(["python3.12", "-Wd", "-m", "mod", "-E"]) == set()
    assert interpreter_flags(["python", "-usI", "t.py"]) == {"u", "s", "I"}
    assert interpreter_flags(["python", "t.py", "-S"]) == set()
    assert dropped(["torchrun", "-S"], check_env=False) is None


def test_an_empty_pythonpath_never_puts_the_current_directory_on_the_path(tmp_path):
    """PYTHONPATH= (set, empty) adds nothing to the program's path, as without run: a torch.py in the
    current directory is not imported, and the real torch is patched."""
    if subprocess.run([sys.executable, "-c", "import torchgen_patch"], env=dict(os.environ, PYTHONPATH=""),
                      cwd=tmp_path, capture_output=True).returncode != 0:
        pytest.skip("torchgen-patch is not installed in this Python (the source tree is only on PYTHONPATH)")
    (tmp_path / "torch.py").write_text("raise SystemExit('the current directory was imported from')\n")
    prog = tmp_path / "prog" / "p.py"
    prog.parent.mkdir()
    prog.write_text("import sys, torch; print(torch.__file__.endswith('__init__.py'), '' in sys.path)\n")
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "--", sys.executable, str(prog)],
                       cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""))
    assert (r.returncode, r.stdout) == (0, "True False\n"), r.stderr
    assert "kernels active (cpp)" in r.stderr


def test_a_users_sitecustomize_that_exits_exits_as_without_run(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("raise SystemExit(5)\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    plain = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True,
                           env=dict(os.environ, **env))
    r = tgp_run("--", sys.executable, "-c", "print('ran')", env=env)
    assert (r.returncode, r.stdout) == (plain.returncode, plain.stdout), r.stderr


def test_a_bad_import_is_refused_before_the_program_starts(tmp_path):
    marker = tmp_path / "ran"
    r = tgp_run("--runtime-op", "tgp_test::*", "--import", "no_such_module_xyz", "--",
                sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert r.returncode == 2 and not marker.exists(), r.stderr
    assert r.stderr.endswith("torchgen-patch: error: --import no_such_module_xyz: ModuleNotFoundError: "
                             "No module named 'no_such_module_xyz'\n")
