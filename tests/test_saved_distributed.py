"""The saved-tensor check under DDP and FSDP2 (``reshard_after_forward``) on 2 ranks, gloo on CPU
(scripts/saved_distributed.py; its report: reports/saved-check-distributed-gloo-cpu-torch*.md): with the
check on no finding and every loss bit-identical to the run without it; the optimizer stepped between
forward and backward is a finding on every rank, naming its rank. On 2 GPUs (nccl) the same script runs
where such a machine is there (``--backend nccl``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from testbed.ranks import free_port, ran_whole
from tests.conftest import ROOT


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available in this build")
def test_ddp_and_fsdp2_on_two_ranks_no_false_finding_the_same_losses_and_the_step_found_by_rank(tmp_path):
    out = tmp_path / "ranks.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "saved_distributed.py"), "--steps", "3",
                        "--json", str(out)], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert sorted(data["verdicts"]) == ["ddp rank 0", "ddp rank 1", "fsdp2 rank 0", "fsdp2 rank 1"]
    for where, held in data["verdicts"].items():
        assert all(held.values()), (where, held)
    for rank in data["ranks"]:
        for wrap in ("ddp", "fsdp2"):
            res = rank["results"][wrap]
            assert res["on"]["losses"] == res["off"]["losses"] and len(res["off"]["losses"]) == 3
            assert {f["rank"] for f in res["step between"]["findings"]} == {rank["rank"]}


# one rank of FSDP2 (reshard_after_forward=True) with AdamW, foreach then fused, stepped between forward and
# backward under the check on the path argv[1] ("python-late": the Python path judging at the end of backward, as
# on a GPU); its findings go to the file argv[2] (before the teardown)
STEP_BETWEEN = r"""
import importlib, json, sys
import torch
import torch.distributed as dist
sys.path.insert(0, ROOT)
import torchgen_patch
from torchgen_patch.runtime.checklib import prepare
from torchgen_patch.saved.render import as_dict
from torchgen_patch.saved import fingerprint
from testbed.fsdp import fsdp2
path, out = sys.argv[1], sys.argv[2]
if path == "python-late":
    path, fingerprint._FORCE_DEVICE_PATH = "python", True
if path == "native":
    assert prepare("native") is None
torch.set_num_threads(1)
dist.init_process_group("gloo")
fully_shard = importlib.import_module(fsdp2()[0]).fully_shard
mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (2,))
results = {}
for mode in ("foreach", "fused"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, **{mode: True})
    x = torch.randn(4, 8)
    model(x).sum().backward()  # gradients to step with
    with torchgen_patch.check_saved("warn", path=path) as check:
        loss = model(x).pow(2).sum()
        opt.step()  # between forward and backward
        loss.backward()
    results[mode] = {"path": check.path, "findings": [as_dict(f) for f in check.findings]}
with open(out, "w") as f:
    json.dump({"rank": dist.get_rank(), "results": results}, f)
dist.destroy_process_group()
""".replace("ROOT", repr(ROOT))


def _two_ranks(script: str, args: list[str], tmp_path) -> list[dict]:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=ROOT)
        out = tmp_path / f"rank{rank}.json"
        procs.append((out, subprocess.Popen([sys.executable, "-c", script, *args, str(out)], env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    ranks = []
    for out, p in procs:
        _, err = p.communicate(timeout=600)
        assert ran_whole(p.returncode, str(out), err), err[-3000:]
        ranks.append(json.loads(out.read_text()))
    return ranks


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available in this build")
@pytest.mark.parametrize("path", ["native", "python", "python-late"])
def test_fsdp2_resharded_an_adamw_step_between_forward_and_backward_is_named_with_its_line_on_every_rank(
        path, tmp_path):
    """The gradient accumulation bug under FSDP2: the parameter autograd saved is the all-gathered copy, freed
    after forward and gathered again from the shards the step wrote. On every rank the finding names AdamW
    (foreach and fused) and the line of its step() call, as the one writer; judged at the end of backward too
    (as on a GPU), where the gathered copy has been freed again and only the facts kept at use remain."""
    if path == "native":
        from torchgen_patch.runtime import checklib

        assert checklib.prepare("native") is None  # built once here, loaded by each rank
    line = next(i for i, text in enumerate(STEP_BETWEEN.splitlines(), 1) if "opt.step()  # between" in text)
    ranks = _two_ranks(STEP_BETWEEN, [path], tmp_path)
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        for mode in ("foreach", "fused"):
            res = r["results"][mode]
            assert res["path"] == path.split("-")[0] and res["findings"], (r["rank"], mode, res)
            for f in res["findings"]:
                assert f["optimizer"] == "torch.optim.adamw.AdamW" and f["writers"] == ["optimizer"], f
                assert f["optimizer_step"] == {"file": "<string>", "line": line, "function": "<module>"}, f
                assert f["rank"] == r["rank"] and f"at <string>:{line} (<module>) after the backward" in f["fix"]


def test_a_rank_ran_whole_only_with_its_results_and_the_teardown_line(tmp_path):
    results = tmp_path / "rank0.json"
    line = "...\nterminate called without an active exception\n"
    assert ran_whole(0, str(results), "") and not ran_whole(1, str(results), line)
    assert not ran_whole(-6, str(results), line)  # no results: it died before its last act
    results.write_text("{}")
    assert ran_whole(-6, str(results), line)
    assert not ran_whole(-6, str(results), "Segmentation fault") and not ran_whole(-11, str(results), line)
