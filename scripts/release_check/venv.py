"""The venv of the release's time: .venv-check-<release>, torch of the release from the package index,
PyTorch's test dependencies, lintrunner and this project; and the environment a command runs in there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .config import ROOT, TEST_DEPS

def _sh(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
        sys.exit(f"error: {what} failed: {tail[0][:300]}")
    return r


def release_venv(release: str) -> str:
    """.venv-check-<release>: torch==release from the index, the test dependencies and this project."""
    path = os.path.join(ROOT, f".venv-check-{release}")
    python, marker = os.path.join(path, "bin", "python"), os.path.join(path, "pytorch-check.json")
    wanted = [f"torch=={release}", *TEST_DEPS]
    try:
        reuse = json.load(open(marker)) == wanted and os.path.isfile(python)
    except (OSError, ValueError):
        reuse = False
    if not reuse:
        if not os.path.isfile(python):
            _sh([sys.executable, "-m", "venv", path], "venv creation")
        _sh([python, "-m", "pip", "install", "-q", *wanted], f"pip install torch=={release}")
        _sh([python, "-m", "pip", "install", "-q", "--no-deps", "-e", ROOT], "pip install of this project")
        json.dump(wanted, open(marker, "w"))
    return python


def torch_version(python: str) -> str:
    return _sh([python, "-c", "import torch; print(torch.__version__)"], "import torch").stdout.strip()


def run_env(python: str) -> dict[str, str]:
    """The release venv active (VIRTUAL_ENV, PATH), CI unset (PyTorch's test utilities act as its CI then)."""
    venv = os.path.dirname(os.path.dirname(python))
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTHONPATH")}
    env.update(VIRTUAL_ENV=venv, PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""),
               TORCHGEN_PATCH_CACHE=os.path.join(ROOT, ".cache", f"torchgen-patch-{os.path.basename(venv)}"))
    return env
