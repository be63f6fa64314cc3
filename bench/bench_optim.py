"""An optimizer step with the overlay's optimizer entries active vs without them, side by side in
one process: torch's own AdamW, which no entry
names (it pays one dictionary look-up per step), and DeepSpeedCPUAdam, whose every parameter is
snapshotted before and bumped after each step. Target: <= 1.01 a step, on an MLP of 1024-wide
layers (2.1 M parameters in 6 tensors); a 256-wide one (133 k in 6) is reported beside it, where
the hooks' fixed cost weighs more.

Blocks of steps are paired (one with the entries, one without, in alternating order, the switch
outside the timing); a block counts by its median step, so a neighbour's preemption is an outlier
of one block, not a figure. Each figure: the median of the per-pair ratios (p25-p75 beside it),
the ratio of the fastest steps, and the hooks' own cost per step measured alone (a floor under the
ratio: after a real step they run with colder caches, about twice as long).

Usage: python bench/bench_optim.py [--pairs N] [--seconds S] [--json FILE]
(make bench runs it with OMP_NUM_THREADS=1 and one torch thread.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TARGET = 1.01
WIDTHS = (1024, 256)  # the first is the target's case
BLOCK = 7  # steps per timed block; a block counts by its median step (a neighbour's preemption is one outlier)


def _mlp(width: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 10))


def _per_step(opt, steps: int) -> float:
    t = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t) / steps


def _hooks_alone(opt, entries) -> float:
    """The entries' own cost per step of ``opt``: their two hooks called as a step calls them, in a
    loop of their own (so with hot caches: after a real step they find colder ones), the fastest of
    several repeats, in seconds."""
    import timeit

    from torchgen_patch.runtime import optim

    def both():
        optim.before_step(opt, (), {})
        optim.after_step(opt, (), {})

    optim.activate(entries)
    try:
        return min(timeit.repeat(both, number=2000, repeat=7)) / 2000
    finally:
        optim.deactivate()


def main() -> int:
    import torch

    from torchgen_patch.plan.overlay import load_runtime
    from torchgen_patch.runtime import optim
    from torchgen_patch.sources import shipped_overlay

    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=200, help="at most this many paired blocks per case")
    ap.add_argument("--seconds", type=float, default=20.0, help="about how long each case runs")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    entries = load_runtime(shipped_overlay()).optimizers
    results = []
    for width in WIDTHS:
        for name, make in (("torch.optim.AdamW", lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
                           ("DeepSpeedCPUAdam", lambda ps: DeepSpeedCPUAdam(ps, lr=1e-3))):
            model = _mlp(width)
            params = list(model.parameters())
            opt = make(params)
            for p in params:
                p.grad = torch.randn_like(p) * 1e-3
            step_s = _per_step(opt, 5)  # state created, caches warm
            pairs = max(11, min(args.pairs, round(args.seconds / (2 * BLOCK * step_s))))
            off, on, ratios = [], [], []
            for i in range(pairs):  # a block with the entries, one without, in alternating order
                pair = {}
                for which in (("off", "on") if i % 2 == 0 else ("on", "off")):
                    if which == "on":
                        optim.activate(entries)
                        optim.entry_for(type(opt))  # resolved once per class in a program: not timed here
                    pair[which] = statistics.median(_per_step(opt, 1) for _ in range(BLOCK))
                    optim.deactivate()
                off.append(pair["off"])
                on.append(pair["on"])
                ratios.append(pair["on"] / pair["off"])
            hooks = _hooks_alone(opt, entries)
            q = statistics.quantiles(ratios, n=4)
            r = {"name": f"{name} step, MLP {width} wide ({sum(p.numel() for p in params):,} parameters in "
                         f"{len(params)} tensors), entries active / not",
                 "optimizer": name, "width": width, "tensors": len(params),
                 "off_median_us": statistics.median(off) * 1e6, "on_median_us": statistics.median(on) * 1e6,
                 "ratio": statistics.median(ratios), "p25": q[0], "p75": q[2], "ratio_fastest": min(on) / min(off),
                 "hooks_us": hooks * 1e6, "hooks_share": hooks / statistics.median(off), "pairs": pairs,
                 "target": TARGET if width == WIDTHS[0] else None}
            r["met"] = None if r["target"] is None else r["ratio"] <= TARGET
            results.append(r)
            verdict = "" if r["met"] is None else f"  [target <= {TARGET}: {'met' if r['met'] else 'NOT MET'}]"
            print(f"{r['name']}: {r['on_median_us']:.1f} us vs {r['off_median_us']:.1f} us, ratio {r['ratio']:.4f} "
                  f"(p25-p75 {q[0]:.4f}-{q[2]:.4f}; fastest steps {r['ratio_fastest']:.4f}); the hooks alone "
                  f"{r['hooks_us']:.2f} us a step ({100 * r['hooks_share']:.2f} %){verdict}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, sort_keys=True)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
