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
