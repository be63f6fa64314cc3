"""Per-call cost, three columns in one run: the op unpatched, the op with PyTorch's own kernel
(what upstream's codegen emits once fixed: bench/pytorch_shaped.py) and with this project's
kernel. Paired rounds, the three interleaved in a rotating order against drift; per case the
medians of the per-round ratios with their spread. The Python fallback and the boxed kernel
are timed in the same rounds, against the unpatched op.

Target: this project's kernel <= 1.00x the PyTorch-shaped one (within +-1 % counts as equal).

Usage: python bench/bench_call.py [--device cpu|cuda] [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

TARGET, EQUAL = 1.00, 0.01
COLUMNS = ("unpatched", "pytorch", "ours")


def cases(device):
    """name -> (op, the call)."""
    import torch

    def split(rows, cols):
        x = torch.randn(rows, cols, device=device)
        outs = [torch.empty(rows, cols // 2, device=device) for _ in range(2)]
        half = cols // 2
        return lambda: torch.split_with_sizes_copy(x, [half, half], dim=1, out=outs)

    def foreach_add(n):
        ts = [torch.randn(n, device=device) for _ in range(2)]
        return lambda: torch._foreach_add_(ts, 1.0)

    def fused_adamw(n_params, numel):
        def lst():
            return [torch.rand(numel, device=device) for _ in range(n_params)]

        params, grads, m, v = lst(), lst(), lst(), lst()
        steps = [torch.ones((), device=device) for _ in range(n_params)]
        return lambda: torch._fused_adamw_(params, grads, m, v, [], steps, lr=1e-9, beta1=0.9, beta2=0.999,
                                           weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)

    split_op, add_op, adamw_op = "aten::split_with_sizes_copy.out", "aten::_foreach_add_.Scalar", "aten::_fused_adamw_"
    return {
        "split_with_sizes_copy.out 2x2 (the report's sizes)": (split_op, split(2, 2)),
        "split_with_sizes_copy.out 2x262144 (two 1 MiB outputs)": (split_op, split(2, 262144)),
        "_foreach_add_.Scalar 2x1 elements": (add_op, foreach_add(1)),
        "_foreach_add_.Scalar 2x262144 (1 MiB tensors)": (add_op, foreach_add(262144)),
        "_fused_adamw_ 8 parameters of 4096": (adamw_op, fused_adamw(8, 4096)),
    }


def calls_per_block(fn, sync, seconds: float = 0.03) -> int:
    """As many calls as take about ``seconds`` unpatched (at least 20)."""
    per_call(fn, 20, sync)
    return max(20, int(seconds / per_call(fn, 50, sync)))


def per_call(fn, n, sync):
    for _ in range(10):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n


def spread(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": min(xs), "max": max(xs)}


def main() -> int:
    import torch

    import pytorch_shaped
    import torchgen_patch
    from torchgen_patch.pipeline import plan as make_plan
    from torchgen_patch.sources import Options

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads of torch (default 1: every column the same, and no stalls from a shared "
                         "machine's other processes; 0 keeps torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    todo = cases(args.device)
    ops = sorted({op for op, _ in todo.values()})
    shaped = pytorch_shaped.load(ops)
    _, plan = make_plan(Options())
    ours = torchgen_patch.install(plan=plan)  # build (cached) once, outside the timing
    assert set(ops) <= set(ours.registered), ours.summary()
    library = ours.library
    torchgen_patch.uninstall()

    def timed(which, op, fn, n):
        if which == "pytorch":
            shaped.pytorch_shaped_register()
        elif which == "ours":
            torchgen_patch.install(library=library)
        elif which == "python":
            torchgen_patch.install([op], backend="python", plan=plan)
        elif which == "boxed":
            torchgen_patch.install(runtime_ops=[op])
        try:
            return per_call(fn, n, sync)
        finally:
            shaped.pytorch_shaped_unregister()
            torchgen_patch.uninstall()

    orders = list(itertools.permutations(COLUMNS))
    results = []
    for name, (op, fn) in todo.items():
        n = calls_per_block(fn, sync)
        t = {c: [] for c in COLUMNS + ("python", "boxed")}
        for i in range(args.rounds):
            for which in orders[i % len(orders)] + ("python", "boxed"):
                t[which].append(timed(which, op, fn, n))
        ratio = {"ours_vs_pytorch": [o / p for o, p in zip(t["ours"], t["pytorch"], strict=True)],
                 "ours_vs_unpatched": [o / b for o, b in zip(t["ours"], t["unpatched"], strict=True)],
                 "pytorch_vs_unpatched": [p / b for p, b in zip(t["pytorch"], t["unpatched"], strict=True)],
                 "python_vs_unpatched": [p / b for p, b in zip(t["python"], t["unpatched"], strict=True)],
                 "boxed_vs_unpatched": [p / b for p, b in zip(t["boxed"], t["unpatched"], strict=True)]}
        row = {"case": name, "op": op, "device": args.device, "torch": torch.__version__, "rounds": args.rounds,
               "calls_per_block": n, "threads": torch.get_num_threads(),
               **{f"{c}_us": statistics.median(v) * 1e6 for c, v in t.items()},
               **{k: spread(v) for k, v in ratio.items()}, "target": TARGET, "equal_within": EQUAL}
        row["met"] = row["ours_vs_pytorch"]["median"] <= TARGET + EQUAL
        results.append(row)
        r = row["ours_vs_pytorch"]
        print(f"{args.device} {name}: unpatched {row['unpatched_us']:.2f} us | PyTorch-shaped {row['pytorch_us']:.2f} "
              f"us | ours {row['ours_us']:.2f} us | ours/PyTorch-shaped {r['median']:.3f} "
              f"(p25-p75 {r['p25']:.3f}-{r['p75']:.3f}, min-max {r['min']:.3f}-{r['max']:.3f}) "
              f"[target <= {TARGET:.2f} +-{EQUAL:.0%}: {'met' if row['met'] else 'NOT MET'}] | "
              f"PyTorch-shaped/unpatched {row['pytorch_vs_unpatched']['median']:.3f}, "
              f"ours/unpatched {row['ours_vs_unpatched']['median']:.3f}, "
              f"python {row['python_vs_unpatched']['median']:.2f}x, boxed {row['boxed_vs_unpatched']['median']:.2f}x",
              flush=True)
    print(table(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, sort_keys=True)
    return 0


def table(rows: list[dict]) -> str:
    """The three-column table (markdown), ratios as medians of paired rounds with p25-p75."""
    out = ["| case | unpatched | PyTorch-shaped kernel | this project's kernel | ours / PyTorch-shaped "
           "(p25-p75) | PyTorch-shaped / unpatched |", "|---|---|---|---|---|---|"]
    for r in rows:
        q = r["ours_vs_pytorch"]
        out.append(f"| {r['case']} | {r['unpatched_us']:.2f} us | {r['pytorch_us']:.2f} us | {r['ours_us']:.2f} us | "
                   f"**{q['median']:.3f}** ({q['p25']:.3f}-{q['p75']:.3f}) | "
                   f"{r['pytorch_vs_unpatched']['median']:.3f} |")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
