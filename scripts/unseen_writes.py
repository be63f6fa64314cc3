"""Writes autograd cannot see, measured on one device, in fresh processes:

- each case of scripts/unseen_writes_cases.py four ways: unpatched; unpatched inside
  ``torchgen_patch.check_saved("warn")`` (its findings from the check's JSON renderer); under
  ``torchgen-patch run``; under ``torchgen-patch run --check-saved=warn`` (its findings from the
  lines it prints on stderr);
- the optimizer entries: each optimizer case under ``run`` without an entry for its class and
  with one (the shipped one, or one given where none ships), and a short training loop
  unpatched and under ``run``, which must be bit-identical;
- the lint's optimizer rule: ``lint --runtime --import`` DeepSpeed's optimizer modules, with the
  shipped overlay and without;
- no false findings: the compatibility battery (tests/compat_scenarios.py) patched with the check
  off and on, and small GPT-2, BERT, Llama and ResNet-18 training (tests/saved_training.py: fused
  and foreach AdamW, AMP, clipping, checkpointing, torch.compile) with the check off and on: the
  same outcomes and losses, bit for bit, and no finding.

A row whose library, compiler or device is missing says "not run" and why. The report is one
markdown file with its JSON beside it::

    python scripts/unseen_writes.py --device cuda [--part PART ...] [--cases A,B] [--jobs N] \\
        [--deadline SECONDS] [--report FILE.md] [--json FILE.json]
    python scripts/unseen_writes.py --part prepare       # build what the parts need, nothing else
    python scripts/unseen_writes.py --docs FILE.json     # docs/unseen-writes.md's CUDA table from a report

Parts: prepare (the kernels and DeepSpeed's ops, built side by side), cases, optimizers, lint,
battery, training; all by default. Exit 0 when it ran (whatever it found), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, ROOT)

import unseen_writes_cases as cases  # noqa: E402

PY = sys.executable
PROGRAM = os.path.join("scripts", "unseen_writes_cases.py")
PARTS = ("prepare", "cases", "optimizers", "lint", "battery", "training")
MODES = {"unpatched": "unpatched", "check": "unpatched, `check_saved(\"warn\")`", "run": "`run`",
         "run-check": "`run --check-saved=warn`"}
FINDING = "torchgen-patch: saved tensor changed without a version bump"
SUMMARY = re.compile(r"saved-tensor check in pid \d+(?: \(rank \d+\))?: (\d+) changed saved tensors? \((\d+) "
                     r"distinct\) in (\d+) checked")
PATCHED = re.compile(r"torchgen-patch: (\d+) kernels active \((\w+)\), (\d+) refused[^;\n]*; (\d+) optimizer entries "
                     r"active")
LINT_MODULES = ("deepspeed.ops.adam", "deepspeed.ops.lamb", "deepspeed.ops.lion")
# DeepSpeed's ops the parts load, by the op builder that makes each: the fused optimizers' (CUDA's;
# FusedAdam has a CPU build too), and the CPU optimizers' the lint probes without an overlay
DEEPSPEED_OPS = {"fused_adam": "FusedAdamBuilder", "fused_lamb": "FusedLambBuilder", "fused_lion": "FusedLionBuilder",
                 "cpu_adam": "CPUAdamBuilder", "cpu_lion": "CPULionBuilder"}
NOT_HERE = {"transformer_engine": "Transformer Engine", "apex": "apex", "colossalai": "ColossalAI"}


class Runner:
    """Runs commands in fresh processes, a few at a time, each in a process group of its own and
    stopped (with its group) at the run's deadline."""

    def __init__(self, jobs: int, deadline: float, env: dict):
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
        self.deadline, self.env = deadline, env
        self.live: set = set()  # the processes running now

    def stop_all(self) -> None:
        """Stop every process still running, with its group (a SIGTERM to this script does this)."""
        self.deadline = 0
        for proc in list(self.live):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def submit(self, cmd: list[str], limit: float = 600, env: dict | None = None):
        return self.pool.submit(self._run, cmd, limit, env or {})

    def _run(self, cmd: list[str], limit: float, env: dict) -> dict:
        left = self.deadline - time.monotonic()
        if left < 5:
            return {"rc": None, "out": "", "err": "", "seconds": 0.0, "timed_out": True}
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.live.add(proc)
        try:
            out, err = proc.communicate(timeout=min(limit, left))
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
        finally:
            self.live.discard(proc)
        timed_out = timed_out or self.deadline == 0
        return {"rc": proc.returncode, "out": out, "err": err, "seconds": round(time.monotonic() - start, 1),
                "timed_out": timed_out}


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


def _run_prefix(*flags: str) -> list[str]:
    return [PY, "-m", "torchgen_patch", "run", *flags, "--"]


# --- prepare: the builds every later process reuses ------------------------------------------------


def prepare(runner: Runner, device: str, parts: set[str], names: list[str]) -> dict:
    """The kernels (the first ``run`` builds them into the cache) and DeepSpeed's ops the parts need
    (``prepare`` alone: what every part needs), built side by side, each in a process of its own, so
    later processes only load them."""
    import importlib.util

    if parts == {"prepare"}:
        parts = set(PARTS)

    fused = ["fused_adam"] if device == "cpu" else ["fused_adam", "fused_lamb", "fused_lion"]  # CPU: FusedAdam's only
    ops = []
    deepspeed = any((cases.CASES[n].optimizer or "").startswith("deepspeed.") for n in names)
    if deepspeed and {"cases", "optimizers"} & parts:
        ops += fused
    if "lint" in parts:  # the probe constructs each class the overlay does not cover (ZenFlowCPUAdam: cpu_adam)
        ops += ["cpu_adam", "cpu_lion"] + fused
    ops = sorted(set(ops)) if importlib.util.find_spec("deepspeed") else []
    jobs = str(max(1, (os.cpu_count() or 2) // max(1, len(ops))))
    futures = {"kernels": runner.submit(_run_prefix() + [PY, "-c", "import torch"], limit=420)}  # built once
    for op in ops:
        code = ("import warnings; warnings.simplefilter('ignore'); import deepspeed.ops.op_builder as b; "
                f"b.{DEEPSPEED_OPS[op]}().load()")
        futures[op] = runner.submit([PY, "-c", code], limit=420, env={"MAX_JOBS": jobs})
    out = {}
    for name, f in futures.items():
        r = f.result()
        out[name] = {"rc": r["rc"], "seconds": r["seconds"], "timed_out": r["timed_out"],
                     "log": _tail(r["err"], 800) if r["rc"] != 0 else ""}
    return out


# --- the cases, four ways -------------------------------------------------------------------------------


def case_command(mode: str, name: str, device: str, overlay: str | None = None) -> list[str]:
    prog = [PY, PROGRAM, "case", name, device]
    if mode == "unpatched":
        return prog
    if mode == "check":
        return prog + ["--check", "warn"]
    flags = (["--check-saved=warn"] if mode == "run-check" else []) + (["--overlay", overlay] if overlay else [])
    return _run_prefix(*flags) + prog


def parse(r: dict) -> dict:
    """What a case's process gave: its own line, the findings it printed, the launcher's lines."""
    line = next((ln for ln in reversed(r["out"].splitlines()) if ln.startswith(cases.MARK)), None)
    if line is None and r["rc"] is None:  # never started: the run's deadline came first
        got = {"outcome": "not run", "detail": "the run's deadline came before it started"}
    elif line is None:
        why = f"timed out after {r['seconds']:.0f} s" if r["timed_out"] else f"exited {r['rc']} without its line"
        got = {"outcome": "error", "detail": f"{why}: {_tail(r['err'], 600)}"}
    else:
        got = json.loads(line[len(cases.MARK):])
    got["lines"] = sorted({ln[len(FINDING):].lstrip(": ").strip() for ln in r["err"].splitlines()
                           if ln.startswith(FINDING)})
    counts = [tuple(map(int, m.groups())) for m in SUMMARY.finditer(r["err"])]
    if counts:
        got["summary"] = {"changed": sum(c[0] for c in counts), "distinct": sum(c[1] for c in counts),
                          "checked": sum(c[2] for c in counts)}
    m = PATCHED.search(r["err"])
    if m:
        got["patched"] = {"kernels": int(m.group(1)), "backend": m.group(2), "refused": int(m.group(3)),
                          "optimizer_entries": int(m.group(4))}
    got["seconds"] = r["seconds"]
    return got


def run_cases(runner: Runner, device: str, names: list[str]) -> dict:
    futures = {}
    for name in names:
        if device not in cases.CASES[name].devices:  # no process: the case does not exist there
            futures[name] = {m: None for m in MODES}
            continue
        futures[name] = {m: runner.submit(case_command(m, name, device), limit=420) for m in MODES}
    out = {}
    for name, modes in futures.items():
        case = cases.CASES[name]
        if all(f is None for f in modes.values()):
            where = ", ".join(d.upper() for d in case.devices)
            got = {m: {"outcome": "not run", "detail": f"exists on {where} only"} for m in MODES}
        else:
            got = {m: parse(f.result()) for m, f in modes.items()}
        out[name] = {"what": case.what, "modes": got}
    return out


# --- the optimizer entries ------------------------------------------------------------------------------


def _overlays(tmp: str, paths: list[str]) -> dict:
    """class path -> (whether the shipped overlay has its entry, an overlay without it, one with it):
    copies of the shipped overlay, every other entry as it is (so the kernels are the same build)."""
    import yaml

    from torchgen_patch.plan.overlay import load_runtime
    from torchgen_patch.sources import shipped_overlay

    with open(shipped_overlay()) as fh:
        data = yaml.safe_load(fh)
    shipped = data.get("optimizers") or {}
    out = {}
    for k, path in enumerate(paths):
        files = []
        for keep in (False, True):
            opts = {c: e for c, e in shipped.items() if c != path}
            if keep:
                opts[path] = shipped.get(path) or {"writes": ["params"], "reason": "the entry the measurement gives"}
            f = os.path.join(tmp, f"overlay-{k}-{'with' if keep else 'without'}.yaml")
            with open(f, "w") as fh:
                yaml.safe_dump({**data, "optimizers": opts}, fh, sort_keys=False)
            assert (path in load_runtime(f).optimizers) == keep, f  # read back by the tool's own parser
            files.append(f)
        out[path] = (path in shipped, *files)
    return out


def run_optimizers(runner: Runner, device: str, names: list[str], tmp: str) -> dict:
    """Each optimizer case whose library is installed: without and with an entry, and training."""
    import importlib.util

    opt = [n for n in names if cases.CASES[n].optimizer and device in cases.CASES[n].devices
           and importlib.util.find_spec(cases.CASES[n].optimizer.split(".")[0])]
    overlays = _overlays(tmp, [cases.CASES[n].optimizer for n in opt])
    futures = {}
    for n in opt:
        shipped, without, with_ = overlays[cases.CASES[n].optimizer]
        train = [PY, PROGRAM, "train", n, device]
        futures[n] = {"shipped": shipped,
                      "without": runner.submit(case_command("run", n, device, without), limit=420),
                      "with": runner.submit(case_command("run", n, device, with_), limit=420),
                      "train-unpatched": runner.submit(train, limit=420),
                      "train-run": runner.submit(_run_prefix("--overlay", with_) + train, limit=420)}
    out = {}
    for n, f in futures.items():
        got = {"optimizer": cases.CASES[n].optimizer, "shipped": f["shipped"]}
        got.update({k: parse(f[k].result()) for k in ("without", "with", "train-unpatched", "train-run")})
        a, b = got["train-unpatched"], got["train-run"]
        if a["outcome"] == b["outcome"] == "trained":
            got["identical"] = a["losses"] == b["losses"] and a["digest"] == b["digest"]
            got["bumps_per_step"] = sorted({(v - u) / cases.TRAIN_STEPS
                                            for u, v in zip(a["versions"], b["versions"], strict=False)})
        out[n] = got
    return out


# --- the lint's optimizer rule ------------------------------------------------------------------------------


def _shown(path: str | None) -> str | None:
    """A path as the report shows it: relative to the tree, or to the folder on sys.path it is under."""
    if not path:
        return path
    for d in sorted((p for p in sys.path + [ROOT] if p), key=len, reverse=True):
        if path.startswith(d.rstrip(os.sep) + os.sep):
            return path[len(d.rstrip(os.sep)) + 1:]
    return path


def run_lint(runner: Runner) -> dict:
    imports = [a for m in LINT_MODULES for a in ("--import", m)]
    base = [PY, "-m", "torchgen_patch", "lint", "--runtime", *imports, "--namespace", "aten"]
    variants = {"shipped overlay": [], "no overlay": ["--no-overlay"]}
    futures = {k: (runner.submit(base + v, limit=420), runner.submit(base + v + ["--format", "json"], limit=420))
               for k, v in variants.items()}
    out = {"command": "torchgen-patch lint --runtime " + " ".join(imports) + " --namespace aten"}
    for k, (text, js) in futures.items():
        t, j = text.result(), js.result()
        shown = [_shown(ln) for ln in t["out"].splitlines() if any(f"] {m}." in ln for m in LINT_MODULES)]
        got = {"rc": t["rc"], "text": "\n".join(shown + t["out"].splitlines()[-1:]), "stderr": _tail(t["err"], 800)}
        try:
            doc = json.loads(j["out"])
            got["optimizers"] = {f["op"]: {"rule": f["rule"], "message": f["message"], "path": _shown(f.get("path"))}
                                 for f in doc["findings"] if f["rule"].startswith("optimizer-")}
            got["probed"] = doc.get("optimizers")
        except (ValueError, KeyError):
            got["json_error"] = f"exit {j['rc']}: {_tail(j['err'], 600)}"
        out[k] = got
    return out


# --- no false findings --------------------------------------------------------------------------------------


def run_battery(runner: Runner, device: str, tmp: str) -> dict:
    """The compatibility battery, patched, with the check off and on (warn): outcomes, versions, findings."""
    runs = {}
    for check in ("", "warn"):
        env = {"COMPAT_CHECK_SAVED": check, "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, f"inductor-battery{check}"),
               "TRITON_CACHE_DIR": os.path.join(tmp, f"triton-battery{check}")}
        runs[check or "off"] = runner.submit([PY, os.path.join("tests", "compat_scenarios.py"), device, "1"],
                                             limit=480, env=env)
    got = {k: f.result() for k, f in runs.items()}
    try:
        off, on = (json.loads(got[k]["out"].strip().splitlines()[-1]) for k in ("off", "warn"))
    except (ValueError, IndexError):
        return {"error": "; ".join(f"{k}: exit {r['rc']}{' (timed out)' if r['timed_out'] else ''}: "
                                   f"{_tail(r['err'], 500)}" for k, r in got.items())}
    differ = sorted(k for k in off if (off[k].get("value"), off[k].get("raises"), off[k]["versions"])
                    != (on.get(k, {}).get("value"), on.get(k, {}).get("raises"), on.get(k, {}).get("versions")))
    return {"scenarios": len(off), "identical": len(off) - len(differ), "different": differ,
            "findings": sum(v.get("saved", {}).get("findings", 0) for v in on.values()),
            "checked": sum(v.get("saved", {}).get("checked", 0) for v in on.values()),
            "raising": sorted(k for k in off if "raises" in off[k])}


def run_training(runner: Runner, device: str, tmp: str) -> dict:
    """tests/saved_training.py's cases on ``device``, the check off and on (warn); a second run with
    it off where the two differ, to tell the check from a training that differs run to run."""
    prog = [PY, os.path.join("tests", "saved_training.py")]

    def launch(mode: str, k: int):
        env = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, f"inductor-training-{mode}-{k}"),
               "TRITON_CACHE_DIR": os.path.join(tmp, f"triton-training-{mode}-{k}"),
               "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        return runner.submit(prog + [mode, "all", device], limit=480, env=env)

    def result(f):
        r = f.result()
        try:
            return json.loads(r["out"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": f"exit {r['rc']}{' (timed out)' if r['timed_out'] else ''}: {_tail(r['err'], 600)}"}

    first = launch("off", 0), launch("warn", 0)
    off, on = (result(f) for f in first)
    if "error" in off or "error" in on:
        return {"error": off.get("error") or on.get("error")}
    again = None
    if any(off[c]["losses"] != on[c]["losses"] for c in off):
        again = result(launch("off", 1))
    out = {}
    for c in sorted(off):
        same = off[c]["losses"] == on[c]["losses"]
        out[c] = {"identical": same, "findings": on[c]["findings"], "checked": on[c]["checked"],
                  "trains": off[c]["losses"][-1] < off[c]["losses"][0],
                  "off_run_to_run": None if same or again is None or "error" in again
                  else again[c]["losses"] == off[c]["losses"]}
    return {"cases": out}


# --- the report ----------------------------------------------------------------------------------------------


def environment(device: str) -> dict:
    import importlib.metadata
    import platform

    import torch

    libs = {}
    for dist in ("deepspeed", "liger-kernel", "triton", "cupy-cuda13x", "cupy-cuda12x", "transformers",
                 "transformer-engine", "apex", "colossalai"):
        try:
            libs[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            libs[dist] = None
    nvcc = None
    try:
        from torch.utils.cpp_extension import CUDA_HOME

        exe = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else "nvcc"
        nvcc = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    except (OSError, IndexError):
        pass
    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else None
    return {"device": device, "gpu": gpu, "torch": torch.__version__, "python": platform.python_version(),
            "libraries": libs, "nvcc": nvcc}


def cell(r: dict, notes: list[str]) -> str:
    """One mode's outcome as a table cell; a finding's text goes to ``notes`` (shown under the table)."""
    o = r.get("outcome")
    detail = (r.get("detail") or "").replace("|", "\\|").replace("\n", " ")
    if o == "not run":
        return f"not run: {detail}"
    if o == "error":
        return f"**error**: {detail[:300]}"
    if not r.get("wrote", True):
        return f"{o}, but the write left the saved tensor's bits as they were"
    text = r.get("lines") or [_finding_text(f) for f in r.get("findings", [])]
    if text:
        notes.extend(t for t in text if t not in notes)
        refs = ", ".join(f"[F{notes.index(t) + 1}]" for t in text)
        return f"**finding** {refs}" + (" (then autograd's error)" if o == "raises" else "")
    if o == "raises":
        return "raises (autograd's error)"
    if o == "finding":
        return f"**finding**: {detail}"
    checked = "summary" in r or "checked" in r  # the check was on: its count at exit, or its block's
    return "**silent**" + (", no finding" if checked else "")


def _lint_cell(f: dict) -> str:
    """A lint finding on an optimizer class, short: what its probe found."""
    text = f["message"].split(": ", 1)[-1]
    if f["rule"] == "optimizer-step-unseen":
        unseen = text.split("cannot see the write: ", 1)[-1]
        return "**unseen**: " + unseen.split("; an optimizer entry in the overlay")[0]
    return text


def _finding_text(f: dict) -> str:
    t = f["tensor"]
    return (f"{t['dtype']}[{', '.join(map(str, t['shape']))}] on {t['device']}, saved by {f['node']}; likely written "
            f"by: {', '.join(f['writers'])}" + (f" (optimizer {f['optimizer']})" if f.get("optimizer") else ""))


def render(res: dict) -> str:
    env = res["environment"]
    lines = [f"# Writes autograd cannot see, on {env['device'].upper()}: torch {env['torch']}", "",
             f"- device: {env['gpu'] or env['device']}; Python {env['python']}; nvcc: {env['nvcc'] or 'none'}",
             "- libraries: " + ", ".join(f"{k} {v}" if v else f"{k}: not installed"
                                         for k, v in sorted(env["libraries"].items())),
             f"- command: `{res['command']}`",
             "- each cell: a fresh process running the case (scripts/unseen_writes_cases.py): forward, the write, "
             "backward. *silent*: backward ran and computed with the written contents; *raises*: autograd's "
             "\"modified by an inplace operation\"; *finding*: the saved-tensor check's finding (unpatched inside "
             "`check_saved(\"warn\")`: from its JSON; under `run --check-saved=warn`: the lines it printed)"]
    patched = sorted({json.dumps(m["patched"], sort_keys=True) for c in res.get("cases", {}).values()
                      for m in c["modes"].values() if "patched" in m})
    if patched:
        lines.append("- under `run`: " + "; ".join(
            "{kernels} kernels active ({backend}), {refused} refused, {optimizer_entries} optimizer entries active"
            .format(**json.loads(p)) for p in patched))
    if res.get("prepare"):
        lines.append("- built first, side by side: " + ", ".join(
            f"{k} {v['seconds']:.0f} s" + ("" if v["rc"] == 0 else f" (**exit {v['rc']}**)")
            for k, v in sorted(res["prepare"].items())))
    notes: list[str] = []
    if res.get("cases"):
        lines += ["", "## The writes", "",
                  "| write between forward and backward | " + " | ".join(MODES.values()) + " |",
                  "|---|" + "---|" * len(MODES)]
        for c in res["cases"].values():
            lines.append(f"| {c['what']} | " + " | ".join(cell(c["modes"][m], notes) for m in MODES) + " |")
        missing = [n for lib, n in NOT_HERE.items() if not any(k.startswith(lib.replace("_", "-")) and v
                                                               for k, v in env["libraries"].items())]
        if missing:
            lines += ["", f"Not measured here: {', '.join(missing)} (not installed on this machine)."]
    if res.get("optimizers"):
        lines += ["", "## The optimizer entries", "",
                  "| optimizer | entry | `run` without an entry | `run` with it | training, unpatched vs `run` with "
                  "it |",
                  "|---|---|---|---|---|"]
        for o in res["optimizers"].values():
            a, b = o["train-unpatched"], o["train-run"]
            if "identical" in o:
                train = (("bit-identical" if o["identical"] else "**different**") +
                         f" (losses and final parameters; versions +{'/'.join(f'{x:g}' for x in o['bumps_per_step'])}"
                         " a step)")
            else:
                train = cell(a if a["outcome"] != "trained" else b, notes)
            lines.append(f"| `{o['optimizer']}` | {'shipped' if o['shipped'] else 'given (none ships)'} | "
                         f"{cell(o['without'], notes)} | {cell(o['with'], notes)} | {train} |")
    if notes:
        lines += ["", "Findings:", ""] + [f"- [F{i}] {t}" for i, t in enumerate(notes, 1)]
    if res.get("lint"):
        lint = res["lint"]
        lines += ["", "## The lint's optimizer rule", "", f"`{lint['command']}`, with the shipped overlay and with "
                  "`--no-overlay` (below the table: its lines on these classes and its last line):", "",
                  "| class | no overlay | shipped overlay |", "|---|---|---|"]
        classes = sorted(set().union(*(v.get("optimizers", {}) for k, v in lint.items() if k != "command"))
                         | set((lint.get("shipped overlay", {}).get("probed") or {}).get("covered_by_overlay", [])))
        for c in classes:
            row = []
            for k in ("no overlay", "shipped overlay"):
                f = lint.get(k, {}).get("optimizers", {}).get(c)
                covered = c in ((lint.get(k, {}).get("probed") or {}).get("covered_by_overlay") or [])
                row.append("covered by its entry" if covered else _lint_cell(f) if f else "no finding")
            lines.append(f"| `{c}` | " + " | ".join(r.replace("|", "\\|") for r in row) + " |")
        for k in ("no overlay", "shipped overlay"):
            v = lint.get(k, {})
            lines += ["", f"<details><summary>{k}: exit {v.get('rc')}</summary>", "", "```",
                      (v.get("text") or "").strip() or v.get("stderr", ""), "```", "</details>"]
    if res.get("battery"):
        b = res["battery"]
        lines += ["", "## No false findings", ""]
        if "error" in b:
            lines.append(f"- compatibility battery: **error**: {b['error']}")
        else:
            lines.append(f"- compatibility battery (tests/compat_scenarios.py {env['device']}, patched), the check off "
                         f"and on: {b['scenarios']} scenarios, {b['identical']} identical (outcome, value, version "
                         f"counters){'; different: ' + ', '.join(b['different']) if b['different'] else ''}; "
                         f"**{b['findings']} findings** in {b['checked']} checked saved tensors")
    if res.get("training"):
        t = res["training"]
        if not res.get("battery"):
            lines += ["", "## No false findings", ""]
        if "error" in t:
            lines.append(f"- training: **error**: {t['error']}")
        else:
            lines += ["- training (tests/saved_training.py, patched), the check off and on:", "",
                      "| case | losses, check off vs on | findings | checked | trains |", "|---|---|---|---|---|"]
            for c, v in t["cases"].items():
                same = "bit-identical" if v["identical"] else "**different**" + (
                    "" if v["off_run_to_run"] is None else " (without the check as well, run to run)"
                    if not v["off_run_to_run"] else " (the same run to run without the check)")
                lines.append(f"| {c} | {same} | **{v['findings']}** | {v['checked']} | "
                             f"{'yes' if v['trains'] else 'no'} |")
    return "\n".join(lines) + "\n"


# --- docs/unseen-writes.md's CUDA table ---------------------------------------------------------------------

DOCS = os.path.join(ROOT, "docs", "unseen-writes.md")
BEGIN, END = "<!-- cuda-table: begin (scripts/unseen_writes.py --docs) -->", "<!-- cuda-table: end -->"


def docs_table(res: dict | None) -> str:
    """The docs' CUDA table: from a report's JSON, or, without one, every case 'not measured'."""
    where = "" if res is None else f" ({res['environment']['gpu'] or 'CUDA'}, torch {res['environment']['torch']})"
    head = ["| write between forward and backward, on CUDA" + where + " | unpatched | patched (`run`) | "
            "patched, with the check |", "|---|---|---|---|"]
    rows = []
    for name, case in cases.CASES.items():
        if "cuda" not in case.devices:
            continue
        got = (res or {}).get("cases", {}).get(name)
        if got is None:
            rows.append(f"| {case.what} | not measured | not measured | not measured |")
            continue
        rows.append(f"| {case.what} | " + " | ".join(_short(got["modes"][m]) for m in ("unpatched", "run", "run-check"))
                    + " |")
    return "\n".join(head + rows)


def _short(r: dict) -> str:
    o = r.get("outcome")
    if o == "not run":
        return "not run: " + (r.get("detail") or "").split(" (")[0].replace("|", "\\|")
    if o == "error":
        return "error (see the report)"
    if r.get("lines") or r.get("findings"):
        return "finding"
    return {"raises": "raises", "silent": "silent"}.get(o, o)


def write_docs(json_path: str | None) -> str:
    """Put the table (from ``json_path``, or none) between the docs' markers; returns the new text."""
    res = None
    if json_path:
        with open(json_path) as fh:
            res = json.load(fh)
    with open(DOCS) as fh:
        text = fh.read()
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:i] + "\n" + docs_table(res) + "\n" + text[j:]


# --- main --------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--part", action="append", choices=PARTS, help="run only these parts (repeatable)")
    ap.add_argument("--cases", help="only these cases, comma-separated (default: all)")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 2), help="processes at a time")
    ap.add_argument("--deadline", type=float, default=3600, help="seconds: stop what still runs then (its row "
                                                                  "says so) and write the report")
    ap.add_argument("--report", help="the markdown report (default: reports/unseen-writes-DEVICE-torchV.md)")
    ap.add_argument("--json", dest="json_path", help="its JSON (default: the report's name, .json)")
    ap.add_argument("--docs", metavar="FILE.json", help="only write docs/unseen-writes.md's CUDA table from FILE.json")
    a = ap.parse_args(argv)
    if a.docs:
        text = write_docs(a.docs)
        with open(DOCS, "w") as fh:
            fh.write(text)
        print(f"wrote {os.path.relpath(DOCS, ROOT)}")
        return 0
    names = list(cases.CASES) if not a.cases else a.cases.split(",")
    unknown = [n for n in names if n not in cases.CASES]
    if unknown:
        ap.error(f"unknown case(s): {', '.join(unknown)} (known: {', '.join(cases.CASES)})")
    parts = set(a.part or PARTS)
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    # DeepSpeed's ops where the tests build them (tests/conftest.py), unless the caller says otherwise
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".cache", "torch_extensions"))
    runner = Runner(a.jobs, start + a.deadline, env)

    def stop(signum, frame):
        runner.stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    shown = [os.path.basename(x) if os.path.isabs(x) else x for x in (argv if argv is not None else sys.argv[1:])]
    res = {"environment": environment(a.device), "command": "python scripts/unseen_writes.py " + " ".join(shown)}
    with tempfile.TemporaryDirectory(prefix="unseen-writes-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=len(PARTS)) as parts_pool:  # they only wait
        res["prepare"] = prepare(runner, a.device, parts, names)
        print("built: " + ", ".join(f"{k} {v['seconds']:.0f} s (exit {v['rc']})" + (f": {v['log'][-300:]}" if v["log"]
                                                                                 else "")
                                    for k, v in sorted(res["prepare"].items())), flush=True)
        work = {"battery": (run_battery, runner, a.device, tmp), "training": (run_training, runner, a.device, tmp),
                "lint": (run_lint, runner), "cases": (run_cases, runner, a.device, names),
                "optimizers": (run_optimizers, runner, a.device, names, tmp)}  # the longest first
        jobs = {k: parts_pool.submit(*fn) for k, fn in work.items() if k in parts}
        for k, f in jobs.items():
            res[k] = f.result()
    runner.pool.shutdown()
    res["seconds"] = round(time.monotonic() - start)
    version = res["environment"]["torch"].split("+")[0]
    report = a.report or os.path.join(ROOT, "reports", f"unseen-writes-{a.device}-torch{version}.md")
    json_path = a.json_path or os.path.splitext(report)[0] + ".json"
    for path, text in ((json_path, json.dumps(res, indent=2, sort_keys=True) + "\n"), (report, render(res))):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    print(f"wrote {report} and {json_path} in {res['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
