"""A virtual environment without torch, for running a checkout-layout tree's codegen the way a
PyTorch source build does, and the console script pip would write for the tool in one (stdlib
only; never imports torch or torchgen)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

BASE = ["pyyaml", "jinja2", "typing_extensions"]
_MARKER = "notorch-venv.json"


def _python(path: str) -> str:
    return os.path.join(path, "Scripts", "python.exe") if os.name == "nt" else os.path.join(path, "bin", "python")


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-30:])
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")


def make_venv(path: str, packages: list[str]) -> str:
    """Create (or reuse, if its marker records the same packages) a venv at `path` with BASE +
    `packages` installed; returns its python. Raises RuntimeError if torch is importable there."""
    wanted = sorted(set(BASE + list(packages)))
    python, marker = _python(path), os.path.join(path, _MARKER)
    try:
        with open(marker) as f:
            reuse = json.load(f) == wanted and os.path.isfile(python)
    except (OSError, ValueError):
        reuse = False
    if not reuse:
        shutil.rmtree(path, ignore_errors=True)
        _run([sys.executable, "-m", "venv", path], "venv creation")
        _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *wanted], "pip install")
        with open(marker, "w") as f:
            json.dump(wanted, f)
    if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
        raise RuntimeError(f"torch is importable in the venv at {path}; it must not be (installed as a "
                           f"dependency of {packages}?)")
    return python


def entry_point(python: str, bin_dir: str) -> str:
    """A `torchgen-patch` console script for ``python`` in ``bin_dir``, written as pip writes one
    (its own folder first on sys.path, never the current directory); returns its path."""
    os.makedirs(bin_dir, exist_ok=True)
    path = os.path.join(bin_dir, "torchgen-patch")
    with open(path, "w") as fh:
        fh.write(f"#!{python}\nimport sys\nfrom torchgen_patch.cli import main\nsys.exit(main())\n")
    os.chmod(path, 0o755)
    return path
