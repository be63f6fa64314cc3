"""FSDP2 (fully_shard) on 2 ranks with AdamW, foreach and fused: the losses of
training unpatched and patched must be identical.

    python scripts/fsdp2_two_ranks.py --device cpu  [--report FILE]   # gloo
    python scripts/fsdp2_two_ranks.py --device cuda [--report FILE]   # nccl, needs 2 GPUs
    python scripts/fsdp2_two_ranks.py --device cpu --check-saved raise  # the patched ranks also check

Launches ``torch.distributed.run --nproc-per-node 2`` twice (without, then with
``torchgen_patch.install()`` in every rank, and with ``--check-saved`` the saved-tensor check on
in the patched ranks); exit 0 when the losses are identical (and the check found nothing),
1 when not, 3 when the machine cannot run it (no torch.distributed, fewer than 2 GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from testbed import ranks as ranks_  # noqa: E402

MODES = ("foreach", "fused")
STEPS = 5


def train(model, opt, x, y, steps: int, forward=None) -> list[float]:
    """``steps`` steps of MSE training; the losses (``forward``: what runs the model, e.g. its compiled form)."""
    import torch

    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss((forward or model)(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def worker(device: str, patched: bool, out: str, check: str = "") -> None:
    import torch
    import torch.distributed as dist

    saved = None
    if patched:
        import torchgen_patch

        rep = torchgen_patch.install()
        assert not rep.refused, rep.summary()
        if check:
            saved = torchgen_patch.check_saved(check).start()
    rank = int(os.environ["RANK"])
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    from torch.distributed.device_mesh import init_device_mesh
    import importlib

    sys.path.insert(0, ROOT)
    from testbed.fsdp import fsdp2

    fully_shard = importlib.import_module(fsdp2()[0]).fully_shard

    mesh = init_device_mesh(device, (2,))
    losses = {}
    for mode in MODES:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, **{mode: True})
        torch.manual_seed(1 + rank)  # each rank its own batch
        x, y = torch.randn(16, 8, device=device), torch.randn(16, 4, device=device)
        losses[mode] = train(model, opt, x, y, STEPS)
    with open(f"{out}.{rank}", "w") as f:  # the results first: what follows is teardown
        json.dump({"losses": losses, "torch": torch.__version__, "patched": patched,
                   "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "check_saved": None if saved is None else {"mode": check, "findings": len(saved.findings),
                                                               "checked": saved.checked}}, f)
    dist.destroy_process_group()


def launch(device: str, patched: bool, tmp: str, timeout: int, check: str = "") -> list[dict]:
    out = os.path.join(tmp, "patched" if patched else "unpatched")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(ranks_.free_port()), os.path.abspath(__file__), "--worker", device,
           "1" if patched else "0", out,
           check]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    side = "patched" if patched else "unpatched"
    if r.returncode != 0 and not aborted_at_exit(r.stderr, [f"{out}.{rank}" for rank in (0, 1)]):
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-5000:])
        raise SystemExit(f"error: torchrun ({side}) exited {r.returncode}")
    runs = [json.load(open(f"{out}.{rank}")) for rank in (0, 1)]
    for run in runs:
        run["aborted_at_exit"] = r.returncode != 0
    return runs


def aborted_at_exit(stderr: str, outputs: list[str]) -> bool:
    """Every rank wrote its results (after training, before the process group's teardown), and the ranks
    that failed were ended by SIGABRT with the unjoined-thread message, or by torchrun's SIGTERM after
    another did: the training ran whole; its teardown crashed."""
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)
    return (all(os.path.isfile(o) for o in outputs) and ranks_.ABORT_AT_EXIT in stderr and "-6" in codes
            and set(codes) <= {"-6", "-15"})


def report(device: str, runs: dict[str, list[dict]]) -> tuple[str, bool]:
    first = runs["unpatched"][0]
    same = all(runs["unpatched"][r]["losses"] == runs["patched"][r]["losses"] for r in (0, 1))
    checks = [runs["patched"][r].get("check_saved") for r in (0, 1)]
    if checks[0]:
        same = same and all(c["findings"] == 0 for c in checks)
    lines = ["# FSDP2 on 2 ranks, AdamW foreach and fused: losses unpatched vs patched", "",
             f"- torch: `{first['torch']}`", f"- device: `{first['device']}` x 2, backend "
             f"`{'nccl' if device == 'cuda' else 'gloo'}`",
             f"- command: `python scripts/fsdp2_two_ranks.py --device {device} --report ...`",
             f"- identical: **{'yes' if same else 'NO'}** (every loss of every step, mode and rank, exact equality)",
             *([f"- patched: the saved-tensor check on ({checks[0]['mode']}) in every rank: "
                f"{sum(c['findings'] for c in checks)} findings, {sum(c['checked'] for c in checks)} saved tensors "
                "checked"] if checks[0] else []),
             *[f"- {side}: the ranks wrote their losses, then a rank aborted in the process group's teardown "
               f"(SIGABRT, \"{ranks_.ABORT_AT_EXIT}\")" for side in ("unpatched", "patched")
               if runs[side][0].get("aborted_at_exit")],
             "", "| rank | optimizer | step | unpatched | patched |", "|---|---|---|---|---|"]
    for rank in (0, 1):
        for mode in MODES:
            for i, (a, b) in enumerate(zip(runs["unpatched"][rank]["losses"][mode],
                                           runs["patched"][rank]["losses"][mode], strict=False)):
                lines.append(f"| {rank} | AdamW {mode}=True | {i} | {a!r} | {b!r} |")
    return "\n".join(lines) + "\n", same


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--report", help="write the markdown report here")
    p.add_argument("--timeout", type=int, default=540, help="seconds for each torchrun launch")
    p.add_argument("--check-saved", choices=("warn", "raise"), default="",
                   help="turn the saved-tensor check on in the patched ranks")
    a = p.parse_args(argv)
    import torch

    if not torch.distributed.is_available():
        print("error: torch.distributed is not available in this torch build", file=sys.stderr)
        return 3
    if a.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"error: --device cuda needs 2 GPUs, this machine has {torch.cuda.device_count()}", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"unpatched": launch(a.device, False, tmp, a.timeout),
                "patched": launch(a.device, True, tmp, a.timeout, a.check_saved)}
    text, same = report(a.device, runs)
    if a.report:
        with open(a.report, "w") as f:
            f.write(text)
    sys.stdout.write(text)
    return 0 if same else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3] == "1", sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else "")
    else:
        raise SystemExit(main())
