"""Launch: every Python process of a program, or of an environment, gets the kernels at its own first
``import torch``. The third part of the runtime, beside build and load.

``launcher.py``: ``torchgen-patch run``'s parent (entry points ``prepare``, then ``run_program``; and
``check_program`` for ``--runtime-op``), which never imports torch; ``spec.py``: the launch spec it
hands to each process, one frozen value that parses and checks itself; ``process.py``: the install
step in each such process (``after_import``, called by the hook in ``runtime/site/``); ``enable.py``:
the same hook for every process of an environment, from a ``.pth`` line in its site-packages.

This package imports nothing when it is imported: each process the program starts imports
``process.py`` and ``spec.py`` only, and the launcher's names are imported when first named.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .launcher import check_program, launch_spec, prepare, run_program

__all__ = ["check_program", "launch_spec", "prepare", "run_program"]
_LAUNCHER = (*__all__, "_check_main")  # and the one the --runtime-op check's process imports


def __getattr__(name: str):
    if name in _LAUNCHER:
        return getattr(importlib.import_module(".launcher", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
