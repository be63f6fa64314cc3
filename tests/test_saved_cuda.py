"""The saved-tensor check on CUDA: the native hooks' kernel (compiled at run time by NVRTC, launched from
C++) and the Python path's torch ops compute exactly the fingerprint the CPU tests check, in every
layout; a one-bit change in any element changes it; writes are found on both paths; batch norm's own
statistics (cuDNN's node) are exempt only in training mode; and a backward pass costs one host
synchronisation whatever the number of tensors it checks. Skipped without a GPU; the benchmark's code
(bench/bench_saved.py) runs here on CPU as well."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from torchgen_patch.saved import fingerprint as fp

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
PATHS = ["native", "python"]

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]


def _sample(dtype, rows: int = 64, cols: int = 48):
    """A rows x cols tensor of ``dtype`` with random bits (NaN payloads and all: bits, not values)."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (rows, cols * dtype.itemsize), generator=g, dtype=torch.uint8)
    return raw[:, :cols] % 2 == 1 if dtype == torch.bool else raw.view(dtype)


def _layouts(t):
    return {"contiguous": t, "transposed": t.t(), "sliced": t[:, ::3], "offset": t[:, 1:], "expanded":
            t[:1].expand(4, -1), "0-d": t[0, 0], "column": t[:1].t(), "heads": t.view(t.shape[0], 4, -1)[:, 1:3]
            .transpose(0, 1), "columns": t[:, 16:48],  # heads, columns: the rows kernel where 16-byte aligned
            "sliced, transposed": t[:, ::3].t()}  # the strided kernel, its dimensions read by decreasing stride


@pytest.fixture(scope="module")
def native_hooks():
    from torchgen_patch.runtime import checklib

    why = checklib.prepare("native")
    assert why is None, why
    from torchgen_patch.saved import native

    return native._STATE["module"].Hooks(None, None, None, None, fp.plain_types())


def _cpu_reference(t) -> int:
    return int(fp.fingerprint(t)[0]) & ((1 << 64) - 1)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_computes_the_fingerprint_the_cpu_tests_check(dtype, native_hooks):
    """The native kernel and torch's ops on CUDA: the CPU's number, for every layout (the dense kernel,
    the strided one, unaligned starts), small and of many NH blocks (several blocks of threads)."""
    for rows, cols in ((64, 48), (1031, 96)):
        t = _sample(dtype, rows, cols)
        for name, v in _layouts(t).items():
            want = _cpu_reference(v)
            on = _layouts(t.cuda())[name]
            assert native_hooks.fingerprint(on) == want, (rows, name)
            assert int(fp.fingerprint(on)[0]) & ((1 << 64) - 1) == want, (rows, name)
    devices = native_hooks.devices()
    assert devices and all(why == "" for why in devices.values()), devices  # the kernel, not a fallback


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int8], ids=str)
def test_on_cuda_a_one_bit_change_changes_the_fingerprint(dtype, native_hooks):
    t = _sample(dtype).cuda()
    raw = t.view(torch.uint8).view(-1)
    for read in (native_hooks.fingerprint, lambda x: int(fp.fingerprint(x)[0])):
        for byte in (0, 7, raw.numel() // 2, raw.numel() - 1):
            for bit in (0, 7):
                before = read(t)
                raw[byte] ^= 1 << bit
                assert read(t) != before, (byte, bit)
                raw[byte] ^= 1 << bit
                assert read(t) == before


def _syncs(fn) -> int:
    """Host synchronisations while ``fn`` runs, as torch's sync debug mode counts them."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_checked_backward_pass_synchronises_at_most_once_whatever_it_checks(path):
    import torchgen_patch

    torch.manual_seed(0)
    layers = []
    for _ in range(24):
        layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(32, 64, device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()

    check = torchgen_patch.check_saved("raise", path=path)
    with check:
        step()  # the kernel compiled, the key on the device
    plain = _syncs(step)
    with check:
        before = check.checked
        checked = _syncs(step)
        saved = check.checked - before
    assert check.path == path
    # the native hooks wait on the stream with the driver (torch's sync debug mode does not count it)
    assert saved >= 48 and checked <= plain + 1, (saved, plain, checked)
    assert check.findings == []


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["warn", "raise"])
def test_on_cuda_a_data_write_is_found_and_named(path, mode):
    import torchgen_patch
    from torchgen_patch.saved import SavedTensorChanged

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved(mode, path=path)
    try:
        with check:
            loss = model(x).pow(2).sum()
            model[2].weight.data.mul_(2)
            loss.backward()
    except SavedTensorChanged as e:
        assert mode == "raise"
        finding = e.finding
    else:
        assert mode == "warn" and len(check.findings) == 1
        finding = check.findings[0]
    assert finding.name == "2.weight" and finding.device == "cuda:0" and finding.node.startswith("Addmm")
    before = len(check.findings)
    with check:  # the same without the write: nothing
        model(x).pow(2).sum().backward()
    assert len(check.findings) == before


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_on_cuda_batch_norm_statistics_are_exempt_only_in_training_mode(path):
    import torchgen_patch

    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(8).cuda()
    frozen = torch.nn.BatchNorm2d(8).cuda()
    frozen.weight.requires_grad_(False)
    x = torch.randn(4, 8, 6, 6, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved("warn", path=path)
    with check:  # training mode: the op updates its own statistics after saving them
        bn(x).sum().backward()
    assert check.findings == []
    bn.eval()
    with check:  # eval mode: backward reads running_var; a write to it is a finding
        loss = bn(x).sum()
        bn.running_var.data.mul_(2)
        loss.backward()
    assert [f.name for f in check.findings] == ["running_var"]
    with check:  # a frozen affine weight in training mode: a finding too
        loss = frozen(x).sum()
        frozen.weight.data.mul_(2)
        loss.backward()
    assert [f.name for f in check.findings][1:] == ["weight"]


def test_the_benchmark_runs_its_code_on_cpu(monkeypatch, tmp_path):
    """bench/bench_saved.py's timing, floor, memory, report and JSON on a tiny model on CPU (so the GPU
    run is not their first)."""
    import importlib.util
    import json
    import os

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("bench_saved", os.path.join(ROOT, "bench", "bench_saved.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setitem(bench.PRENORM, "tiny", (1, 32, 2, 2, 16))
    monkeypatch.setitem(bench.CPU_MODELS, "tiny", ("a tiny pre-norm transformer", 1.5))
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    bench.main(2, str(report), str(js), device="cpu", models=["tiny"])
    (t,) = json.loads(js.read_text())[0]["models"]
    assert t["saved_tensors"] > 10 and t["saved_bytes"] > 0 and t["off_ms"] > 0 and t["on_ms"] > 0
    assert t["floor"] >= t["identity_ratio"] > 0 and t["met"] == (t["ratio"] <= 1.5) and t["findings"] == 0
    assert t["checked_per_step"] == t["saved_tensors"]
    assert t["every"] == 32 and t["sampled_steps"] == 2 * bench.STEPS_PER_ROUND.get("tiny", 1) > 0
    assert t["sampled_ratio"] > 0 and t["not_drawn_us"] == json.loads(js.read_text())[0]["not_drawn_us"]
    assert t["not_drawn_host"] == pytest.approx(1 + t["not_drawn_us"] / 1e3 / t["off_ms"])
    text = report.read_text()
    assert "| a tiny pre-norm transformer | " in text and "floor (identity hooks + two reads)" in text
    assert "N = 32: " in text and "us a step): <= 1.002: " in text


@pytest.mark.cuda
@needs_cuda
def test_fingerprints_on_two_streams_across_a_new_buffer_of_slots_give_no_finding(native_hooks):
    """A buffer of slots is zeroed before any stream can use it: a fingerprint launched on a second stream
    while the first is busy is never wiped (a correct program, no finding)."""
    import torchgen_patch

    native_hooks.launch_cost(torch.randn(256, device="cuda"), 1 << 16)  # uses up a buffer of slots
    torch.cuda.synchronize()
    a = torch.randn(4096, device="cuda", requires_grad=True)
    w = torch.randn(4096, device="cuda", requires_grad=True)
    side = torch.cuda.Stream()
    with torchgen_patch.check_saved("warn", path="native") as c:
        torch.cuda._sleep(10**9)  # the default stream busy while the side stream runs ahead
        y1 = (a * w).sum()
        with torch.cuda.stream(side):
            y2 = (a.exp() * w).sum()
        torch.cuda.synchronize()
        (y1 + y2).backward()
        torch.cuda.synchronize()
    assert c.findings == [] and c.checked >= 4


@pytest.mark.cuda
@needs_cuda
def test_rows_whose_offsets_pass_two_to_the_31_are_read_where_they_are(native_hooks):
    b = torch.zeros(2 * 2**31 + 8, dtype=torch.bfloat16, device="cuda")
    for i in range(3):
        b[i * 2**31:i * 2**31 + 8] = i + 1
    t = b.as_strided((3, 8), (2**31, 1))
    assert native_hooks.fingerprint(t) == _cpu_reference(t.cpu())
    del b, t
    torch.cuda.empty_cache()


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_saved_cuda_tensor_moved_to_the_cpu_before_backward_is_a_finding(path):
    import torchgen_patch

    x = torch.randn(1 << 10, device="cuda", requires_grad=True)
    w = torch.nn.Parameter(torch.randn(1 << 10, device="cuda"))
    with torchgen_patch.check_saved("warn", path=path) as c:
        y = (x * w).sum()
        w.data = torch.randn(1 << 10)  # as Module.cpu() does
        try:
            y.backward()
        except RuntimeError:
            pass  # autograd may refuse the gradient's device; the check has spoken before
    assert len(c.findings) == 1


def _a_write_between_forward_and_backward(mode: str, path: str, hold_backward: bool):
    """A .data write to a saved weight between forward and backward, an optimizer step after the backward
    (before the findings are read); with hold_backward, the device kept busy for about a second before the
    backward's kernels. (host seconds of backward(), the findings)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    return _timed_write(mode, path, hold_backward, lambda: model(x).pow(2).sum(), model[2].weight,
                        torch.optim.SGD(model.parameters(), lr=0.1))


def _timed_write(mode: str, path: str, hold_backward: bool, forward, weight, opt):
    """``forward()`` once (the kernel compiled, the key on the device), then again, a .data write to ``weight``,
    the backward (timed, after holding the device if asked), ``opt`` stepped; (host seconds of backward(),
    the findings)."""
    import time

    import torchgen_patch
    from torchgen_patch.saved import SavedTensorChanged

    check = torchgen_patch.check_saved(mode, path=path)
    with check:
        forward().backward()
        loss = forward()
        weight.data.mul_(2)
        torch.cuda.synchronize()
        if hold_backward:
            torch.cuda._sleep(int(2e9))  # about a second of the device's clock
        start = time.perf_counter()
        try:
            loss.backward()
        except SavedTensorChanged:
            assert mode == "raise"
        took = time.perf_counter() - start
        opt.step()  # after the pass: not a writer of what it found
        findings = list(check.findings)
    torch.cuda.synchronize()
    return took, findings


@pytest.mark.cuda
@needs_cuda
def test_in_warn_mode_a_backward_pass_never_waits_for_the_device(native_hooks):
    took_raise, _ = _a_write_between_forward_and_backward("raise", "native", hold_backward=True)
    took_warn, findings = _a_write_between_forward_and_backward("warn", "native", hold_backward=True)
    assert took_raise > 0.5, took_raise  # raise reads its comparisons at the pass's end: it waits for them
    assert took_warn < took_raise / 4, (took_warn, took_raise)
    assert len(findings) == 1 and findings[0].name == "2.weight"


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_finding_read_after_the_pass_is_judged_as_of_the_passs_end(path):
    from torchgen_patch.saved.render import as_dict

    _, warned = _a_write_between_forward_and_backward("warn", path, hold_backward=False)
    _, raised = _a_write_between_forward_and_backward("raise", path, hold_backward=False)
    assert len(warned) == len(raised) == 1
    assert warned[0].optimizer is None  # the step after the pass's end is not named
    assert as_dict(warned[0]) == as_dict(raised[0])


# the three readings a node's saved CUDA tensors can get: (name, the check's path, one launch a node at use)
READINGS = (("batched", "native", True), ("per tensor", "native", False), ("python", "python", True))


@contextlib.contextmanager
def _reading(batched: bool):
    """The native hooks batching (or not) for a block, batching again after it."""
    from torchgen_patch.saved import native

    native.batching(batched)
    try:
        yield
    finally:
        native.batching(True)


def _layer_norm_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                               torch.nn.Linear(64, 8)).cuda()


@pytest.mark.cuda
@needs_cuda
def test_at_use_a_nodes_saved_tensors_are_read_in_one_launch(native_hooks):
    """One launch at use for each backward node's CUDA tensors (layer norm saves five, each product two),
    one a tensor when batching is off; the same tensors checked either way, nothing found."""
    import torchgen_patch
    from torchgen_patch.saved import native

    model = _layer_norm_net()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved("raise", path="native")
    counts = {}
    for turn, on in enumerate((True, False, True, False)):
        with _reading(on), check:
            loss = model(x).pow(2).sum()
            before, checked, unpacked = native.launches(), check.checked, check.unpacked
            loss.backward()
            counts[turn] = (on, native.launches() - before, check.checked - checked, check.unpacked - unpacked)
    why = (counts, check.skipped)
    assert all(c[2] == c[3] == 11 for c in counts.values()), why  # every tensor checked, either way
    nodes = 5  # the nodes that saved CUDA tensors: addmm (2), layer norm (5), gelu (1), addmm (2), pow (1)
    assert [c[1] for c in counts.values()] == [nodes, 11, nodes, 11], why
    assert check.findings == []


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("target", ["0.weight", "1.weight", "1.bias", "3.weight", "x"])
def test_a_write_to_any_tensor_read_in_a_batch_is_found_the_same_on_every_path(target):
    """A .data write to one of a node's saved tensors between forward and backward: one finding, the same
    (as a dict) with the node's tensors read in one launch, one launch a tensor, and on the Python path."""
    import torchgen_patch
    from torchgen_patch.saved.render import as_dict

    out = {}
    for name, path, batched in READINGS:
        model = _layer_norm_net()
        x = torch.randn(16, 64, device="cuda", requires_grad=True)
        written = x if target == "x" else dict(model.named_parameters())[target]
        check = torchgen_patch.check_saved("warn", path=path)
        with _reading(batched), check:
            loss = model(x).pow(2).sum()
            written.data.add_(1)
            loss.backward()
        out[name] = [as_dict(f) for f in check.findings]
    assert len(out["batched"]) == 1, out
    assert out["batched"] == out["per tensor"] == out["python"], out


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_comparison_read_in_a_batch_that_its_node_never_uses_is_not_judged(path):
    """Saves made while one node is made form its batch: a custom Function whose forward runs an op with
    grad enabled (that op's node saves z) saves its own tensors next, so z's comparison is read with them.
    z is written and never used by a backward pass: no finding. A write to the Function's own saved tensor:
    one finding, on both paths."""
    import torchgen_patch

    z = torch.randn(256, device="cuda")

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            with torch.enable_grad():
                w = torch.ones(256, device="cuda", requires_grad=True)
                ctx.inner = w * z  # its node saves z (w requires grad), kept alive by ctx
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * b, g * a

    a = torch.randn(256, device="cuda", requires_grad=True)
    b = torch.randn(256, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved("warn", path=path)
    with check:
        out = F.apply(a, b)
        z.data.add_(1)  # z's bits change, its version does not: its comparison in the batch differs
        out.sum().backward()
    assert check.findings == []
    with check:
        out = F.apply(a, b)
        b.data.mul_(2)
        out.sum().backward()
    assert len(check.findings) == 1 and check.findings[0].node.startswith("FBackward"), check.findings


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_graph_kept_for_a_second_backward_is_read_again_at_its_second_use(path):
    """retain_graph: the second pass reads every node's tensors again (its batches are its own), so a write
    between the two passes is found in the second only."""
    import torchgen_patch

    model = _layer_norm_net()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved("warn", path=path)
    with check:
        loss = model(x).pow(2).sum()
        loss.backward(retain_graph=True)
        first = len(check.findings)
        model[1].weight.data.mul_(2)
        loss.backward()
    assert first == 0
    assert [f.name for f in check.findings] == ["1.weight"]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int8], ids=str)
def test_a_batch_reads_every_layout_as_its_own_launch_does(dtype, native_hooks):
    """A node that saved one tensor of every layout (the dense kernel's, the rows', the strided one's,
    unaligned starts; several blocks of threads each), read in one launch at use: no finding when nothing
    changed, and one bit flipped in any one of them is that one finding."""
    import torchgen_patch

    bits = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    names = list(_layouts(_sample(dtype)))

    def views():  # each from a base of its own: a write to one changes no other
        return [_layouts(_sample(dtype, 1031, 96).cuda())[name] for name in names]

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *saved):
            ctx.save_for_backward(*saved)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            _ = ctx.saved_tensors  # unpacked: read at use
            return (g,) + (None,) * len(names)

    x = torch.randn(4, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved("warn", path="native")
    with check:
        Keep.apply(x, *views()).sum().backward()
    assert check.findings == []
    for i, name in enumerate(names):
        saved = views()
        with check:
            out = Keep.apply(x, *saved)
            saved[i].data[(0,) * saved[i].dim()].view(bits).bitwise_xor_(1)
            out.sum().backward()
        assert len(check.findings) == i + 1, (name, len(check.findings))


FIRST_PASS = r"""
import json, torch, torchgen_patch
from torchgen_patch.runtime import checklib
assert checklib.prepare("native") is None
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
x = torch.randn(16, 64, device="cuda", requires_grad=True)
check = torchgen_patch.check_saved("raise", path="native")
with check:
    model(x).pow(2).sum().backward()
print(json.dumps({"checked": check.checked, "unpacked": check.unpacked, "skipped": check.skipped}))
"""


@pytest.mark.cuda
@needs_cuda
def test_a_processs_first_backward_pass_checks_its_first_saved_tensor(native_hooks):
    """autograd's device thread has no CUDA context current before its first kernel; the first saved tensor
    a fresh process's first backward pass uses is read there, before any: it is checked like the others."""
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FIRST_PASS], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["skipped"] == {} and got["checked"] == got["unpacked"] >= 5, got


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_pass_after_one_that_raised_finds_a_write_to_its_first_tensor(path):
    """A backward pass that raised (autograd's own error: a saved weight bumped in place) never reaches its
    end; the next pass reads its comparisons first, at its first saved tensor. That read must not lose
    the next pass's own first comparison: the output pow saved, written between forward and backward, is
    the one finding."""
    import torchgen_patch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(16, 64, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved("warn", path=path)
    with check:
        loss = model(x).sum()
        with torch.no_grad():
            model[0].weight.mul_(1)  # a version bump: addmm's unpack raises autograd's error
        with pytest.raises(RuntimeError):
            loss.backward()
        y = model(x)
        loss = y.pow(2).sum()
        y.data.mul_(2)  # pow's saved output: the first tensor the pass uses
        loss.backward()
        torch.cuda.synchronize()
        findings = list(check.findings)
    assert len(findings) == 1 and findings[0].node.startswith("Pow"), findings


@pytest.mark.cuda
@needs_cuda
def test_in_raise_mode_two_writes_to_one_node_name_the_same_tensor_on_every_path():
    """Both of a product's saved tensors written: raise names the same one whether the node's tensors
    were read in one launch, one launch each, or on the Python path (a parity check: a node unpacks in
    the order it saved, so the batch's order and the order of use agree here)."""
    import torchgen_patch
    from torchgen_patch.saved import SavedTensorChanged

    named = {}
    for name, path, batched in READINGS:
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 64).cuda()
        x = torch.randn(16, 64, device="cuda", requires_grad=True)
        check = torchgen_patch.check_saved("raise", path=path)
        with _reading(batched), check:
            loss = model(x).pow(2).sum()
            x.data.add_(1)
            model.weight.data.add_(1)
            with pytest.raises(SavedTensorChanged) as e:
                loss.backward()
        named[name] = e.value.finding.name
    assert named["batched"] == named["per tensor"] == named["python"], named


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_saved_tensor_read_outside_backward_is_judged_there_and_leaves_nothing_behind(path):
    """``grad_fn._saved_result`` outside a backward pass (as graph viewers read it): the comparison is read
    at once, a write found there; the next backward pass, with nothing written, adds no finding."""
    import torchgen_patch

    x = torch.randn(256, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved("warn", path=path)
    with check:
        y = (x * 2).exp()  # exp's node saves its result
        y.data.add_(1)
        _ = y.grad_fn._saved_result  # unpacked outside backward
        found = len(check.findings)
        (x * 2).exp().sum().backward()
        torch.cuda.synchronize()
        after = len(check.findings)
    assert (found, after) == (1, 1), (found, after, check.findings)


class _KeepsWeight(torch.autograd.Function):
    """Keeps its weight in a dict attribute of ``ctx`` (no ``save_for_backward``)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.kept = {"w": w}
        return x * w

    @staticmethod
    def backward(ctx, g):
        return g * ctx.kept["w"], None


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["warn", "raise"])
def test_on_cuda_a_ctx_attribute_written_through_data_is_found(path, mode):
    """A tensor a custom Function keeps on ``ctx``, on CUDA: a .data write between forward and backward is
    found on both paths, in both modes; without it, nothing."""
    import torchgen_patch
    from torchgen_patch.saved import SavedTensorChanged

    w = torch.nn.Parameter(torch.randn(1 << 12, device="cuda"))
    x = torch.randn(1 << 12, device="cuda", requires_grad=True)
    check = torchgen_patch.check_saved(mode, path=path)
    with check:
        _KeepsWeight.apply(x, w).sum().backward()
    assert check.findings == [] and check.checked == 1
    try:
        with check:
            y = _KeepsWeight.apply(x, w).sum()
            w.data.mul_(2)
            y.backward()
    except SavedTensorChanged as e:
        assert mode == "raise"
        finding = e.finding
    else:
        assert mode == "warn"
        (finding,) = check.findings
    assert finding.node == "_KeepsWeightBackward" and finding.device == "cuda:0" and finding.shape == (1 << 12,)


def _ctx_write(mode: str, hold_backward: bool):
    """As ``_a_write_between_forward_and_backward`` on the native path, the weight a custom Function keeps on
    ``ctx``."""
    w = torch.nn.Parameter(torch.randn(1 << 12, device="cuda"))
    x = torch.randn(1 << 12, device="cuda", requires_grad=True)
    return _timed_write(mode, "native", hold_backward, lambda: _KeepsWeight.apply(x, w).sum(), w,
                        torch.optim.SGD([w], lr=0.1))


@pytest.mark.cuda
@needs_cuda
def test_in_warn_mode_a_ctx_attribute_on_cuda_never_makes_backward_wait(native_hooks):
    """On the native path in warn mode the comparison of a CUDA ctx attribute is read once it has run, as
    the native hooks read theirs: backward() returns before the device has run it; the finding comes when
    the findings are asked for, judged as of the pass's end (the step after it is not named)."""
    took_raise, raised = _ctx_write("raise", hold_backward=True)
    took_warn, warned = _ctx_write("warn", hold_backward=True)
    assert took_raise > 0.5, took_raise  # raise reads its comparisons at the pass's end: it waits for them
    assert took_warn < took_raise / 4, (took_warn, took_raise)
    assert len(raised) == len(warned) == 1 and warned[0].optimizer is None
    assert warned[0].node == raised[0].node == "_KeepsWeightBackward"


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("path", PATHS)
def test_a_backward_pass_with_a_cuda_ctx_attribute_synchronises_no_more_than_without_the_check(path):
    import torchgen_patch

    w = torch.randn(1 << 12, device="cuda")
    x = torch.randn(1 << 12, device="cuda", requires_grad=True)

    def step():
        _KeepsWeight.apply(x, w).sum().backward()

    check = torchgen_patch.check_saved("warn", path=path)
    with check:
        step()  # the key on the device
    plain = _syncs(step)
    with check:
        checked = _syncs(step)
    assert checked <= plain + (1 if path == "python" else 0), (plain, checked)  # the Python path reads once a pass
    assert check.findings == [] and check.checked == 2
