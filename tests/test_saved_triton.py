"""A Triton kernel launched between save and use with a pointer into a saved tensor's storage is named by
the finding (``torchgen_patch/saved/launches.py``): its name and the program's line that launched it.
Triton is not installed here: a stand-in ``triton`` module in ``sys.modules`` launches as Triton does
(its launch hook called with a LazyDict before the kernel runs, from ``JITFunction.run``, whose code lies
in a library directory, as Triton's does), in each of the three places Triton keeps the hook. The kernel
itself is a Python function writing its argument through ``.data``. The real Triton on a GPU:
tests/test_saved_cuda.py."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import sysconfig
import types

import pytest
import torch

from torchgen_patch.saved import check_saved
from torchgen_patch.saved.finding import Finding, Frame
from torchgen_patch.saved.attribute import LAUNCHES
from torchgen_patch.vocabulary import Writer

# where the stand-in's code says it lies: a library's directory, as an installed Triton's does
_FILE = os.path.join(sysconfig.get_paths()["purelib"], "triton", "runtime", "jit.py")

_SOURCE = '''
class LazyDict:
    def __init__(self, data):
        self.data, self.extras = data, []

    def get(self):
        for func, args in self.extras:
            self.data = self.data | func(*args)
        self.extras.clear()
        return self.data


class HookChain:
    def __init__(self):
        self.calls = []

    def add(self, func):
        if func not in self.calls:
            self.calls.append(func)

    def remove(self, func):
        if func in self.calls:
            self.calls.remove(func)

    def __call__(self, *args, **kwargs):
        for call in self.calls:
            call(*args, **kwargs)


class JITFunction:
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def run(self, *args, grid, warmup, **kwargs):
        bound_args = dict(zip(self.fn.__code__.co_varnames, args)) | kwargs
        hook = HOLDER[0].launch_enter_hook
        metadata = None if hook is None else LazyDict({"name": self.fn.__name__, "function": 7, "stream": 0})
        if hook is not None:  # what the C launcher does before it launches
            hook(metadata)
        self.fn(*bound_args.values())


def jit(fn):
    return JITFunction(fn)
'''


def _fake_triton(api: str) -> dict[str, types.ModuleType]:
    """A stand-in Triton keeping its hook where ``api`` says: ``chain`` (3.5: ``knobs.runtime``'s
    HookChain), ``knobs`` (3.4: ``knobs.runtime``'s attribute), ``compiled`` (3.2:
    ``compiler.CompiledKernel``'s attribute)."""
    triton = types.ModuleType("triton")
    triton.__file__ = os.path.join(os.path.dirname(os.path.dirname(_FILE)), "__init__.py")
    exec(compile(_SOURCE, _FILE, "exec"), triton.__dict__)  # noqa: S102 — the stand-in's own code
    modules = {"triton": triton}
    if api == "compiled":
        compiler = types.ModuleType("triton.compiler")
        compiler.CompiledKernel = type("CompiledKernel", (), {"launch_enter_hook": None})
        triton.compiler = compiler
        modules["triton.compiler"] = compiler
        holder = compiler.CompiledKernel
    else:
        holder = types.SimpleNamespace(launch_enter_hook=triton.HookChain() if api == "chain" else None)
        triton.knobs = types.SimpleNamespace(runtime=holder)
    triton.HOLDER = [holder]
    return modules


def _their_hook(api: str, triton):
    """The program's own launch hook, set as the program sets it; returns (the hook's calls, the hook)."""
    calls: list = []

    def theirs(metadata):
        calls.append(metadata.get()["name"])

    holder = triton.HOLDER[0]
    if api == "chain":
        holder.launch_enter_hook.add(theirs)
    else:
        holder.launch_enter_hook = theirs
    return calls, theirs


def _hook_is_theirs(api: str, triton, theirs) -> bool:
    hook = triton.HOLDER[0].launch_enter_hook
    return hook.calls == [theirs] if api == "chain" else hook is theirs


@pytest.fixture(autouse=True)
def _no_launches_kept():
    LAUNCHES.recent.clear()
    yield
    assert not LAUNCHES.installed


@pytest.fixture(params=["native", "python"])
def check_path(request, monkeypatch):
    monkeypatch.setenv("TORCHGEN_PATCH_CHECK_PATH", request.param)
    from torchgen_patch.runtime import checklib

    assert checklib.prepare(request.param) is None or request.param == "python"
    return request.param


@pytest.fixture(params=["chain", "knobs", "compiled"])
def triton(request, monkeypatch):
    modules = _fake_triton(request.param)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return request.param, modules["triton"]


def _kernels(triton):
    @triton.jit
    def _init_kernel(x_ptr):
        pass

    @triton.jit
    def _scale_kernel(x_ptr, n):
        x_ptr.data.mul_(2)  # the kernel writes its input, where autograd cannot see it

    @triton.jit
    def _other_kernel(y_ptr):
        pass

    return _init_kernel, _scale_kernel, _other_kernel


def test_a_kernel_launched_between_save_and_use_is_named_with_its_line(check_path, triton):
    api, module = triton
    calls, theirs = _their_hook(api, module)
    init, scale, other = _kernels(module)
    a = torch.randn(4)
    w = torch.randn(4, requires_grad=True)
    with check_saved("warn") as c:
        init[(1,)](a)  # before the save: not the writer
        out = a * w  # MulBackward0 saves a
        scale[(1,)](a, n=4); line = sys._getframe().f_lineno  # noqa: E702 — the launch's own line
        other[(1,)](torch.zeros(3))  # after the save, elsewhere
        out.sum().backward()
    [f] = c.findings
    assert f.writers[0] == Writer.TRITON and f.kernel == "_scale_kernel", f
    assert f.launch is not None and f.launch.line == line and f.launch.file.endswith("test_saved_triton.py")
    assert f.launch.function == "test_a_kernel_launched_between_save_and_use_is_named_with_its_line"
    # the program's own hook was called at each launch, and is all that is left
    assert calls == ["_init_kernel", "_scale_kernel", "_other_kernel"]
    assert _hook_is_theirs(api, module, theirs) and not LAUNCHES.installed


def test_the_finding_says_the_kernel_in_each_renderer(triton):
    from torchgen_patch.saved import render

    _, module = triton
    _, scale, _ = _kernels(module)
    a = torch.randn(4)
    w = torch.randn(4, requires_grad=True)
    with pytest.raises(Exception) as raised, check_saved("raise"):
        out = a * w
        scale[(1,)](a, 4)
        out.sum().backward()
    f = raised.value.finding
    at = f.launch.render()
    assert f"likely written by: the Triton kernel `_scale_kernel` launched at {at}, between save and use" in \
        str(raised.value)
    assert f"fix:      after the kernel `_scale_kernel` launched at {at}, call `torch.autograd.graph." \
           "increment_version(t)` on the tensor it wrote" in str(raised.value)
    assert render.fix(f) in str(raised.value) and render.fix(f) in render.line(f)
    assert render.as_dict(f)["triton_kernel"] == {"name": "_scale_kernel", "file": f.launch.file,
                                                  "line": f.launch.line, "function": f.launch.function}


def test_a_kernel_launched_in_a_step_not_drawn_is_not_recorded_and_no_hook_is_set(triton):
    from tests.test_saved_sample import Scripted

    api, module = triton
    calls, theirs = _their_hook(api, module)
    _, scale, _ = _kernels(module)
    w = torch.randn(4, requires_grad=True)
    c = check_saved("warn", every=4)
    c.sampler.draw = Scripted(True, False, False)
    c.start()
    installed, found, recorded = [], [], []
    try:
        for _ in range(3):  # not drawn (the first step never is), drawn, not drawn
            installed.append(LAUNCHES.installed and not _hook_is_theirs(api, module, theirs))
            a = torch.randn(4)
            before, seen = len(c.findings), len(LAUNCHES.recent)
            out = a * w
            scale[(1,)](a, 4)
            recorded.append(len(LAUNCHES.recent) > seen)
            out.sum().backward()
            found.append(len(c.findings) > before)
    finally:
        c.stop()
    assert installed == recorded == found == [False, True, False]
    assert c.findings[0].kernel == "_scale_kernel"
    assert calls == ["_scale_kernel"] * 3 and _hook_is_theirs(api, module, theirs)


def test_a_hook_the_program_set_over_the_checks_is_kept():
    """Where the hook is an attribute, a hook the program sets while the check's is set stays when the
    check's is removed; the check's, if the program's calls it, only calls what it wrapped from then on."""
    modules = _fake_triton("knobs")
    module = modules["triton"]
    first, theirs = _their_hook("knobs", module)
    later = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "triton", module)
        _, scale, _ = _kernels(module)
        with check_saved("warn"):
            ours = module.HOLDER[0].launch_enter_hook
            assert ours is not theirs

            def replacing(metadata):
                later.append(metadata.data["name"])
                ours(metadata)

            module.HOLDER[0].launch_enter_hook = replacing
            scale[(1,)](torch.zeros(2), 2)
        assert module.HOLDER[0].launch_enter_hook is replacing
        before = len(LAUNCHES.recent)
        scale[(1,)](torch.zeros(2), 2)
    assert later == ["_scale_kernel"] * 2 and first == ["_scale_kernel"] * 2 and len(LAUNCHES.recent) == before


@pytest.mark.parametrize("where", ["a custom Function's call", "a backward pass on a device"])
def test_a_triton_imported_after_the_check_started_gets_the_hook(triton, where, monkeypatch):
    """Checked every step, the check lays its hooks once: a Triton imported later gets the launch hook at
    the next custom Function's call, or at the first device tensor a backward pass compares (the device
    path run on CPU, on the Python path)."""
    from tests.test_saved import _Scale
    from torchgen_patch.saved import fingerprint

    saved = {name: sys.modules.pop(name) for name in ("triton", "triton.compiler") if name in sys.modules}
    monkeypatch.setattr(fingerprint, "_FORCE_DEVICE_PATH", True)
    monkeypatch.setenv("TORCHGEN_PATCH_CHECK_PATH", "python")
    w = torch.ones(2, requires_grad=True)
    with check_saved("warn"):
        assert not LAUNCHES.installed
        sys.modules.update(saved)  # the program imports Triton (a library's kernels load lazily)
        if where == "a custom Function's call":
            _Scale.apply(w, torch.ones(2))
        else:
            (w * torch.ones(2)).sum().backward()
        assert LAUNCHES.installed
    assert not LAUNCHES.installed


class _NoTriton:
    """An import finder that records every import of Triton tried (and refuses it)."""

    def __init__(self):
        self.tried: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            self.tried.append(name)
            raise ImportError(name)
        return None


def test_without_triton_imported_nothing_is_touched_or_imported(monkeypatch, check_path):
    for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
        monkeypatch.delitem(sys.modules, name)
    finder = _NoTriton()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    a = torch.randn(4)
    w = torch.randn(4, requires_grad=True)
    with check_saved("warn") as c:
        assert not LAUNCHES.installed
        out = a * w
        a.data.mul_(2)
        out.sum().backward()
    [f] = c.findings
    assert Writer.TRITON not in f.writers and f.kernel is None and f.launch is None
    assert finder.tried == [] and "triton" not in sys.modules and not LAUNCHES.installed


@pytest.mark.parametrize("launch", [Frame("train.py", 42, "step"), None], ids=["line known", "line unknown"])
def test_a_fleets_line_and_report_carry_the_kernel(tmp_path, launch):
    from torchgen_patch.checks.fleet import report
    from torchgen_patch.checks.fleet_render import text, to_json
    from torchgen_patch.saved.fleet import Record

    f = Finding((8, 32000), "float32", "cuda:0", 0, node="TanhBackward0", forward=Frame("train.py", 38, "forward"),
                backward=Frame("train.py", 44, "step"), writers=(Writer.TRITON, Writer.ALIAS), kernel="_ce_kernel",
                launch=launch)
    r = Record("h", 1, 0, f)
    assert Record.parse(r.to_line()[:-1]) == r
    (tmp_path / "findings-h-1.jsonl").write_bytes(r.to_line() * 2)
    rep = report(str(tmp_path))
    at = "train.py:42 (step)" if launch else "an unknown frame"
    assert f"likely written by: the Triton kernel `_ce_kernel` launched at {at}, between save and use" in text(rep)
    where = {"file": "train.py", "line": 42, "function": "step"} if launch else \
        {"file": None, "line": None, "function": None}
    assert json.loads(to_json(rep))["sites"][0]["triton_kernel"] == {"name": "_ce_kernel", **where}
    obj = json.loads(r.to_line())
    obj["triton_kernel"]["name"] = 3
    with pytest.raises(ValueError, match="'name' is a int, not a string"):
        Record.parse(json.dumps(obj).encode())


# ---- the real Triton, on a GPU -------------------------------------------------------------------------------

needs_triton = pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
                                  reason="no CUDA device" if not torch.cuda.is_available() else
                                  "triton is not installed")


@pytest.mark.cuda
@needs_triton
@pytest.mark.parametrize("every", [1, 2])
def test_on_cuda_a_triton_kernel_writing_a_saved_tensor_is_named_with_its_line(check_path, every):
    """A ``@triton.jit`` kernel doubling a saved tensor in place between forward and backward: the finding
    names it and the line that launched it, on both paths; with the check sampled, the steps drawn."""
    from tests import saved_triton_kernel as k
    from tests.test_saved_sample import Scripted

    x = torch.randn(1000, device="cuda")
    w = torch.randn(1000, device="cuda", requires_grad=True)
    c = check_saved("warn", every=every)
    if every > 1:
        c.sampler.draw = Scripted(True, False, False)
    lines, found = [], []
    with c:
        for _ in range(2 if every == 1 else 3):  # sampled: not drawn (the first), drawn, not drawn
            out = x * w  # MulBackward0 saves x
            k._double_kernel[k.grid(x.numel())](x, x.numel(), BLOCK=k.BLOCK); lines.append(sys._getframe().f_lineno)  # noqa: E702,E501
            before = len(c.findings)
            out.sum().backward()
            found.append(len(c.findings) > before)
    assert found == ([True, True] if every == 1 else [False, True, False])
    for f in c.findings:
        assert f.writers[0] == Writer.TRITON and f.kernel == "_double_kernel", f
        assert f.launch is not None and f.launch.line == lines[0] and f.launch.file.endswith("test_saved_triton.py")


@pytest.mark.cuda
@needs_triton
def test_on_cuda_a_triton_imported_after_the_check_started_is_seen_from_the_next_step(check_path, monkeypatch):
    """Checked every step: Triton (imported, to the check, only once the check started) gets the launch hook at
    the first backward pass that compares a CUDA tensor; the kernel of the next step is named."""
    from tests import saved_triton_kernel as k

    x = torch.randn(1000, device="cuda")
    w = torch.randn(1000, device="cuda", requires_grad=True)
    real = sys.modules["triton"]
    monkeypatch.delitem(sys.modules, "triton")
    with check_saved("warn") as c:
        assert not LAUNCHES.installed
        sys.modules["triton"] = real  # the program imports it now
        (x * w).sum().backward()
        assert LAUNCHES.installed and not c.findings
        out = x * w
        k._double_kernel[k.grid(x.numel())](x, x.numel(), BLOCK=k.BLOCK)
        out.sum().backward()
    [f] = c.findings
    assert f.writers[0] == Writer.TRITON and f.kernel == "_double_kernel", f
