"""Issue 13's user: a fresh venv with their own torch installed first, then `pip install` of this
project; no other torch may appear, and `torchgen-patch run -- python -c ...` patches the program.

The seed repro (split_with_sizes_copy.out) already bumps on CPU by luck, so the program also
steps a fused SGD op, which CPU leaves at version 0 unpatched: the same program run directly in
the same venv must print 0 there, so the test fails if `run` patched nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.build

PROGRAM = """
import torch
x = torch.randn(2, 2)
y, z = torch.empty(2, 1), torch.empty(2, 1)
torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
print(y._version, z._version)
p, g, m = [torch.zeros(3)], [torch.ones(3)], []
torch._fused_sgd_(p, g, m, weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0, nesterov=False,
                  maximize=False, is_first_step=True)
print(p[0]._version)
"""


def _pip(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory):
    if os.environ.get("TORCHGEN_PATCH_NO_VENV"):
        pytest.skip("TORCHGEN_PATCH_NO_VENV is set (a machine with no package index)")
    import torch

    venv = str(tmp_path_factory.mktemp("user") / "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True)
    python = os.path.join(venv, "bin", "python")
    version = torch.__version__.split("+")[0]
    r = _pip(python, f"torch=={version}", "ninja")
    if r.returncode != 0:
        pytest.skip(f"torch {version} cannot be installed here: {r.stderr.strip().splitlines()[-1:]}")
    before = subprocess.run([python, "-c", "import torch; print(torch.__version__, torch.__file__)"],
                            capture_output=True, text=True, check=True).stdout + _torch_line(python)
    r = _pip(python, ROOT)  # the project, as a user installs it: not editable, its own dependencies
    assert r.returncode == 0, r.stderr
    return python, before


def _freeze(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    return {line.split("==")[0].split(" @ ")[0].lower(): line for line in out.splitlines()}


def _torch_line(python: str) -> str:
    return _freeze(python)["torch"] + "\n"


def test_pip_install_keeps_the_users_torch(user_venv):
    python, before = user_venv
    after = subprocess.run([python, "-c", "import torch; print(torch.__version__, torch.__file__)"],
                           capture_output=True, text=True, check=True).stdout + _torch_line(python)
    assert after == before and after.splitlines()[-1].startswith("torch==")  # the very build installed first
    names = _freeze(python)
    cpu_build = "+cpu" in before.split()[0]  # a CPU build brings no CUDA libraries, and the project adds none
    assert "torchgen-patch" in names and (not cpu_build or not [n for n in names if n.startswith("nvidia")])


def test_run_patches_the_seed_repro_in_the_users_venv(user_venv, tmp_path):
    python, _ = user_venv
    tool = os.path.join(os.path.dirname(python), "torchgen-patch")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCHGEN_PATCH_EXTRA_CFLAGS")}
    env["TORCHGEN_PATCH_CACHE"] = str(tmp_path / "cache")  # a user's own cache: built here, once
    env["PATH"] = os.path.dirname(python) + os.pathsep + env["PATH"]  # the venv, activated
    plain = subprocess.run([python, "-c", PROGRAM], capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert plain.stdout == "1 1\n0\n", plain.stderr  # unpatched: the fused step does not bump on CPU
    r = subprocess.run([tool, "run", "--", "python", "-c", PROGRAM], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (0, "1 1\n1\n"), r.stderr
    assert "kernels active (cpp), 0 refused" in r.stderr
