"""Ranks that hang: the multi-process ranks of PyTorch's tests watched while a test command runs, dumped
with py-spy once stuck, and what their stacks explain of the tests a rank timeout failed."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from stack_dump import read_stuck

# PyTorch's multi-process tests (MultiProcessTestCase) end a rank that does not finish within
# DISTRIBUTED_TESTS_DEFAULT_TIMEOUT and fail the test with "Process N terminated or timed out". A rank of this
# check's groups finishes in ~10 s here, so one alive after STUCK_AFTER_S is stuck: its threads' Python and
# native stacks are dumped once with py-spy (the release venv has it) while it is still alive, and the test
# it runs is read from MultiProcessTestCase.run_test's arguments. Torch 2.6's ProcessGroupGloo destructor
# joins gloo's worker threads with the GIL held (the Python binding does not release it; PyTorch fixed this
# after 2.6, pytorch/pytorch#154976) while a worker, destroying a finished work's tensors, waits for the GIL:
# a deadlock of PyTorch's own, seen on both sides. Stacks with that signature and no frame of this project
# explain a rank timeout (explain_failures); nothing else does. A dump is read by its frames (stack_dump.py),
# never by its text: a local variable may name any function.
STUCK_AFTER_S = 30
RANK_TIMEOUT = "terminated or timed out"
GLOO_TEARDOWN_DEADLOCK = "PyTorch's gloo teardown deadlock"


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (state, ppid, ...), or [] for a process gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def children(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc."""
    parent = {int(n): int(f[1]) for n in os.listdir("/proc") if n.isdigit() and len(f := _stat(int(n))) > 1}
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _is_rank(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing.spawn" in f.read()
    except OSError:
        return False


def _started(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22): with the pid, its identity."""
    f = _stat(pid)
    return int(f[19]) if len(f) > 19 else None


class StuckRanks(threading.Thread):
    """Watches the processes below one pid while a test command runs; dumps each rank alive after
    STUCK_AFTER_S into DIR/stuck-<pid>-<start time>.txt, once (a rank is its pid and start time). ``failed`` counts the
    dumps py-spy could not make."""

    def __init__(self, pid: int, py_spy: str, folder: str):
        super().__init__(daemon=True)
        self.pid, self.py_spy, self.folder = pid, py_spy, folder
        self.done, self.dumps, self.failed = threading.Event(), [], 0  # dumps: file paths

    def run(self) -> None:
        first_seen: dict[tuple[int, int | None], float] = {}
        dumped: set[tuple[int, int | None]] = set()
        while not self.done.wait(2):
            now = time.monotonic()
            for p in children(self.pid):
                if not _is_rank(p):
                    continue
                rank = (p, _started(p))
                if now - first_seen.setdefault(rank, now) > STUCK_AFTER_S and rank not in dumped:
                    dumped.add(rank)
                    try:
                        self._dump(p, rank[1])
                    except Exception:  # noqa: BLE001 - a rank not dumped is counted, the watch goes on
                        self.failed += 1

    def _dump(self, p: int, started: int | None) -> None:
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"stuck-{p}-{started}.txt")
        try:
            r = subprocess.run([self.py_spy, "dump", "--native", "--locals", "--pid", str(p)], capture_output=True,
                               text=True, timeout=20)
            ok, text = r.returncode == 0, r.stdout if r.returncode == 0 else \
                f"py-spy failed (exit {r.returncode}): {r.stderr.strip()}\n"
        except (OSError, subprocess.TimeoutExpired) as e:  # a dump that cannot be had explains nothing
            ok, text = False, f"py-spy failed: {e}\n"
        with open(path, "w") as f:
            f.write(text)
        if ok:
            self.dumps.append(path)
        else:
            self.failed += 1


def explain_failures(cases: dict[str, tuple[str, str]], dumps: list[str], root: str,
                     failed_dumps: int = 0) -> dict[str, dict]:
    """test id -> why it failed, for every test that failed by a rank timeout: the dumps of its stuck ranks
    (paths relative to ``root``) and the cause they show: GLOO_TEARDOWN_DEADLOCK when every dump of its ranks
    shows it, and no dump of the run failed, names no test or shows a frame of this project (such a rank may
    be any test's); "unexplained" otherwise."""
    read = []
    for path in dumps:
        with open(path, encoding="utf-8", errors="replace") as f:
            read.append((os.path.relpath(path, root), read_stuck(f.read())))
    # a rank that names no test, or shows a frame of this project, may be any failed test's
    spoiled = failed_dumps or any(r["test"] is None or r["ours"] for _, r in read)
    out = {}
    for test, (kind, message) in sorted(cases.items()):
        if kind not in ("failed", "error") or RANK_TIMEOUT not in message:
            continue
        mine = [(p, r) for p, r in read if r["test"] and test.endswith("." + r["test"])]
        cause = (GLOO_TEARDOWN_DEADLOCK if mine and not spoiled and all(r["gloo_teardown_deadlock"] for _, r in mine)
                 else "unexplained")
        out[test] = {"cause": cause, "stacks": [p for p, _ in mine]}
    return out
