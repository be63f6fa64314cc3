"""The saved-tensor check (``torchgen_patch.check_saved``, ``install(check_saved=)``,
``run --check-saved``): every write autograd cannot see is silent without it and a finding with
it; the same programs without the write give none; a moved version raises autograd's own error,
word for word; the fingerprint never differs for unchanged bits; the program's own saved-tensor
hooks keep working and keep being checked."""

from __future__ import annotations

import copy
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import torchgen_patch
from tests.conftest import ROOT
from torchgen_patch.saved import Frame, SavedTensorChanged, check_saved
from torchgen_patch.saved import fingerprint as fp
from torchgen_patch.saved import compose, hooks
from torchgen_patch.vocabulary import Writer

MODIFIED = "modified by an inplace operation"


class Holder(torch.nn.Module):
    """One parameter ``w`` (4 x 3) that ``x @ w`` saves for backward (the gradient of ``x`` needs it)."""

    def __init__(self, w=None):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3, generator=torch.Generator().manual_seed(0)) if w is None else w)


def _x():
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()


def run(make, write: bool, check=None):
    """Forward, the write (or not), backward: x's gradient, and the check when one was on."""
    holder, writer = make()
    x = _x()

    def body():
        loss = (x @ holder.w).tanh().sum()
        if write:
            writer(holder.w)
        loss.backward()
        return x.grad.clone()

    if check is None:
        return body(), None
    with check_saved(check) as c:
        g = body()
    return g, c


# --- every write autograd cannot see, and how each one writes -------------------------------------


def _numpy(w):
    a = w.detach().numpy()
    np.multiply(a, 2, out=a)


def _memoryview(w):
    memoryview(w.detach().numpy())[0, 0] = 5.0


def _set_data(w):
    w.data = w.detach() * 2


def _storage_copy(w):
    w.untyped_storage().copy_((w.detach() * 2).untyped_storage())


def _storage_fill(w):
    w.untyped_storage().fill_(1)


def _dlpack(w):
    torch.from_dlpack(w.detach()).mul_(2)


def _memmove(w):
    src = torch.full_like(w, 2.0)
    ctypes.memmove(w.data_ptr(), src.data_ptr(), w.nbytes)


def _unsafe_set_version(w):
    v = w._version
    with torch.no_grad():
        w.mul_(2)
    torch._C._autograd._unsafe_set_version_counter((w,), (v,))


def _unsafe_preserve(w):
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(w):
        w.mul_(2)


def _other_process(w):
    import torch.multiprocessing as mp

    def child(t):
        with torch.no_grad():
            t.mul_(2)

    p = mp.get_context("fork").Process(target=child, args=(w,))
    p.start()
    p.join(60)
    assert p.exitcode == 0


def _plain():
    return Holder(), None


def _with(writer, make=None):
    def factory():
        holder = make() if make else Holder()
        return holder, writer
    return factory


def _shared():
    h = Holder()
    h.w.data.share_memory_()
    return h


_BUF: dict = {}


def _from_buffer():
    buf = bytearray(struct.pack("12f", *[0.5 + i / 7 for i in range(12)]))
    _BUF["buf"] = buf  # the tensor aliases it: kept alive as long as the case runs
    return Holder(torch.frombuffer(buf, dtype=torch.float32).view(4, 3))


def _write_buffer_struct(w):
    struct.pack_into("f", _BUF["buf"], 0, 7.0)


def _write_buffer_numpy(w):
    np.frombuffer(_BUF["buf"], dtype=np.float32)[1] = 7.0


def _from_file(tmp=[]):  # noqa: B006 — one file for the process
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "w.bin")
    with open(path, "wb") as f:
        f.write(struct.pack("12f", *[0.5 + i / 7 for i in range(12)]))
    _BUF["file"] = path
    return Holder(torch.from_file(path, shared=True, size=12, dtype=torch.float32).view(4, 3))


def _write_file(w):
    with open(_BUF["file"], "r+b") as f:
        f.write(struct.pack("f", 9.0))


UNSEEN = {
    "p.data.mul_(2)": _with(lambda w: w.data.mul_(2)),
    "a numpy view (t.detach().numpy())": _with(_numpy),
    "memoryview of the numpy view": _with(_memoryview),
    "p.data = other (set_data)": _with(_set_data),
    "untyped_storage().copy_": _with(_storage_copy),
    "untyped_storage().fill_": _with(_storage_fill),
    "torch.from_dlpack alias": _with(_dlpack),
    "ctypes.memmove on data_ptr()": _with(_memmove),
    "torch._C._autograd._unsafe_set_version_counter": _with(_unsafe_set_version),
    "torch.autograd._unsafe_preserve_version_counter": _with(_unsafe_preserve),
    "shared memory written by another process": _with(_other_process, _shared),
    "torch.frombuffer's bytearray (struct.pack_into)": _with(_write_buffer_struct, _from_buffer),
    "np.frombuffer alias of the same bytearray": _with(_write_buffer_numpy, _from_buffer),
    "torch.from_file(shared=True): the file written": _with(_write_file, _from_file),
}


@pytest.mark.parametrize("case", sorted(UNSEEN))
def test_an_unseen_write_is_silent_without_the_check_and_a_finding_with_it(case):
    make = UNSEEN[case]
    clean, _ = run(make, write=False)
    silent, _ = run(make, write=True)  # no error: autograd cannot see the write ...
    assert not torch.equal(clean, silent)  # ... and backward silently used the new contents
    with pytest.raises(SavedTensorChanged) as e:
        run(make, write=True, check="raise")
    f = e.value.finding
    assert (f.name, f.owner, f.view, f.node, f.shape, f.dtype) == ("w", "Holder", False, "MmBackward0", (4, 3),
                                                                  "float32")
    assert f.forward.file == os.path.relpath(__file__) and f.forward.function == "body"
    assert f.backward.file == os.path.relpath(__file__) and f.backward.function == "body"
    assert f.backward.line > f.forward.line
    if case == "p.data = other (set_data)":
        assert f.writers[0] == Writer.STORAGE
    else:
        assert f.writers[0] == Writer.DATA and Writer.ALIAS in f.writers and Writer.KERNEL in f.writers
    # the negative: the same program without the write, checked: nothing, and the same gradient
    g, c = run(make, write=False, check="raise")
    assert c.findings == [] and c.checked >= 2 and torch.equal(g, clean)


def test_warn_prints_one_line_per_distinct_finding_and_a_count(capsys):
    make = UNSEEN["p.data.mul_(2)"]
    holder, _ = make()
    x = _x()
    with check_saved("warn") as c:
        for _ in range(3):  # the same write at the same place, three times: one line
            loss = (x @ holder.w).tanh().sum()
            holder.w.data.mul_(2)
            loss.backward()
    err = capsys.readouterr().err.splitlines()
    lines = [line for line in err if line.startswith("torchgen-patch: saved tensor changed without a version bump")]
    assert len(lines) == 1 and len(c.findings) == 3
    assert "`w` of Holder (float32[4, 3] on cpu), saved by MmBackward0 in the forward call at " in lines[0]
    assert "likely written by: an in-place op on `.data`" in lines[0]
    assert err[-1].startswith("torchgen-patch: saved-tensor check: 3 changed saved tensors (1 distinct) in ")
    doc = json.loads(c.to_json())
    assert len(doc) == 3 and doc[0]["tensor"] == {"name": "w", "owner": "Holder", "view": False, "shape": [4, 3],
                                                  "dtype": "float32", "device": "cpu", "version": 0}
    assert doc[0]["node"] == "MmBackward0" and doc[0]["writers"][0] == "data" and doc[0]["rank"] is None


class _WriteOnly:
    """A stderr a program redirected to an object that can write but not flush."""

    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text


@pytest.mark.parametrize("stderr", ["closed", "write-only"])
def test_warn_with_stderr_closed_or_write_only_never_breaks_the_program(stderr, capsys, monkeypatch):
    """``sys.stderr`` None (the program started with ``2>&-``): the lines go nowhere, never to stdout;
    a write-only sink gets them, and backward is not broken by its missing flush."""
    make = UNSEEN["p.data.mul_(2)"]
    holder, _ = make()
    x = _x()
    sink = _WriteOnly()
    monkeypatch.setattr(sys, "stderr", None if stderr == "closed" else sink)
    with check_saved("warn") as c:
        loss = (x @ holder.w).tanh().sum()
        holder.w.data.mul_(2)
        loss.backward()
    monkeypatch.undo()
    assert len(c.findings) == 1 and holder.w.grad is not None  # backward ran to the end
    assert "torchgen-patch" not in capsys.readouterr().out
    if stderr == "write-only":
        lines = sink.text.splitlines()
        assert lines[0].startswith("torchgen-patch: saved tensor changed without a version bump")
        assert lines[-1].startswith("torchgen-patch: saved-tensor check: 1 changed saved tensor")


def test_a_pybind_extension_writing_through_data_ptr():
    """A C++ function bound with pybind, given an integer pointer (no torch headers, so it builds in
    seconds): what libraries' C++ optimizers and kernels do."""
    from torch.utils import cpp_extension

    if not cpp_extension.get_cxx_compiler() or subprocess.run(["which", cpp_extension.get_cxx_compiler()],
                                                             capture_output=True).returncode:
        pytest.skip("no C++ compiler")
    import inspect

    if "no_implicit_headers" not in inspect.signature(cpp_extension.load_inline).parameters:
        pytest.skip("this torch's load_inline always includes torch/extension.h (a minute to build)")
    src = textwrap.dedent("""
        #include <pybind11/pybind11.h>
        #include <cstdint>
        static void scale(std::uintptr_t ptr, long n, double by) {
            float* p = reinterpret_cast<float*>(ptr);
            for (long i = 0; i < n; ++i) p[i] = static_cast<float>(p[i] * by);
        }
        PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scale", &scale); }
    """)
    build = os.path.join(ROOT, ".cache", "torch_extensions", "tgp_saved_scale")
    os.makedirs(build, exist_ok=True)
    ext = cpp_extension.load_inline("tgp_saved_scale", [src], no_implicit_headers=True, build_directory=build)
    make = _with(lambda w: ext.scale(w.data_ptr(), w.numel(), 2.0))
    clean, _ = run(make, write=False)
    silent, _ = run(make, write=True)
    assert not torch.equal(clean, silent)
    with pytest.raises(SavedTensorChanged) as e:
        run(make, write=True, check="raise")
    assert e.value.finding.name == "w" and Writer.KERNEL in e.value.finding.writers
    assert run(make, write=False, check="raise")[1].findings == []


# --- optimizers stepped between forward and backward --------------------------------------------


def _step_between(mode: str, check=None, hooks_=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, **{mode: True})
    x = torch.randn(3, 4)
    model(x).sum().backward()  # gradients to step with
    ctx = check_saved(check) if check else (torch.autograd.graph.saved_tensors_hooks(*hooks_) if hooks_ else None)
    if ctx is None:
        loss = model(x).pow(2).sum()
        opt.step()
        loss.backward()
        return "silent"
    with ctx:
        loss = model(x).pow(2).sum()
        opt.step()
        loss.backward()
    return "silent"


def _outcome(fn):
    try:
        return fn()
    except SavedTensorChanged as e:
        return e
    except RuntimeError as e:
        return str(e)


def test_saved_tensor_hooks_switch_autograds_own_check_off_and_the_check_puts_it_back():
    """foreach AdamW stepped between forward and backward: autograd raises; under an identity pair of
    saved-tensor hooks the same program is silent (the engine checks only what it saved itself); under
    the check, autograd's own message again, word for word."""
    without = _outcome(lambda: _step_between("foreach"))
    assert isinstance(without, str) and MODIFIED in without
    assert _outcome(lambda: _step_between("foreach", hooks_=(lambda t: t.detach(), lambda t: t))) == "silent"
    assert _outcome(lambda: _step_between("foreach", check="raise")) == without


def test_fused_adamw_unpatched_is_a_finding_naming_the_optimizer():
    assert _outcome(lambda: _step_between("fused")) == "silent"
    e = _outcome(lambda: _step_between("fused", check="raise"))
    assert isinstance(e, SavedTensorChanged), e
    f = e.finding
    assert f.optimizer == "torch.optim.adamw.AdamW" and f.writers[0] == Writer.OPTIMIZER
    assert f.name in ("2.weight", "0.weight", "2.bias", "0.bias") and f.owner == "Sequential"
    assert f.writers == (Writer.OPTIMIZER,)  # the writer the check knows, named alone
    step = Frame(os.path.relpath(__file__), _line_of(_step_between, "opt.step()", -1), "_step_between")
    assert f.step == step
    assert f"the optimizer torch.optim.adamw.AdamW, whose step at {step.render()} ran between save and use" in str(e)
    assert f"fix:      move the step of torch.optim.adamw.AdamW at {step.render()} after the backward call" in str(e)


def _line_of(fn, text: str, which: int = 0) -> int:
    """The line of ``fn``'s source where ``text`` is (its ``which``-th such line)."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + [i for i, line in enumerate(lines) if text in line][which]


class _DataOptimizer(torch.optim.Optimizer):
    """Plain SGD that writes its parameters through ``p.data``, as DeepSpeed's CPU optimizers do (from
    C++, given ``p.data``): no version moves."""

    def __init__(self, params, lr: float = 0.1):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-group["lr"])


def _data_optimizer_between(check=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = _DataOptimizer(model.parameters())
    x = torch.randn(3, 4)
    model(x).sum().backward()
    with check_saved(check) if check else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        loss = model(x).pow(2).sum()
        opt.step()
        loss.backward()
    return model[0].weight.grad.clone()


def test_an_optimizer_writing_through_data_between_forward_and_backward_is_named_with_its_step():
    """A ``torch.optim.Optimizer`` subclass writing through ``p.data`` (DeepSpeed's CPU optimizers): silent
    without the check; with it, the finding names the optimizer's class and the line of its step() call,
    and nothing else as the writer."""
    assert isinstance(_outcome(_data_optimizer_between), torch.Tensor)  # silent: backward ran with the new weights
    e = _outcome(lambda: _data_optimizer_between("raise"))
    assert isinstance(e, SavedTensorChanged), e
    f = e.finding
    step = Frame(os.path.relpath(__file__), _line_of(_data_optimizer_between, "opt.step()"), "_data_optimizer_between")
    assert f.optimizer == f"{__name__}._DataOptimizer" and f.writers == (Writer.OPTIMIZER,) and f.step == step
    assert f.name in ("2.weight", "0.weight") and f"whose step at {step.render()} ran between save and use" in str(e)


@pytest.mark.build
@pytest.mark.parametrize("mode", ["fused", "foreach"])
def test_adamw_patched_raises_autograds_own_error_checked_or_not(patched, mode):
    without = _outcome(lambda: _step_between(mode))
    assert isinstance(without, str) and MODIFIED in without
    assert _outcome(lambda: _step_between(mode, check="raise")) == without


@pytest.mark.build
@pytest.mark.parametrize("case", sorted(UNSEEN))
def test_the_kernels_do_not_see_these_writes(patched, case):
    """The patched column of the docs' table: installing the kernels changes none of these (they do
    not go through the dispatcher)."""
    clean, _ = run(UNSEEN[case], write=False)
    silent, _ = run(UNSEEN[case], write=True)
    assert not torch.equal(clean, silent)


@pytest.mark.build
def test_a_version_move_inside_a_checkpointed_region_is_silent_patched_too(patched):
    m, x, loss_of = _checkpointed(False)
    loss = loss_of()
    with torch.no_grad():
        m[2].weight.mul_(1)
    loss.backward()  # checkpointing's own hooks switch autograd's version check off, patched or not


@pytest.mark.build
def test_an_operator_without_a_version_kernel_is_a_finding_and_the_runtime_op_patch_makes_it_raise():
    """A library's operator (torch.library ``define``) that writes an argument and has no ADInplaceOrView
    kernel: silent, a finding under the check, autograd's own error once patched as a runtime op."""
    import testbed.custom_ops  # noqa: F401 — defines tgp_test::write_one

    def write(w):
        with torch.no_grad():
            torch.ops.tgp_test.write_one(w.detach() * 2, w)

    make = _with(write)
    clean, _ = run(make, write=False)
    assert not torch.equal(clean, run(make, write=True)[0])
    with pytest.raises(SavedTensorChanged):
        run(make, write=True, check="raise")
    rep = torchgen_patch.install(runtime_ops=["tgp_test::write_one"], backend="python")
    try:
        assert "tgp_test::write_one" in rep.registered + rep.already
        with pytest.raises(RuntimeError, match=MODIFIED):
            run(make, write=True)
        with pytest.raises(RuntimeError, match=MODIFIED):
            run(make, write=True, check="raise")
    finally:
        torchgen_patch.uninstall()


# --- autograd's own message, word for word --------------------------------------------------------


def _leaf_param(dtype):
    def scenario():
        p = torch.nn.Parameter(torch.ones(2, 3, dtype=dtype))
        loss = (p * p).sum() if not dtype.is_complex else (p * p).abs().sum()
        with torch.no_grad():
            p.mul_(2)
        loss.backward()
    return scenario


def _saved_output():
    x = torch.randn(3, requires_grad=True)
    y = x.exp()  # saves its output
    with torch.no_grad():
        y.add_(1)
    y.sum().backward()


def _saved_output_rebased():
    x = torch.randn(3, requires_grad=True)
    y = (x * 1).exp()
    y.mul_(3)  # in grad mode: y's grad_fn moves to MulBackward0
    y.sum().backward()


def _saved_input_rebased():
    x = torch.randn(3, requires_grad=True)
    a = x * 1
    y = a.sin()  # saves its input a
    a.mul_(2)
    y.sum().backward()


def _saved_input_no_grad():
    x = torch.randn(3, requires_grad=True)
    a = x * 1
    y = a.sin()
    with torch.no_grad():
        a.add_(1)
    y.sum().backward()


def _second_output_as_input():
    x = torch.randn(4, 3, requires_grad=True)
    _, mean = torch.var_mean(x * 1, dim=1)
    z = mean.sin()
    with torch.no_grad():
        mean.mul_(2)
    z.sum().backward()


def _indices():
    x = torch.randn(4, 3, requires_grad=True)
    values, idx = (x * 1).max(dim=1)  # saves the indices (int64, no grad)
    idx.add_(0)
    values.sum().backward()


def _bool_mask():
    x = torch.randn(4, requires_grad=True)
    mask = x.detach() > 0
    y = torch.where(mask, x, x * 2)
    mask.logical_not_()
    y.sum().backward()


def _saved_other(dtype):
    def scenario():
        x = torch.randn(3, requires_grad=True)
        other = torch.ones(3, dtype=dtype)
        y = x * other  # saves other
        other.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[other.element_size()]).add_(0)
        y.sum().backward()
    return scenario


def _custom_function_output():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            out = a * 2
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx, g):
            out, = ctx.saved_tensors
            return g * out

    z = Twice.apply(torch.randn(3, requires_grad=True) * 1)
    with torch.no_grad():
        z.add_(1)
    z.sum().backward()


def _overload_name():
    a = torch.randn(3, 4, requires_grad=True) * 1
    p = torch.pow(2, a)  # PowBackward2, saves its output
    with torch.no_grad():
        p.add_(1)
    p.sum().backward()


def _view_of_a_weight():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    loss = m(torch.randn(2, 4)).sum()  # saves weight.t(), a view
    with torch.no_grad():
        m[2].weight.mul_(2)
    loss.backward()


def _anomaly_mode():
    with torch.autograd.set_detect_anomaly(True):
        _saved_output()


MESSAGES = {"leaf float32": _leaf_param(torch.float32), "leaf float64": _leaf_param(torch.float64),
            "leaf bfloat16": _leaf_param(torch.bfloat16), "leaf float16": _leaf_param(torch.float16),
            "leaf complex64": _leaf_param(torch.complex64), "saved output": _saved_output,
            "saved output, rebased": _saved_output_rebased, "saved input, rebased": _saved_input_rebased,
            "saved input, no_grad write": _saved_input_no_grad, "second output saved as input": _second_output_as_input,
            "int64 indices": _indices, "bool mask": _bool_mask, "custom Function": _custom_function_output,
            "PowBackward2": _overload_name, "a view of a weight": _view_of_a_weight, "anomaly mode": _anomaly_mode,
            **{f"saved other {d}": _saved_other(getattr(torch, d)) for d in ("uint8", "int8", "int16", "int32", "bool",
                                                                             "uint16", "uint32") if hasattr(torch, d)}}


@pytest.mark.parametrize("named", ["Exp", "ExpBackward0"])
def test_the_node_is_named_as_this_torch_names_it(named, monkeypatch):
    """Newer releases shorten the node's name in the message (``Exp``), older ones print it whole
    (``ExpBackward0``, torch 2.11): the check names it as the probe of this torch did."""
    from torchgen_patch.saved import moved

    text = (f"one of the variables needed for gradient computation has been modified by an inplace operation: "
            f"[torch.FloatTensor [1]], which is output 0 of {named}, is at version 1; expected version 0 instead. "
            "Hint: the end.")
    monkeypatch.setattr(moved, "_TEXT", {})
    monkeypatch.setattr(moved, "_probe", lambda out: out.update(text=text))
    a = torch.ones(3, requires_grad=True)
    b = a.pow(2)
    got = moved.version_error(a, 0, 1, leaf=False, output=False, output_nr=0, node=b.grad_fn, grad_fn=b.grad_fn)
    assert got.endswith(f"[torch.FloatTensor [3]], which is output 0 of {'Pow' if named == 'Exp' else 'PowBackward0'}, "
                        "is at version 1; expected version 0 instead. Hint: the end."), got


@pytest.mark.parametrize("scenario", sorted(MESSAGES))
def test_a_moved_version_raises_autograds_own_message_word_for_word(scenario):
    import warnings

    def message(check):
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # anomaly mode's traceback
            try:
                if check:
                    with check_saved("raise"):
                        MESSAGES[scenario]()
                else:
                    MESSAGES[scenario]()
            except RuntimeError as e:
                return type(e), str(e)
        return None

    without = message(False)
    assert without is not None and MODIFIED in without[1]
    assert message(True) == without


# --- the fingerprint ---------------------------------------------------------------------------


def _dtypes():
    out = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
           torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
    out += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
            if hasattr(torch, n)]
    return out


def _sample(dtype, shape=(6, 5)):
    bits = torch.randint(-128, 127, (int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size(),),
                         generator=torch.Generator().manual_seed(3), dtype=torch.int8)
    return bits.view(dtype).view(shape) if dtype != torch.bool else (bits > 0).view(shape)


def _layouts(t):
    """The same memory seen as a contiguous tensor, transposed, sliced with gaps (and transposed: its logical
    order not its order in memory), expanded (overlapping) and as a 0-d tensor."""
    return {"contiguous": t, "transposed": t.t(), "sliced": t[:, ::2], "row": t[1], "expanded": t[:1].expand(4, -1),
            "0-d": t[0, 0], "column": t[:1].t(),  # column: contiguous, yet its last stride is not 1
            "sliced, transposed": t[:, ::2].t()}


def pytest_generate_tests(metafunc):
    """Every test of the check on both paths (native and Python), but the fingerprint's own, which name
    their implementation (``path``)."""
    if "check_path" in metafunc.fixturenames and "path" not in metafunc.fixturenames:
        metafunc.parametrize("check_path", ["native", "python"], indirect=True)


@pytest.fixture(autouse=True)
def check_path(request, monkeypatch):
    """The path the check takes in this test (and in the processes it starts): $TORCHGEN_PATCH_CHECK_PATH."""
    param = getattr(request, "param", None)
    if param == "native":
        request.getfixturevalue("native_module")
    if param is not None:
        monkeypatch.setenv("TORCHGEN_PATCH_CHECK_PATH", param)
    return param


@pytest.fixture(scope="module")
def native_module():
    """The check's native hooks, built once (cached by content) and loaded through the trust checks."""
    from torchgen_patch.runtime import checklib

    why = checklib.prepare("native")
    assert why is None, why
    from torchgen_patch.saved import native

    return native._STATE["module"]


IMPLEMENTATIONS = ["numpy", "torch ops", "native"]


@pytest.fixture(params=IMPLEMENTATIONS)
def path(request, monkeypatch):
    """Each fingerprint test on every implementation: numpy's (the Python path on CPU), torch's ops
    (the Python path on any other device, run here on CPU) and the native hooks' C++."""
    monkeypatch.setattr(fp, "_FORCE_DEVICE_PATH", request.param == "torch ops")
    if request.param == "native":
        module = request.getfixturevalue("native_module")
        hooks_ = module.Hooks(None, None, None, None, fp.plain_types())
        monkeypatch.setattr(sys.modules[__name__], "_fingerprint", lambda t: _native_fingerprint(hooks_, t))
    return request.param


def _native_fingerprint(h, t):
    if type(t) not in fp.plain_types() or fp.skip_reason(t) is not None or not t.numel():
        return fp.fingerprint(t)  # what the native hooks leave to the Python path
    return (h.fingerprint(t),)


def _fingerprint(t):
    return fp.fingerprint(t)


def _same(a, b) -> bool:
    return all(bool(x == y) for x, y in zip(a, b, strict=False)) and len(a) == len(b)


def _value(parts) -> int:
    return int(parts[0]) & ((1 << 64) - 1)


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
def test_the_fingerprint_never_differs_for_unchanged_bits(dtype, path):
    t = _sample(dtype)
    for name, v in _layouts(t).items():
        first = _fingerprint(v)
        copy = v.clone()  # other memory, same bits
        assert _same(first, _fingerprint(v)), name
        if name != "expanded":  # a copy of a tensor whose elements do not overlap keeps the order of its
            # dimensions in memory (a contiguous one stays contiguous, a transposed one transposed): the same
            assert _same(first, _fingerprint(copy)), name


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
def test_every_implementation_gives_the_same_number(dtype, native_module):
    """numpy, torch's ops and the native C++ agree on every layout (so the CUDA kernel, compared with
    the native CPU code in tests/test_saved_cuda.py, agrees with all three), including tensors of
    several NH blocks with a partial last one, and elements that straddle no word."""
    h = native_module.Hooks(None, None, None, None, fp.plain_types())
    for shape in ((6, 5), (37, 41), (300, 7)):
        for name, v in _layouts(_sample(dtype, shape)).items():
            numpy_ = _value(fp.fingerprint(v))
            fp._FORCE_DEVICE_PATH = True
            try:
                ops = _value(fp.fingerprint(v))
            finally:
                fp._FORCE_DEVICE_PATH = False
            assert numpy_ == ops == h.fingerprint(v), (shape, name)
            assert numpy_ == fp._cpu_without_numpy(v), (shape, name)


def test_bits_not_values_nan_payloads_and_negative_zero(path):
    x = torch.tensor([0.0, 1.0, float("nan")])
    before = _fingerprint(x)
    x.view(torch.int32)[0] = torch.tensor(-0.0).view(torch.int32)  # 0.0 -> -0.0: equal values, other bits
    assert not _same(before, _fingerprint(x)) and bool((x == torch.tensor([0.0, 1.0, float("nan")]))[:2].all())
    before = _fingerprint(x)
    x.view(torch.int32)[2] ^= 1  # another NaN payload: still NaN
    assert not _same(before, _fingerprint(x)) and bool(x[2].isnan())


def _flip_one_bit(view, cell: int, bit: int) -> None:
    """Flip one bit of element ``cell`` (in logical order) of ``view``, in its storage's memory."""
    idx = np.unravel_index(cell, tuple(view.shape)) if view.dim() else ()
    offset = view.storage_offset() + sum(int(i) * s for i, s in zip(idx, view.stride(), strict=False))
    raw = torch.empty(0, dtype=torch.uint8).set_(view.untyped_storage())
    raw[offset * view.element_size() + bit // 8] ^= 1 << (bit % 8)


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
def test_the_fingerprint_sees_a_one_bit_change_in_any_element_of_any_layout(dtype, path):
    for name in _layouts(_sample(dtype)):
        for cell in range(0, 30, 7):
            t = _sample(dtype)
            view = _layouts(t)[name]
            cell %= max(view.numel(), 1)
            bits = 1 if dtype == torch.bool else view.element_size() * 8
            for bit in {0, bits - 1, (cell * 5) % bits}:
                before = _fingerprint(view)
                _flip_one_bit(view, cell, bit)
                assert not _same(before, _fingerprint(view)), (name, cell, bit)
                _flip_one_bit(view, cell, bit)
                assert _same(before, _fingerprint(view)), (name, cell, bit)  # back as it was: the same again


def test_tensors_whose_contents_are_not_read_say_why():
    assert fp.fingerprint(torch.empty(3, device="meta")) == fp.Skip("meta tensors (no data)")
    assert fp.fingerprint(torch.eye(3).to_sparse()) == fp.Skip("sparse_coo tensors")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own: nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    assert fp.fingerprint(nested).reason.startswith("nested")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(3)
    assert fp.fingerprint(fake) == fp.Skip("a FakeTensor (no storage of its own to read)")
    freed = torch.ones(8)
    freed.untyped_storage().resize_(0)  # as FSDP does between uses
    assert fp.fingerprint(freed).reason.startswith("a tensor whose storage is smaller")
    assert fp.fingerprint(torch.empty(0)) == (0,)


def test_a_wrapper_subclass_is_read_through_its_inner_tensors(path):
    from torchgen_patch.checks.subclass import wrapper_type

    w = wrapper_type()(torch.arange(6.0))
    before = _fingerprint(w)
    assert _same(before, _fingerprint(w))
    w.inner[3] = 9.0
    assert not _same(before, _fingerprint(w))


@pytest.mark.parametrize("size", [256, 8192])
def test_the_fingerprints_misses_match_a_uniform_hash(size, path):
    """What backs the docs' miss rate: truncated to 10 bits, the fingerprint of a random change goes
    unseen about once in 1024 changes, as a uniform hash's would; within one NH block and across many."""
    rng = np.random.default_rng(0)
    base = torch.from_numpy(rng.standard_normal(size).astype(np.float32))
    ref = _value(_fingerprint(base)) % 1021  # every bit of the 64 counts in the residue
    misses, n = 0, 8000 if path != "torch ops" else 3000
    for _ in range(n):
        t = base.clone()
        pos = rng.integers(0, t.numel(), 3)
        t[pos] = torch.from_numpy(rng.standard_normal(3).astype(np.float32))
        misses += _value(_fingerprint(t)) % 1021 == ref
    low, high = _poisson_band(n / 1021, 5e-5)  # the key is drawn per process: each run is a fresh draw
    assert low <= misses <= high, (misses, low, high)


def _poisson_band(mean: float, tail: float) -> tuple[int, int]:
    """(low, high): a Poisson count of ``mean`` falls below low, or above high, each with a chance of at
    most ``tail``."""
    import math

    pmf, cdf, k, low = math.exp(-mean), 0.0, 0, 0
    while True:
        if cdf <= tail:
            low = k  # P(X < k) <= tail
        cdf += pmf
        if 1 - cdf <= tail:
            return low, k
        k += 1
        pmf *= mean / k


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_sign_flips_swaps_and_other_structured_changes_are_seen(dtype, path):
    """Changes a linear sum can cancel: an even number of sign flips (of float64 elements, of the odd
    elements of a float32 tensor), two values swapped, a value and its negation swapped, rows swapped,
    a whole tensor negated: the products of NH are not linear in the words, so each is seen."""
    n = 8192 if dtype != torch.float32 else 16384
    base = torch.randn(n).to(dtype) if dtype.is_floating_point else torch.randint(-5, 5, (n,), dtype=dtype)

    def flip(a, pick):
        a[pick] = -a[pick] if dtype.is_floating_point else a[pick] ^ (-(1 << 63))

    def swap(a, i, j):
        a[i], a[j] = a[j].clone(), a[i].clone()

    def swap_negated(a, i, j):
        a[i], a[j] = -a[j].clone(), -a[i].clone()

    changes = [lambda a: flip(a, slice(0, 2)), lambda a: flip(a, slice(None)), lambda a: flip(a, slice(1, None, 2)),
               lambda a: flip(a, slice(0, 64)), lambda a: swap(a, 3, 4000), lambda a: swap(a, 0, 1),
               lambda a: swap_negated(a, 5, 777), lambda a: swap(a.view(64, -1), 2, 9)]
    before = _fingerprint(base)
    for k, change in enumerate(changes):
        t = base.clone()
        change(t)
        if torch.equal(t.view(torch.uint8) if dtype != torch.bfloat16 else t.view(torch.int16),
                       base.view(torch.uint8) if dtype != torch.bfloat16 else base.view(torch.int16)):
            continue  # the same bits (two equal values swapped): nothing to see
        assert not _same(before, _fingerprint(t)), k


def _old_cpu_weights(rows: int):
    """The fixed weights an earlier fingerprint used on CPU (constants of every process: column c of
    row r weighed cols[c] * rows[r] mod 2**64), as a program could compute them offline."""
    cols = np.random.default_rng([0x5A7ED, 0, 0]).integers(0, 1 << 63, 4096, dtype=np.uint64) * np.uint64(2) + \
        np.uint64(1)
    row_w = np.random.default_rng([0x5A7ED, 1, 0]).integers(0, 1 << 63, 4096, dtype=np.uint64) * np.uint64(2) + \
        np.uint64(1)
    return cols[:2048], row_w[:rows]


def test_a_pair_constructed_to_cancel_a_fixed_weighting_is_seen(path):
    """A sign-flip swap at two positions whose weights agree mod 2**33 cancelled the earlier fixed
    weighted sum (x[p] = a, x[q] = -a swapped: a difference of 2**31 * (w_p - w_q), 0 mod 2**64); with a
    key drawn per process and NH's products, the same pair is seen."""
    cols, rows = _old_cpu_weights(512)
    with np.errstate(over="ignore"):
        w = (rows[:, None] * cols[None, :]).reshape(-1) & np.uint64((1 << 33) - 1)
    order = np.argsort(w, kind="stable")
    same = np.nonzero(w[order][1:] == w[order][:-1])[0]
    assert len(same) > 0, "no pair of equal weights mod 2**33 in 1 M positions"
    found = 0
    for i in same[:20]:
        p, q = int(order[i]), int(order[i + 1])
        x = torch.from_numpy(np.random.default_rng(int(i)).standard_normal(512 * 2048).astype(np.float32))
        x[p], x[q] = 1.5, -1.5
        before = _fingerprint(x)
        x[p], x[q] = -1.5, 1.5
        # the earlier sum did not see it: the bit patterns differ by +-2**31 at two positions of equal weight
        diff = (np.uint64(1 << 31) * (w[p] - w[q])) & np.uint64((1 << 33) - 1)
        assert diff == 0
        found += not _same(before, _fingerprint(x))
    assert found == min(20, len(same))


def test_the_key_is_drawn_per_process():
    """Two processes fingerprint the same bits differently (no constant to compute pairs against)."""
    code = ("import torch; from torchgen_patch.saved import fingerprint as fp; "
            "print(fp.fingerprint(torch.arange(999.0))[0])")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p))
    seen = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           check=True).stdout.strip() for _ in range(3)}
    assert len(seen) == 3, seen


def test_a_value_moved_between_blocks_is_seen(path):
    """Word i of block k and word k of block i: a change that adds to one what it takes from the other
    is seen (every block has a weight of its own, every word a key word of its own)."""
    for dtype, per in ((torch.int32, 1), (torch.int64, 2)):
        t = torch.zeros(3 * fp.WORDS // per, dtype=dtype)
        before = _fingerprint(t)
        words = t.view(torch.int32)
        words[fp.WORDS + 2] += 1
        words[2 * fp.WORDS + 1] -= 1
        assert not _same(before, _fingerprint(t)), dtype


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_the_torch_ops_path_is_one_sum_whatever_its_pieces(monkeypatch, layout):
    """Read in pieces of any size (torch's ops on a device), the same number as read at once."""
    monkeypatch.setattr(fp, "_FORCE_DEVICE_PATH", True)
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.int8):
        base = torch.randint(-100, 100, (40, 30)).to(dtype)
        t = {"contiguous": base, "transposed": base.t(), "sliced": base[:, ::3]}[layout]
        want = fp.fingerprint(t)
        monkeypatch.setattr(fp, "CHUNK", 7)
        monkeypatch.setattr(fp, "DEVICE_BLOCKS", 1)
        assert _same(want, fp.fingerprint(t)), dtype
        monkeypatch.undo()
        monkeypatch.setattr(fp, "_FORCE_DEVICE_PATH", True)


# --- composition with the program's own hooks -----------------------------------------------------


def _checkpointed(reentrant: bool):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4, requires_grad=True)
    return m, x, lambda: checkpoint(m, x, use_reentrant=reentrant).pow(2).sum()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing_keeps_working_and_being_checked(reentrant):
    def grads(check, write=None):
        m, x, loss_of = _checkpointed(reentrant)
        with (check_saved(check) if check else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)):
            loss = loss_of()
            if write:
                write(m, x)
            loss.backward()
        return [x.grad] + [p.grad for p in m.parameters()]

    plain = grads(None)
    checked = grads("raise")
    assert all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
    # a write to the region's input: found (reentrant checkpointing saves its inputs itself)
    with pytest.raises(SavedTensorChanged):
        grads("raise", lambda m, x: x.data.mul_(2))
    if not reentrant:  # a parameter inside the region: found through the composed hooks
        with pytest.raises(SavedTensorChanged) as e:
            grads("raise", lambda m, x: m[2].weight.data.mul_(2))
        assert e.value.finding.name == "2.weight"
        # a version move inside a checkpointed region: silent without the check (checkpointing's hooks
        # switch autograd's check off), autograd's own error with it
        def bump(m, x):
            with torch.no_grad():
                m[2].weight.mul_(1)
        assert grads(None, bump) is not None
        with pytest.raises(RuntimeError, match=MODIFIED):
            grads("raise", bump)
    else:  # the documented limit: a reentrant region saves its parameters only when backward recomputes it
        grads("raise", lambda m, x: m[2].weight.data.mul_(2))


def test_copying_hooks_keep_offloading_and_a_write_to_the_original_is_harmless():
    calls = {"pack": 0, "unpack": 0}

    class Counting(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self):
            def pack(t):
                calls["pack"] += 1
                return t.clone()  # a copy, as save_on_cpu keeps one

            def unpack(t):
                calls["unpack"] += 1
                return t
            super().__init__(pack, unpack)

    def train(check, write=None):
        calls.update(pack=0, unpack=0)
        holder, x = Holder(), _x()
        ctx = check_saved(check) if check else None
        if ctx:
            ctx.start()
        try:
            with Counting():
                loss = (x @ holder.w).tanh().sum()
            if write:
                write(holder.w)
            loss.backward()
        finally:
            if ctx:
                ctx.stop()
        return x.grad, dict(calls), ctx

    g0, calls0, _ = train(None)
    g1, calls1, c = train("raise")
    assert torch.equal(g0, g1) and calls0 == calls1 and calls0["pack"] >= 2 and c.findings == []
    # the copy is what backward uses: a write to the live parameter does not change the gradient, and is no
    # finding (the copy is compared with what was saved: the same bits, checked)
    assert torch.equal(train(None, lambda w: w.data.mul_(2))[0], g0)
    g2, _, c2 = train("raise", lambda w: w.data.mul_(2))
    assert torch.equal(g2, g0) and c2.findings == [] and c2.checked == c.checked >= 2
    with check_saved("raise") as c:
        with torch.autograd.graph.save_on_cpu():
            holder, x = Holder(), _x()
            loss = (x @ holder.w).tanh().sum()
        loss.backward()
    assert c.findings == [] and c.checked >= 2


def test_hooks_already_pushed_are_wrapped_and_put_back():
    seen = []
    outer = torch.autograd.graph.saved_tensors_hooks(lambda t: (seen.append(1), t.detach())[1], lambda t: t)
    with outer:
        before = hooks.engine.top()
        holder, x = Holder(), _x()
        with check_saved("raise"):
            loss = (x @ holder.w).tanh().sum()
            holder.w.data.mul_(2)
            with pytest.raises(SavedTensorChanged):
                loss.backward()
        assert hooks.engine.top() == before  # the program's own hooks on top again, as they were
    assert seen  # theirs ran inside the check's
    assert hooks.engine.top() is None and not compose.patched()


def test_torch_compile_saves_through_autograd_and_is_checked(tmp_path, monkeypatch):
    """A compiled region saves what its compiled backward needs through autograd (one node,
    CompiledFunctionBackward): those tensors are checked, with compiled autograd too, and turning the
    check on or off compiles nothing again."""
    import torch._dynamo.utils as du

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    cm, x = torch.compile(m), torch.randn(3, 4)
    with check_saved("raise") as c:
        cm(x).pow(2).sum().backward()
    assert c.findings == [] and c.checked > 0
    graphs = du.counters["stats"]["unique_graphs"]
    cm(x).pow(2).sum().backward()  # the check off again
    assert du.counters["stats"]["unique_graphs"] == graphs
    # the setting engages compiled autograd for a backward called inside a function compiled while it is on
    # (one called eagerly runs as without it): the backward is one graph Dynamo compiles, the check's unpack
    # hooks in it (traced, they stopped the program), and no node of its own the check could name
    for compiled_autograd, node in ((False, "CompiledFunctionBackward"), (True, None)):
        captures = du.counters["compiled_autograd"]["captures"]
        # torch's own patch (monkeypatch's undo would delete the setting: a second run could not set it)
        with torch._dynamo.config.patch(compiled_autograd=compiled_autograd), check_saved("raise"):
            backward = torch.compile(lambda loss: loss.backward(), backend="eager")
            loss = cm(x).pow(2).sum()
            m[2].weight.data.mul_(2)
            with pytest.raises(SavedTensorChanged) as e:
                backward(loss)
        assert (e.value.finding.name, e.value.finding.node) == ("2.weight", node)
        assert (du.counters["compiled_autograd"]["captures"] > captures) == compiled_autograd
    torch._dynamo.reset()


def test_torch_func_transforms_run_under_the_check():
    """torch.func's grad refuses any saved-tensor hooks; under the check it runs as without it."""
    x = torch.randn(3)
    expected = torch.func.grad(lambda t: t.sin().sum())(x)
    with check_saved("raise"):
        assert torch.equal(torch.func.grad(lambda t: t.sin().sum())(x), expected)
        assert torch.vmap(torch.sin)(x.view(3, 1)).shape == (3, 1)


def test_on_a_torch_that_cannot_read_the_hook_stack_the_check_tracks_it_itself(monkeypatch):
    """torch before 2.8 has no ``_top_saved_tensors_default_hooks``: the check's own record of what it
    and the program pushed stands in."""
    monkeypatch.setattr(hooks.engine, "top", lambda: ...)
    monkeypatch.setattr(compose, "_TLS", __import__("threading").local())
    m, x, loss_of = _checkpointed(False)
    with check_saved("raise"):
        loss = loss_of()
        m[2].weight.data.mul_(2)
        with pytest.raises(SavedTensorChanged):
            loss.backward()
    assert compose._mirror() == []


# --- the device path: one read per backward pass ------------------------------------------------------


def test_the_device_path_reads_its_comparisons_once_at_the_end_of_backward(monkeypatch):
    """The Python path's device reading (torch's ops, run here on CPU): one read per backward pass
    (the native hooks' is tests/test_saved_cuda.py's)."""
    monkeypatch.setenv("TORCHGEN_PATCH_CHECK_PATH", "python")
    monkeypatch.setattr(fp, "_FORCE_DEVICE_PATH", True)
    reads = []
    real = hooks._PythonHooks.flush

    def counting(self, task):
        reads.append(task)
        return real(self, task)

    monkeypatch.setattr(hooks._PythonHooks, "flush", counting)
    make = UNSEEN["p.data.mul_(2)"]
    g, c = run(make, write=False, check="raise")
    assert c.findings == [] and len(reads) == 1 and torch.equal(g, run(make, write=False)[0])
    with pytest.raises(SavedTensorChanged) as e:  # raised from the end-of-backward callback, out of backward()
        run(make, write=True, check="raise")
    assert e.value.finding.name == "w" and e.value.finding.node == "MmBackward0"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_a_data_write_is_found_without_a_synchronisation_per_tensor():
    holder = Holder().cuda()
    x = _x().detach().cuda().requires_grad_()
    with check_saved("raise"):
        loss = (x @ holder.w).tanh().sum()
        holder.w.data.mul_(2)
        with pytest.raises(SavedTensorChanged) as e:
            loss.backward()
    assert e.value.finding.device.startswith("cuda") and e.value.finding.name == "w"
    with check_saved("raise") as c:
        loss = (x @ holder.w).tanh().sum()
        loss.backward()
    assert c.findings == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_a_triton_kernel_writing_a_saved_tensor_is_found():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def double(ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(ptr + offs, tl.load(ptr + offs, mask=mask) * 2, mask=mask)

    holder = Holder().cuda()
    x = _x().detach().cuda().requires_grad_()
    with check_saved("raise"):
        loss = (x @ holder.w).tanh().sum()
        double[(1,)](holder.w.detach(), holder.w.numel(), BLOCK=16)
        with pytest.raises(SavedTensorChanged):
            loss.backward()


# --- modes, install(), run --------------------------------------------------------------------


def test_a_bad_mode_is_refused_before_anything_runs(monkeypatch):
    with pytest.raises(ValueError, match="check_saved mode must be 'warn' or 'raise', not 'x'"):
        check_saved("x")
    from torchgen_patch import runtime

    def no_build(*a, **k):
        raise AssertionError("built before the mode was checked")

    monkeypatch.setattr(runtime, "library", no_build)
    with pytest.raises(ValueError, match="not 'bogus'"):
        torchgen_patch.install(check_saved="bogus")


def test_with_the_check_off_nothing_of_it_runs():
    import torch.autograd.graph as graph
    from torch.optim import optimizer

    assert hooks.engine.top() is None and not compose.patched()
    assert graph.saved_tensors_hooks.__enter__.__module__ == "torch.autograd.graph"
    n = len(optimizer._global_optimizer_post_hooks)
    with check_saved("raise"):
        assert hooks.engine.top() is not None and compose.patched()
        assert len(optimizer._global_optimizer_post_hooks) == n + 1
    assert hooks.engine.top() is None and not compose.patched()
    assert len(optimizer._global_optimizer_post_hooks) == n


PROGRAM = textwrap.dedent("""
    import torch
    m = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    for _ in range(2):
        loss = (m(x) * 2).sum()
        WRITE
        loss.backward()
    print("done")
""")


def _program(tmp_path, write="m.weight.data.mul_(2)"):
    p = tmp_path / "prog.py"
    p.write_text(PROGRAM.replace("WRITE", write))
    return str(p)


@pytest.mark.build
def test_install_turns_the_check_on_for_the_process(library, tmp_path):
    prog = ("import torch, torchgen_patch\n"
            f"rep = torchgen_patch.install(library={library.path!r}, check_saved='warn')\n"
            "print(rep.summary().splitlines()[1])\n" + open(_program(tmp_path)).read())
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["  saved-tensor check: warn", "done"]
    found = [line for line in r.stderr.splitlines() if "saved tensor changed" in line]
    assert len(found) == 1 and "a view of `weight` of Linear" in found[0] and "<string>" in found[0]
    assert r.stderr.splitlines()[-1].startswith("torchgen-patch: saved-tensor check in pid ") and \
        ": 2 changed saved tensors (1 distinct)" in r.stderr.splitlines()[-1]


@pytest.mark.build
@pytest.mark.parametrize("mode", ["warn", "raise"])
def test_run_check_saved_in_every_process(library, tmp_path, mode):
    prog = _program(tmp_path)
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", f"--check-saved={mode}", "--", sys.executable,
                        prog], capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT))
    if mode == "warn":
        assert r.returncode == 0 and "done" in r.stdout, r.stderr
        lines = [line for line in r.stderr.splitlines() if "saved tensor changed without a version bump" in line]
        assert len(lines) == 1 and ": a view of `weight` of Linear (float32[4, 3] on cpu), saved by AddmmBackward0 " \
            "in the forward call at prog.py:6 (<module>), used by the backward call at prog.py:8 (<module>)" in lines[0]
        assert "kernels active (cpp)" in r.stderr and ": 2 changed saved tensors (1 distinct)" in r.stderr
    else:
        assert r.returncode == 1 and "done" not in r.stdout
        assert "torchgen_patch.saved.finding.SavedTensorChanged: a tensor saved for backward was written" in r.stderr
    clean = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", f"--check-saved={mode}", "--",
                            sys.executable, _program(tmp_path, "pass")], capture_output=True, text=True, cwd=tmp_path,
                           env=dict(os.environ, PYTHONPATH=ROOT))
    assert clean.returncode == 0 and "saved tensor changed" not in clean.stderr, clean.stderr


def test_run_refuses_a_bad_mode_before_the_program_starts(tmp_path):
    marker = tmp_path / "started"
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "run", "--check-saved=bogus", "--", sys.executable,
                        "-c", f"open({str(marker)!r}, 'w')"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2 and not marker.exists()
    assert r.stderr == ("torchgen-patch run: error: argument --check-saved: invalid choice: 'bogus' (choose from "
                        "off, warn, raise) (see torchgen-patch run --help)\n")


def test_run_check_saved_alone_means_warn(monkeypatch):
    from torchgen_patch.cli.parser import parser

    args = parser().parse_args(["run", "--check-saved"])
    assert args.check_saved == "warn"
    assert parser().parse_args(["run"]).check_saved is None


COLLECTIVE = textwrap.dedent("""
    import json, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    def grad(write):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()
        w = torch.full((4, 3), float(rank + 1))  # saved by x @ w (the gradient of x needs it)
        loss = (x @ w).tanh().sum()
        if write:
            dist.all_reduce(w)  # in place, through c10d: no version moves
        loss.backward()
        return x.grad.tolist()
    out = {"rank": rank, "clean": grad(False), "written": grad(True)}
    dist.destroy_process_group()
    with open(f"rank{rank}.json", "w") as f:  # a file each: the ranks share one stdout
        json.dump(out, f)
""")


@pytest.mark.build
def test_an_in_place_collective_is_a_finding_naming_its_rank(library, tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    script = tmp_path / "collective.py"
    script.write_text(COLLECTIVE)

    def launch(*run):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                    "127.0.0.1", "--master-port", str(port), str(script)]
        cmd = [sys.executable, "-m", "torchgen_patch", "run", *run, "--", *torchrun] if run else torchrun
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600,
                           env=dict(os.environ, PYTHONPATH=ROOT))
        assert r.returncode == 0, r.stderr[-3000:]
        ranks = sorted(tmp_path.glob("rank*.json"))
        out = [json.loads(f.read_text()) for f in ranks]
        for f in ranks:
            f.unlink()
        return out, r.stderr

    plain, _ = launch()
    assert len(plain) == 2 and all(p["clean"] != p["written"] for p in plain)  # silent, and backward used the sum
    checked, err = launch("--check-saved=warn")
    assert sorted(p["rank"] for p in checked) == [0, 1]
    for rank in (0, 1):
        head = f"torchgen-patch: saved tensor changed without a version bump [rank {rank}]: " \
               "a tensor float32[4, 3] on cpu"
        lines = [line for line in err.splitlines() if line.startswith(head)]
        assert len(lines) == 1, err[-3000:]
        assert "saved by MmBackward0" in lines[0] and "collective.py" in lines[0]


# --- exact answers: batch norm, the program's lossy hooks, ctx attributes --------------------------------


def _bn_grad(train: bool, write=None, frozen: bool = False):
    """x's gradient through a batch norm (train or eval mode), with ``write`` applied to the module between
    forward and backward; the check's findings with it on."""
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm1d(4)
    bn.running_var.fill_(2.0)
    if frozen:
        bn.weight.requires_grad_(False)
    bn.train(train)
    x = torch.randn(8, 4, requires_grad=True)
    with check_saved("warn") as c:
        loss = (bn(x) * torch.arange(1.0, 5.0)).sum()
        if write:
            write(bn)
        loss.backward()
    return x.grad, c


def test_batch_norm_in_training_mode_updates_its_own_statistics_and_nothing_is_found():
    _, c = _bn_grad(True)
    assert c.findings == [] and c.skipped == {hooks.SAVER: 2}


def test_a_write_to_running_var_in_eval_mode_changes_the_gradient_and_is_found():
    """In eval mode backward reads the running statistics: a `.data` write to them between forward and
    backward changes x's gradient, so it is a finding (batch norm's exemption is its own update only)."""
    clean, _ = _bn_grad(False)
    written, c = _bn_grad(False, lambda bn: bn.running_var.data.mul_(4))
    assert not torch.allclose(clean, written)
    assert [(f.name, f.node) for f in c.findings] == [("running_var", "NativeBatchNormBackward0")]


def test_a_write_to_a_frozen_affine_weight_in_training_mode_is_found():
    clean, _ = _bn_grad(True, frozen=True)
    written, c = _bn_grad(True, lambda bn: bn.weight.data.mul_(3), frozen=True)
    assert not torch.allclose(clean, written)
    assert [f.name for f in c.findings] == ["weight"]


class _Compressing(torch.autograd.graph.saved_tensors_hooks):
    """Activation compression as programs do it: pack to bfloat16, unpack back to float32 (lossy)."""

    def __init__(self):
        super().__init__(lambda t: (t.dtype, t.to(torch.bfloat16)), lambda p: p[1].to(p[0]))


def test_lossy_hooks_of_the_program_give_no_finding_on_a_correct_program():
    """The originals of the activations die after the forward (only the compressed copies live): what
    the hooks return differs from what was saved by design, which is counted as not judged."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    with check_saved("raise") as c:
        with _Compressing():
            loss = model(x).pow(2).sum()
        loss.backward()
    assert c.findings == [] and c.skipped.get(hooks.LOSSY, 0) >= 1


def test_lossy_hooks_of_the_program_and_a_write_to_a_live_original_is_no_finding():
    """Backward uses the compressed copy, not the weight: a write to the weight since changes nothing."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8, requires_grad=True)
    with check_saved("raise") as c:
        with _Compressing():
            loss = model(x).pow(2).sum()
        model[2].weight.data.mul_(2)
        loss.backward()
    assert c.findings == [] and c.skipped.get(hooks.LOSSY, 0) >= 1


class _Scale(torch.autograd.Function):
    """A custom Function that keeps its weight as a ``ctx`` attribute instead of ``save_for_backward``."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w
        return x * w

    @staticmethod
    def backward(ctx, g):
        return g * ctx.w, None


@pytest.mark.parametrize("mode", ["warn", "raise"])
def test_a_ctx_attribute_written_through_data_between_forward_and_backward_is_found(mode):
    """Autograd never saves ``ctx.w = w``: the check fingerprints it when forward returns and compares it
    when backward runs the node (docs/unseen-writes.md)."""
    w = torch.full((3,), 2.0)
    x = torch.ones(3, requires_grad=True)
    with check_saved(mode) as c:
        y = _Scale.apply(x, w).sum()
        w.data.mul_(5)
        if mode == "raise":
            with pytest.raises(SavedTensorChanged) as e:
                y.backward()
            (f,) = [e.value.finding]
        else:
            y.backward()
            (f,) = c.findings
    assert (f.node, f.shape, f.version) == ("_ScaleBackward", (3,), 0) and f.writers[0] == Writer.DATA
    assert f.forward.file == f.backward.file and f.forward.line < f.backward.line and c.checked == 1


def test_a_correct_custom_function_with_ctx_attributes_gives_nothing():
    w = torch.full((3,), 2.0)
    x = torch.ones(3, requires_grad=True)
    with check_saved("raise") as c:
        _Scale.apply(x, w).sum().backward()
        with torch.no_grad():
            w.mul_(5)  # after backward: no matter
    assert c.findings == [] and c.checked == 1 and c.unpacked == 1 and torch.equal(x.grad, torch.full((3,), 2.0))


class _Kept(torch.autograd.Function):
    """Keeps its weights inside a list, a tuple and a dict attribute of ``ctx``, and a tensor it also saves."""

    @staticmethod
    def forward(ctx, x, a, b, c, d):
        ctx.weights = [a]
        ctx.pair = (b, 1)
        ctx.by_name = {"c": c, "n": None}
        ctx.d = d
        ctx.save_for_backward(d)
        return x * a * b * c * d

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return g * ctx.weights[0] * ctx.pair[0] * ctx.by_name["c"] * d, None, None, None, None


@pytest.mark.parametrize("written", range(4))
def test_tensors_in_a_list_tuple_or_dict_attribute_are_checked_and_one_also_saved_is_found_once(written):
    """One level into lists, tuples and dicts; ``d``, both a ctx attribute and saved, is the saved tensor's
    finding alone (one finding, not two)."""
    ws = [torch.full((2,), float(i + 2)) for i in range(4)]
    x = torch.ones(2, requires_grad=True)
    with check_saved("warn") as c:
        y = _Kept.apply(x, *ws).sum()
        ws[written].data.add_(1)
        y.backward()
    (f,) = c.findings
    assert f.node == "_KeptBackward" and c.checked == 4


class _Detached(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w.detach()  # the same memory as the saved tensor, another tensor object
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return g * ctx.w + 0 * w, None


def test_a_ctx_attribute_that_is_a_detached_alias_of_a_saved_tensor_is_left_to_the_saved_check():
    w = torch.full((3,), 2.0)
    x = torch.ones(3, requires_grad=True)
    with check_saved("warn") as c:
        y = _Detached.apply(x, w).sum()
        w.data.mul_(5)
        y.backward()
    (f,) = c.findings  # the saved tensor's
    assert f.node == "_DetachedBackward" and c.checked == 1


def test_a_custom_function_whose_backward_never_runs_holds_nothing():
    """What is kept of a ctx attribute is held by the node's hooks alone, and goes with the node (at once:
    no cycle); neither the node nor the tensor is held by the check."""
    import gc
    import weakref

    from torchgen_patch.saved import ctxattr

    def watches() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is ctxattr._Watch)

    x = torch.ones(3, requires_grad=True)
    with check_saved("raise") as c:
        before = watches()
        w = torch.full((3,), 2.0)
        y = _Scale.apply(x, w)
        node, tensor = weakref.ref(y.grad_fn), weakref.ref(w)
        assert watches() == before + 1
        del y, w
        assert node() is None and tensor() is None and watches() == before
    assert c.unpacked == 0 and c.findings == []


class _Workspace(torch.autograd.Function):
    """Its backward writes a ctx attribute of its own (a workspace) through ``.data``."""

    @staticmethod
    def forward(ctx, x):
        ctx.scratch = torch.zeros(3)
        ctx.w = torch.full((3,), 2.0)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        ctx.scratch.data.add_(g)
        return g * ctx.w


def test_a_graph_kept_for_another_backward_is_compared_again_at_each():
    """retain_graph: the second pass is compared with what the first left (the node's own write to its
    workspace is no finding); a write between the two passes is."""
    x = torch.ones(3, requires_grad=True)
    with check_saved("warn") as c:
        y = _Workspace.apply(x).sum()
        y.backward(retain_graph=True)
        y.backward(retain_graph=True)
        assert c.findings == [] and c.checked == 4
        y.grad_fn.next_functions[0][0].w.data.mul_(3)
        y.backward()
    (f,) = c.findings
    assert f.node == "_WorkspaceBackward" and torch.equal(x.grad, torch.full((3,), 10.0))


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x * x

    @staticmethod
    def backward(ctx, g):
        return 2 * g * ctx.x  # differentiable: a double backward goes through it


def test_a_double_backward_through_a_ctx_attribute_gives_nothing():
    x = torch.full((3,), 3.0, requires_grad=True)
    with check_saved("raise") as c:
        (g,) = torch.autograd.grad(_Square.apply(x).sum(), x, create_graph=True)
        assert c.checked == 1  # ctx.x
        (gg,) = torch.autograd.grad(g.sum(), x)  # through the ops of the Function's backward
    assert torch.equal(g, torch.full((3,), 6.0)) and torch.equal(gg, torch.full((3,), 2.0))
    assert c.findings == [] and c.checked == 2


class _Dirty(torch.autograd.Function):
    """Writes its input in place in forward, marks it dirty and keeps it as a ctx attribute."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w
        w.mul_(2)
        ctx.mark_dirty(w)
        return w * x, w

    @staticmethod
    def backward(ctx, g, gw):
        return g * ctx.w, None


class _Replaced(torch.autograd.Function):
    """Replaces its ctx attribute by another tensor in forward: only the one there at return counts."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w
        ctx.w = w * 2
        return x * ctx.w

    @staticmethod
    def backward(ctx, g):
        return g * ctx.w, None


@pytest.mark.parametrize("function", [_Dirty, _Replaced], ids=["marked dirty", "replaced"])
def test_a_ctx_attribute_the_function_writes_or_replaces_in_forward_gives_nothing(function):
    w = torch.full((3,), 2.0)
    x = torch.ones(3, requires_grad=True)
    with check_saved("raise") as c:
        out = function.apply(x, w)
        if function is _Replaced:
            w.data.mul_(5)  # the tensor given in, no longer what backward reads
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    assert c.findings == [] and c.checked == 1 and torch.equal(x.grad, torch.full((3,), 4.0))


def test_a_ctx_attribute_written_with_a_version_bump_is_not_judged():
    """Autograd checks no version of a ctx attribute; a write it could see is counted, not judged."""
    from torchgen_patch.saved import ctxattr

    w = torch.full((3,), 2.0)
    x = torch.ones(3, requires_grad=True)
    with check_saved("raise") as c:
        y = _Scale.apply(x, w).sum()
        with torch.no_grad():
            w.mul_(5)
        y.backward()
    assert c.findings == [] and c.skipped == {ctxattr.BUMPED: 1}


class _Carries(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, kept):
        ctx.kept = kept
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2, None


def test_a_sparse_ctx_attribute_is_counted_as_a_saved_one_is():
    x = torch.ones(3, requires_grad=True)
    with check_saved("raise") as c:
        _Carries.apply(x, torch.eye(3).to_sparse()).sum().backward()
    assert c.findings == [] and c.skipped == {"sparse_coo tensors": 1} and c.checked == 0


def test_function_apply_is_wrapped_only_while_a_check_is_on_and_composes_with_other_wrappers():
    from torchgen_patch.saved import ctxattr

    function = torch.autograd.Function
    own, calls = function.__dict__["apply"], []
    assert not ctxattr.wrapped()
    w = torch.full((3,), 2.0)
    x = torch.ones(3, requires_grad=True)
    with check_saved("raise") as c:
        assert ctxattr.wrapped()
        under = function.__dict__["apply"]

        def theirs(cls, *args):
            calls.append(cls)
            return under.__get__(None, cls)(*args)

        function.apply = classmethod(theirs)
    try:
        assert function.__dict__["apply"].__func__ is theirs  # theirs stays, ours under it, passing calls through
        with check_saved("warn") as c:
            y = _Scale.apply(x, w).sum()
            w.data.mul_(5)
            y.backward()
        assert len(c.findings) == 1 and c.checked == 1 and calls == [_Scale]  # compared once
    finally:
        function.apply = under
    with check_saved("raise"):
        pass
    assert function.__dict__["apply"] is own and not ctxattr.wrapped()  # torch's own again


class _Linear(torch.autograd.Function):
    """A linear layer as extension libraries write one: its input saved, its weight and bias kept on ``ctx``."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x)
        ctx.weight, ctx.bias = weight, bias
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g @ ctx.weight, g.t() @ x, g.sum(0)


def _train(steps: int, fused_step_inside: bool = False) -> list[float]:
    torch.manual_seed(0)
    first, second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
    params = [*first.parameters(), *second.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True) if fused_step_inside else torch.optim.SGD(params, lr=0.1)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)  # (a step with gradients of zeros writes the weights all the same)
        h = _Linear.apply(x, first.weight, first.bias).tanh()
        loss = (_Linear.apply(h, second.weight, second.bias) - y).pow(2).mean()
        if fused_step_inside:
            opt.step()  # between forward and backward: it writes the weights without a version bump
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_a_model_of_custom_functions_trains_the_same_with_no_finding_and_a_step_inside_is_found():
    off = _train(5)
    with check_saved("raise") as c:
        on = _train(5)
    assert on == off and off[-1] < off[0] and c.findings == []
    assert c.checked == 5 * (2 * 3 + 2)  # a step: each Function's input, weight and bias; tanh's result, pow's input
    with check_saved("warn") as c:
        _train(2, fused_step_inside=True)
    assert c.findings and {f.optimizer for f in c.findings} == {"torch.optim.adamw.AdamW"}
    assert {f.node for f in c.findings} == {"_LinearBackward"}


class _OnDevice(torch.Tensor):
    """A CPU tensor that says it is a CUDA one: the ctx attribute's device comparison, run on CPU."""

    @property
    def is_cuda(self):
        return True


class _Event:
    """torch.cuda.Event, as the device runs what was recorded: when ``ran`` says so."""

    ran = False

    def record(self, stream=None):
        pass

    def query(self):
        return _Event.ran

    def synchronize(self):
        _Event.ran = True


class _KeepsOnDevice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.w = w
        return x * w.as_subclass(torch.Tensor)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.w.as_subclass(torch.Tensor), None


def test_in_warn_mode_a_device_comparison_of_a_ctx_attribute_is_judged_once_it_has_run(monkeypatch, capsys):
    """On the native path in warn mode, a ctx attribute's comparison on a device is not waited for at the
    pass's end: it is judged once it has run (here: when the findings are asked for), as of that end (a step
    after it is not named). The Python path reads it at the pass's end."""
    empty = torch.empty
    monkeypatch.setattr(fp, "_FORCE_DEVICE_PATH", True)
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: empty(*a, **k))
    monkeypatch.setattr(_Event, "ran", False)
    w = torch.full((3,), 2.0).as_subclass(_OnDevice)
    x = torch.ones(3, requires_grad=True)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with check_saved("warn") as c:
        y = _KeepsOnDevice.apply(x, w).sum()
        w.data.mul_(3)
        y.backward()
        said = capsys.readouterr().err
        opt.step()  # after the pass
        (f,) = c.findings
    assert ("saved tensor changed" in said) == (c.path == "python")
    assert f.node == "_KeepsOnDeviceBackward" and f.optimizer is None and c.checked == 1


def test_a_cuda_ctx_attribute_kept_while_a_cuda_graph_is_captured_is_counted_not_judged(monkeypatch):
    """What runs while a CUDA graph is captured is recorded, not run: no fingerprint is read then, and the
    attribute is counted as the native hooks count a tensor saved then."""
    from torchgen_patch.saved import ctxattr

    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    w = torch.full((3,), 2.0).as_subclass(_OnDevice)
    x = torch.ones(3, requires_grad=True)
    with check_saved("raise") as c:
        y = _KeepsOnDevice.apply(x, w).sum()
        capturing[0] = False
        w.data.mul_(3)
        y.backward()
    assert c.findings == [] and c.skipped == {ctxattr.CAPTURED: 1} and c.checked == 0


def test_a_ctx_attribute_inside_a_compiled_region_is_checked():
    """torch.compile keeps a ctx attribute of a Function it traced as a tensor of its own node with no version
    check (``ctx._tensors_no_vc_check``): checked as well, and turning the check on or off compiles nothing
    again (the wrapper does nothing under tracing)."""
    import torch._dynamo.utils as du

    torch._dynamo.reset()
    w = torch.full((3,), 2.0)
    x = torch.ones(3, requires_grad=True)
    f = torch.compile(lambda x, w: (_Scale.apply(x.sin(), w) * 2).sum(), backend="aot_eager")
    with check_saved("raise") as c:
        f(x, w).backward()
    assert c.findings == [] and c.checked == 2
    graphs = du.counters["stats"]["unique_graphs"]
    f(x, w).backward()
    with check_saved("raise"):
        y = f(x, w)
        w.data.mul_(5)
        with pytest.raises(SavedTensorChanged) as e:
            y.backward()
    assert e.value.finding.node == "CompiledFunctionBackward" and du.counters["stats"]["unique_graphs"] == graphs
    torch._dynamo.reset()


def test_two_copies_of_one_model_are_told_apart():
    """A teacher and its student copy share every parameter path: a finding names which one by its id."""
    torch.manual_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    teacher = copy.deepcopy(student)
    x = torch.randn(3, 4)
    with check_saved("warn") as c:
        loss = (teacher(x) - student(x)).pow(2).sum()
        teacher[2].weight.data.mul_(2)
        loss.backward()
    (f,) = c.findings
    assert f.name == "2.weight" and f.owner == f"Sequential at 0x{id(teacher):x}"
    del teacher, student, loss, f, c
    import gc

    gc.collect()
    alone = torch.nn.Sequential(torch.nn.Linear(4, 1))
    with check_saved("warn") as c:
        loss = alone(torch.randn(2, 4, requires_grad=True)).sum()
        alone[0].weight.data.mul_(2)
        loss.backward()
    assert c.findings[0].owner == "Sequential"  # one model of its class: its class alone


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.out = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.inp(x).tanh())


class _Distill(torch.nn.Module):
    """A teacher and its student copy, called by those attribute names."""

    def __init__(self):
        super().__init__()
        self.teacher = _Net()
        self.student = copy.deepcopy(self.teacher)

    def forward(self, x):
        return (self.teacher(x) - self.student(x)).pow(2).sum()


def _copies_written(distill: bool):
    """Forward through a teacher and its student copy (on a parent, or called by the program itself), both
    copies' ``out.weight`` written through ``.data``, backward: the check, the copies, the line of each call."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    parent = _Distill() if distill else None
    teacher, student = (parent.teacher, parent.student) if parent else (_Net(), None)
    student = student or copy.deepcopy(teacher)
    with check_saved("warn") as c:
        if parent:
            loss = parent(x)
            lines = [sys._getframe().f_lineno - 1] * 2
        else:
            t = teacher(x)
            s = student(x)
            lines = [sys._getframe().f_lineno - 2, sys._getframe().f_lineno - 1]
            loss = (t - s).pow(2).sum()
        teacher.out.weight.data.mul_(2)
        student.out.weight.data.mul_(3)
        loss.backward()
    return c, (teacher, student), lines


def test_a_teacher_and_its_student_copy_differ_by_path_and_by_the_programs_call(capsys):
    """Each copy's finding names its path from the outermost module (``teacher.out.weight`` on a parent
    that calls them by those names), and the program's frame outside every module's own ``forward``:
    where the program called its model. Without a parent, the class with its address and each call."""
    here = os.path.relpath(__file__)
    c, _, lines = _copies_written(distill=True)
    assert sorted(f.name for f in c.findings) == ["student.out.weight", "teacher.out.weight"]
    for f in c.findings:
        assert f.owner == "_Distill" and f.forward.function == "forward"
        assert f.call == Frame(here, lines[0], "_copies_written")
    c, copies, lines = _copies_written(distill=False)
    by_owner = {f.owner: f for f in c.findings}
    assert sorted(by_owner) == sorted(f"_Net at 0x{id(m):x}" for m in copies)
    for model, line in zip(copies, lines, strict=True):
        f = by_owner[f"_Net at 0x{id(model):x}"]
        assert f.name == "out.weight" and f.forward.function == "forward"
        assert f.call == Frame(here, line, "_copies_written")
    said = [x for x in capsys.readouterr().err.splitlines() if x.startswith("torchgen-patch: saved tensor changed")]
    assert len(said) == 4 and len({f.key() for f in c.findings}) == 2  # each copy its own line
    assert f", called from {here}:{lines[1]} (_copies_written)" in said[-1] + said[-2]


# --- what the user sees -----------------------------------------------------------------------------------


def _process(code: str, **variables):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p),
               **variables)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_the_check_says_once_at_start_that_it_is_on_and_a_process_without_backward_prints_no_count():
    start = "import torch, torchgen_patch.saved as s; from torchgen_patch.runtime.checklib import prepare; prepare(); "
    r = _process(start + "s.enable('warn'); s.enable('warn'); torch.ones(3) * 2")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    on = "torchgen-patch: saved-tensor check on (warn, every step) in pid "
    assert len([x for x in lines if x.startswith(on)]) == 1
    assert not any("changed saved tensor" in x for x in lines), lines  # no backward ran: no count
    r = _process(start + "s.enable('warn'); x = torch.ones(3, requires_grad=True); (x * x).sum().backward()")
    assert r.returncode == 0 and r.stderr.splitlines()[-1].startswith("torchgen-patch: saved-tensor check in pid "), \
        r.stderr


def test_the_start_line_names_the_program_and_rank_and_raise_mode_counts_at_exit():
    """The line at start names the process as the kernels' line does (its program, its rank); in raise mode
    the count at exit is said too (a finding the program caught is counted)."""
    start = "import torch, torchgen_patch.saved as s; from torchgen_patch.runtime.checklib import prepare; prepare(); "
    body = textwrap.dedent("""
        x = torch.ones(3, requires_grad=True)
        y = x.exp()
        z = (y * y).sum()
        y.data.mul_(2)
        try:
            z.backward()
        except s.SavedTensorChanged:
            pass
    """)
    r = _process(start + "s.enable('raise')\n" + body, RANK="1")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert re.search(r"^torchgen-patch: saved-tensor check on \(raise, every step\) in pid \d+ \(python -c, rank 1\): ",
                     r.stderr, re.M), r.stderr
    assert lines[-1].startswith("torchgen-patch: saved-tensor check in pid ") and \
        "(rank 1): 1 changed saved tensor (1 distinct) in " in lines[-1], r.stderr


# --- the stack, memory, and what each path reads alike ---------------------------------------------------


def _version_check_is_on() -> bool:
    """Whether autograd's own version check is in force on this thread (any saved-tensor hooks switch it off)."""
    a = torch.ones(3, requires_grad=True)
    b = a.exp()
    s = b.sum()
    with torch.no_grad():
        b.mul_(2)
    try:
        s.backward()
    except RuntimeError as e:
        return "modified by an inplace operation" in str(e)
    return False


def test_a_check_stopped_inside_the_programs_own_hooks_leaves_nothing_behind():
    identity = (lambda t: t, lambda t: t)
    c = check_saved("raise").start()
    with torch.autograd.graph.saved_tensors_hooks(*identity):
        c.stop()
    assert hooks.engine.top() is None and _version_check_is_on()


def test_a_check_started_inside_the_programs_own_hooks_outlives_them():
    make = UNSEEN["p.data.mul_(2)"]
    ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    ctx.__enter__()
    c = check_saved("warn").start()
    ctx.__exit__(None, None, None)  # the program's block ends while the check is on
    try:
        holder, writer = make()
        x = _x()
        loss = (x @ holder.w).tanh().sum()
        writer(holder.w)
        loss.backward()
    finally:
        c.stop()
    assert len(c.findings) == 1 and hooks.engine.top() is None


def test_checks_started_and_stopped_are_freed():
    import gc
    import weakref

    x = torch.ones(3, requires_grad=True)
    refs = []
    for _ in range(50):
        c = check_saved("raise")
        with c:
            (x * x).sum().backward()
        refs.append(weakref.ref(c))
        del c
    gc.collect()
    assert sum(r() is not None for r in refs) == 0 and len(compose._OWN) == 0


def test_a_backward_that_raised_leaves_no_comparison_waiting(monkeypatch):
    """The engine runs no end-of-backward callback for a pass that raised: its comparisons are read at the
    next pass, so nothing (the graph they name) is kept for ever."""
    monkeypatch.setattr(fp, "_FORCE_DEVICE_PATH", True)
    monkeypatch.setenv("TORCHGEN_PATCH_CHECK_PATH", "python")

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("boom")

    x = torch.ones(4, requires_grad=True)
    with check_saved("raise") as c:
        for _ in range(5):
            with pytest.raises(RuntimeError, match="boom"):
                Boom.apply(x).exp().sum().backward()
        assert len(c._python.tasks()) <= 1
        (x * x).sum().backward()
        assert c._python.tasks() == []


def test_a_layout_the_native_code_does_not_read_at_use_is_compared_as_the_python_path_does():
    """More than 8 strided dimensions once the tensor is used (``.data`` replaced between save and use)."""
    w = torch.nn.Parameter(torch.randn((2,) * 9))
    x = torch.randn((2,) * 9, requires_grad=True)
    with check_saved("warn") as c:
        loss = (x * w).sum()
        w.data = torch.randn((4,) * 9)[(slice(None, None, 2),) * 9]
        loss.backward()
    assert len(c.findings) == 1 and c.findings[0].writers[0] == Writer.STORAGE


def test_empty_tensors_are_counted_alike():
    x = torch.empty(5, 0, requires_grad=True)
    w = torch.empty(5, 0, requires_grad=True)
    with check_saved("raise") as c:
        (x * w).sum().backward()
    assert c.findings == [] and c.checked == 2 and c.skipped == {}


def test_bool_tensors_with_gaps_are_read_by_their_bits(native_module):
    """A bool tensor's bytes need not be 0 or 1: every path reads what is stored, not a copy's 0/1."""
    t = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.uint8).view(torch.bool)[::2]
    h = native_module.Hooks(None, None, None, None, fp.plain_types())
    fp._FORCE_DEVICE_PATH = True
    try:
        ops = _value(fp.fingerprint(t))
    finally:
        fp._FORCE_DEVICE_PATH = False
    assert h.fingerprint(t) == _value(fp.fingerprint(t)) == ops == fp._cpu_without_numpy(t)


def test_a_library_that_is_not_the_checks_is_refused_in_one_line():
    from torchgen_patch.errors import EnvironmentProblem
    from torchgen_patch.runtime import checklib
    from torchgen_patch.runtime.compile import build_boxed

    with pytest.raises(EnvironmentProblem, match="not of the saved-tensor check's native hooks"):
        checklib.load(build_boxed().path)
