"""What the saved-tensor check costs a training step, on CPU: the same step (forward, backward,
AdamW) with the check off and on, side by side in one process, interleaved round by round; and
the step's extra peak memory, each mode in a fresh process. Targets: <= 1.1 on the small GPT-2,
<= 1.3 on the MLP, extra peak memory <= 5 %. With the check off nothing of it runs: the hook
stack is empty, torch's classes are as they were, no optimizer hook is registered (printed).

On CUDA (``--device cuda``): the wall time of a step (synchronised at the ends of each block) of
GPT-2 small on a batch that keeps the GPU busy (target <= 1.2), the same under bf16 autocast, and
the CPU benchmark's small GPT-2, whose step is too short to hide the launch of the check's
kernels (reported); for each, the host synchronisations of one step with the check off and on
(counted twice: torch.cuda.set_sync_debug_mode's warnings, and the profiler's *Synchronize calls),
its kernel launches, and the step's peak of allocated memory.

    .venv/bin/python bench/bench_saved.py [--device cpu|cuda] [--rounds N] [--json PATH] [--report [FILE]]

``--report`` writes reports/saved-check-DEVICE-torch<version>.md (or FILE).
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
# on CUDA: name -> (what it is, target); GPT2 holds each one's configuration
CUDA_MODELS = {
    "gpt2-small": ("GPT-2 small (transformers: 12 layers, 768 wide, 12 heads, vocabulary 50257), batch 8 x 512 "
                   "tokens, float32", 1.2),
    "gpt2-small-bf16": ("the same under bf16 autocast (reported)", None),
    "gpt2": ("the CPU benchmark's small GPT-2 (2 layers, 768 wide, vocabulary 8192, batch 2 x 128 tokens): a step "
             "too short to hide the launches of the check's kernels (reported)", None),
}
STEPS_PER_ROUND = {"gpt2": 1, "gpt2-narrow": 2, "mlp": 5, "mlp-deep": 10, "gpt2-small": 1, "gpt2-small-bf16": 1}
GPT2 = {"gpt2": (2, 768, 12, 8192, 2, 128), "gpt2-narrow": (4, 256, 4, 4096, 4, 128),
        "gpt2-small": (12, 768, 12, 50257, 8, 512), "gpt2-small-bf16": (12, 768, 12, 50257, 8, 512)}


def build(name: str, device: str = "cpu"):
    """(model, the function that makes one step's loss)."""
    import torch

    torch.manual_seed(0)
    if name in GPT2:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging

        logging.set_verbosity_error()
        layers, width, heads, vocab, batch, tokens = GPT2[name]
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=tokens,
                                           vocab_size=vocab, bos_token_id=0, eos_token_id=0)).to(device)
        ids = torch.randint(0, vocab, (batch, tokens), device=device)
        amp = name.endswith("-bf16")

        def loss_of():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
                return model(ids, labels=ids).loss

        return model, loss_of
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


def _verdict(t: dict) -> str:
    return "" if t["target"] is None else f"  [target <= {t['target']}: {'met' if t['met'] else 'NOT MET'}]"


def _written(results: dict, json_path: str | None, report, device: str, rendered) -> dict:
    """``results`` saved as JSON and rendered into the report, where asked for; returned."""
    if json_path:
        save([results], json_path)
    if report:
        _write_report(report, device, rendered())
    return results


def main(rounds: int = 15, report=False, json_path: str | None = None, device: str = "cpu") -> dict:
    """``report``: True for reports/saved-check-DEVICE-torch<version>.md, or a path."""
    if device == "cuda":
        return main_cuda(rounds, report, json_path)
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
        verdict = _verdict(t)
        print(f"{name}: CPU time off {t['off_ms']:.1f} ms, on {t['on_ms']:.1f} ms, ratio {t['ratio']:.3f} "
              f"(p25-p75 {t['p25']:.3f}-{t['p75']:.3f}; wall {t['wall_ratio']:.3f}; reading nothing "
              f"{t['hooks_ratio']:.3f}){verdict}; {t['bytes_per_step'] / 1e6:.0f} MB read a step, "
              f"{t['saved_tensors_per_step']} saved tensors a step; peak {m['off']['peak_mib']:.0f} -> "
              f"{m['on']['peak_mib']:.0f} MiB ({m['extra_peak']:+.1%}), the step's own "
              f"{m['off']['step_peak_mib']:.1f} -> {m['on']['step_peak_mib']:.1f} MiB", flush=True)
    return _written(results, json_path, report, "cpu", lambda: render(results, rounds))


def _write_report(report, device: str, text: str) -> None:
    import torch

    path = report if isinstance(report, str) else os.path.join(
        ROOT, "reports", f"saved-check-{device}-torch{torch.__version__.split('+')[0]}.md")
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(path, ROOT) if path.startswith(ROOT) else path}")


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
             "- with the check off: " + ", ".join(f"{k}: `{v}`" for k, v in results["off"].items()),
             f"- fingerprints of contiguous tensors of {results.get('kernel_min', 0):,} elements or more read by the "
             "check's Triton kernel, the others by torch's ops", "",
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



# --- CUDA -----------------------------------------------------------------------------------------


def _device_step(name: str, device: str):
    """A training step of ``name`` on ``device``: forward, backward, AdamW (foreach)."""
    import torch

    model, loss_of = build(name, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss_of().backward()
        opt.step()

    return step


def syncs_and_launches(step, device: str) -> dict:
    """One step's host synchronisations, counted by torch's sync debug mode (a warning per
    synchronising call) and by the profiler (its cuda*Synchronize calls), and its kernel launches
    (on a device other than CUDA, where neither is counted, None and 0)."""
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    debug = None
    if device == "cuda":
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
        debug = sum("synchroniz" in str(w.message) for w in caught)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
    names = [e.name for e in prof.events()]
    return {"sync_debug_mode": debug, "profiler_synchronize": sum("Synchronize" in n for n in names),
            "kernel_launches": sum(n in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
                                   for n in names)}


def timing_cuda(name: str, rounds: int, device: str = "cuda") -> dict:
    """``name`` of CUDA_MODELS timed on ``device`` (``cpu``: how tests run this code without a GPU)."""
    import torch

    import torchgen_patch
    from torchgen_patch.saved import hooks

    step = _device_step(name, device)
    check = torchgen_patch.check_saved("raise")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def block(on: bool, reading: bool = True) -> float:
        n = STEPS_PER_ROUND[name]
        real = hooks.fingerprint
        if not reading:  # the hooks and their bookkeeping alone: no tensor's memory is read
            hooks.fingerprint = lambda t: (0,)
        if on:
            check.start()
        try:
            sync()
            t = time.perf_counter()
            for _ in range(n):
                step()
            sync()
            return (time.perf_counter() - t) / n
        finally:
            if on:
                check.stop()
            hooks.fingerprint = real

    for on in (False, True, False, True):  # warm-up (and the check's weights made on the device)
        block(on)
    runs: dict[str, list] = {"off": [], "on": [], "ratio": [], "hooks": []}
    for r in range(rounds):
        first = r % 2 == 0
        a = block(not first)
        b = block(first)
        off, on = (a, b) if first else (b, a)
        runs["off"].append(off)
        runs["on"].append(on)
        runs["ratio"].append(on / off)
        runs["hooks"].append(block(True, reading=False) / off)
    counted = {}
    for on in (False, True):
        if on:
            check.start()
        try:
            if on:
                before = check.checked
                step()
                counted["saved_tensors"] = check.checked - before
            counted["on" if on else "off"] = syncs_and_launches(step, device)
        finally:
            if on:
                check.stop()
    peaks = {"off": None, "on": None}
    for on in (False, True) if device == "cuda" else ():
        if on:
            check.start()
        try:
            sync()
            torch.cuda.reset_peak_memory_stats()
            step()
            sync()
            peaks["on" if on else "off"] = torch.cuda.max_memory_allocated() / 2**20
        finally:
            if on:
                check.stop()
    what, target = CUDA_MODELS[name]
    ratio = statistics.median(runs["ratio"])
    q = statistics.quantiles(runs["ratio"], n=4) if rounds >= 4 else [ratio, ratio, ratio]
    return {"model": name, "what": what, "off_ms": statistics.median(runs["off"]) * 1e3,
            "on_ms": statistics.median(runs["on"]) * 1e3, "ratio": ratio, "p25": q[0], "p75": q[2],
            "hooks_ratio": statistics.median(runs["hooks"]), "rounds": rounds, "target": target,
            "met": None if target is None else ratio <= target, "counted": counted,
            "peak_mib": peaks, "extra_peak": peaks["on"] / peaks["off"] - 1 if peaks["off"] else None}


def main_cuda(rounds: int, report, json_path: str | None, device: str = "cuda") -> dict:
    """The CUDA benchmark (``device``: ``cpu`` is how tests run this code without a GPU)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device")
    from torchgen_patch.saved import fingerprint as fp

    results = {"device": torch.cuda.get_device_name() if device == "cuda" else device, "torch": torch.__version__,
               "off": nothing_runs_when_off(), "models": [], "kernel_min": fp._KERNEL_MIN}
    print(f"with the check off: {results['off']}", flush=True)
    for name in CUDA_MODELS:
        t = timing_cuda(name, rounds, device)
        results["models"].append(t)
        c = t["counted"]
        verdict = _verdict(t)
        print(f"{name}: off {t['off_ms']:.1f} ms, on {t['on_ms']:.1f} ms, ratio {t['ratio']:.3f} "
              f"(p25-p75 {t['p25']:.3f}-{t['p75']:.3f}; reading nothing {t['hooks_ratio']:.3f}){verdict}; "
              f"{c['saved_tensors']} saved tensors a step; synchronisations a step off/on: "
              f"{c['off']['sync_debug_mode']}/{c['on']['sync_debug_mode']} (sync debug mode), "
              f"{c['off']['profiler_synchronize']}/{c['on']['profiler_synchronize']} (profiler); kernel launches "
              f"{c['off']['kernel_launches']}/{c['on']['kernel_launches']}; peak allocated {_peak(t)}", flush=True)
    return _written(results, json_path, report, device, lambda: render_cuda(results, rounds))


def _peak(t: dict) -> str:
    p = t["peak_mib"]
    if p["off"] is None:
        return "not measured"
    return f"{p['off']:.0f} / {p['on']:.0f} MiB ({t['extra_peak']:+.1%})"


def render_cuda(results: dict, rounds: int) -> str:
    import platform

    lines = ["# The saved-tensor check's cost: a training step with the check on / off, CUDA", "",
             f"- {results['device']}, torch `{results['torch']}`, Python {platform.python_version()}",
             f"- command: `python bench/bench_saved.py --device cuda --rounds {rounds} --report`",
             "- each figure: the median of per-round ratios of one step's wall time (forward, backward, AdamW step; "
             "the device synchronised before and after each block of steps), both modes in one process, "
             "interleaved, the first mode alternating; host synchronisations and kernel launches of one step, "
             "counted with the check off and on (torch.cuda.set_sync_debug_mode('warn')'s warnings; the "
             "profiler's cuda*Synchronize calls; its kernel launches); peak: torch.cuda.max_memory_allocated "
             "over one step",
             "- with the check off: " + ", ".join(f"{k}: `{v}`" for k, v in results["off"].items()),
             f"- fingerprints of contiguous tensors of {results.get('kernel_min', 0):,} elements or more read by the "
             "check's Triton kernel, the others by torch's ops", "",
             "| model | saved tensors a step | off | on | on / off (p25-p75) | the hooks alone, reading nothing | "
             "target | synchronisations a step, off / on (sync debug mode; profiler) | kernel launches off / on | "
             "peak allocated off / on |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t in results["models"]:
        c = t["counted"]
        target = "reported" if t["target"] is None else f"<= {t['target']}: {'met' if t['met'] else '**not met**'}"
        lines.append(f"| {t['what']} | {c['saved_tensors']} | {t['off_ms']:.1f} ms | {t['on_ms']:.1f} ms | "
                     f"**{t['ratio']:.3f}** ({t['p25']:.3f}-{t['p75']:.3f}) | {t['hooks_ratio']:.3f} | {target} | "
                     f"{c['off']['sync_debug_mode']} / {c['on']['sync_debug_mode']}; "
                     f"{c['off']['profiler_synchronize']} / {c['on']['profiler_synchronize']} | "
                     f"{c['off']['kernel_launches']} / {c['on']['kernel_launches']} | "
                     f"{_peak(t)} |")
    return "\n".join(lines) + "\n"

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--report", nargs="?", const=True, default=False, metavar="FILE")
    ap.add_argument("--kernel-min", type=int, metavar="N",
                    help="CUDA: read tensors of N elements or more with the fingerprint's Triton kernel "
                         "(default: the check's own threshold; a huge N: torch's ops only)")
    a = ap.parse_args()
    if a.kernel_min is not None:
        from torchgen_patch.saved import fingerprint as _fp

        _fp._KERNEL_MIN = a.kernel_min
    main(a.rounds, a.report, a.json, a.device)
