"""Two ranks on gloo, judged at exit. torch's gloo teardown now and then destroys a C++ thread object
unjoined once a CPU training is over, unpatched and patched alike: the rank dies of SIGABRT with the line
below and no Python frame (reproduced with DDP alone, no torchgen-patch imported, about one run in seven
of 1000 steps on torch 2.13). A rank whose results file is written (its last act) ran whole; only its
teardown crashed."""

from __future__ import annotations

import os
import socket

ABORT_AT_EXIT = "terminate called without an active exception"


def ran_whole(returncode: int, results: str, output: str) -> bool:
    """The rank exited 0, or it wrote ``results`` and then died of SIGABRT with the unjoined-thread line
    in ``output`` (its stderr)."""
    return returncode == 0 or (returncode == -6 and os.path.isfile(results) and ABORT_AT_EXIT in output)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
