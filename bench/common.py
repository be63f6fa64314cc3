"""Helpers for side-by-side benchmarks: paired, interleaved runs; medians; ratios."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code: str, env: dict | None = None, args: list[str] = (), pythonpath: str | None = None,
           cwd: str = ROOT) -> float:
    """Run ``code`` (with ``args``) in a fresh interpreter; it must print the seconds it measured.
    ``pythonpath``: put first on the path (a checkout whose torchgen is to be imported); ``cwd``: where
    it runs, which ``python -c`` puts before the path (another tree of this package: run there)."""
    e = _env(PYTHONPATH=os.pathsep.join(p for p in (pythonpath, ROOT) if p))
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=e, cwd=cwd)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return float(r.stdout.strip().splitlines()[-1])


def _env(**kw) -> dict:
    """The environment of a measured process. Bytecode caches on, as for any installed
    package (pip compiles them): a PYTHONDONTWRITEBYTECODE=1 in the caller's environment
    would make every run recompile the source tree's modules and measure that instead."""
    e = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    e.update(kw)
    return e


def wall(cmd: list[str], env: dict | None = None) -> float:
    e = _env(PYTHONPATH=ROOT)
    e.update(env or {})
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=ROOT)
    dt = time.perf_counter() - t
    if r.returncode not in (0, 1):
        raise RuntimeError(r.stderr)
    return dt


def paired(a, b, n: int) -> tuple[list[float], list[float]]:
    """Run a() and b() n times each, interleaved (a b a b ...), so drift hits both."""
    xs, ys = [], []
    for _ in range(n):
        xs.append(a())
        ys.append(b())
    return xs, ys


def ratio_line(name: str, xs: list[float], ys: list[float], target: float | None) -> dict:
    """The ratio of the medians, judged against ``target``; the ratio of the bests beside it (the least
    disturbed run of each side, where a shared machine's noise is wider than the difference)."""
    mx, my = statistics.median(xs), statistics.median(ys)
    ratio = mx / my
    ok = None if target is None else ratio <= target
    verdict = "" if ok is None else ("  [target <= %.2f: %s]" % (target, "met" if ok else "NOT MET"))
    spread = _spread([x / y for x, y in zip(xs, ys, strict=True)])  # each round's pair: the run's noise
    print(f"{name}: {mx:.4f}s vs {my:.4f}s  ratio {ratio:.3f} (rounds p25-p75 {spread[0]:.3f}-{spread[1]:.3f}); "
          f"best {min(xs):.4f}s vs {min(ys):.4f}s, ratio {min(xs) / min(ys):.3f}{verdict}", flush=True)
    return {"name": name, "median_s": mx, "anchor_median_s": my, "ratio": ratio, "target": target, "met": ok,
            "runs": len(xs), "best_s": min(xs), "anchor_best_s": min(ys), "best_ratio": min(xs) / min(ys),
            "round_ratio_p25_p75": list(spread)}


def _spread(ratios: list[float]) -> tuple[float, float]:
    if len(ratios) < 2:
        return ratios[0], ratios[0]
    q = statistics.quantiles(ratios, n=4)
    return q[0], q[2]


def save(results: list[dict], path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(results, fh, indent=2, sort_keys=True)
        fh.write("\n")
