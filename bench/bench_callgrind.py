"""Per-call cost in instructions, the measure PyTorch's reviewers judge dispatcher changes by: callgrind
through ``torch.utils.benchmark.Timer.collect_callgrind`` (valgrind from the distribution's packages), on
CPU, one thread. Four calls, each in a valgrind process of its own:

- a zero-returns op (``_foreach_add_.Scalar`` on one tensor) unpatched: no ADInplaceOrView kernel;
- the same op with the kernel PyTorch's fixed codegen emits (bench/pytorch_shaped.py);
- the same op with this project's kernel (what ``torchgen-patch run`` installs);
- an in-place op over the same tensor whose ADInplaceOrView kernel PyTorch generates today (``add_.Scalar``).

Instruction counts are per call: callgrind's count over ``--number`` calls (``denoise=True``: without the
interpreter's allocator noise), divided by the number. Where valgrind is not on PATH, nothing is measured
and the result says so.

Usage: python bench/bench_callgrind.py [--json FILE] [--number N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

OP, INPLACE = "aten::_foreach_add_.Scalar", "aten::add_.Scalar"
SETUP = "import torch\ntorch.set_num_threads(1)\nt = torch.ones(1)\nts = [t]\n"
# name -> (op, kernel, statement)
CALLS = {
    "unpatched": (OP, "no ADInplaceOrView kernel", "torch._foreach_add_(ts, 1.0)"),
    "pytorch-shaped": (OP, "the kernel PyTorch's fixed codegen emits", "torch._foreach_add_(ts, 1.0)"),
    "ours": (OP, "this project's kernel", "torch._foreach_add_(ts, 1.0)"),
    "generated in-place": (INPLACE, "the kernel PyTorch generates today", "t.add_(1.0)"),
}


def _setups() -> dict[str, str]:
    """The setup of each call: the kernel registered (built once here, outside valgrind)."""
    import pytorch_shaped

    import torchgen_patch
    from torchgen_patch.pipeline import plan as make_plan
    from torchgen_patch.sources import Options

    shaped = pytorch_shaped.load([OP])
    _, plan = make_plan(Options())
    ours = torchgen_patch.install([OP], plan=plan)  # built (cached) here; the valgrind process loads the cache
    assert OP in ours.registered, ours.summary()
    torchgen_patch.uninstall()
    root = os.path.dirname(HERE)
    return {
        "unpatched": SETUP,
        "pytorch-shaped": SETUP + f"import ctypes\nctypes.CDLL({shaped._name!r}).pytorch_shaped_register()\n",
        "ours": SETUP + f"import sys\nsys.path.insert(0, {root!r})\nimport torchgen_patch\n"
                        f"torchgen_patch.install(library={ours.library!r})\n",
        "generated in-place": SETUP,
    }


def measure(number: int = 100) -> dict:
    """Instructions per call of each of CALLS, or ``not_run`` with the reason."""
    import torch
    from torch.utils.benchmark import Timer

    result: dict = {"torch": torch.__version__, "device": "cpu", "number": number, "threads": 1}
    if shutil.which("valgrind") is None:
        return result | {"not_run": "valgrind is not on PATH (the distribution's package `valgrind`)"}
    # Timer runs `python` from PATH in its valgrind process: this interpreter's, with this checkout importable
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    setups = _setups()
    calls = []
    for name, (op, kernel, stmt) in CALLS.items():
        stats = Timer(stmt, setup=setups[name]).collect_callgrind(number=number, collect_baseline=False)
        per_call = stats.counts(denoise=True) / number
        calls.append({"name": name, "op": op, "kernel": kernel, "stmt": stmt, "instructions": round(per_call)})
        print(f"cpu {name}: {op}, {kernel}: {per_call:,.0f} instructions per call",
              flush=True)
    return result | {"calls": calls}


def summary(r: dict) -> str:
    """The figures in the form PyTorch's boxed-kernel issue used: before, after, the increase."""
    if "not_run" in r:
        return f"instruction counts: not run ({r['not_run']})"
    c = {x["name"]: x["instructions"] for x in r["calls"]}
    before, after = c["unpatched"], c["pytorch-shaped"]
    return (f"`_foreach_add_.Scalar`, one tensor (instruction count per call, mean over {r['number']} calls)\n"
            f"Before (no kernel): {before:,}, After (generated kernel): {after:,} "
            f"({after - before:+,}, {100 * (after - before) / before:+.1f}%); this project's kernel: {c['ours']:,}\n"
            f"`add_.Scalar` on the same tensor (PyTorch's generated kernel today): {c['generated in-place']:,}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--number", type=int, default=100, help="calls per valgrind run (default 100)")
    args = ap.parse_args()
    r = measure(args.number)
    print(summary(r))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
