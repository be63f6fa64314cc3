"""The saved-tensor check on CUDA: the device fingerprint computed by CUDA's kernels is exactly the
one the CPU tests check (tests/test_saved.py runs the device path on CPU), a one-bit change in
any element changes it, and a backward pass costs one host synchronisation whatever the number
of tensors it checks (the comparisons stay on the device until its end). Skipped without a GPU;
the CUDA benchmark's code (bench/bench_saved.py --device cuda) runs here on CPU as well."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchgen_patch.saved import fingerprint as fp

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.complex64]


def _sample(dtype, rows: int = 64, cols: int = 48):
    """A rows x cols tensor of ``dtype`` with random bits (NaN payloads and all: bits, not values)."""
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (rows, cols * dtype.itemsize), generator=g, dtype=torch.uint8)
    return raw[:, :cols] % 2 == 1 if dtype == torch.bool else raw.view(dtype)


def _layouts(t):
    return {"contiguous": t, "transposed": t.t(), "sliced": t[:, ::3], "expanded": t[:1].expand(4, -1), "0-d": t[0, 0],
            "column": t[:1].t()}


def _device_path_on_cpu(t) -> int:
    fp._FORCE_DEVICE_PATH = True
    try:
        return int(fp.fingerprint(t)[0])
    finally:
        fp._FORCE_DEVICE_PATH = False


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_computes_the_fingerprint_the_cpu_tests_check(dtype):
    t = _sample(dtype)
    for name, v in _layouts(t).items():
        on_cuda = fp.fingerprint(_layouts(t.cuda())[name])
        assert int(on_cuda[0]) == _device_path_on_cpu(v), name


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int8], ids=str)
def test_on_cuda_a_one_bit_change_changes_the_fingerprint(dtype):
    t = _sample(dtype).cuda()
    raw = t.view(torch.uint8).view(-1)
    for byte in (0, 7, raw.numel() // 2, raw.numel() - 1):
        for bit in (0, 7):
            before = int(fp.fingerprint(t)[0])
            raw[byte] ^= 1 << bit
            assert int(fp.fingerprint(t)[0]) != before, (byte, bit)
            raw[byte] ^= 1 << bit
            assert int(fp.fingerprint(t)[0]) == before


@pytest.mark.cuda
@needs_cuda
def test_on_cuda_the_kernel_reads_contiguous_tensors_and_gives_torchs_sum(monkeypatch):
    """With Triton there, the kernel passed its probe and reads a large contiguous tensor at once: the
    same number torch's ops give reading it a chunk at a time (a tensor of more than one chunk)."""
    pytest.importorskip("triton", reason="Triton is not installed")
    device = torch.device("cuda", torch.cuda.current_device())
    assert fp._kernel_for(device) is not None, "the kernel's probe did not give torch's sum"
    t = torch.randn(fp.DEVICE_CHUNK + 12345, device=device)
    by_kernel = int(fp.fingerprint(t)[0])
    monkeypatch.setitem(fp._KERNELS, device, None)
    assert int(fp.fingerprint(t)[0]) == by_kernel


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
def test_a_checked_backward_pass_synchronises_once_whatever_it_checks():
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

    check = torchgen_patch.check_saved("raise")
    with check:
        step()  # the fingerprint's weights made on the device first
    plain = _syncs(step)
    with check:
        before = check.checked
        checked = _syncs(step)
        saved = check.checked - before
    assert saved >= 48 and plain <= checked <= plain + 1, (saved, plain, checked)  # at most the one read at the end
    assert check.findings == []


def test_the_cuda_benchmark_runs_its_code_on_cpu(monkeypatch, tmp_path):
    """bench/bench_saved.py --device cuda's timing, counting, report and JSON, on a tiny GPT-2 on CPU
    (where no synchronisation is counted): so the GPU run is not their first."""
    import importlib.util
    import json
    import os

    from tests.conftest import ROOT

    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("bench_saved", os.path.join(ROOT, "bench", "bench_saved.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setitem(bench.GPT2, "tiny", (1, 32, 2, 64, 2, 16))
    monkeypatch.setattr(bench, "CUDA_MODELS", {"tiny": ("a tiny GPT-2", 1.2)})
    monkeypatch.setitem(bench.STEPS_PER_ROUND, "tiny", 1)
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    bench.main_cuda(2, str(report), str(js), device="cpu")
    (t,) = json.loads(js.read_text())[0]["models"]
    c = t["counted"]
    assert c["saved_tensors"] > 10 and c["off"]["sync_debug_mode"] is None and c["off"]["kernel_launches"] == 0
    assert t["off_ms"] > 0 and t["on_ms"] > 0 and t["met"] == (t["ratio"] <= 1.2) and t["peak_mib"]["off"] is None
    text = report.read_text()
    assert f"| a tiny GPT-2 | {c['saved_tensors']} | " in text and "| None / None; 0 / 0 | 0 / 0 | not measured |" in text
