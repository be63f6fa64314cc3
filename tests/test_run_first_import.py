"""`torchgen-patch run` and what a program does before its own `import torch`: an environment variable
it sets first must still reach torch (PyTorch's own test_torch.py, `test_terminate_handler_on_crash`,
found by the release check: docs/release-check.md)."""

from __future__ import annotations

import subprocess
import sys

from tests.test_run import tgp_run

# The child of PyTorch's test: sets TORCH_CUSTOM_TERMINATE, then imports torch and aborts; torch's
# terminate handler (installed at import when the variable is set) prints its message on stdout.
CHILD = 'import os; os.environ["TORCH_CUSTOM_TERMINATE"] = "1"; import torch, torch._C; torch._C._abort()'
MESSAGE = "Unhandled exception caught in c10/util/AbortHandler.h"


def test_the_scenario_shows_the_message_unpatched():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert r.returncode != 0 and MESSAGE in r.stdout, r.stdout[-500:] + r.stderr[-500:]


def test_an_environment_variable_set_before_import_torch_reaches_torch_under_run():
    r = tgp_run("--backend", "python", "--op", "aten::_cummax_helper", "--", sys.executable, "-c", CHILD)
    assert r.returncode != 0 and MESSAGE in r.stdout, r.stdout[-500:] + r.stderr[-500:]
