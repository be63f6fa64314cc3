"""What the saved-tensor check costs a training step, on CPU: the same step (forward, backward,
AdamW) with the check off and on, side by side in one process, interleaved round by round; and
the step's extra peak memory, each mode in a fresh process. Targets: <= 1.1 on the small GPT-2,
<= 1.3 on the MLP, extra peak memory <= 5 %. With the check off nothing of it runs: the hook
stack is empty, torch's classes are as they were, no optimizer hook is registered (printed).

    .venv/bin/python bench/bench_saved.py [--rounds N] [--json PATH] [--report]

``--report`` writes reports/saved-check-cpu-torch<version>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import ROOT, save  # noqa: E402

sys.path.insert(0, ROOT)

# name -> (what it is, target)
MODELS = {
    "gpt2": ("small GPT-2 (transformers; GPT-2 small's width: 768 wide, 12 heads; 2 layers, vocabulary 8192, "
             "batch 2 x 128 tokens)", 1.1),
    "gpt2-narrow": ("narrow GPT-2 (4 layers, 256 wide, 4 heads, vocabulary 4096, batch 4 x 128 tokens: reported)",
                    None),
    "mlp": ("MLP, 4 x Linear(1024, 1024) + ReLU, batch 64", 1.3),
    "mlp-deep": ("MLP, 16 x Linear(256, 256) + ReLU, batch 64 (deep and narrow: reported)", None),
}
STEPS_PER_ROUND = {"gpt2": 1, "gpt2-narrow": 2, "mlp": 5, "mlp-deep": 10}
GPT2 = {"gpt2": (2, 768, 12, 8192, 2, 128), "gpt2-narrow": (4, 256, 4, 4096, 4, 128)}


def build(name: str):
    """(model, the function that makes one step's loss)."""
    import torch

    torch.manual_seed(0)
    if name in GPT2:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging

        logging.set_verbosity_error()
        layers, width, heads, vocab, batch, tokens = GPT2[name]
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=tokens,
                                           vocab_size=vocab, bos_token_id=0, eos_token_id=0))
        ids = torch.randint(0, vocab, (batch, tokens))
        return model, lambda: model(ids, labels=ids).loss
    width, depth = (1024, 4) if name == "mlp" else (256, 16)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(64, width)
    return model, lambda: model(x).pow(2).mean()


def nothing_runs_when_off() -> dict:
    """With no check on: no saved-tensor hooks on the stack, saved_tensors_hooks' methods torch's own,
    no global optimizer hook."""
    import torch.autograd.graph as graph
    from torch.optim import optimizer

    from torchgen_patch.saved import engine, hooks

    return {"hooks on the stack": engine.top(), "torch patched": hooks.patched(),
            "saved_tensors_hooks.__enter__ from": graph.saved_tensors_hooks.__enter__.__module__,
            "global optimizer post-hooks": len(optimizer._global_optimizer_post_hooks)}


def timing(name: str, rounds: int) -> dict:
    import torch

    import torchgen_patch

    model, loss_of = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    check = torchgen_patch.check_saved("raise")

    def step():
        opt.zero_grad(set_to_none=True)
        loss_of().backward()
        opt.step()

    from torchgen_patch.saved import hooks

    def block(on: bool, reading: bool = True) -> tuple[float, float]:
        n = STEPS_PER_ROUND[name]
        real = hooks.fingerprint
        if not reading:  # the hooks and their bookkeeping alone: no tensor's memory is read
            hooks.fingerprint = lambda t: (0,)
        if on:
            check.start()
        try:
            t, c = time.perf_counter(), time.process_time()
            for _ in range(n):
                step()
            return (time.perf_counter() - t) / n, (time.process_time() - c) / n
        finally:
            if on:
                check.stop()
            hooks.fingerprint = real

    for on in (False, True, False, True):  # warm-up
        block(on)
    runs: dict[str, list] = {"off": [], "on": [], "wall": [], "cpu": [], "hooks": []}
    for r in range(rounds):
        first = r % 2 == 0  # alternate which mode goes first
        a = block(not first)
        b = block(first)
        off, on = (a, b) if first else (b, a)
        runs["off"].append(off)
        runs["on"].append(on)
        runs["wall"].append(on[0] / off[0])
        runs["cpu"].append(on[1] / off[1])
        runs["hooks"].append(block(True, reading=False)[1] / off[1])
    what, target = MODELS[name]
    ratio = statistics.median(runs["cpu"])
    q = statistics.quantiles(runs["cpu"], n=4) if rounds >= 4 else [ratio, ratio, ratio]
    return {"model": name, "what": what, "off_ms": statistics.median(o[1] for o in runs["off"]) * 1e3,
            "on_ms": statistics.median(o[1] for o in runs["on"]) * 1e3, "ratio": ratio, "p25": q[0], "p75": q[2],
            "wall_ratio": statistics.median(runs["wall"]), "hooks_ratio": statistics.median(runs["hooks"]),
            "rounds": rounds, "target": target,
            "met": None if target is None else ratio <= target, "threads": torch.get_num_threads(),
            "saved_tensors_per_step": check.checked // ((rounds + 2) * STEPS_PER_ROUND[name]),
            "bytes_per_step": _bytes_read(loss_of, opt)}


def _bytes_read(loss_of, opt) -> int:
    """The bytes one checked step reads to fingerprint its saved tensors (at save and at use)."""
    import torchgen_patch
    from torchgen_patch.saved import fingerprint

    seen = []
    real = fingerprint._block
    fingerprint._block = lambda ptr, n: (seen.append(n), real(ptr, n))[1]
    try:
        with torchgen_patch.check_saved("raise"):
            opt.zero_grad(set_to_none=True)
            loss_of().backward()
    finally:
        fingerprint._block = real
    return sum(seen)


MEMORY = r"""
import sys, json
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/bench")
import torch, torchgen_patch
torch.set_num_threads(1)
from bench_saved import build
name, on = sys.argv[2], sys.argv[3] == "1"
model, loss_of = build(name)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    opt.zero_grad(set_to_none=True); loss_of().backward(); opt.step()
def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
check = torchgen_patch.check_saved("raise")
if on:
    check.start()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from now: the model and optimizer built, no step yet
base = kb("VmRSS:")
for _ in range(3):
    step()
print(json.dumps({"base_kb": base, "peak_kb": kb("VmHWM:")}))
"""


def memory(name: str, repeats: int = 3) -> dict:
    out = {}
    for on in (False, True):
        runs = []
        for _ in range(repeats):
            r = subprocess.run([sys.executable, "-c", MEMORY, ROOT, name, "1" if on else "0"], capture_output=True,
                               text=True, env=dict(os.environ, PYTHONPATH=ROOT))
            if r.returncode:
                raise RuntimeError(r.stderr[-2000:])
            runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
        best = min(runs, key=lambda m: m["peak_kb"])
        out["on" if on else "off"] = {"peak_mib": best["peak_kb"] / 1024,
                                      "step_peak_mib": (best["peak_kb"] - best["base_kb"]) / 1024}
    out["extra_peak"] = out["on"]["peak_mib"] / out["off"]["peak_mib"] - 1
    out["extra_step_peak"] = out["on"]["step_peak_mib"] / max(out["off"]["step_peak_mib"], 1e-9) - 1
    out["met"] = out["extra_step_peak"] <= 0.05
    return out


def main(rounds: int = 15, report: bool = False, json_path: str | None = None) -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time is then the work done, whatever else the machine runs
    try:
        return _main(rounds, report, json_path)
    finally:
        torch.set_num_threads(threads)


def _main(rounds: int, report: bool, json_path: str | None) -> dict:
    results = {"off": nothing_runs_when_off(), "models": []}
    print(f"with the check off: {results['off']}", flush=True)
    for name in MODELS:
        t = timing(name, rounds)
        t["memory"] = memory(name)
        results["models"].append(t)
        m = t["memory"]
        verdict = "" if t["target"] is None else f"  [target <= {t['target']}: {'met' if t['met'] else 'NOT MET'}]"
        print(f"{name}: CPU time off {t['off_ms']:.1f} ms, on {t['on_ms']:.1f} ms, ratio {t['ratio']:.3f} "
              f"(p25-p75 {t['p25']:.3f}-{t['p75']:.3f}; wall {t['wall_ratio']:.3f}; reading nothing "
              f"{t['hooks_ratio']:.3f}){verdict}; {t['bytes_per_step'] / 1e6:.0f} MB read a step, "
              f"{t['saved_tensors_per_step']} saved tensors a step; peak {m['off']['peak_mib']:.0f} -> "
              f"{m['on']['peak_mib']:.0f} MiB ({m['extra_peak']:+.1%}), the step's own "
              f"{m['off']['step_peak_mib']:.1f} -> {m['on']['step_peak_mib']:.1f} MiB", flush=True)
    if json_path:
        save([results], json_path)
    if report:
        import torch

        path = os.path.join(ROOT, "reports", f"saved-check-cpu-torch{torch.__version__.split('+')[0]}.md")
        with open(path, "w") as f:
            f.write(render(results, rounds))
        print(f"wrote {os.path.relpath(path, ROOT)}")
    return results


def _budget(t: dict) -> str:
    left_ms = (t["target"] - t["hooks_ratio"]) * t["off_ms"]
    return (f": a ratio of {t['target']} would leave {left_ms:.0f} ms for it, a fingerprint of "
            f"{t['bytes_per_step'] / 1e6 / max(left_ms, 1e-9):.1f} GB/s")


def render(results: dict, rounds: int) -> str:
    import platform

    import torch

    lines = ["# The saved-tensor check's cost: a training step with the check on / off, CPU", "",
             f"- torch `{torch.__version__}`, Python {platform.python_version()}, "
             f"{os.cpu_count()} CPU cores (shared: other jobs ran beside it), {results['models'][0]['threads']} torch "
             "thread (so CPU time is the work done; the check's own work runs on one thread whatever torch uses)",
             f"- command: `.venv/bin/python bench/bench_saved.py --rounds {rounds} --report` (also in `make bench`)",
             "- each figure: the median of per-round ratios of one step's CPU time (forward, backward, AdamW step), "
             "both modes in one process, interleaved, the first mode alternating (wall-clock ratio beside it); "
             "memory: a fresh process per mode (best of 3), the peak resident size over three steps, and the "
             "steps' own peak above the resident size before the first (the target applies to that one)",
             "- with the check off: " + ", ".join(f"{k}: `{v}`" for k, v in results["off"].items()), "",
             "| model | saved tensors, bytes read a step | CPU time off | on | on / off (p25-p75) | wall on / off | "
             "the hooks alone, reading nothing | target | process peak off / on | the steps' own peak off / on |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in results["models"]:
        m = t["memory"]
        target = "reported" if t["target"] is None else f"<= {t['target']}: {'met' if t['met'] else '**not met**'}"
        lines.append(f"| {t['what']} | {t['saved_tensors_per_step']}, {t['bytes_per_step'] / 1e6:.0f} MB | "
                     f"{t['off_ms']:.1f} ms | {t['on_ms']:.1f} ms | **{t['ratio']:.3f}** "
                     f"({t['p25']:.3f}-{t['p75']:.3f}) | "
                     f"{t['wall_ratio']:.3f} | {t['hooks_ratio']:.3f} | {target} | "
                     f"{m['off']['peak_mib']:.0f} / {m['on']['peak_mib']:.0f} MiB ({m['extra_peak']:+.1%}) | "
                     f"{m['off']['step_peak_mib']:.1f} / {m['on']['step_peak_mib']:.1f} MiB "
                     f"({m['extra_step_peak']:+.1%}; <= 5 %: {'met' if m['met'] else '**not met**'}) |")
    lines += ["", "Where the time goes: the hooks and their bookkeeping alone (every tensor's version, place and "
              "frames, no memory read) cost the ratio of the 'reading nothing' column; the rest is reading each "
              "saved tensor twice, at save and at use:", ""]
    for t in results["models"]:
        extra_s = (t["on_ms"] - t["off_ms"] * t["hooks_ratio"]) / 1e3
        speed = t["bytes_per_step"] / extra_s / 1e9 if extra_s > 0 else float("inf")
        lines.append(f"- {t['model']}: {t['bytes_per_step'] / 1e6:.0f} MB read a step in about {extra_s * 1e3:.0f} "
                     f"ms ({speed:.1f} GB/s) beside {t['off_ms']:.0f} ms of training"
                     + (_budget(t) if t["target"] and not t["met"] else ""))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    main(a.rounds, a.report, a.json)
