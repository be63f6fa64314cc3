"""The sampled saved-tensor check's detection law, measured: a write that recurs every step between
forward and backward (a ``.data`` write to a weight, which no version counter sees) is found at the
first step whose forward was drawn (never the first: the first draw is at the end of the first backward
pass), so over processes with independent draws the first step that finds it is one plus a geometric: found
within k steps with probability 1 - (1 - 1/N)^(k-1), and with R ranks, each drawing on its own,
1 - (1 - 1/N)^(R(k-1)).

Each "process" here is a check of its own, started with a seed of its own (``$TORCHGEN_PATCH_CHECK_SEED``,
read by the check's own draw when it is made) and run on a small model until it finds the write or
``--steps`` pass; many of them run one after another in one interpreter. With ``--ranks 2`` two ranks run
them under DDP (gloo, CPU), each with its own seed; each rank goes on until both have found the write, so
every rank's own first step is known, and the first step any rank found it is their minimum.

    python scripts/saved_sample_law.py [--every N] [--seeds M] [--steps K] [--ranks 1|2] [--json PATH]

Prints, for some k, how many processes found the write within k steps beside what the law expects."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from testbed import ranks as ranks_  # noqa: E402

SEED = "TORCHGEN_PATCH_CHECK_SEED"


def _model(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def first_detections(every: int, seeds: int, steps: int, tag: str, group=None) -> list[int | None]:
    """The first step (1-based) at which a check sampled at ``every`` found the recurring write, for each of
    ``seeds`` processes (None: not within ``steps``). ``group``: the ranks' process group (DDP; every rank
    goes on until all have found it). A finding is made as always, but for the module path of the tensor
    (``attribute.module_name`` walks every object of the process, a tenth of a second a finding here),
    which is left out: which step finds the write is all that is counted."""
    from torchgen_patch.saved import attribute

    named = attribute.module_name
    attribute.module_name = lambda t, original=None: (None, None, False)
    try:
        return _first_detections(every, seeds, steps, tag, group)
    finally:
        attribute.module_name = named


def _first_detections(every: int, seeds: int, steps: int, tag: str, group) -> list[int | None]:
    import torch

    import torchgen_patch

    world = torch.distributed.get_world_size(group) if group is not None else 1
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    model = _model(torch)
    net = torch.nn.parallel.DistributedDataParallel(model, process_group=group) if group is not None else model
    out: list[int | None] = []
    before = os.environ.get(SEED)
    for s in range(seeds):
        os.environ[SEED] = f"{tag}:{s}"  # read by the check's draw when it is made
        check = torchgen_patch.check_saved("warn", every=every)
        if before is None:
            del os.environ[SEED]
        else:
            os.environ[SEED] = before
        check.start()
        found = None
        try:
            for step in range(1, steps + 1):
                loss = net(x).pow(2).mean()
                model[2].weight.data.neg_()  # the write: after forward saved the weight, before backward uses it
                loss.backward()
                if found is None and check.findings:
                    found = step
                done = torch.tensor([0 if found is None else 1])
                if world > 1:
                    torch.distributed.all_reduce(done, op=torch.distributed.ReduceOp.MIN, group=group)
                if done.item():
                    break
        finally:
            check.stop()
        out.append(found)
    return out


def within(first: list[int | None], k: int) -> int:
    """How many of ``first`` found it within ``k`` steps."""
    return sum(1 for f in first if f is not None and f <= k)


def law(every: int, k: int, ranks: int = 1) -> float:
    """The probability that a write recurring every step is found within ``k`` steps (the first never drawn)."""
    return 1 - (1 - 1 / every) ** (ranks * (k - 1))


def rank_main(out: str, every: int, seeds: int, steps: int) -> None:
    """One of the two ranks: its index, and the file the ranks meet at, in ``out``'s name and folder."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, ROOT)
    torch.set_num_threads(1)
    rank = int(os.path.basename(out)[len("rank"):-len(".json")])
    dist.init_process_group("gloo", init_method="file://" + os.path.join(os.path.dirname(out), "store"), rank=rank,
                            world_size=2)
    first = first_detections(every, seeds, steps, f"rank{rank}", dist.group.WORLD)
    with open(out, "w") as f:  # before the teardown: written, the rank ran whole (testbed/ranks.py)
        json.dump({"rank": rank, "first": first}, f)
    dist.destroy_process_group()


def two_ranks(every: int, seeds: int, steps: int, timeout: int = 600) -> list[list[int | None]]:
    """Each rank's first detections (by rank), two processes on gloo."""
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        env = {k: v for k, v in os.environ.items() if k != SEED}
        env["PYTHONPATH"] = ROOT
        for rank in range(2):
            out = os.path.join(tmp, f"rank{rank}.json")
            argv = [sys.executable, __file__, "--rank", out, "--every", str(every), "--seeds", str(seeds),
                    "--steps", str(steps)]
            with open(out + ".log", "w") as log:  # a file, not a pipe: a rank never waits on the other's reader
                procs.append((out, subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)))
        ranks = []
        try:
            for out, p in procs:
                p.wait(timeout=timeout)
                with open(out + ".log") as f:
                    log = f.read()
                if not ranks_.ran_whole(p.returncode, out, log):
                    raise RuntimeError(f"a rank failed (exit {p.returncode}):\n{log[-3000:]}")
                with open(out) as f:
                    ranks.append(json.load(f))
        finally:
            for _, p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    return [r["first"] for r in sorted(ranks, key=lambda r: r["rank"])]


def earliest(ranks: list[list[int | None]]) -> list[int | None]:
    """Per process, the first step any rank found it."""
    return [min((f for f in fs if f is not None), default=None) for fs in zip(*ranks, strict=True)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--ranks", type=int, choices=(1, 2), default=1)
    ap.add_argument("--json")
    ap.add_argument("--rank", help=argparse.SUPPRESS)  # a rank's own process: where its results go
    a = ap.parse_args(argv)
    if a.rank:
        rank_main(a.rank, a.every, a.seeds, a.steps)
        return 0
    if a.ranks == 1:
        series = {"one process": first_detections(a.every, a.seeds, a.steps, "main")}
    else:
        ranks = two_ranks(a.every, a.seeds, a.steps)
        series = {"rank 0": ranks[0], "rank 1": ranks[1], "either rank": earliest(ranks)}
    for name, first in series.items():
        r = 2 if name == "either rank" else 1
        print(f"{name}: " + ", ".join(f"within {k}: {within(first, k)} (law {a.seeds * law(a.every, k, r):.1f})"
                                      for k in (1, 2, 4, 8, 16, 32) if k <= a.steps))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(series, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
