"""The sampled check started at the end of the first backward pass (``saved/later.py``): each
test runs a small program in a process of its own, with the start armed as ``run`` and ``enable`` arm it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(8, 16), torch.randn(8, 1)
def train(steps=60):
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        model[2].weight.data.mul_(0.999)  # no version moves
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def _python(code: str, **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHGEN_PATCH_")}
    env.update(PYTHONPATH=ROOT, TORCHGEN_PATCH_CHECK_PATH="python", **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_a_training_loop_on_a_thread_of_its_own_gets_the_check():
    """The program's first backward pass runs on a thread other than the one that imported torch (a
    training loop in a thread, as Ray Train runs one): the check starts there, or says it did not start;
    it never stays armed in silence while every backward pass goes unchecked."""
    r = _python("""
import threading
from torchgen_patch import saved
saved.enable_at_first_backward("warn", 2)
""" + TRAIN + """
t = threading.Thread(target=train)
t.start(); t.join()
""", TORCHGEN_PATCH_CHECK_SEED="3")
    assert r.returncode == 0, r.stderr
    assert "saved-tensor check on" in r.stderr or "saved-tensor check NOT on" in r.stderr, r.stderr
    assert "saved tensor changed without a version bump" in r.stderr, r.stderr


def test_a_start_armed_over_a_sampled_check_already_on_draws_once_a_pass():
    r = _python("""
import torch
from torchgen_patch import saved
saved.enable_at_first_backward("warn", 4, quiet=True)  # what run's install arms
c = saved.enable("warn", every=4, quiet=True)  # the program's own check, on already
torch.ones(3, requires_grad=True).exp().sum().backward()
print(c.sampler.counts()[1])
""")
    assert r.returncode == 0 and r.stdout == "1\n", r.stdout + r.stderr


def test_a_start_armed_over_a_check_on_every_step_never_says_the_check_is_not_on():
    """A second install (sampled) whose start cannot prepare, over the check already on every step: the
    check is on, and no line says it is NOT on (``arm``: "on already, nothing changes")."""
    r = _python("""
import torch
from torchgen_patch import saved
c = saved.enable("warn", every=1, quiet=True)
saved.enable_at_first_backward("warn", 32, quiet=True, prepare=lambda: 1 / 0)
torch.ones(3, requires_grad=True).exp().sum().backward()
""")
    assert r.returncode == 0, r.stderr
    assert "NOT on" not in r.stderr, r.stderr


def test_a_child_forked_before_the_first_backward_pass_draws_on_its_own():
    """sample.py: with $TORCHGEN_PATCH_CHECK_SEED, "a forked child then seeds from that seed and its pid".
    A child forked after the start was armed and before it ran must not draw the parent's very steps."""
    r = _python("""
import os, torch
from torchgen_patch import saved
from torchgen_patch.saved import whole
saved.enable_at_first_backward("warn", 2, quiet=True)
r, w = os.pipe()
pid = os.fork()
seen = ""
for _ in range(40):
    torch.ones(3, requires_grad=True).exp().sum().backward()
    seen += "1" if whole.current().sampler.laid else "0"
if pid == 0:
    os.write(w, seen.encode())
    os._exit(0)
os.waitpid(pid, 0)
print(seen == os.read(r, 100).decode())
""", TORCHGEN_PATCH_CHECK_SEED="5")
    assert r.returncode == 0 and r.stdout == "False\n", r.stdout + r.stderr


def test_a_relative_findings_folder_is_where_it_was_when_the_check_was_armed(tmp_path):
    """$TORCHGEN_PATCH_FINDINGS relative: the folder is the one it named when the check was armed (at
    import torch), not wherever the program has changed directory to by its first backward pass (Hydra's
    run directory)."""
    (tmp_path / "run").mkdir()
    r = _python(f"""
import os
os.chdir({str(tmp_path)!r})
from torchgen_patch import saved
saved.enable_at_first_backward("warn", 2, quiet=True)
""" + TRAIN + """
os.chdir("run")  # the program's own run directory
train()
""", TORCHGEN_PATCH_CHECK_SEED="3", TORCHGEN_PATCH_FINDINGS="fleet")
    assert r.returncode == 0 and re.search(r"[1-9]\d* changed saved tensors", r.stderr), r.stderr
    assert (tmp_path / "fleet").is_dir() and not (tmp_path / "run" / "fleet").exists()


def test_uninstall_before_the_first_backward_pass_calls_off_the_start_install_armed():
    """``uninstall()``: "turn off the saved-tensor check install() turned on" (an armed start included)."""
    r = _python("""
import torch, torchgen_patch
from torchgen_patch.saved import later  # (saved.whole imports saved.hooks: not here, as run's process has not)
torchgen_patch.install(backend="python", runtime_ops=["aten::abs_"], check_saved="warn", check_every=32)
assert later.pending() is not None
torchgen_patch.uninstall()
torch.ones(3, requires_grad=True).exp().sum().backward()
from torchgen_patch.saved import whole
print(later.pending() is None and whole.current() is None)
""")
    assert r.returncode == 0 and r.stdout == "True\n", r.stdout + r.stderr
    assert "saved-tensor check on" not in r.stderr, r.stderr


@pytest.mark.parametrize("start", ["armed", "on"])
def test_a_program_using_torch_func_grad_runs_under_the_sampled_check(start):
    """torch.func.grad runs autograd.grad inside a block where saved-tensor hooks are refused: a draw made at
    the end of that inner pass must not lay the check's hooks there (the program died with RuntimeError)."""
    on = 'saved.enable_at_first_backward("warn", 2)' if start == "armed" else 'saved.enable("warn", every=2)'
    r = _python(f"""
import torch
from torchgen_patch import saved
{on}
w = torch.randn(4)
for _ in range(20):
    torch.func.grad(lambda x: (x * w).sin().sum())(torch.randn(4))
    torch.randn(4, requires_grad=True).exp().sum().backward()
print("ran")
""", TORCHGEN_PATCH_CHECK_SEED="1")
    assert r.returncode == 0 and r.stdout == "ran\n", r.stderr[-2000:]
