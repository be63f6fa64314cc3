"""The compiler's processes: each build runs in a process group of its own that ends with the build
(SIGINT, SIGTERM, this process's exit, or its death by SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import subprocess

from ...fs.dirs import Dir

_CHILDREN: dict = {}  # the build processes running now (each the leader of its own group) -> the pid that started it


def _kill_children() -> None:
    """End the build processes this process started (never those of a parent it was forked from)."""
    import signal

    me = os.getpid()
    for proc, owner in list(_CHILDREN.items()):
        if owner != me:
            continue
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass


os.register_at_fork(after_in_child=_CHILDREN.clear)  # a child forked mid-build owns none of its parent's


def _die_with_parent() -> None:
    """In a build child: SIGTERM when this process dies, even by SIGKILL (ninja then stops its compilers)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def own_process_group():
    """While the block runs: SIGINT/SIGTERM end the build's process group before they act (SIGTERM
    exits 143, after the temporary build is removed), and so does this process's exit."""
    import atexit
    import signal
    import threading

    handlers: dict = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):
            _kill_children()
            previous = handlers.get(signum)
            if callable(previous):
                previous(signum, frame)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, on_signal)
    atexit.register(_kill_children)
    try:
        yield
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
        atexit.unregister(_kill_children)


def run_in_group(d: Dir, argv: list[str], log, verbose: bool, env: dict | None = None) -> tuple[int, str]:
    """``argv`` in ``d`` (its working directory set from the descriptor; ``env``: its environment, None:
    this process's), in a process group of its own that ends with the build; (exit status, its output)."""
    with own_process_group():
        proc = d.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                     start_new_session=True, preexec=_die_with_parent)
        _CHILDREN[proc] = os.getpid()
        try:
            out = []
            for line in proc.stdout:
                out.append(line)
                if verbose:
                    log.write(line.decode(errors="replace"))
                    log.flush()
            proc.wait()
        except BaseException:
            _kill_children()
            proc.wait()
            raise
        finally:
            _CHILDREN.pop(proc, None)
            proc.stdout.close()
    return proc.returncode, b"".join(out).decode(errors="replace")


