"""The saved-tensor check sampled by step (``every=N``, ``torchgen_patch/saved/sample.py``): a step not
drawn has no saved-tensor hooks at all, each backward pass is a draw, what was saved under the hooks is
compared whenever it is used, and the first step that finds a write recurring every step follows the law
docs/unseen-writes.md states, in one process and with 2 ranks (gloo)."""

from __future__ import annotations

import math
import re
import os
import statistics
import subprocess
import sys
import threading

import pytest
import torch

import torchgen_patch
from tests.conftest import ROOT
from tests.support import script
from torchgen_patch.saved import check_saved, compose, engine, sample

law = script("saved_sample_law")


# the draw, what is said, what a process of its own does: the default path alone
ONE_PATH = ("law", "every_is", "the_draw", "enable_says", "install_sampled")
# those run on the default path, the native hooks, which the autouse fixture compiles where the cache lacks them
ONE_PATH_BUILDS = pytest.mark.build


def pytest_generate_tests(metafunc):
    """The mechanism on both paths (native and Python)."""
    if "check_path" in metafunc.fixturenames and not any(w in metafunc.function.__name__ for w in ONE_PATH):
        metafunc.parametrize("check_path", ["native", "python"], indirect=True)


@pytest.fixture(autouse=True)
def check_path(request, monkeypatch):
    param = getattr(request, "param", None)
    if param is not None:
        monkeypatch.setenv("TORCHGEN_PATCH_CHECK_PATH", param)
    from torchgen_patch.runtime import checklib

    assert checklib.prepare(param) is None or param == "python"
    return param


class Scripted:
    """Draws in a given order (the check's own draw is random), counted as the check's are."""

    def __init__(self, *outcomes: bool):
        self.outcomes, self.draws, self.drawn = list(outcomes), 0, 0

    def __call__(self) -> bool:
        hit = self.outcomes[self.draws]
        self.draws += 1
        self.drawn += hit
        return hit


def _sampled(*outcomes: bool, mode: str = "warn"):
    c = check_saved(mode, every=4)
    c.sampler.draw = Scripted(*outcomes)
    return c


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


X = torch.randn(3, 4)


def _nothing_of_the_check_left() -> bool:
    return engine.top() is None and not engine.wrapped() and not compose.patched()


def test_every_step_is_the_check_of_every_step_with_nothing_wrapped():
    net = _net()
    with check_saved("warn") as c:
        assert c.sampler.counts() is None and not engine.wrapped()
        for _ in range(3):
            assert engine.top() is not None
            loss = net(X).sum()
            net[2].weight.data.mul_(2)
            loss.backward()
    assert len(c.findings) == 3 and _nothing_of_the_check_left()


def test_a_step_not_drawn_has_no_hooks_at_all_and_a_drawn_one_finds_the_write():
    drawn = (False, True, False, False, True, True, False)  # the first step is never drawn
    net = _net()
    c = _sampled(*drawn[1:], False).start()  # a draw at the end of each backward pass, for the next step
    found = []
    try:
        assert engine.wrapped()
        for step in range(len(drawn)):
            assert (engine.top() is not None) == drawn[step] == c.sampler.laid, step
            loss = net(X).sum()
            assert (engine.top() is not None) == drawn[step], step  # no hooks through a forward not drawn
            net[2].weight.data.mul_(-1)
            before = len(c.findings)
            loss.backward()
            found.append(len(c.findings) > before)
    finally:
        c.stop()
    assert tuple(found) == drawn
    assert c.sampler.counts() == (3, len(drawn), 4) and _nothing_of_the_check_left()


def test_each_backward_pass_is_a_draw_but_one_inside_another():
    """Gradient accumulation (several backward passes to a step), ``autograd.grad``, a retained graph used
    again: each is a draw. A reentrant checkpoint's backward runs inside the outer pass: not one."""
    net = _net()
    c = _sampled(*[True, False] * 8).start()
    try:
        for _ in range(3):  # three micro-batches, one optimizer step
            net(X).sum().backward()
        assert c.sampler.draw.draws == 3
        x = X.clone().requires_grad_()
        torch.autograd.grad(net(x).sum(), x)
        loss = net(X).sum()
        loss.backward(retain_graph=True)
        loss.backward()
        assert c.sampler.draw.draws == 6
        x = X.clone().requires_grad_()
        torch.utils.checkpoint.checkpoint(net, x, use_reentrant=True).sum().backward()
        assert c.sampler.draw.draws == 7
    finally:
        c.stop()
    assert _nothing_of_the_check_left()


def test_what_was_saved_under_the_hooks_is_compared_after_they_were_lifted():
    net = _net()
    c = _sampled(True, False, False).start()
    try:
        net(X).sum().backward()  # the first step, never drawn: the draw at its end lays the hooks for the next
        loss = net(X).sum()
        loss.backward(retain_graph=True)
        assert not c.sampler.laid and engine.top() is None and not c.findings
        net[2].weight.data.mul_(2)  # between two passes over the graph saved while the hooks were on
        loss.backward()
    finally:
        c.stop()
    assert len(c.findings) == 1 and c.findings[0].node == "AddmmBackward0"


def test_a_process_that_runs_no_backward_never_draws_and_never_has_the_hooks():
    """Inference, or evaluation with grad mode on, in a process where the sampled check is on (as by
    default under run and enable): no draw, no hooks, whatever its forwards save."""
    net = _net()
    c = check_saved("warn", every=1 << 30).start()
    c.sampler.draw = Scripted(*[True] * 8)  # a draw would lay the hooks: none is made
    try:
        for _ in range(5):
            assert engine.top() is None
            net(X).sum()
            with torch.no_grad():
                net(X)
    finally:
        c.stop()
    assert c.sampler.counts() == (0, 0, 1 << 30) and _nothing_of_the_check_left()


def test_a_backward_in_another_thread_is_no_draw_of_this_thread():
    net = _net()
    c = _sampled(False, True).start()
    try:
        t = threading.Thread(target=lambda: net(X).sum().backward())
        t.start()
        t.join()
        assert c.sampler.draw.draws == 0 and engine.top() is None
    finally:
        c.stop()


@pytest.mark.parametrize("block", ["each step", "the whole loop"])
def test_the_programs_own_hooks_keep_their_place(block):
    """The program's saved-tensor hooks (``save_on_cpu``) around each step or around the whole loop: the
    check laid and lifted between steps keeps them working, finds the write on drawn steps, leaves the stack
    as it was."""
    draws = [False, True, True, False, True, False, False, True, False]  # laid or not, step by step
    net = _net()
    c = _sampled(*draws[1:], False).start()  # the first step is never drawn
    found = []
    try:
        whole = torch.autograd.graph.save_on_cpu() if block == "the whole loop" else None
        if whole is not None:
            whole.__enter__()
        for _ in range(len(draws) - 1):
            step = torch.autograd.graph.save_on_cpu() if whole is None else None
            if step is not None:
                step.__enter__()
            before = len(c.findings)
            laid = c.sampler.laid
            loss = net(X).sum()
            net[2].weight.data.mul_(-1)
            loss.backward()
            if step is not None:
                step.__exit__(None, None, None)
            found.append((laid, len(c.findings) > before))
        if whole is not None:
            whole.__exit__(None, None, None)
    finally:
        c.stop()
    assert all(f == laid for laid, f in found), found  # found exactly where the hooks were on
    assert [laid for laid, _ in found][:3] == [False, True, True]
    assert _nothing_of_the_check_left()


def test_no_write_no_finding_sampled():
    net = _net()
    c = check_saved("raise", every=2).start()
    try:
        for _ in range(20):
            net(X).sum().backward()
    finally:
        c.stop()
    assert not c.findings and c.checked > 0


@ONE_PATH_BUILDS
def test_the_draw_is_the_processs_own_unless_seeded(monkeypatch):
    monkeypatch.delenv(sample.ENV, raising=False)
    a, b = sample.Draw(2), sample.Draw(2)
    assert [a() for _ in range(128)] != [b() for _ in range(128)]  # equal with probability 2^-128
    monkeypatch.setenv(sample.ENV, "7")
    a, b = sample.Draw(2), sample.Draw(2)
    assert [a() for _ in range(128)] == [b() for _ in range(128)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: seeded afresh at the fork, from the seed and its pid
        os.write(w, bytes(a() for _ in range(128)))
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as fh:
        child = list(fh.read())
    assert child != [int(a()) for _ in range(128)]


@ONE_PATH_BUILDS
@pytest.mark.parametrize("every", [0, -3, 1.5, True, "4", None])
def test_every_is_a_whole_number_of_steps(every):
    for make in (check_saved, torchgen_patch.check_saved, lambda mode, every: torchgen_patch.saved.enable(mode,
                                                                                                           every=every)):
        with pytest.raises(ValueError, match="every must be a whole number of steps >= 1"):
            make("warn", every=every)
    if every is not True:  # install()'s keywords equal to their default (True == 1) are the default
        with pytest.raises(ValueError, match="every must be a whole number"):
            torchgen_patch.install(check_saved="warn", check_every=every, ops=[], build=False)


@ONE_PATH_BUILDS
def test_enable_says_it_is_sampled_and_the_count_at_exit_how_many_steps_were_checked(monkeypatch):
    code = ("import torch, torchgen_patch.saved as s; from torchgen_patch.runtime.checklib import prepare; prepare(); "
            "s.enable('warn', every=4); m = torch.nn.Linear(4, 1); x = torch.ones(2, 4, requires_grad=True)\n"
            "for _ in range(10): m(x).sum().backward()")
    env = dict(os.environ, PYTHONPATH=ROOT, **{sample.ENV: "3"})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert re.match(r"torchgen-patch: saved-tensor check on \(warn, 1 step in 4\) in pid \d+ ", lines[0]), lines
    monkeypatch.setenv(sample.ENV, "3")
    draw = sample.Draw(4)  # the same seed: the same draws, one after each backward pass (the first step: none)
    drawn = [draw() for _ in range(10)]
    assert lines[-1].startswith("torchgen-patch: saved-tensor check in pid ")
    assert lines[-1].endswith(f"in {2 * sum(drawn[:9])} checked (sampled at 1/4: {sum(drawn)} of 10 draws hit)"), \
        lines


# --- the law ------------------------------------------------------------------------------------------------

EVERY, STEPS, KS = 8, 32, (2, 3, 5, 9, 17)  # k - 1 = 1, 2, 4, 8, 16 steps drawn for


def binomial_band(n: int, p: float, alpha: float) -> tuple[int, int]:
    """The counts between which Binomial(n, p) falls with probability at least 1 - alpha (alpha/2 a side)."""
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
                    + (x * math.log(p) if x else 0.0) + ((n - x) * math.log1p(-p) if n - x else 0.0))
           for x in range(n + 1)]
    cdf, lo, hi = 0.0, None, n
    for x, q in enumerate(pmf):
        if lo is None and cdf + q > alpha / 2:
            lo = x
        cdf += q
        if cdf >= 1 - alpha / 2:
            hi = x
            break
    return lo or 0, hi


def mean_band(ranks: int, n: int, alpha: float) -> tuple[float, float]:
    """Where the mean first-detection step of ``n`` processes falls with probability about 1 - alpha, by
    the law (a step past ``STEPS`` counted as STEPS + 1), from its exact mean and variance."""
    q = (1 - 1 / EVERY) ** ranks  # a step missed by every rank (the first: by all, never drawn)
    steps = range(2, STEPS + 2)
    probs = [q ** (k - 2) * (1 - q) if k <= STEPS else q ** (STEPS - 1) for k in steps]
    mu = sum(k * p for k, p in zip(steps, probs, strict=True))
    sd = math.sqrt(sum((k - mu) ** 2 * p for k, p in zip(steps, probs, strict=True)))
    z = statistics.NormalDist().inv_cdf(1 - alpha / 2)
    return mu - z * sd / math.sqrt(n), mu + z * sd / math.sqrt(n)


def _follows_the_law(first: list, ranks: int, alpha: float) -> None:
    n = len(first)
    for k in KS:
        lo, hi = binomial_band(n, law.law(EVERY, k, ranks), alpha)
        assert lo <= law.within(first, k) <= hi, (k, ranks, law.within(first, k), (lo, hi))
    lo, hi = mean_band(ranks, n, alpha)
    assert lo <= statistics.mean(STEPS + 1 if f is None else f for f in first) <= hi


def _first_drawn(tag: str, seeds: int, monkeypatch) -> list:
    """The first step each seeded process draws, replayed by the check's own draw (step k's draw is made at
    the end of step k - 1's backward pass; the first step has none)."""
    out = []
    for s in range(seeds):
        monkeypatch.setenv(sample.ENV, f"{tag}:{s}")
        draw = sample.Draw(EVERY)
        out.append(next((k for k in range(2, STEPS + 1) if draw()), None))
    return out


ALPHA = 1e-3 / (len(KS) + 1)  # each band 1 - ALPHA: all of a series inside with probability >= 0.999


@ONE_PATH_BUILDS
def test_the_first_step_that_finds_a_recurring_write_follows_the_law_per_process(monkeypatch):
    """400 processes, each a check of its own seed (the check's own draw), N = 8: the write is found at the
    very step each first draws, and how many found it within k steps lies in the law's 99.9 % band."""
    first = law.first_detections(EVERY, 400, STEPS, "one")
    assert first == _first_drawn("one", 400, monkeypatch)
    _follows_the_law(first, 1, ALPHA)


@ONE_PATH_BUILDS
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available in this build")
def test_two_ranks_find_it_sooner_as_the_law_says_gloo(monkeypatch):
    """2 ranks under DDP (gloo), each drawing on its own: each rank's first step follows the law of one
    process, the first step either rank finds it the law of two, and the law's bands of the mean first step
    for one and for two ranks are apart, so two ranks find it sooner."""
    seeds = 200
    ranks = law.two_ranks(EVERY, seeds, STEPS)
    for r, first in enumerate(ranks):
        assert first == _first_drawn(f"rank{r}", seeds, monkeypatch)
        _follows_the_law(first, 1, ALPHA)
    either = law.earliest(ranks)
    _follows_the_law(either, 2, ALPHA)
    assert mean_band(2, seeds, ALPHA)[1] < mean_band(1, seeds, ALPHA)[0]
    assert statistics.mean(STEPS + 1 if f is None else f for f in either) < min(
        statistics.mean(STEPS + 1 if f is None else f for f in first) for first in ranks)


@pytest.mark.build
def test_install_sampled_at_the_default_finds_a_recurring_write_within_300_steps(library, tmp_path):
    """``install(check_saved=, check_every=DEFAULT_EVERY)``, the process's own unseeded draw: a ``.data`` write
    to a weight at every step is found within 300 steps (missed with probability (31/32)^300 = 7.3e-5 by
    the law), and the count at exit says how many draws drew."""
    prog = ("import torch, torchgen_patch\nfrom torchgen_patch.saved import DEFAULT_EVERY\n"
            f"torchgen_patch.install(library={library.path!r}, check_saved='warn', check_every=DEFAULT_EVERY)\n"
            "m = torch.nn.Linear(4, 3)\nx = torch.randn(2, 4, requires_grad=True)\n"
            "for _ in range(300):\n"
            "    loss = m(x).sum()\n    m.weight.data.mul_(-1)\n    loss.backward()\n")
    env = {k: v for k, v in os.environ.items() if k != sample.ENV}
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(env, PYTHONPATH=ROOT), timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert any(re.match(r"torchgen-patch: saved-tensor check on \(warn, 1 step in 32\) ", line)
               for line in lines), lines
    assert sum("saved tensor changed without a version bump" in line for line in lines) == 1, lines
    assert "of 300 draws hit)" in lines[-1] and " 0 changed" not in lines[-1], lines[-1]


def test_a_step_not_drawn_wraps_no_custom_function_and_a_drawn_one_finds_a_ctx_attribute_written():
    """The ctx attributes of custom Functions are kept on the drawn steps only: on the others torch's own
    Function.apply runs, unwrapped."""
    from tests.test_saved import _Scale  # a custom Function keeping its weight on ctx
    from torchgen_patch.saved import ctxattr

    drawn = (False, False, True, False, True)
    w = torch.ones(4)
    c = _sampled(*drawn[1:], False).start()
    found = []
    try:
        for step in range(len(drawn)):
            assert ctxattr.wrapped() == drawn[step], step
            x = torch.ones(4, requires_grad=True)
            y = _Scale.apply(x, w).sum()
            w.data.mul_(2)  # the kept weight written behind autograd's back
            before = len(c.findings)
            y.backward()
            found.append(len(c.findings) > before)
    finally:
        c.stop()
    assert tuple(found) == drawn and not ctxattr.wrapped() and _nothing_of_the_check_left()
