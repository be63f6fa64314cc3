"""`torchgen-patch enable` / `disable` / `status`, in throwaway environments (a venv that sees this
torch through a path file, with torchgen-patch pip-installed from a wheel of this tree): every Python
process of the environment patched, whatever starts it; disable and pip uninstall leave the
interpreter's start as it was; the file an output like any other, and status truthful about it."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.build
PROBE = "import torch, torchgen_patch; print('active', len(torchgen_patch.installed_ops()))"
BACKWARD = "; torch.ones(1, requires_grad=True).exp().sum().backward()"  # the sampled check starts at its end
LINE = re.compile(r"^torchgen-patch: (\d+) kernels active \(cpp\), 0 refused, from the cached build; \d+ optimizer "
                  r"entries active, in pid \d+ "
                  r"\(python -c, enabled\)$", re.M)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    d = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(d),
                        ROOT], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return glob.glob(str(d / "*.whl"))[0]


def _inherited() -> dict:
    """This process's environment less PYTHONPATH: the environment's programs import what it installed."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


class Env:
    """A virtual environment of its own (torch seen through a path file), torchgen-patch installed in it."""

    def __init__(self, path, wheel):
        import torch

        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
        self.python = str(path / "bin" / "python")
        self.site = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(self.site, "same-torch.pth"), "w") as fh:
            fh.write(os.path.dirname(os.path.dirname(torch.__file__)) + "\n")
        # pip of this machine's configuration left out (a target, --user, a prefix would put it elsewhere), and
        # the caller's PYTHONPATH (a source tree on it, with the egg-info a wheel build leaves, is "installed")
        clean = {k: v for k, v in _inherited().items() if not k.startswith("PIP_")}
        r = subprocess.run([sys.executable, "-m", "pip", "--isolated", "--python", self.python, "install", "-q",
                            "--no-deps", "--no-index", "--disable-pip-version-check", wheel], capture_output=True,
                           text=True, env=dict(clean, PIP_CONFIG_FILE=os.devnull))
        assert r.returncode == 0, r.stderr
        self.pth = os.path.join(self.site, "torchgen_patch_enable.pth")
        self.data = os.path.join(self.site, "torchgen_patch_enable.json")
        records = glob.glob(os.path.join(self.site, "torchgen_patch-*.dist-info", "RECORD"))
        assert len(records) == 1, (r.stdout, r.stderr, sorted(os.listdir(self.site)))
        self.record = records[0]

    def run(self, *args, env=None, **kw):
        return subprocess.run([self.python, *args], capture_output=True, text=True,
                              env=dict(_inherited(), **(env or {})) if env is not False else {}, cwd=self.site, **kw)

    def tool(self, *args):
        return self.run("-m", "torchgen_patch", *args)

    def listing(self):
        return sorted(os.listdir(self.site)), open(self.record, "rb").read()


@pytest.fixture
def env(tmp_path, wheel):
    return Env(tmp_path / "venv", wheel)


def test_every_process_of_an_enabled_environment_is_patched_whatever_starts_it(env, tmp_path):
    """-I, -E, a cleared environment and a launcher the tool never sees: all out of run's reach, all
    patched; run inside the environment still installs once; -q keeps the processes quiet."""
    r = env.tool("enable")
    assert r.returncode == 0 and r.stdout.startswith(f"enabled: {env.pth}: every Python process of this environment "
                                                     "that imports torch gets the kernels (cpp: "), r.stderr
    assert "`pip uninstall torchgen-patch` undoes it" in r.stdout
    launcher = tmp_path / "launch.sh"  # a launcher of its own: a clean environment, then python -E
    launcher.write_text(f"#!/bin/sh\nexec env -i {env.python} -E -c \"{PROBE}{BACKWARD}\"\n")
    launcher.chmod(0o755)
    for r in (env.run("-I", "-c", PROBE + BACKWARD), subprocess.run([str(launcher)], capture_output=True, text=True)):
        assert r.returncode == 0 and r.stdout == f"active {LINE.search(r.stderr).group(1)}\n", r.stderr
        assert int(r.stdout.split()[1]) > 100 and len(r.stderr.splitlines()) == 2, r.stderr
        # the check, on by default, sampled, on the native hooks enable made (nothing compiled in the process)
        assert re.search(r"^torchgen-patch: saved-tensor check on \(warn, 1 step in 32\) in pid \d+ \(python -c\): "
                         r"native hooks", r.stderr, re.M), r.stderr
    r = env.run("-I", "-c", PROBE)  # no backward pass: the check never starts, and says nothing
    assert r.returncode == 0 and len(r.stderr.splitlines()) == 1 and "kernels active" in r.stderr, r.stderr
    r = env.tool("run", "--", env.python, "-c", PROBE)  # run's own hook and the environment's: one install
    assert r.returncode == 0 and len(re.findall("kernels active", r.stderr)) == 1 and "enabled" not in r.stderr
    assert env.tool("enable", "-q").returncode == 0
    r = env.run("-c", PROBE, env=False)
    assert (r.returncode, r.stderr) == (0, "") and int(r.stdout.split()[1]) > 100
    assert "one line per process" not in env.tool("status").stdout


def _start(python, *args):
    t = time.perf_counter()
    subprocess.run([python, *args, "-c", "pass"], check=True, capture_output=True)
    return time.perf_counter() - t


def test_enabled_adds_at_most_10ms_to_a_start_and_disable_leaves_it_as_before(env):
    """`python -c pass` with the file and without it (the disabled state), interleaved, best of 15 each;
    after disable the environment's site-packages and pip's RECORD are byte for byte what they were
    before enable, so a start reads exactly what it read before: nothing added."""
    before = env.listing()
    assert env.tool("enable").returncode == 0
    off = env.pth + ".off"  # not a .pth: the interpreter reads nothing of it
    plain, enabled = [], []
    for _ in range(15):  # interleaved, so load on the machine hits both; the best of each
        os.rename(env.pth, off)
        plain.append(_start(env.python))
        os.rename(off, env.pth)
        enabled.append(_start(env.python))
    assert min(enabled) - min(plain) <= 0.01, (min(enabled), min(plain))
    r = env.tool("disable")
    assert (r.returncode, r.stdout) == (0, f"disabled: removed {env.pth} and {env.data}, and their lines in pip's "
                                           "RECORD\n"), r.stderr
    assert env.listing() == before
    r = env.tool("disable")
    assert r.returncode == 0 and r.stderr == f"disable: not enabled ({env.pth} does not exist)\n"


def test_pip_uninstall_removes_it_and_a_tool_gone_or_damaged_does_nothing(env, tmp_path, wheel):
    assert env.tool("enable").returncode == 0
    r = subprocess.run([sys.executable, "-m", "pip", "--python", env.python, "uninstall", "-y", "torchgen-patch"],
                       capture_output=True, text=True, env=_inherited())  # a source tree on PYTHONPATH is "installed"
    assert r.returncode == 0 and not os.path.exists(env.pth), r.stdout + r.stderr
    r = env.run("-c", "import torch; print('started')")
    assert (r.returncode, r.stdout, r.stderr) == (0, "started\n", "")
    other = Env(tmp_path / "other", wheel)
    assert other.tool("enable").returncode == 0
    hook = os.path.join(other.site, "torchgen_patch", "runtime", "site", "_torchgen_patch_hook.py")
    with open(hook, "w") as fh:  # damaged: no Python at all
        fh.write("this is not Python (\n")
    shutil.rmtree(os.path.join(other.site, "torchgen_patch", "runtime", "site", "__pycache__"), ignore_errors=True)
    for says in ("SyntaxError: ",
                 f"LookupError: its hook {hook} is gone"):  # damaged, then gone: one line, never a stop
        r = other.run("-c", "import torch; print('started')")
        assert (r.returncode, r.stdout) == (0, "started\n") and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("torchgen-patch: NOT active in pid ") and f"{other.pth}: {says}" in r.stderr
        shutil.rmtree(os.path.join(other.site, "torchgen_patch"))  # then gone (removed by hand), the file left
        os.makedirs(os.path.join(other.site, "torchgen_patch"))
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "status"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))  # this environment's own: not enabled
    assert r.returncode == 1 and r.stdout.startswith("not enabled: ")


def test_a_damaged_file_leaves_every_program_running_unpatched_and_says_so(env):
    """A spec edited into one no torchgen-patch installs: each process that imports torch goes on, with
    one line naming the data file and what to do; status names it once. Enabled again with one op:
    counts of one."""
    assert env.tool("enable", "--op", "aten::_cummin_helper").returncode == 0
    text = open(env.data).read()
    with open(env.data, "w") as fh:
        fh.write(text.replace('"backend": "cpp"', '"backend": "pyth0n"'))
    hint = "(hint: `torchgen-patch enable` writes it again, `torchgen-patch disable` removes it)"
    for args in (("-c", PROBE), ("-I", "-c", PROBE)):
        r = env.run(*args)
        assert (r.returncode, r.stdout) == (0, "active 0\n"), r.stderr
        assert re.fullmatch(rf"torchgen-patch: NOT active in pid \d+: {re.escape(env.data)}: unknown backend 'pyth0n' "
                            rf"{re.escape(hint)}\n", r.stderr), r.stderr
    r = env.tool("status")
    assert (r.returncode, r.stdout) == (1, f"{env.pth}: {env.data}: unknown backend 'pyth0n' (`torchgen-patch enable` "
                                           "writes it again, `torchgen-patch disable` removes it)\n")
    with open(env.data, "w") as fh:  # the spec no longer one: the hook's own reading of it, the same rule
        fh.write(text.replace('"roots"', '"rootz"'))
    r = env.run("-c", PROBE)
    assert (r.returncode, r.stdout) == (0, "active 0\n"), r.stderr
    assert re.fullmatch(rf"torchgen-patch: NOT active in pid \d+: {re.escape(env.data)}: not a launch spec of "
                        rf"torchgen-patch \('roots' is NoneType\) {re.escape(hint)}\n", r.stderr), r.stderr
    r = env.tool("enable", "--op", "aten::_cummin_helper", "--check-saved=off")
    assert r.returncode == 0 and re.search(r"\(cpp: 1 kernel, (from the cached build|built now)\)", r.stdout), r.stdout
    assert env.tool("status").returncode == 0
    r = env.run("-c", PROBE)
    assert (r.returncode, r.stdout) == (0, "active 1\n") and re.fullmatch(
        r"torchgen-patch: 1 kernel active \(cpp\), 0 refused, from the cached build; \d+ optimizer entr(y|ies) "
        r"active, in pid \d+ \(python -c, enabled\)\n", r.stderr), r.stderr


def test_status_says_what_the_file_is(env):
    assert env.tool("status").returncode == 1
    assert env.tool("enable").returncode == 0
    r = env.tool("status")
    assert r.returncode == 0 and r.stdout.startswith(f"enabled: {env.pth} (torchgen-patch 0.1.0; cpp, every op of "
                                                     "the plan; the build it names is there; one line per process; "
                                                     "fail open: a process that cannot have the kernels runs "
                                                     "unpatched, said in one line; saved-tensor check: warn, 1 step "
                                                     "in 32; "
                                                     "pip uninstall torchgen-patch removes it)"), r.stdout
    text, data = open(env.pth).read(), open(env.data).read()
    gone = os.path.join(env.site, "torchgen_patch", ""), "/gone/torchgen_patch/"
    old = "# torchgen-patch 0.0.9: every Python process ...\nimport os, sys; exec('pass')\n"
    for (changed, changed_data), says in [
        ((text, data.replace('"torchgen_patch": "0.1.0"', '"torchgen_patch": "0.0.9"')),
         "written by torchgen-patch 0.0.9; this is 0.1.0"),
        ((text.replace(*gone), data.replace(*gone)),
         "its hook /gone/torchgen_patch/runtime/site/_torchgen_patch_hook.py is gone (that torchgen-patch was "
         "uninstalled or moved): it does nothing"),
        ((text.replace("import os, sys", "import os, sys, antigravity"), data),
         "it is not as torchgen-patch writes it (edited?): what it does is its own"),
        (("import os\n", data), "it is not as torchgen-patch writes it (edited?): what it does is its own"),
        ((old, data), "written by torchgen-patch 0.0.9 in a form this one does not read"),
        ((text, data.replace('"backend": "cpp"', '"backend": "pyth0n"')), f"{env.data}: unknown backend 'pyth0n'"),
        ((text, data[:len(data) // 2]), f"{env.data} is damaged (not the JSON torchgen-patch writes)"),
    ]:
        assert (changed, changed_data) != (text, data)
        for path, content in ((env.pth, changed), (env.data, changed_data)):
            with open(path, "w") as fh:
                fh.write(content)
        r = env.tool("status")
        assert (r.returncode, r.stdout.split(": ", 1)[-1].split(" (`torchgen-patch enable`")[0]) == (1, says)


def test_an_environment_of_another_account_or_read_only_is_refused_in_one_line(env):
    before = env.listing()
    os.chown(env.site, 65534, -1)  # another account's environment: root would leave a file of its own there
    try:
        r = env.tool("enable")
    finally:
        os.chown(env.site, 0, -1)
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and r.stdout == "", r.stderr
    assert r.stderr.startswith(f"torchgen-patch: error: {env.site} belongs to ")
    assert "(hint: run torchgen-patch enable as that account" in r.stderr
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed: no read-only mount to try")
    ro = f"mount --bind {env.site} {env.site} && mount -o remount,bind,ro {env.site} && " \
         f"exec {env.python} -m torchgen_patch enable"
    r = subprocess.run(["unshare", "-m", "sh", "-c", ro], capture_output=True, text=True, cwd=env.site)
    if "mount" in r.stderr and "torchgen-patch" not in r.stderr:
        pytest.skip(f"no private read-only mount here: {r.stderr.strip()}")
    assert (r.returncode, r.stderr) == (3, f"torchgen-patch: error: cannot write into {env.site}: it is on a read-only "
                                           "file system (hint: enable a writable environment (a read-only image is "
                                           "enabled when it is built))\n")
    assert env.listing() == before
