"""The variables every process reads, checked where they are read: ``run`` refuses a bad one before the
program starts (exit 2, one line); in a process a bad value affects only the choice it names, never the
kernels nor the check."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

ENV = dict(os.environ, PYTHONPATH=ROOT)
PROG = ("import torch\nx = torch.ones(3, requires_grad=True)\ny = torch.ones(3)\nz = (x * y).sum()\n"
        "y.data.mul_(2)\nz.backward()\nprint('backward done')\n")


@pytest.mark.parametrize("check", [[], ["--check-saved=warn"]])
def test_run_refuses_a_bad_check_path_variable_in_one_line(tmp_path, check):
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "--backend", "python", *check, "--",
                        sys.executable, "-c", "open('ran', 'w')"], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(ENV, TORCHGEN_PATCH_CHECK_PATH="bogus"))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr == ("torchgen-patch: error: $TORCHGEN_PATCH_CHECK_PATH is 'bogus', neither 'native' nor 'python' "
                        "(hint: set it to native or python, or unset it)\n")
    assert not (tmp_path / "ran").exists()


def test_in_a_process_a_bad_check_path_variable_costs_neither_the_kernels_nor_the_check(tmp_path):
    """install() with the check on, the variable bad: the kernels registered, the check on (its line says the
    variable was ignored), and the write between forward and backward found."""
    code = ("import torch, torchgen_patch\nrep = torchgen_patch.install(['aten::_cummin_helper'], backend='python', "
            "check_saved='warn')\nprint('kernels', len(rep.registered) + len(rep.already))\n" + PROG)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(ENV, TORCHGEN_PATCH_CHECK_PATH="bogus"))
    assert r.returncode == 0 and r.stdout == "kernels 1\nbackward done\n", r.stderr
    on = re.search(r"^torchgen-patch: saved-tensor check on \(warn, every step\) in pid \d+ \(python -c\): .*; "
                   r"\$TORCHGEN_PATCH_CHECK_PATH is 'bogus', neither 'native' nor 'python': ignored, either path may "
                   r"run$", r.stderr, re.M)
    assert on, r.stderr
    assert re.search(r"saved tensor|saved for backward", r.stderr[on.end():]), r.stderr
    assert "NOT active" not in r.stderr and "Traceback" not in r.stderr


def test_a_bad_path_argument_is_still_refused_before_anything_runs():
    import torchgen_patch

    with pytest.raises(ValueError, match="must be 'native' or 'python', not 'bogus'"):
        torchgen_patch.check_saved("warn", path="bogus")
