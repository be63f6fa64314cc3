"""The results: one json a release, each step's results merged into it as they come (under a lock: runs of
other steps may write it meanwhile), and every file written whole (a temporary file, then renamed)."""

from __future__ import annotations

import fcntl
import json
import os

from .config import ROOT


def atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def save(path: str, seed: str, updates: dict, tests: dict | None = None) -> dict:
    """Merge one step's results into the json as it is on disk now (runs of other steps may have
    written it meanwhile); returns the merged data."""
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", "pytorch-check.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        src = path if os.path.isfile(path) else seed
        data = json.load(open(src)) if os.path.isfile(src) else {}
        data.update(updates)
        data.setdefault("tests", {}).update(tests or {})
        for t in data["tests"].values():  # verdicts live in VERDICTS, never in the json
            keep = ("test", "unpatched", "patched", "reruns", "runs", "stuck")
            t["differ"] = [{k: d[k] for k in keep if k in d} for d in t["differ"]]
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data
