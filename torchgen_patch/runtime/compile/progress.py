"""What a build says while it runs: a line per translation unit ninja finishes, on a terminal."""

from __future__ import annotations

import os
from typing import Any

from ...fs.dirs import Dir
from .ninja import ninja_times


class Progress:
    """On a terminal (not in CI), a line per translation unit as ninja finishes it, with its own
    compile time (ninja's log); elsewhere nothing. A context manager around the compile."""

    def __init__(self, directory: Dir, sources: list[str], log):
        self.directory, self.log = directory, log
        self.pending = {os.path.splitext(os.path.basename(s))[0] + ".o": os.path.basename(s) for s in sources}
        self.total = len(self.pending)
        self.on = bool(getattr(log, "isatty", lambda: False)()) and not os.environ.get("CI")
        self._stop: Any = None  # a threading.Event while it watches

    def poll(self) -> None:
        times = ninja_times(self.directory)
        for obj in sorted(set(times) & set(self.pending), key=lambda o: (times[o], o)):
            done = self.total - len(self.pending) + 1
            print(f"torchgen-patch: [{done}/{self.total}] compiled {self.pending.pop(obj)} in {times[obj]:.0f} s",
                  file=self.log, flush=True)

    def __enter__(self):
        if self.on:
            import threading

            self._stop = threading.Event()

            def watch():
                while not self._stop.wait(0.5):
                    self.poll()

            self._thread = threading.Thread(target=watch, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
            if exc[0] is None:
                self.poll()
        return False


