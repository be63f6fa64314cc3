"""Run a command and sample the summed RSS of its whole process tree (/proc)."""

from __future__ import annotations

import os
import subprocess
import threading
import time


def _children() -> dict[int, int]:
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                parent[int(d)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass
    return parent


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(root: int) -> int:
    parent = _children()
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in tree:
                tree.add(c)
                frontier.append(c)
    return sum(_rss_kb(p) for p in tree)


def run_measured(cmd: list[str], env=None, cwd=None) -> tuple[float, int, subprocess.CompletedProcess]:
    """(wall seconds, peak summed RSS in bytes, result)."""
    peak = [0]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, text=True)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss_kb(proc.pid))
            stop.wait(0.05)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t
    stop.set()
    th.join()
    return wall, peak[0] * 1024, subprocess.CompletedProcess(cmd, proc.returncode, out, err)
