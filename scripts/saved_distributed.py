"""The saved-tensor check under DDP and FSDP2 on 2 ranks (gloo on CPU, nccl on 2 GPUs): a small
transformer trained with the check off and on (every loss bit-identical, no finding), then with the
optimizer stepped between forward and backward (a finding on every rank, naming its rank), and what the
check costs a step on each rank. FSDP2 reshards after forward (``reshard_after_forward=True``): the
unsharded parameters' storage is freed after forward and all-gathered again before backward, so what
the check reads at use was re-made in between. The optimizer is fused AdamW, whose step on a plain
torch (no kernels installed) moves no version: only the check can see it.

    python scripts/saved_distributed.py [--backend gloo|nccl] [--steps N] [--json PATH] [--report [FILE]]

``--report`` writes reports/saved-check-distributed-BACKEND-DEVICE-torch<version>.md (or FILE). Exits 1
when a claim does not hold (a false finding, a loss that differs, a rank without its finding)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from testbed import ranks as ranks_  # noqa: E402

WRAPS = ("ddp", "fsdp2")
CASES = ("off", "on", "step between")


def _model(torch, wrap: str, device: str):
    import torch.distributed as dist

    nn = torch.nn
    torch.manual_seed(0)
    layers = []
    for _ in range(2):
        layers += [nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)]
    model = nn.Sequential(*layers, nn.Linear(32, 8)).to(device)
    if wrap == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # releases whose FSDP2 is only under _composable
        from torch.distributed._composable.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model


def _run(torch, wrap: str, case: str, device, steps: int) -> dict:
    import torchgen_patch

    model = _model(torch, wrap, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    g = torch.Generator(device="cpu").manual_seed(1 + torch.distributed.get_rank())
    x = torch.randn(16, 32, generator=g).to(device)
    y = torch.randn(16, 8, generator=g).to(device)
    check = torchgen_patch.check_saved("warn") if case != "off" else None
    losses, times, error = [], [], None
    if check is not None:
        check.start()
    try:
        for step in range(steps):
            between = case == "step between" and step == steps - 1
            sync(torch, device)
            t = clock(device)
            if not between:  # (a step between forward and backward steps with the last step's gradients)
                opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            if between:
                opt.step()  # the step autograd cannot see: backward then computes with the new weights
            loss.backward()
            opt.step()
            sync(torch, device)
            times.append(clock(device) - t)
            losses.append(loss.item())
    except RuntimeError as e:
        error = str(e).splitlines()[0]
    finally:
        if check is not None:
            check.stop()
    findings = [] if check is None else [{"rank": f.rank, "node": f.node, "name": f.name, "optimizer": f.optimizer}
                                         for f in check.findings]
    return {"losses": losses, "step_ms": statistics.median(times[1:] or times) * 1e3, "findings": findings,
            "checked": 0 if check is None else check.checked, "path": None if check is None else check.path,
            "error": error}


def clock(device) -> float:
    """CPU time of this rank on CPU (its own work, whatever the other rank and the machine do), wall time on
    a GPU (the device synchronised at both ends of a step)."""
    return time.perf_counter() if device.type == "cuda" else time.process_time()


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_main(out: str, steps: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT and BACKEND in the environment): every case."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, ROOT)
    backend = os.environ["BACKEND"]
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # two ranks on one machine: one thread each
    results = {wrap: {case: _run(torch, wrap, case, device, steps) for case in CASES} for wrap in WRAPS}
    with open(out, "w") as f:  # before the teardown: written, the rank ran whole (testbed/ranks.py)
        json.dump({"rank": rank, "results": results}, f)
    dist.destroy_process_group()


def launch(backend: str, steps: int, timeout: int = 900) -> list[dict]:
    """Both ranks, each a process of its own; their results, by rank."""
    with tempfile.TemporaryDirectory() as tmp:
        port, procs = ranks_.free_port(), []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), BACKEND=backend, PYTHONPATH=ROOT)
            out = os.path.join(tmp, f"rank{rank}.json")
            procs.append((out, subprocess.Popen([sys.executable, __file__, "--rank", out, "--steps", str(steps)],
                                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        outs = []
        for out, p in procs:
            _, err = p.communicate(timeout=timeout)
            if not ranks_.ran_whole(p.returncode, out, err):
                raise SystemExit(f"error: a rank failed (exit {p.returncode}):\n{err[-3000:]}")
            with open(out) as f:
                outs.append(json.load(f))
    return sorted(outs, key=lambda r: r["rank"])


def verdicts(ranks: list[dict]) -> dict:
    """Each claim of the module's docstring, per wrapper and rank: True where it holds."""
    out = {}
    for wrap in WRAPS:
        for r in ranks:
            res = r["results"][wrap]
            step = res["step between"]["findings"]
            out[f"{wrap} rank {r['rank']}"] = {
                "the same losses": res["on"]["losses"] == res["off"]["losses"] and len(res["off"]["losses"]) > 0,
                "no finding": res["on"]["findings"] == [] and res["on"]["error"] is None and res["on"]["checked"] > 0,
                "the step found, named by rank": bool(step) and all(f["rank"] == r["rank"] for f in step),
            }
    return out


def report(ranks: list[dict], backend: str, steps: int) -> str:
    import platform

    import torch

    device = "CUDA" if backend == "nccl" else "CPU"
    held = verdicts(ranks)
    lines = [f"# The saved-tensor check under DDP and FSDP2, 2 ranks, {backend} on {device}", "",
             f"- torch `{torch.__version__}`, Python {platform.python_version()}; the check in `warn` mode, on its "
             f"{ranks[0]['results']['ddp']['on']['path']} path",
             f"- command: `python scripts/saved_distributed.py --backend {backend} --steps {steps} --report`",
             "- model: 2 pre-norm MLP blocks (LayerNorm, Linear 32 -> 64, GELU, Linear 64 -> 32) and a head; fused "
             "AdamW; each rank its own batch; FSDP2 with `reshard_after_forward=True` on every Linear and the model",
             f"- each run {steps} steps; the step time is the median after the first ("
             + ("wall time" if backend == "nccl" else "the rank's CPU time, one torch thread a rank") + ")", "",
             "| wrapper | rank | losses off = on | findings with the check on | step between forward and backward: "
             "findings (rank named) | step off | step on | on / off |", "|---|---|---|---|---|---|---|---|"]
    for wrap in WRAPS:
        for r in ranks:
            res = r["results"][wrap]
            v = held[f"{wrap} rank {r['rank']}"]
            step = res["step between"]["findings"]
            named = ", ".join(sorted({f"rank {f['rank']}: {f['node']}" for f in step})) or "none"
            lines.append(f"| {wrap} | {r['rank']} | {'yes' if v['the same losses'] else '**no**'} | "
                         f"{len(res['on']['findings'])} in {res['on']['checked']} checked | {len(step)} ({named}) | "
                         f"{res['off']['step_ms']:.2f} ms | {res['on']['step_ms']:.2f} ms | "
                         f"{res['on']['step_ms'] / res['off']['step_ms']:.3f} |")
    ok = all(all(v.values()) for v in held.values())
    lines += ["", "Every claim holds." if ok else "**A claim does not hold** (the rows above say which)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json")
    ap.add_argument("--report", nargs="?", const=True, default=False, metavar="FILE")
    ap.add_argument("--rank", help=argparse.SUPPRESS)  # a rank's own process: where its results go
    a = ap.parse_args(argv)
    if a.rank:
        rank_main(a.rank, a.steps)
        return 0
    ranks = launch(a.backend, a.steps)
    text = report(ranks, a.backend, a.steps)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ranks": ranks, "verdicts": verdicts(ranks)}, f, indent=2, sort_keys=True)
    if a.report:
        import torch

        path = a.report if isinstance(a.report, str) else os.path.join(
            ROOT, "reports", f"saved-check-distributed-{a.backend}-{'cuda' if a.backend == 'nccl' else 'cpu'}-torch"
                             f"{torch.__version__.split('+')[0]}.md")
        with open(path, "w") as f:
            f.write(text)
    return 0 if all(all(v.values()) for v in verdicts(ranks).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
