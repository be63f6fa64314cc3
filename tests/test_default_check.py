"""The saved-tensor check on by default under `run`: sampled (each step checked with probability 1/32),
it finds a `.data` write that recurs every step between forward and backward within 300 steps (missed
with probability (31/32)^299 < 1e-4, by the law in docs/unseen-writes.md); `--check-saved=off` turns it
off; a program with no such write gets no finding; nothing compiles for it (the Python backend, and the
check's own hooks never built in a program's process when sampled)."""

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
for step in range(300):
    loss = torch.nn.functional.mse_loss(model(x), y)
    if WRITE:
        model[2].weight.data.mul_(0.999)  # an EMA-like write between forward and backward: no version moves
    opt.zero_grad()
    loss.backward()
    opt.step()
print("trained")
"""


def _run(tmp_path, *flags, write=True):
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("WRITE", str(write)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHGEN_PATCH_")}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "--backend", "python", *flags, "--",
                           sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)


def test_run_with_no_flag_finds_a_recurring_data_write_within_300_steps(tmp_path):
    r = _run(tmp_path)
    assert r.returncode == 0 and r.stdout == "trained\n", r.stderr
    assert re.search(r"^torchgen-patch: saved-tensor check on \(warn, 1 step in 32\) in pid \d+ \(train\.py\): "
                     r"(Python|native) hooks", r.stderr, re.M), r.stderr  # native where the user's cache has them
    found = [line for line in r.stderr.splitlines() if "saved tensor changed without a version bump" in line]
    assert found and all("`2.weight` of Sequential" in line for line in found), r.stderr
    assert "; fix: write " in found[0] and "not through `.data`" in found[0], found[0]
    count = r.stderr.splitlines()[-1]
    assert re.search(r"\(sampled at 1/32: \d+ of 300 draws hit\)$", count), count


@pytest.mark.parametrize("flags,write", [(["--check-saved=off"], True), ([], False)], ids=["off", "no write"])
def test_off_turns_it_off_and_a_program_without_the_write_gets_nothing(tmp_path, flags, write):
    r = _run(tmp_path, *flags, write=write)
    assert r.returncode == 0 and r.stdout == "trained\n", r.stderr
    assert "saved tensor changed" not in r.stderr
    assert ("saved-tensor check on" in r.stderr) == (not flags), r.stderr


@pytest.mark.parametrize("flags,says", [
    (["--check-saved=off", "--check-every", "4"], "--check-every need the saved-tensor check"),
    (["--check-every", "0"], "not a whole number of steps >= 1: '0'"),
])
def test_contradictory_or_bad_flags_are_refused_in_one_line(tmp_path, flags, says):
    r = _run(tmp_path, *flags)
    assert r.returncode == 2 and r.stdout == "" and says in r.stderr and len(r.stderr.splitlines()) <= 3, r.stderr
    assert "Traceback" not in r.stderr


NO_BACKWARD = """
import sys, torch
model = torch.nn.Linear(16, 1)
with torch.enable_grad():
    loss = model(torch.randn(8, 16)).sum()  # a graph is made and never run backward
heavy = sorted(m for m in ("torchgen_patch.runtime.checklib", "torchgen_patch.saved.hooks",
                           "torchgen_patch.saved.native") if m in sys.modules)
print("loaded:", ",".join(heavy) or "none")
"""


def test_a_process_that_runs_no_backward_pass_loads_nothing_of_the_check_and_says_nothing(tmp_path):
    """The sampled check starts at the end of the first backward pass: before it, only the callback on the
    return of each pass is there; the check's hooks, its native library and their lookup are not."""
    script = tmp_path / "infer.py"
    script.write_text(NO_BACKWARD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHGEN_PATCH_")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "--backend", "python", "--", sys.executable,
                        str(script)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout == "loaded: none\n", r.stdout + r.stderr
    assert "kernels active" in r.stderr and "saved-tensor check" not in r.stderr, r.stderr


def test_findings_go_to_the_folder_from_a_check_that_starts_at_the_first_backward_pass(tmp_path):
    r = _run(tmp_path, "--findings", str(tmp_path / "fleet"))
    assert r.returncode == 0 and "saved-tensor check on (warn, 1 step in 32)" in r.stderr, r.stderr
    files = os.listdir(tmp_path / "fleet")
    assert len(files) == 1 and files[0].startswith("findings-"), files
    lines = (tmp_path / "fleet" / files[0]).read_text().splitlines()
    count = re.search(r"saved-tensor check in pid \d+: (\d+) changed saved tensors", r.stderr)
    assert lines and count and len(lines) == int(count.group(1)), r.stderr  # a line each, the distinct said once


def test_uninstall_before_the_first_backward_pass_calls_the_start_off():
    code = """
import torch, torchgen_patch
from torchgen_patch import saved
from torchgen_patch.saved import engine, later
saved.enable_at_first_backward("warn", 4, quiet=False)
assert later.pending() is not None and engine.wrapped()
saved.disable()
assert later.pending() is None and not engine.wrapped()
torch.ones(1, requires_grad=True).exp().sum().backward()
saved.enable_at_first_backward("warn", 4, quiet=True, prepare=lambda: 1 / 0)
torch.ones(1, requires_grad=True).exp().sum().backward()  # the start fails: one line, the program goes on
assert later.pending() is None and not engine.wrapped()
print("done")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHGEN_PATCH_")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert re.fullmatch(r"torchgen-patch: saved-tensor check NOT on in pid \d+: ZeroDivisionError: division by zero\n",
                        r.stderr), r.stderr


def test_a_program_asking_for_the_check_before_its_first_backward_pass_gets_the_armed_one_drawn_once_a_pass():
    code = """
import torch
from torchgen_patch import saved
from torchgen_patch.saved import later, whole
saved.enable_at_first_backward("warn", 4, quiet=True)
check = saved.enable("warn", every=4, quiet=True)  # as a program that reads its check's findings does
assert later.pending() is None and check is whole.current() and check.sampler.every == 4
for _ in range(5):
    torch.ones(1, requires_grad=True).exp().sum().backward()
assert check.sampler.counts()[1] == 5, check.sampler.counts()  # a draw a pass, none twice
saved.disable()
saved.enable_at_first_backward("warn", 4, quiet=True)
on = whole.enable(saved.mode_of("warn"), None, 4, True)  # on already when the armed start comes
for _ in range(3):
    torch.ones(1, requires_grad=True).exp().sum().backward()
assert later.pending() is None and whole.current() is on and on.sampler.counts()[1] == 3, on.sampler.counts()
print("done")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHGEN_PATCH_")}
    env["PYTHONPATH"] = ROOT
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
