"""Issue 14: per-call cost of the patched kernel on a DTensor ``_foreach_add_``
(a list of 8 parameters, one-rank process group) against the same call
unpatched, paired (ABBA blocks against drift). DTensor's own dispatch dominates
the call; the target is a ratio <= 1.02.

Usage: python bench/bench_dtensor.py [--device cpu|cuda] [--rounds N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_call import per_call  # noqa: E402

TARGET = 1.02


def main() -> int:
    import torch
    from torchgen_patch.checks.subclass import dtensor_api

    Shard, distribute_tensor = dtensor_api().Shard, dtensor_api().distribute_tensor

    import torchgen_patch
    from torchgen_patch.checks.subclass import one_rank_mesh

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    torchgen_patch.install()  # build (cached) once, outside the timing
    torchgen_patch.uninstall()
    with one_rank_mesh(args.device) as mesh:
        params = [torch.nn.Parameter(distribute_tensor(torch.randn(64, 64, device=args.device), mesh, [Shard(0)]))
                  for _ in range(8)]
        grads = [torch.randn_like(p) for p in params]

        def fn():
            with torch.no_grad():
                torch._foreach_add_(params, grads, alpha=-1e-6)

        base, cpp = [], []
        for i in range(args.rounds):
            for which in (("base", "cpp") if i % 2 == 0 else ("cpp", "base")):
                if which == "cpp":
                    torchgen_patch.install()
                    cpp.append(per_call(fn, args.calls, sync))
                    torchgen_patch.uninstall()
                else:
                    base.append(per_call(fn, args.calls, sync))
    ratio = statistics.median(c / b for c, b in zip(cpp, base, strict=True))
    row = {"case": "DTensor _foreach_add_.List, 8 parameters of 64x64, Shard(0), one rank",
           "device": args.device, "torch": torch.__version__, "rounds": args.rounds, "calls": args.calls,
           "unpatched_us": statistics.median(base) * 1e6, "cpp_us": statistics.median(cpp) * 1e6,
           "cpp_ratio_median_of_pairs": ratio, "target": TARGET, "met": ratio <= TARGET}
    print(f"{args.device} {row['case']}: unpatched {row['unpatched_us']:.1f} us, patched {row['cpp_us']:.1f} us "
          f"(median of paired ratios {ratio:.3f}, target <= {TARGET}: {'met' if row['met'] else 'NOT MET'})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([row], fh, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
