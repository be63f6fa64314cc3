"""The hook's two parts beside it (runtime/site/_torchgen_patch_spec.py and _torchgen_patch_spawn.py), loaded by
their path: a part gone, damaged or not as the hook's own file is one line and the program goes on (unpatched
without the spec part; patched, its children unwatched, without the spawn part); under ``enable --strict`` the
spec part gone is no exit 3 (strict is in the data file that part reads); the spawn part still names a child that
drops the hook; a module of a part's name (or of the standard library's that a part imports) on the program's path
or in its working directory is never the part's; ``status`` names a part gone, in a real enabled environment too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_enable import Env, wheel
from tests.test_run import tgp_run

SITE = os.path.join(ROOT, "torchgen_patch", "runtime", "site")
SPEC, SPAWN = "_torchgen_patch_spec", "_torchgen_patch_spawn"
PY = sys.executable
NAME = os.path.basename(PY)
OP = "aten::_cummax_helper"
PROBE = "import torch, torchgen_patch; print('active', len(torchgen_patch.installed_ops()))"
CANNOT = "its part {} cannot be loaded: {} (hint: reinstall torchgen-patch)"


def _cannot(part, why):
    """The line's pattern for ``part`` that cannot be loaded, ``why`` (a pattern itself)."""
    return re.escape(CANNOT.format(part, "\0")).replace(re.escape("\0"), why)


def _site(tmp_path):
    """The hook's folder in a copy of the package, each file's mode kept (the hook imports the tool from the package it
    is in): run's PYTHONPATH entry, or an enabled environment's hook."""
    tree = tmp_path / "tree" / "torchgen_patch"
    shutil.copytree(os.path.dirname(os.path.dirname(SITE)), tree, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "templates"), tree.parent / "templates")
    return tree / "runtime" / "site"


def _spec(**kw):
    from torchgen_patch.runtime import launch
    from torchgen_patch.sources import Options

    return launch.launch_spec(Options(), "python", [OP], [], [], quiet=True, **kw)


def _run(site, code):
    """``python -c code`` as run starts it, with the hook of ``site``: that folder first on PYTHONPATH (the
    tree after it, for the program's own ``import torchgen_patch``), the spec in $TORCHGEN_PATCH_RUN."""
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{ROOT}", TORCHGEN_PATCH_RUN=_spec().to_json())
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env, cwd=site.parent, timeout=300)


def _enabled(tmp_path, site, code, strict=False):
    """``python -c code`` in a process of an enabled environment whose hook is the one of ``site``: the .pth
    line enable writes, run as site runs it, with its data file beside it."""
    from torchgen_patch.runtime.launch import enable as en

    packages = tmp_path / "site-packages"
    packages.mkdir()
    hook = str(site / "_torchgen_patch_hook.py")
    (packages / en.DATA).write_bytes(en.render_data(_spec(strict=strict), hook=hook))
    (packages / en.DATA).chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k != "TORCHGEN_PATCH_RUN"}
    return subprocess.run([PY, "-c", en.render(str(packages), hook) + code], capture_output=True, text=True,
                          env=dict(env, PYTHONPATH=ROOT), cwd=tmp_path, timeout=300)


def test_a_copy_of_the_hooks_folder_patches_as_the_tree_does(tmp_path):
    """The other tests' baseline: with both parts there, the copy patches under run and in an enabled
    environment, strict or not, and says nothing (a quiet spec)."""
    site = _site(tmp_path)
    for r in (_run(site, PROBE), _enabled(tmp_path, site, PROBE, strict=True)):
        assert (r.returncode, r.stdout, r.stderr) == (0, "active 1\n", "")


def test_the_names_the_parts_share_with_the_hook_agree():
    """What the spawn part spells again (it imports nothing of the hook) and enable's names of the parts (enable
    never imports the hook) are the hook's own."""
    from torchgen_patch.runtime.launch import enable as en
    from torchgen_patch.runtime.site import _torchgen_patch_hook as hook
    from torchgen_patch.runtime.site import _torchgen_patch_spawn as spawn

    assert (spawn.ENV, spawn.HERE) == (hook.ENV, hook.HERE)
    assert (en.SPEC_NAME, en.SPAWN_NAME) == (hook.SPEC, hook.SPAWN) and set(en.PARTS) == {hook.SPEC, hook.SPAWN}
    assert {hook.SPEC + ".py", hook.SPAWN + ".py"} <= set(os.listdir(hook.HERE))


def _fifo(path):
    path.unlink()
    os.mkfifo(path, 0o644)


@pytest.mark.parametrize("how,why", [
    (lambda p: p.unlink(), "No such file or directory"),
    (lambda p: p.write_text("this is not Python (\n"), r"SyntaxError: .*"),
    (lambda p: p.chmod(0o666), r"not a regular file as the hook's own \(uid \d+, mode 100666\)"),
    (_fifo, r"not a regular file as the hook's own \(uid \d+, mode 10644\)"),  # opened without blocking, never read
], ids=["gone", "damaged", "writable by others", "a FIFO"])
def test_a_spec_part_that_cannot_be_had_is_one_line_and_the_program_runs_unpatched(tmp_path, how, why):
    site = _site(tmp_path)
    part = site / f"{SPEC}.py"
    how(part)
    r = _run(site, PROBE + "; print('end')")
    assert (r.returncode, r.stdout) == (0, "active 0\nend\n"), r.stderr
    assert re.fullmatch(rf"torchgen-patch: NOT active in pid \d+: {_cannot(part, why)}\n", r.stderr), r.stderr


def test_a_spawn_part_gone_is_one_line_at_the_first_process_started_and_the_program_stays_patched(tmp_path):
    """What is left undone is the watching of the processes it starts (said once, however many it starts),
    not the kernels of the program itself."""
    site = _site(tmp_path)
    part = site / f"{SPAWN}.py"
    part.unlink()
    code = ("import os, subprocess, sys\nfor _ in range(2):\n    subprocess.run([sys.executable, '-I', '-c', 'pass'])\n"
            f"print(os.getpid())\n{PROBE}\n")
    r = _run(site, code)
    assert r.returncode == 0 and r.stdout.splitlines()[1:] == ["active 1"], r.stderr
    pid = r.stdout.split()[0]
    assert r.stderr == f"torchgen-patch: NOT watching the processes pid {pid} starts: " \
                       f"{CANNOT.format(part, 'No such file or directory')}\n"


def test_under_enable_strict_a_spec_part_gone_is_no_exit_3(tmp_path):
    """Strict is a field of the data file, and the spec part is what reads it: with that part gone it is
    unknown, as with a damaged data file, so the process goes on unpatched (said in one line) rather than
    stop every process of the environment."""
    site = _site(tmp_path)
    part = site / f"{SPEC}.py"
    part.unlink()
    r = _enabled(tmp_path, site, PROBE + "; print('end')", strict=True)
    assert (r.returncode, r.stdout) == (0, "active 0\nend\n"), r.stderr
    says = _cannot(part, "No such file or directory")
    assert re.fullmatch(rf"torchgen-patch: NOT active in pid \d+: {says}\n", r.stderr), r.stderr


def test_the_spawn_part_still_names_a_child_that_drops_the_hook(tmp_path):
    """Under run (the tree's own hook): a child started with -I, and one through a shell's -c (the part reads
    it with the standard library's shlex), each named once; a child that keeps the hook, and the program's own
    pid in each line, as before the part was split off."""
    prog = tmp_path / "spawner.py"
    prog.write_text("import os, subprocess, sys\nprint(os.getpid())\npy = sys.executable\n"
                    "subprocess.run([py, '-c', 'pass'])\nsubprocess.run([py, '-I', '-c', 'pass'])\n"
                    "subprocess.run(['sh', '-c', py + ' -S -c pass'])\n")
    r = tgp_run("--backend", "python", "--op", OP, "--", PY, prog)
    assert r.returncode == 0, r.stderr
    pid = r.stdout.strip()
    hint = "(hint: torchgen-patch enable patches every Python process of an environment)"
    assert r.stderr.splitlines() == [
        f"torchgen-patch: NOT active in a child of pid {pid} ({PY} -I -c pass): {NAME} -I: isolated mode ignores "
        f"PYTHONPATH {hint}",
        f"torchgen-patch: NOT active in a child of pid {pid} (sh -c {PY} -S -c pass): {NAME} -S: it skips the site "
        f"module, which loads the hook {hint}"]


def test_a_module_of_a_parts_name_on_the_programs_path_is_never_the_part(tmp_path):
    """Modules named as the two parts, and a shlex.py (the spawn part imports shlex), beside the program, in its
    working directory and on its PYTHONPATH, the program started through a shell's -c (run's own check splits
    that text too): the parts are the files beside the hook, their shlex the standard library's, in run's
    process and the program's; the program's own `import shlex` still gets the one beside it, as without run."""
    d = tmp_path / "prog"
    d.mkdir()
    for name in (SPEC, SPAWN, "shlex"):
        (d / f"{name}.py").write_text(f"print('planted {name}', flush=True)\n")
    (d / "prog.py").write_text(
        "import subprocess, sys\nprint('before', flush=True)\n"
        "subprocess.run(['sh', '-c', sys.executable + ' -I -c pass'])\nprint('after', flush=True)\n"
        f"{PROBE}\nimport shlex\nprint('shlex', shlex.__file__)\n")
    r = tgp_run("--backend", "python", "--op", OP, "--", "sh", "-c", f"{PY} prog.py", cwd=d,
                env={"PYTHONPATH": f"{ROOT}{os.pathsep}{d}"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["before", "after", "active 1", "planted shlex", f"shlex {d / 'shlex.py'}"]
    assert f"(sh -c {PY} -I -c pass): {NAME} -I: isolated mode ignores PYTHONPATH" in r.stderr, r.stderr


@pytest.mark.parametrize("name,undone", [(SPEC, "it does nothing"),
                                         (SPAWN, "run in this environment names no process that drops the hook")])
def test_status_names_a_part_gone(tmp_path, monkeypatch, run_cli, name, undone):
    """The environment's files name a hook whose part is gone: status says which, and what that leaves
    undone (exit 1); with both there it says nothing of parts."""
    from torchgen_patch.runtime.launch import enable as en

    site = _site(tmp_path)
    packages = tmp_path / "site-packages"
    packages.mkdir()
    hook = str(site / "_torchgen_patch_hook.py")
    (packages / en.FILE).write_text(en.render(str(packages), hook))
    (packages / en.DATA).write_bytes(en.render_data(_spec(), hook=hook))
    assert en.state(str(packages)).problem.startswith("it loads the hook of another")  # this copy, its parts there
    (site / f"{name}.py").unlink()
    says = f"its hook's part {site / (name + '.py')} is gone (that torchgen-patch install is damaged: reinstall " \
           f"it): {undone}"
    assert en.state(str(packages)).problem == says
    monkeypatch.setattr(en, "site_dir", lambda: str(packages))
    rc, out, _ = run_cli("status")
    assert (rc, out) == (1, f"{packages / en.FILE}: {says} (`torchgen-patch enable` writes it again, `torchgen-patch "
                            "disable` removes it)\n")


def test_an_installed_enabled_environment_carries_the_parts_and_says_one_gone(tmp_path, wheel):
    """pip-installed from the wheel, `enable --strict --backend python`: the parts are beside the installed hook
    and a process is patched; the spec part removed by hand, a process goes on (no exit 3) and says so in one
    line, and status names it (exit 1)."""
    env = Env(tmp_path / "venv", wheel)
    r = env.tool("enable", "-q", "--strict", "--backend", "python", "--op", OP)
    assert r.returncode == 0, r.stderr
    here = os.path.join(env.site, "torchgen_patch", "runtime", "site")
    assert {SPEC + ".py", SPAWN + ".py"} <= set(os.listdir(here))
    r = env.run("-c", PROBE)
    assert (r.returncode, r.stdout, r.stderr) == (0, "active 1\n", "")
    part = os.path.join(here, SPEC + ".py")
    os.unlink(part)
    r = env.run("-c", PROBE)
    assert (r.returncode, r.stdout) == (0, "active 0\n"), r.stderr
    assert r.stderr.count("\n") == 1 and CANNOT.format(part, "No such file or directory") in r.stderr, r.stderr
    r = env.tool("status")
    assert r.returncode == 1 and f"its hook's part {part} is gone" in r.stdout, r.stdout + r.stderr
