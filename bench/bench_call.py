"""Issue 5: per-call cost of a patched op against the same op unpatched,
side by side in one run (paired: unpatched and patched blocks alternate), at
the original report's sizes and at 1 MiB tensors; the Python fallback beside.

Usage: python bench/bench_call.py [--device cpu|cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cases(device):
    import torch

    def split(rows, cols):
        x = torch.randn(rows, cols, device=device)
        outs = [torch.empty(rows, cols // 2, device=device) for _ in range(2)]
        half = cols // 2
        return lambda: torch.split_with_sizes_copy(x, [half, half], dim=1, out=outs)

    def foreach_add(n):
        ts = [torch.randn(n, device=device) for _ in range(2)]
        return lambda: torch._foreach_add_(ts, 1.0)

    return {
        "split_with_sizes_copy.out 2x2 (the report's sizes)": split(2, 2),
        "split_with_sizes_copy.out 2x262144 (two 1 MiB outputs)": split(2, 262144),
        "_foreach_add_.Scalar 2x1 elements": foreach_add(1),
        "_foreach_add_.Scalar 2x262144 (1 MiB tensors)": foreach_add(262144),
    }


def per_call(fn, n, sync):
    for _ in range(10):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n


def main() -> int:
    import torch

    import torchgen_patch

    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    torchgen_patch.install()  # build (cached) once, outside the timing
    torchgen_patch.uninstall()
    torchgen_patch.install(runtime_ops=["aten::split_with_sizes_copy.out"])
    torchgen_patch.uninstall()
    results = []
    for name, fn in cases(args.device).items():
        n = 2000 if "1 MiB" not in name else 500
        op = "aten::split_with_sizes_copy.out" if name.startswith("split") else "aten::_foreach_add_.Scalar"
        base, cpp, py, boxed = [], [], [], []
        for i in range(args.rounds):  # paired rounds, the order alternating (ABBA) against drift
            for which in (("base", "cpp") if i % 2 == 0 else ("cpp", "base")):
                if which == "cpp":
                    torchgen_patch.install()
                    cpp.append(per_call(fn, n, sync))
                    torchgen_patch.uninstall()
                else:
                    base.append(per_call(fn, n, sync))
            torchgen_patch.install(backend="python")
            py.append(per_call(fn, n, sync))
            torchgen_patch.uninstall()
            torchgen_patch.install(runtime_ops=[op])  # the boxed kernel of issue 9 on the same op
            boxed.append(per_call(fn, n, sync))
            torchgen_patch.uninstall()
        paired = [c / b for c, b in zip(cpp, base)]
        row = {
            "case": name, "device": args.device, "torch": torch.__version__,
            "unpatched_us": statistics.median(base) * 1e6, "cpp_us": statistics.median(cpp) * 1e6,
            "python_us": statistics.median(py) * 1e6,
            "cpp_ratio_median_of_pairs": statistics.median(paired),
            "python_ratio": statistics.median(py) / statistics.median(base),
            "boxed_us": statistics.median(boxed) * 1e6,
            "boxed_ratio": statistics.median(boxed) / statistics.median(base),
            "target": 1.0,
        }
        row["met"] = row["cpp_ratio_median_of_pairs"] <= 1.0
        results.append(row)
        print(f"{args.device} {name}: unpatched {row['unpatched_us']:.2f} us, patched {row['cpp_us']:.2f} us "
              f"(ratio {row['cpp_ratio_median_of_pairs']:.3f}, target <= 1.0: "
              f"{'met' if row['met'] else 'NOT MET'}), python fallback {row['python_us']:.2f} us "
              f"({row['python_ratio']:.2f}x), boxed kernel {row['boxed_us']:.2f} us ({row['boxed_ratio']:.2f}x)",
              flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
