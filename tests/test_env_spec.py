"""In an enabled environment no variable chooses the code a process imports: ``$TORCHGEN_PATCH_RUN``
governs only where run's own hook passed it on (its PYTHONPATH entry), never under ``python -I`` or
``-E``, never with fewer kernels than the environment's own data file, never stops a program the file
lets run, and never names where the tool or its dependencies come from (the tool is imported from
where the hook is). Another account's directory named by the variable: nothing of it is imported."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_enable import Env, wheel

PROBE = "import torch, torchgen_patch; print('active', len(torchgen_patch.installed_ops()))"
NOT_USED = re.compile(r"^torchgen-patch: \$TORCHGEN_PATCH_RUN not used in pid \d+ \(python -c, enabled\): (.+); "
                      r"this environment's own launch spec governs \((.+)\)$", re.M)
OTHER = 65534  # another account: nobody


@pytest.fixture(scope="module")
def enabled(tmp_path_factory, wheel):
    e = Env(tmp_path_factory.mktemp("envspec") / "venv", wheel)
    r = e.tool("enable")
    assert r.returncode == 0, r.stderr
    with open(e.data) as fh:
        e.spec = json.load(fh)
    e.hook_dir = os.path.join(e.site, "torchgen_patch", "runtime", "site")
    return e


def _planted(tmp_path) -> tuple[str, str]:
    """A directory of another account, writable by all, holding a ``torchgen_patch`` and a ``yaml`` package
    whose import leaves a mark: (the directory, the mark)."""
    d, mark = tmp_path / "theirs", tmp_path / "imported"
    for name in ("torchgen_patch", "yaml"):
        (d / name).mkdir(parents=True)
        (d / name / "__init__.py").write_text(f"open({str(mark)!r}, 'a').write({name!r} + '\\n')\n")
    for p in (d, *d.rglob("*")):
        os.chown(p, OTHER, OTHER) if os.geteuid() == 0 else None
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    return str(d), str(mark)


def _variable(env, **change) -> str:
    spec = dict(env.spec, **change)
    spec.pop("enabled_by", None)
    return json.dumps(spec)


def _lines(r) -> list[str]:
    """The lines of stderr less the saved-tensor check's own (on by default in an enabled environment)."""
    return [line for line in r.stderr.splitlines() if not line.startswith("torchgen-patch: saved-tensor check")]


def _active(r) -> int:
    assert r.returncode == 0, r.stderr
    m = re.fullmatch(r"active (\d+)\n", r.stdout)
    assert m, (r.stdout, r.stderr)
    return int(m.group(1))


@pytest.mark.build
def test_a_variable_naming_another_accounts_directory_imports_nothing_of_it(enabled, tmp_path):
    """No flag, -I, -E and a cleared environment with -I: the variable is not used (one line that says why),
    the environment's own spec installs every kernel, and the planted packages are never imported."""
    theirs, mark = _planted(tmp_path)
    value = _variable(enabled, roots=dict(enabled.spec["roots"], torchgen_patch=theirs, yaml=theirs))
    cases = {
        "no flag": (enabled.run("-c", PROBE, env={"TORCHGEN_PATCH_RUN": value}), "it did not come with run's"),
        "-I": (enabled.run("-I", "-c", PROBE, env={"TORCHGEN_PATCH_RUN": value}), "python -I or -E"),
        "-E": (enabled.run("-E", "-c", PROBE, env={"TORCHGEN_PATCH_RUN": value}), "python -I or -E"),
        "env -i, -I": (subprocess.run(["env", "-i", f"TORCHGEN_PATCH_RUN={value}", enabled.python, "-I", "-c", PROBE],
                                      capture_output=True, text=True, cwd=theirs), "python -I or -E"),
    }
    for how, (r, why) in cases.items():
        assert _active(r) > 100, how
        lines = _lines(r)
        assert len(lines) == 2 and "kernels active (cpp)" in lines[1], (how, r.stderr)
        m = NOT_USED.match(lines[0])
        assert m and m.group(1).startswith(why) and m.group(2) == enabled.data, (how, r.stderr)
        assert not os.path.exists(mark), (how, open(mark).read())


@pytest.mark.build
def test_under_runs_hook_the_variable_governs_but_never_chooses_the_tool(enabled, tmp_path):
    """run's own hook on PYTHONPATH (as run starts a program): the variable's spec governs, the tool and its
    dependencies still come from where the environment has them."""
    theirs, mark = _planted(tmp_path)
    value = _variable(enabled, roots=dict(enabled.spec["roots"], torchgen_patch=theirs, yaml=theirs), strict=False)
    r = enabled.run("-c", PROBE, env={"TORCHGEN_PATCH_RUN": value, "PYTHONPATH": enabled.hook_dir})
    assert _active(r) > 100 and "not used" not in r.stderr and "enabled" not in r.stderr, r.stderr
    assert not os.path.exists(mark)


@pytest.mark.build
def test_a_variable_that_asks_for_less_or_is_no_spec_gives_way_to_the_environments_file(enabled):
    """One op instead of all, the runtime ops left out, no spec at all: the environment's own spec
    governs, with one line; a fail-open environment's program is never stopped by the variable."""
    one = _variable(enabled, ops=["aten::_cummin_helper"])
    full = _active(enabled.run("-c", PROBE))
    for value, hook, why in ((one, True, "it asks for 1 op, fewer than the environment installs"),
                             (one, False, "it did not come with run's"),
                             ("{", True, "not a launch spec of torchgen-patch"),
                             ("{", False, "it did not come with run's")):
        extra = {"PYTHONPATH": enabled.hook_dir} if hook else {}
        r = enabled.run("-c", PROBE, env=dict(extra, TORCHGEN_PATCH_RUN=value))
        assert _active(r) == full, r.stderr
        m = NOT_USED.search(r.stderr)
        assert m and m.group(1).startswith(why), (value, hook, r.stderr)
        assert len(_lines(r)) == 2, r.stderr


def test_a_plain_runs_variable_never_chooses_where_the_tool_comes_from(tmp_path):
    """Not an enabled environment (run's hook on PYTHONPATH): the tool is the hook's own, whatever the
    variable's ``roots`` say."""
    from torchgen_patch.runtime.launch.launcher import SITE, launch_spec
    from torchgen_patch.sources import Options

    theirs, mark = _planted(tmp_path)
    spec = launch_spec(Options(), "python", ["aten::_cummin_helper"], [], [])
    value = json.dumps(dict(spec.to_dict(), roots=dict(spec.roots, torchgen_patch=theirs)))
    r = subprocess.run([sys.executable, "-c", "import torch; print('ok')"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=SITE, TORCHGEN_PATCH_RUN=value), cwd=ROOT)
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr
    assert "1 kernel active (python)" in r.stderr and not os.path.exists(mark), r.stderr
