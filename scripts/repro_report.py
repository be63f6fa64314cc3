"""The original report (pytorch/pytorch#132014) before and after
torchgen_patch.install(), on every device present; prints a markdown report.

    python scripts/repro_report.py [--backend cpp|python] > reports/repro-<device>-torch<ver>.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def calls(device):
    import torch

    def split_with_sizes_copy():
        x = torch.randn(2, 2, device=device)
        y, z = torch.empty(2, 1, device=device), torch.empty(2, 1, device=device)
        torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
        return y._version, z._version

    def foreach_zero_():
        p = [torch.ones(3, device=device), torch.ones(3, device=device)]
        torch._foreach_zero_(p)
        return tuple(t._version for t in p)

    def fused_adam_():
        ps = [torch.randn(3, device=device)]
        gs = [torch.randn(3, device=device)]
        m, v, vmax = [torch.zeros(3, device=device)], [torch.zeros(3, device=device)], [torch.zeros(3, device=device)]
        steps = [torch.ones((), device=device)]
        torch._fused_adam_(ps, gs, m, v, vmax, steps, lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8,
                           amsgrad=True, maximize=False)
        return ps[0]._version, gs[0]._version, m[0]._version, v[0]._version, vmax[0]._version

    return {"torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])": split_with_sizes_copy,
            "torch._foreach_zero_([a, b])": foreach_zero_,
            "torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad=True)":
                fused_adam_}


def main() -> int:
    import torch

    import torchgen_patch

    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpp", choices=("cpp", "python"))
    args = ap.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for d in devices:
        for name, fn in calls(d).items():
            rows.append([d, name, fn()])
    rep = torchgen_patch.install(backend=args.backend)
    i = 0
    for d in devices:
        for fn in calls(d).values():
            rows[i].append(fn())
            i += 1
    print("# The original report, before and after `torchgen_patch.install()`\n")
    print(f"- command: `python scripts/repro_report.py --backend {args.backend}`")
    print(f"- torch: `{torch.__version__}`; python `{platform.python_version()}`")
    if torch.cuda.is_available():
        print(f"- GPU: `{torch.cuda.get_device_name()}`")
    print(f"- install: {rep.summary().splitlines()[0]}\n")
    print("| device | call | `_version` of each written tensor, unpatched | patched |")
    print("|---|---|---|---|")
    for d, name, before, after in rows:
        print(f"| {d} | `{name}` | {' '.join(map(str, before))} | {' '.join(map(str, after))} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
