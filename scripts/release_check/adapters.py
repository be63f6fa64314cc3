"""PyTorch's own lint adapters (`lintrunner init`, then each linter alone) on the files the fix adds or
edits; linters that need the network are listed as not run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib

from .checkout import fix_files
from .config import INIT_WITH, NEEDS_NETWORK
from .venv import run_env


def _glob_re(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def linters_for(config: dict, paths: list[str]) -> dict[str, list[str]]:
    """code -> the given paths its include_patterns take and its exclude_patterns leave."""
    out = {}
    for linter in config.get("linter", []):
        inc = [_glob_re(p) for p in linter.get("include_patterns", [])]
        exc = [_glob_re(p) for p in linter.get("exclude_patterns", [])]
        hit = [p for p in paths if any(r.match(p) for r in inc) and not any(r.match(p) for r in exc)]
        if hit:
            out[linter["code"]] = hit
    return out


def step_adapters(tree: str, work: str, python: str) -> dict:
    """PyTorch's own lint adapters on the files the fix adds or edits."""
    files = fix_files(work)
    config = tomllib.load(open(os.path.join(tree, ".lintrunner.toml"), "rb"))
    lintrunner, env = os.path.join(os.path.dirname(python), "lintrunner"), run_env(python)
    data = os.path.join(work, "lr-adapters")
    result: dict = {"files": files, "linters": {}}
    matched = linters_for(config, files)
    runnable = sorted(c for c in matched if c not in NEEDS_NETWORK)
    take = ",".join(sorted({INIT_WITH.get(c, c) for c in runnable} | set(runnable)))
    init = subprocess.run([lintrunner, "init", "--take", take, "--data-path", data], cwd=tree, env=env,
                          capture_output=True, text=True)
    for code, paths in sorted(matched.items()):
        entry: dict = {"files": paths}
        result["linters"][code] = entry
        if code in NEEDS_NETWORK:
            entry["not_run"] = f"needs the network: {NEEDS_NETWORK[code]}"
            continue
        if init.returncode != 0:
            entry["not_run"] = "lintrunner init failed: " + ((init.stderr or init.stdout).strip().splitlines()
                                                            or ["no message"])[-1][:200]
            continue
        r = subprocess.run([lintrunner, "--take", code, "--output", "json", "--data-path", data, *paths], cwd=tree,
                           env=env, capture_output=True, text=True)
        msgs = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.returncode not in (0, 1):
            entry["not_run"] = f"lintrunner exited {r.returncode}: " + (r.stderr.strip().splitlines() or [""])[-1][:200]
            continue
        # a message with no path is the adapter failing, not a finding
        entry["failures"] = [(m.get("description") or m["name"]).strip().splitlines()[0][:300]
                             for m in msgs if m.get("path") is None]
        entry["findings"] = [dict({k: m.get(k) for k in ("line", "code", "name", "severity")},
                                  path=os.path.relpath(m["path"], tree)) for m in msgs if m.get("path") is not None]
    return result
