"""bitsandbytes' optimizers on a device, unpatched and patched (both backends): save a
parameter for backward, step, backward. Prints a markdown report.

    python scripts/bnb_report.py --device cuda > reports/bitsandbytes-cuda-torch2.11.0.md
"""

from __future__ import annotations

import argparse
import platform
import warnings


def stale(bnb, torch, name: str, device: str) -> str:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, 64, device=device))
    kw = {"lr": 0.05}
    if name.startswith(("SGD", "LARS", "PytorchLARS")):
        kw["momentum"] = 0.9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = getattr(bnb.optim, name)([p], **kw)
    loss = (p * p).sum()
    p.grad = torch.ones_like(p)
    before = p.detach().clone()
    try:
        opt.step()
    except Exception as e:  # noqa: BLE001 — the library's own failure on this device, reported
        return f"step fails in bitsandbytes: {type(e).__name__}: {str(e).splitlines()[0][:60]}"
    if torch.equal(before, p.detach()):
        return "step did not change the parameter"
    try:
        loss.backward()
    except RuntimeError as e:
        return "raises" if "modified by an inplace operation" in str(e) else f"error: {str(e)[:60]}"
    return f"silent (version {p._version})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import bitsandbytes as bnb
    import torch

    import torchgen_patch

    names = sorted(n for n in dir(bnb.optim) if isinstance(getattr(bnb.optim, n), type)
                   and issubclass(getattr(bnb.optim, n), torch.optim.Optimizer))
    cols = {"unpatched": {n: stale(bnb, torch, n, args.device) for n in names}}
    for backend in ("cpp", "python"):
        rep = torchgen_patch.install(backend=backend, runtime_ops=["bitsandbytes::*"])
        try:
            cols[f"patched ({backend}: {len(rep.registered)} ops)"] = {n: stale(bnb, torch, n, args.device)
                                                                       for n in names}
        finally:
            torchgen_patch.uninstall()
    dev = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"# bitsandbytes {bnb.__version__} optimizers on {dev}, torch {torch.__version__}, "
          f"Python {platform.python_version()}\n")
    print("Save a parameter for backward, `opt.step()`, then `backward()`: \"silent\" = the stale parameter was "
          "used without an error; \"raises\" = PyTorch's \"modified by an inplace operation\" error. "
          "Produced by `python scripts/bnb_report.py --device " + args.device + "`.\n")
    print("| optimizer | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for n in names:
        print(f"| `{n}` | " + " | ".join(c[n] for c in cols.values()) + " |")
    for title, c in cols.items():
        tally: dict[str, int] = {}
        for v in c.values():
            k = v.split(" (")[0].split(":")[0]
            tally[k] = tally.get(k, 0) + 1
        print(f"\n- {title}: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
