"""scripts/unseen_writes.py, the report of writes autograd cannot see on one device (the GPU
machine runs it with --device cuda: scripts/device_unseen_writes.sh). Here, on CPU: the cases that
exist there, each four ways in fresh processes, and what each gives; a case that cannot run says
why; the overlays it runs the optimizer entries with; and the docs' CUDA table, which is made from
the committed report (or reads "not measured" until one exists)."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml

from tests.conftest import ROOT
from tests.support import script

uw = script("unseen_writes")
cases = script("unseen_writes_cases")


def test_the_docs_cuda_table_is_made_from_the_committed_report():
    reports = sorted(glob.glob(os.path.join(ROOT, "reports", "unseen-writes-cuda-torch*.json")))
    with open(uw.DOCS) as fh:
        assert fh.read() == uw.write_docs(reports[-1] if reports else None), \
            "docs/unseen-writes.md's CUDA table is stale: python scripts/unseen_writes.py --docs REPORT.json"


def test_the_overlays_differ_from_the_shipped_one_in_one_optimizer_entry(tmp_path):
    from torchgen_patch.plan.overlay import load_runtime
    from torchgen_patch.sources import shipped_overlay

    shipped_path = "deepspeed.ops.lamb.fused_lamb.FusedLamb"
    made = uw._overlays(str(tmp_path), [shipped_path, "some.lib.NotShipped"])
    shipped = load_runtime(shipped_overlay()).optimizers
    with open(shipped_overlay()) as fh:
        rest = {k: v for k, v in yaml.safe_load(fh).items() if k != "optimizers"}
    assert made[shipped_path][0] and not made["some.lib.NotShipped"][0]
    for path, (_, without, with_) in made.items():
        a, b = load_runtime(without).optimizers, load_runtime(with_).optimizers
        assert set(a) == set(shipped) - {path} and set(b) == set(a) | {path}
        assert all(b[c].writes == shipped[c].writes for c in a)
        for f in (without, with_):  # every other decision as shipped: the same kernels
            with open(f) as fh:
                assert {k: v for k, v in yaml.safe_load(fh).items() if k != "optimizers"} == rest


def test_a_case_says_what_it_misses():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert cases.run_case("triton-in-place", "cpu", None) == {
        "case": "triton-in-place", "device": "cpu", "outcome": "not run", "detail": "CPU: the case exists on CUDA only"}
    assert cases.run_case("cupy-dlpack", "cuda", None)["detail"] == "no CUDA device"
    pytest.importorskip("deepspeed")
    got = cases.run_case("deepspeed-fused-lamb", "cpu", None)  # DeepSpeed builds no CPU op for it
    assert got["outcome"] == "not run" and got["detail"].startswith("no CPU build of FusedLamb in its library")


SMOKE = "data-mul,torch-fused-adamw,triton-in-place"


@pytest.mark.build
def test_on_cpu_each_case_gives_four_outcomes_in_fresh_processes(library, tmp_path):
    report = tmp_path / "r.md"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "unseen_writes.py"), "--device", "cpu",
                        "--part", "cases", "--cases", SMOKE, "--jobs", "2", "--report", str(report)], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["prepare"]["kernels"]["rc"] == 0
    got = {name: c["modes"] for name, c in res["cases"].items()}
    data, adamw = got["data-mul"], got["torch-fused-adamw"]
    # p.data: silent unpatched and patched; a finding with the check, through the API (its JSON) and run
    assert [data[m]["outcome"] for m in uw.MODES] == ["silent"] * 4 and all(data[m]["wrote"] for m in uw.MODES)
    assert not data["unpatched"]["lines"] and not data["run"]["lines"]
    (finding,) = data["check"]["findings"]
    assert finding["node"] == "MmBackward0" and finding["writers"][0] == "data" and finding["optimizer"] is None
    assert len(data["run-check"]["lines"]) == 1 and data["run-check"]["summary"]["changed"] == 1
    assert data["run"]["patched"]["kernels"] > 0 and data["run"]["patched"]["refused"] == 0
    # torch's fused AdamW: silent unpatched, a finding naming it with the check; patched, autograd's error
    assert [adamw[m]["outcome"] for m in uw.MODES] == ["silent", "silent", "raises", "raises"]
    assert adamw["check"]["findings"][0]["optimizer"] == "torch.optim.adamw.AdamW"
    assert not adamw["run-check"]["lines"]
    assert {m["outcome"] for m in got["triton-in-place"].values()} == {"not run"}
    text = report.read_text()
    assert re.search(r"\| `p\.data\.mul_\(2\)` \| \*\*silent\*\* \| \*\*finding\*\* \[F1\] \| \*\*silent\*\* \| "
                     r"\*\*finding\*\* \[F1\] \|", text), text
    assert "| `torch.optim.AdamW(fused=True)` stepped between forward and backward | **silent** | **finding** [F2] | " \
           "raises (autograd's error) | raises (autograd's error) |" in text
    assert "- [F2] a tensor float32[8, 8] on cpu, saved by MmBackward0 in the forward call at " \
           "scripts/unseen_writes_cases.py:" in text
    assert "likely written by: the optimizer torch.optim.adamw.AdamW" in text
    table = uw.docs_table(res)  # the docs' renderer, given this (CPU) report
    assert "| `p.data.mul_(2)` | silent | silent | finding |" in table
    assert "| `torch.optim.AdamW(fused=True)` stepped between forward and backward | silent | raises | raises |" \
        in table
    assert "| a hand-written Triton kernel writing its input in place | not run: exists on CUDA only |" in table
